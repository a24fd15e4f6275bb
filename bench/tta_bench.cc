#include "bench/tta_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/flags.h"
#include "bench/netem/emulated_network.h"
#include "bench/server_cluster.h"
#include "bench/shared_flags.h"
#include "bench/training_run.h"
#include "common/json.h"

ABSL_FLAG(double, link_gbps, 1, "tta: rate of every host's link in Gbit/s (0: unshaped)");
ABSL_FLAG(double, target, 0.85, "tta: test accuracy to reach");
ABSL_FLAG(int, max_epochs, 5, "tta: a run that has not reached the target by then ends");
ABSL_FLAG(bool, stop_at_target, true,
          "tta: end a run at its first evaluation at the target (false: run all --max_epochs)");

namespace harrier::bench {
namespace {

constexpr const char* kUsage =
    "usage: harrier-bench tta [flags]\n"
    "Time to accuracy on an emulated network: every shard and every harrier-worker\n"
    "runs in a network namespace of its own behind its own tc-tbf link of\n"
    "--link_gbps (upload and download), joined through a bridge namespace\n"
    "(//bench/netem, per-host model; no latency is added). The workers train\n"
    "the Fashion-MNIST MLP 784-256-256-10 under BSP, batch 64 each; rank 0\n"
    "evaluates the test set every --eval_every steps. For each codec and\n"
    "technique set one JSON line: the training wall time to the first evaluation\n"
    "at or above --target (evaluation time excluded), accuracy, steps and bytes.\n"
    "Needs root (ip netns, tc); says why in one line and exits 1 otherwise.\n"
    "  --codecs=none,fp16,topk,topk_pull10,qsgd8,powersgd2,efsign\n"
    "                           none; fp16; topk = topk:ratio=0.01 (error feedback\n"
    "                           built in) with dense pulls; topk_pull10 = the same\n"
    "                           push, pulls topk:ratio=0.1; qsgd8 =\n"
    "                           qsgd:levels=127,bucket=512 (8-bit codes: sign + 7-bit\n"
    "                           level); powersgd2 = powersgd:rank=2; efsign. Each with\n"
    "                           the server settings of docs/experiments.md\n"
    "  --techniques=none        comm scheduler sets, e.g. none,all ('none': the\n"
    "                           trainer's own path; others are passed to\n"
    "                           harrier-worker --techniques)\n"
    "  --link_gbps=1            rate of every host's link (0: unshaped)\n"
    "  --workers=4              harrier-worker processes, one namespace each\n"
    "  --shards=2               harrier-server shards, one namespace each\n"
    "  --target=0.85            test accuracy to reach\n"
    "  --max_epochs=5           a run that has not reached the target by then ends\n"
    "  --eval_every=20          steps between rank 0's evaluations\n"
    "  --train_examples=0       train on the first N examples only (0: all 60000;\n"
    "                           for smoke tests)\n"
    "  --stop_at_target=true    end a run at its first evaluation at the target\n"
    "                           (false: run all --max_epochs)\n"
    "  --run_timeout_s=900      deadline of one run\n"
    "  --server_binary=PATH     harrier-server (default: from runfiles)\n"
    "  --worker_binary=PATH     harrier-worker (default: from runfiles)\n"
    "  --help\n";

struct Options {
  std::vector<const CodecSetting*> codecs;
  std::vector<std::string> techniques = {"none"};
  double link_gbps = 1;
  double target = 0.85;
  int max_epochs = 5;
  bool stop_at_target = true;
  JobFlags job;
};

// Returns a message for a usage error, "" on success.
std::string ParseArgs(Options* options) {
  const std::string codecs =
      FlagOr(FLAGS_codecs, "none,fp16,topk,topk_pull10,qsgd8,powersgd2,efsign");
  for (absl::string_view codec : absl::StrSplit(codecs, ',', absl::SkipWhitespace())) {
    const CodecSetting* setting = FindCodec(codec);
    if (setting == nullptr) {
      std::vector<std::string> known;
      for (const CodecSetting& s : CodecSettings()) known.push_back(s.name);
      return absl::StrCat("--codecs: unknown codec '", codec, "' (", absl::StrJoin(known, ", "),
                          ")");
    }
    options->codecs.push_back(setting);
  }
  if (options->codecs.empty()) return "--codecs: empty list";
  options->techniques = absl::StrSplit(FlagOr(FLAGS_techniques, "none"), ',',
                                       absl::SkipWhitespace());
  if (options->techniques.empty()) return "--techniques: empty list";
  options->link_gbps = absl::GetFlag(FLAGS_link_gbps);
  if (!(options->link_gbps >= 0)) return absl::StrCat("bad --link_gbps='", options->link_gbps, "'");
  options->target = absl::GetFlag(FLAGS_target);
  if (!(options->target > 0 && options->target <= 1)) return "--target must be in (0, 1]";
  options->max_epochs = absl::GetFlag(FLAGS_max_epochs);
  if (options->max_epochs < 1) return "bad --max_epochs (a positive integer)";
  options->stop_at_target = absl::GetFlag(FLAGS_stop_at_target);
  return ReadJobFlags(&options->job);
}

struct RunResult {
  double time_to_target_s = -1;
  double final_accuracy = -1;
  int64_t steps = 0;
  double wall_s = 0;
  double bytes_up_per_step = -1;  // -1: rank 0's metrics had no complete line
  double bytes_down_per_step = -1;
};

// One codec and technique set: BSP shards with the codec's server settings,
// workers training the MLP for --max_epochs (TrainingRunner).
absl::StatusOr<RunResult> RunOne(const Options& options, const TrainingRunner& runner,
                                 const std::string& dir, const CodecSetting& codec,
                                 const std::string& techniques, int run_index) {
  TrainingJob job;
  job.shards = options.job.shards;
  job.workers = options.job.workers;
  job.server_flags = {"--sync=bsp"};
  job.server_flags.insert(job.server_flags.end(), codec.server_flags.begin(),
                          codec.server_flags.end());
  job.worker_flags = {absl::StrCat("--epochs=", options.max_epochs),
                      absl::StrCat("--codec=", codec.codec),
                      absl::StrCat("--pull_codec=", codec.pull_codec),
                      absl::StrCat("--eval_every=", options.job.eval_every),
                      absl::StrCat("--target_accuracy=", options.target),
                      "--log_every=100",
                      "--rpc_timeout_s=120"};
  if (techniques != "none") job.worker_flags.push_back("--techniques=" + techniques);
  if (options.job.train_examples > 0) {
    job.worker_flags.push_back(absl::StrCat("--train_examples=", options.job.train_examples));
  }
  job.target = options.target;
  job.stop_at_target = options.stop_at_target;
  job.timeout_s = options.job.run_timeout_s;
  auto outcome = runner.Run(job, absl::StrCat(dir, "/run", run_index));
  if (!outcome.ok()) return outcome.status();

  RunResult result;
  result.wall_s = outcome->wall_s;
  for (const EvalPoint& point : outcome->evals) {
    if (point.accuracy >= options.target) {
      result.time_to_target_s = point.wall_s;
      break;
    }
  }
  if (!outcome->evals.empty()) {
    result.final_accuracy = outcome->evals.back().accuracy;
    result.steps = outcome->evals.back().step;
  }
  // Rank 0's per-step traffic from the last complete line of its
  // --metrics_out (cumulative bytes_pushed / bytes_pulled at that step).
  const std::vector<TrafficPoint> traffic = ReadTraffic(outcome->metrics_path);
  if (!traffic.empty() && traffic.back().step > 0) {
    result.bytes_up_per_step = traffic.back().bytes_pushed / traffic.back().step;
    result.bytes_down_per_step = traffic.back().bytes_pulled / traffic.back().step;
  }
  if (!options.stop_at_target) {
    // The worker's own line must agree with what the eval lines say.
    const std::string out = ReadFile(outcome->rank0_stdout);
    const size_t at = out.find("time_to_accuracy_s=");
    double reported = 0;
    if (at == std::string::npos ||
        !absl::SimpleAtod(out.substr(at + 19, out.find('\n', at) - at - 19), &reported) ||
        std::fabs(reported - result.time_to_target_s) > 0.002) {
      return absl::InternalError(
          absl::StrCat("rank 0's time_to_accuracy_s line disagrees with its eval lines (",
                       result.time_to_target_s, "): ", out));
    }
  }
  return result;
}

// A figure of the JSON line: 4 decimals; unknown (not finite) is -1.
double JsonFigure(double value) { return std::isfinite(value) ? RoundTo(value, 4) : -1; }

}  // namespace

int RunTtaBench(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseSubcommandFlags(
          argc, argv, kUsage,
          {"codecs", "techniques", "link_gbps", "workers", "shards", "target", "max_epochs",
           "eval_every", "train_examples", "stop_at_target", "run_timeout_s", "server_binary",
           "worker_binary"},
          ParseArgs, &options)) {
    return *exit_code;
  }
  auto server_binary = PrepareServerBench("tta", options.job.server_binary);
  if (!server_binary.ok()) return 1;
  auto worker_binary = FindWorkerBinary(options.job.worker_binary);
  if (!worker_binary.ok()) {
    std::fprintf(stderr, "harrier-bench tta: %s\n",
                 std::string(worker_binary.status().message()).c_str());
    return 1;
  }

