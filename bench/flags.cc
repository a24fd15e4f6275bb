#include "bench/flags.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/flags.h"

namespace harrier::bench {
namespace {

// Flags every binary takes: absl's and common/flags' own.
constexpr absl::string_view kAlwaysAccepted[] = {
    "flagfile", "fromenv",   "tryfromenv", "undefok", "config",  "help",
    "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
    "only_check_flags",
};

bool Contains(std::initializer_list<absl::string_view> names, absl::string_view name) {
  for (absl::string_view candidate : names) {
    if (candidate == name) return true;
  }
  return false;
}

bool IsAccepted(std::initializer_list<absl::string_view> accepted, absl::string_view name) {
  if (Contains(accepted, name)) return true;
  for (absl::string_view always : kAlwaysAccepted) {
    if (always == name) return true;
  }
  return false;
}

}  // namespace

std::optional<int> ParseBenchFlags(int argc, char** argv, const char* usage,
                                   std::initializer_list<absl::string_view> accepted) {
  // absl takes any flag the binary defines, so harrier-bench would take one
  // subcommand's flags in another, and it exits 1 on an unknown name where
  // the benches' usage errors exit 2: the names are checked here first.
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest is positional: refused below
    if (arg == "--help" || arg == "-help" || arg == "-h") {
      std::fputs(usage, stdout);
      return 0;
    }
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      std::fprintf(stderr, "%s: unknown argument '%s' (flags are --name=value; see --help)\n",
                   argv[0], argv[i]);
      return 2;
    }
    const bool has_value = arg.find('=') != absl::string_view::npos;
    absl::string_view name = arg.substr(0, arg.find('='));
    if (!IsAccepted(accepted, name) && absl::StartsWith(name, "no") &&
        IsAccepted(accepted, name.substr(2))) {
      name.remove_prefix(2);  // --noNAME of a bool flag
    }
    if (!IsAccepted(accepted, name)) {
      std::fprintf(stderr, "%s: unknown flag --%s (see --help)\n", argv[0],
                   std::string(name).c_str());
      return 2;
    }
    // absl also reads "--name value" for a flag that is not a bool.
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (!has_value && flag != nullptr && !flag->IsOfType<bool>()) ++i;
  }
  const std::vector<std::string> positional = ParseFlags(argc, argv, usage);
  if (positional.size() > 1) {
    std::fprintf(stderr, "%s: unknown argument '%s' (flags are --name=value; see --help)\n",
                 argv[0], positional[1].c_str());
    return 2;
  }
  return std::nullopt;
}

std::string FlagOr(const absl::Flag<std::string>& flag, absl::string_view fallback) {
  std::string value = absl::GetFlag(flag);
  return value.empty() ? std::string(fallback) : value;
}

}  // namespace harrier::bench
