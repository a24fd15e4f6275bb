#include "common/flags.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/flags/flag.h"
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
  ApplyEnvironment();

  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace harrier