  EmulatedNetworkOptions network_options;
  network_options.prefix = "htta";
  network_options.num_hosts = options.job.shards + options.job.workers;
  network_options.rate_gbps = options.link_gbps;
  network_options.model = LinkModel::kPerHost;
  auto network = EmulatedNetwork::Create(network_options);
  if (!network.ok()) {
    std::fprintf(stderr, "harrier-bench tta: cannot build the emulated network: %s\n",
                 std::string(network.status().message()).c_str());
    return 1;
  }
  auto measured = MeasureWorkerLinkGbps(**network, options.job.shards, options.link_gbps);
  if (!measured.ok()) {
    std::fprintf(stderr, "harrier-bench tta: measuring the link failed: %s\n",
                 std::string(measured.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "tta: %d hosts, links of %.3g Gbit/s, one TCP stream measured %.3f Gbit/s\n",
               network_options.num_hosts, options.link_gbps, *measured);

  std::string dir = "/tmp/harrier-tta-XXXXXX";
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
    dir = absl::StrCat(tmp, "/harrier-tta-XXXXXX");
  }
  if (mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "harrier-bench tta: cannot create a temporary directory %s\n",
                 dir.c_str());
    return 1;
  }
  std::fprintf(stderr, "tta: logs in %s\n", dir.c_str());

