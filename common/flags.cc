#include "common/flags.h"

#include <unistd.h>  // environ

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

ABSL_FLAG(std::string, config, "",
          "Config file of 'name = value' lines; HARRIER_<NAME> env vars override it, flags "
          "override both.");

namespace harrier {
namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(2);
}

void SetFlag(const std::string& name, const std::string& value, const std::string& source) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) Die(absl::StrCat(source, ": unknown flag '", name, "'"));
  std::string error;
  if (!flag->ParseFrom(value, &error)) {
    Die(absl::StrCat(source, ": bad value '", value, "' for --", name, ": ", error));
  }
}

void ApplyConfigFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) Die(absl::StrCat("--config: cannot read ", path));
  std::string line;
  int line_number = 0;
  while (std::getline(file, line)) {
    ++line_number;
    absl::string_view text = line;
    if (auto hash = text.find('#'); hash != absl::string_view::npos) text = text.substr(0, hash);
    text = absl::StripAsciiWhitespace(text);
    if (text.empty()) continue;
    absl::ConsumePrefix(&text, "--");
    const auto eq = text.find('=');
    if (eq == absl::string_view::npos) {
      Die(absl::StrCat(path, ":", line_number, ": expected 'name = value'"));
    }
    SetFlag(std::string(absl::StripAsciiWhitespace(text.substr(0, eq))),
            std::string(absl::StripAsciiWhitespace(text.substr(eq + 1))),
            absl::StrCat(path, ":", line_number));
  }
}

void ApplyEnvironment() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (name == "config") continue;
    const std::string env = absl::StrCat("HARRIER_", absl::AsciiStrToUpper(name));
    if (const char* value = std::getenv(env.c_str()); value != nullptr) SetFlag(std::string(name), value, env);
  }
}

// HARRIER_* variables a binary accepts without having a flag of that name.
// Anything else named HARRIER_* that is not one of the binary's own flags is
// a typo or a setting for a flag that does not exist, and is refused.
// clang-format off
constexpr absl::string_view kOtherHarrierVariables[] = {
    // Read by ParseFlags itself: the config file.
    "HARRIER_CONFIG",
    // Read by scripts and tests, which pass their environment on to the
    // binaries they start (deploy/quickstart.sh, deploy/test_clang.sh,
    // tests/python, tests/cuda/run_gpu_checks.sh, .bazelrc's sanitizer
    // configs, tests/transport and tests/integration BUILD files, the fuzzers).
    "HARRIER_BIN", "HARRIER_BIN_DIR", "HARRIER_SERVER", "HARRIER_PY_TEST_TIMEOUT",
    "HARRIER_TEST_TRANSPORT", "HARRIER_TEST_SLOWDOWN", "HARRIER_FUZZ_TRACE",
    "HARRIER_FUZZ_SECONDS", "HARRIER_CLANG_OUT", "HARRIER_CLANG_BAZEL_FLAGS",
    // Read by the UCX transport (worker/transport/ucx/ucx_transport.h).
    "HARRIER_UCX_DEVICE_MEMORY",
    // The flags of harrier-server and harrier-worker: deploy/k8s gives every
    // server and worker pod one environment (base/harrier.env), so each
    // binary sees the other's settings. tests/e2e/clear_errors_test.sh checks
    // that this list holds every flag either binary has.
    "HARRIER_APPLY_THREADS", "HARRIER_AUTH_TOKEN_FILE", "HARRIER_BATCH_SIZE", "HARRIER_BETA1", "HARRIER_BETA2",
    "HARRIER_BLAS_THREADS", "HARRIER_CHECKPOINT_DIR", "HARRIER_CHECKPOINT_EVERY_S",
    "HARRIER_CHECKPOINT_KEEP", "HARRIER_CHUNK_KIB", "HARRIER_CODEC", "HARRIER_COMPRESS_MIN_BYTES",
    "HARRIER_COMPUTE_SCALE", "HARRIER_CONNECT_TIMEOUT_S", "HARRIER_DATA_DIR", "HARRIER_DEVICE",
    "HARRIER_EPOCHS", "HARRIER_EPSILON", "HARRIER_EVAL_EVERY", "HARRIER_EXIT_WHEN_DONE", "HARRIER_FUSION_BYTES",
    "HARRIER_GRPC_CONNECTIONS",
    "HARRIER_HEALTH_PORT", "HARRIER_HEARTBEAT_TIMEOUT_MS", "HARRIER_HOST", "HARRIER_JOB",
    "HARRIER_LAYERS", "HARRIER_LOCAL_LR", "HARRIER_LOCAL_STEPS", "HARRIER_LOG_EVERY",
    "HARRIER_LR", "HARRIER_MAX_BUFFERED_BYTES", "HARRIER_MAX_CHUNK_BYTES", "HARRIER_MAX_CHUNKS",
    "HARRIER_MAX_CONNECTION_BYTES", "HARRIER_MAX_INFLIGHT_BYTES", "HARRIER_MAX_PARAM_BYTES",
    "HARRIER_MAX_PENDING_ROUNDS", "HARRIER_MAX_QUEUED_CALLS", "HARRIER_MAX_REQUEST_BYTES",
    "HARRIER_MAX_STEPS", "HARRIER_METRICS_OUT", "HARRIER_METRICS_PORT", "HARRIER_MOMENTUM",
    "HARRIER_NUM_SHARDS", "HARRIER_NUM_WORKERS", "HARRIER_ON_WORKER_LOSS", "HARRIER_OPTIMIZER",
    "HARRIER_PARTITION_BYTES", "HARRIER_PORT", "HARRIER_PORT_FILE", "HARRIER_PULL_CODEC",
    "HARRIER_PULL_THREADS", "HARRIER_PUSH_THREADS", "HARRIER_RANK", "HARRIER_REJOIN_AFTER_MS",
    "HARRIER_RESUME", "HARRIER_RPC_TIMEOUT_S",
    "HARRIER_SEED", "HARRIER_SERVERS", "HARRIER_SHARD", "HARRIER_SHUTDOWN_GRACE_MS",
    "HARRIER_SIGNUM_MOMENTUM", "HARRIER_STALENESS", "HARRIER_STALENESS_AWARE_LR",
    "HARRIER_STEP_DELAY_MS", "HARRIER_STEP_DELAY_PROBABILITY", "HARRIER_SYNC",
    "HARRIER_TARGET_ACCURACY", "HARRIER_TECHNIQUES", "HARRIER_TLS_CA", "HARRIER_TLS_CERT",
    "HARRIER_TLS_KEY", "HARRIER_TRAIN_EXAMPLES", "HARRIER_TRANSPORT", "HARRIER_UCX",
    "HARRIER_WARMUP_STEPS", "HARRIER_WEIGHT_DECAY", "HARRIER_WORKLOAD",
    // harrier-ctl's own flags (its others are in the list above): the
    // Kubernetes probes run it inside the server pods, in their environment.
    "HARRIER_JSON", "HARRIER_TIMEOUT_MS",
};
// clang-format on

