// Flag parsing for harrier-bench's subcommands and the other bench binaries:
// absl flags, read through common/flags' ParseFlags (so --flagfile,
// --fromenv, --config=FILE and HARRIER_<NAME> work as for every Harrier
// binary), with the benches' usage conventions on top.
//
// Every subcommand lives in one binary, so a flag name is defined once for
// all of them. A flag only one subcommand takes is defined next to that
// subcommand, typed and with its default. A flag several subcommands take
// is defined in shared_flags.h; where their defaults or syntax differ it is
// a string whose empty value means "not given", read with FlagOr.

#ifndef HARRIER_BENCH_FLAGS_H_
#define HARRIER_BENCH_FLAGS_H_

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace harrier::bench {

// Parses a bench's command line; argv[0] names the subcommand or binary
// (harrier-bench passes the arguments from the subcommand's name on).
// `accepted` names the flags this bench takes (absl's own --flagfile,
// --fromenv, --tryfromenv, --undefok, the help flags and common/flags'
// --config are always accepted). Returns nullopt when the flags parsed, or
// the exit status to return now:
//   0 after --help or -h, which print `usage` (the subcommand's flags) on
//     stdout; --helpfull and --help=TEXT list every flag of the binary
//     (common/flags);
//   2 after a flag that is not in `accepted` (unknown to the binary, or
//     another subcommand's) or a positional argument: one line saying which
//     on stderr.
// A value absl cannot parse as the flag's type (a word for an integer)
// makes absl print why and exit 1.
std::optional<int> ParseBenchFlags(int argc, char** argv, const char* usage,
                                   std::initializer_list<absl::string_view> accepted);

// A subcommand's whole flag handling: ParseBenchFlags, then `read`, the
// subcommand's reading of the parsed flags into *options, whose non-empty
// result is a usage error: printed on stderr after "<argv[0]>: ", exit
// status 2. Returns nullopt when the subcommand goes on.
template <typename Options>
std::optional<int> ParseSubcommandFlags(int argc, char** argv, const char* usage,
                                        std::initializer_list<absl::string_view> accepted,
                                        std::string (*read)(Options*), Options* options) {
  if (std::optional<int> exit_code = ParseBenchFlags(argc, argv, usage, accepted)) {
    return exit_code;
  }
  if (const std::string error = read(options); !error.empty()) {
    std::fprintf(stderr, "%s: %s\n", argv[0], error.c_str());
    return 2;
  }
  return std::nullopt;
}

// A string flag's value, or `fallback` when it is empty (not given).
std::string FlagOr(const absl::Flag<std::string>& flag, absl::string_view fallback);

// A string flag that holds one number: *out = `fallback` when it is empty,
// else its value, which must be at least `min`. Returns "" on success, else
// the usage error naming --`name`.
template <typename T>
std::string NumberFlagOr(const absl::Flag<std::string>& flag, absl::string_view name, T fallback,
                         T min, T* out) {
  const std::string value = absl::GetFlag(flag);
  if (value.empty()) {
    *out = fallback;
    return "";
  }
  bool parsed = false;
  if constexpr (std::is_floating_point_v<T>) {
    double number = 0;
    parsed = absl::SimpleAtod(value, &number) && std::isfinite(number);
    *out = static_cast<T>(number);
  } else {
    parsed = absl::SimpleAtoi(value, out);
  }
  if (!parsed || *out < min) {
    return absl::StrCat("bad --", name, "='", value, "' (a number >= ", min, ")");
  }
  return "";
}

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_FLAGS_H_