  TrainingRunner runner(**network, *server_binary, *worker_binary);
  int failures = 0;
  int run_index = 0;
  for (const std::string& techniques : options.techniques) {
    std::optional<double> dense_time;
    for (const CodecSetting* codec : options.codecs) {
      std::fprintf(stderr, "tta: codec %s (push %s, pull %s), techniques %s\n", codec->name,
                   codec->codec, codec->pull_codec, techniques.c_str());
      auto result = RunOne(options, runner, dir, *codec, techniques, run_index++);
      if (!result.ok()) {
        std::fprintf(stderr, "harrier-bench tta: codec %s techniques %s: %s\n", codec->name,
                     techniques.c_str(), std::string(result.status().message()).c_str());
        ++failures;
        continue;
      }
      const bool reached = result->time_to_target_s >= 0;
      if (std::string(codec->name) == "none" && reached) dense_time = result->time_to_target_s;
      double speedup = -1;
      if (dense_time.has_value() && reached && result->time_to_target_s > 0) {
        speedup = JsonFigure(*dense_time / result->time_to_target_s);
      }
      const Json line = {
          {"bench", "tta"},
          {"codec", codec->name},
          {"codec_spec", codec->codec},
          {"pull_codec", codec->pull_codec},
          {"techniques", techniques},
          {"link_gbps", JsonFigure(options.link_gbps)},
          {"link_measured_gbps", JsonFigure(*measured)},
          {"workers", options.job.workers},
          {"shards", options.job.shards},
          {"target_accuracy", JsonFigure(options.target)},
          {"time_to_target_s", JsonFigure(result->time_to_target_s)},
          {"speedup_vs_none", speedup},
          {"final_accuracy", JsonFigure(result->final_accuracy)},
          {"steps", result->steps},
          {"eval_every", options.job.eval_every},
          {"wall_s", JsonFigure(result->wall_s)},
          {"bytes_up_per_step", std::llround(result->bytes_up_per_step)},
          {"bytes_down_per_step", std::llround(result->bytes_down_per_step)},
      };
      std::printf("%s\n", DumpJson(line).c_str());
      std::fflush(stdout);
      std::fprintf(stderr,
                   "tta: %-14s %-8s time to %.2f: %8.2f s  final %.4f  %lld steps  job %.1f s  "
                   "up %.0f B/step  down %.0f B/step\n",
                   codec->name, techniques.c_str(), options.target, result->time_to_target_s,
                   result->final_accuracy, static_cast<long long>(result->steps), result->wall_s,
                   result->bytes_up_per_step, result->bytes_down_per_step);
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace harrier::bench