// Refuses a HARRIER_* variable that names no flag of this binary and is not
// in kOtherHarrierVariables.
void CheckHarrierVariables() {
  absl::flat_hash_set<std::string> known(std::begin(kOtherHarrierVariables),
                                         std::end(kOtherHarrierVariables));
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    known.insert(absl::StrCat("HARRIER_", absl::AsciiStrToUpper(name)));
  }
  for (char** entry = environ; *entry != nullptr; ++entry) {
    absl::string_view text = *entry;
    if (!absl::StartsWith(text, "HARRIER_")) continue;
    const std::string name(text.substr(0, text.find('=')));
    if (!known.contains(name)) {
      Die(absl::StrCat(name, ": unknown HARRIER_ variable (no flag --",
                       absl::AsciiStrToLower(absl::StripPrefix(name, "HARRIER_")),
                       "; unset it or fix its name)"));
    }
  }
}

bool IsOwnFlagFile(absl::string_view file) {
  return absl::StrContains(file, "server/") || absl::StrContains(file, "worker/") ||
         absl::StrContains(file, "common/") || absl::StrContains(file, "tests/");
}

}  // namespace

std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage) {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsOwnFlagFile;
  config.contains_help_flags = IsOwnFlagFile;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);

  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--config=")) config_path = std::string(arg);
  }
  if (const char* env = std::getenv("HARRIER_CONFIG"); config_path.empty() && env != nullptr) {
    config_path = env;
  }
  if (!config_path.empty()) ApplyConfigFile(config_path);
  CheckHarrierVariables();
  ApplyEnvironment();

  // absl::ParseCommandLine exits 1 after --help, which reads as a failure to
  // scripts and probes (`harrier-server --help && ...`). The same parse with
  // the usage flags left to us, so that asking for help exits 0; --version
  // and --only_check_flags keep absl's status (0).
  std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) >= 0) {
    std::cout.flush();
    std::exit(0);
  }
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace harrier
