#include "common/flags.h"

#include <unistd.h>  // environ

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <tuple>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

ABSL_FLAG(std::string, config, "",
          "Alias of --flagfile: a file of flags, one --name=value a line ('#' starts a comment "
          "line). HARRIER_<NAME> environment variables override it, the command line overrides "
          "both.");

namespace harrier {
namespace {

// Where the messages come from: argv[0] without its directory.
std::string program_name = "harrier";

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program_name.c_str(), message.c_str());
  std::exit(2);
}

// absl's own flags that print help or the version and exit: never set from
// the environment.
bool IsUsageFlag(absl::string_view name) {
  for (absl::string_view usage : {"help", "helpfull", "helpshort", "helppackage", "helpon",
                                  "helpmatch", "version", "only_check_flags"}) {
    if (name == usage) return true;
  }
  return false;
}

// The flags that name files of flags. Their values are file names, so a
// flagfile line that sets them is not checked as a value.
bool IsFileFlag(absl::string_view name) { return name == "flagfile" || name == "config"; }

// A binary's own flags are those not defined inside absl.
bool IsOwnFlag(const absl::CommandLineFlag& flag) {
  return !absl::StrContains(flag.Filename(), "absl/");
}

// Checks `value` against the flag's type and validator. The flag keeps the
// value, which is harmless: absl's parse sets every file and environment
// value again afterwards, in their order of precedence. (absl::FlagSaver
// would log a line for every flag it restores.)
bool ValueParses(absl::CommandLineFlag& flag, absl::string_view value, std::string* error) {
  return flag.ParseFrom(value, error);
}

// Reads a flagfile the way absl will (leading blanks skipped, '#' lines and
// blank lines ignored, every other line one argument starting with '-') so
// that a mistake is reported with its file and line, which absl does not do.
// absl then sets the flags.
void CheckFlagfile(const std::string& path) {
  std::ifstream file(path);
  if (!file) Die(absl::StrCat("cannot read flagfile ", path));
  std::string line;
  int line_number = 0;
  while (std::getline(file, line)) {
    ++line_number;
    const std::string where = absl::StrCat(path, ":", line_number);
    absl::string_view text = absl::StripLeadingAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    if (text[0] != '-' || text == "-" || text == "--") {
      Die(absl::StrCat(where, ": '", text,
                       "' is not a flag (a flagfile holds one --name=value a line)"));
    }
    if (!absl::ConsumePrefix(&text, "--")) absl::ConsumePrefix(&text, "-");
    const size_t eq = text.find('=');
    const std::string name(text.substr(0, eq));
    if (name == "config") {
      Die(absl::StrCat(where, ": use --flagfile to read another file from a flagfile"));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && eq == absl::string_view::npos && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;
    }
    if (flag == nullptr || flag->IsRetired()) {
      Die(absl::StrCat(where, ": unknown flag '", name, "'"));
    }
    if (eq == absl::string_view::npos || IsFileFlag(name) || IsUsageFlag(name)) continue;
    const absl::string_view value = text.substr(eq + 1);
    std::string error;
    if (!ValueParses(*flag, value, &error)) {
      Die(absl::StrCat(where, ": bad value '", value, "' for --", name, ": ", error));
    }
  }
}

// What a help request asks for.
struct HelpRequest {
  bool wanted = false;
  bool all = false;      // --helpfull: absl's flags too
  std::string matching;  // --help=TEXT: flags whose name or help has TEXT
};

void PrintHelp(const std::string& usage, const HelpRequest& help) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    if (!help.matching.empty()) {
      if (!absl::StrContains(flag->Name(), help.matching) &&
          !absl::StrContains(flag->Help(), help.matching)) {
        continue;
      }
    } else if (!help.all && !IsOwnFlag(*flag)) {
      continue;
    }
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return std::make_tuple(a->Filename(), a->Name()) <
                     std::make_tuple(b->Filename(), b->Name());
            });
  std::cout << usage << "\n";
  std::string file;
  for (const absl::CommandLineFlag* flag : flags) {
    if (flag->Filename() != file) {
      file = flag->Filename();
      std::cout << "\n  Flags from " << file << ":\n";
    }
    const bool quoted = flag->IsOfType<std::string>();
    auto shown = [quoted](const std::string& value) {
      return quoted ? absl::StrCat("\"", value, "\"") : value;
    };
    std::cout << "    --" << flag->Name() << " (" << flag->Help()
              << "); default: " << shown(flag->DefaultValue()) << ";";
    if (flag->CurrentValue() != flag->DefaultValue()) {
      std::cout << " currently: " << shown(flag->CurrentValue()) << ";";
    }
    std::cout << "\n";
  }
  std::cout << "\nEvery flag --name can also be set by the environment variable HARRIER_NAME "
               "or by a line --name=value in a --flagfile (alias --config); the command line "
               "wins over the environment, which wins over flagfiles.\n";
  std::cout.flush();
}

}  // namespace

std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage) {
  if (argc > 0) {
    program_name = std::string(argv[0]);
    if (const size_t slash = program_name.rfind('/'); slash != std::string::npos) {
      program_name.erase(0, slash + 1);
    }
  }
  absl::SetProgramUsageMessage(usage);

  // The command line, with help requests and files of flags taken out: the
  // files go first, so that the environment and the command line override
  // them.
  HelpRequest help;
  std::vector<std::string> flagfiles;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {
      rest.insert(rest.end(), argv + i, argv + argc);
      break;
    }
    absl::string_view body = arg;
    if (body.size() < 2 || body[0] != '-') {
      rest.emplace_back(arg);
      continue;
    }
    if (!absl::ConsumePrefix(&body, "--")) absl::ConsumePrefix(&body, "-");
    const size_t eq = body.find('=');
    const std::string name(body.substr(0, eq));
    const bool has_value = eq != absl::string_view::npos;
    if (name == "help" || name == "helpshort" || name == "helppackage" || name == "helpfull" ||
        (name == "h" && !has_value && absl::FindCommandLineFlag("h") == nullptr)) {
      help.wanted = true;
      help.all = help.all || name == "helpfull";
      if (name == "help" && has_value) help.matching = std::string(body.substr(eq + 1));
      continue;
    }
    if (IsFileFlag(name)) {
      if (has_value) {
        flagfiles.emplace_back(body.substr(eq + 1));
      } else if (i + 1 < argc) {
        flagfiles.emplace_back(argv[++i]);
      } else {
        Die(absl::StrCat("--", name, " needs a file (--", name, "=FILE)"));
      }
      continue;
    }
    rest.emplace_back(arg);
    // `--name value`: the value is not a flag, whatever it looks like.
    if (absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
        !has_value && flag != nullptr && !flag->IsOfType<bool>() && i + 1 < argc) {
      rest.emplace_back(argv[++i]);
    }
  }
  if (flagfiles.empty()) {
    for (const char* variable : {"HARRIER_FLAGFILE", "HARRIER_CONFIG"}) {
      if (const char* value = std::getenv(variable); value != nullptr && *value != '\0') {
        flagfiles.emplace_back(value);
      }
    }
  }
  for (const std::string& list : flagfiles) {
    for (absl::string_view path : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      CheckFlagfile(std::string(path));
    }
  }

  // HARRIER_<NAME> for every flag this binary registers.
  std::vector<std::string> from_environment;
  std::vector<std::string> ignored;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    absl::string_view text = *entry;
    if (!absl::StartsWith(text, "HARRIER_")) continue;
    const size_t eq = text.find('=');
    const std::string variable(text.substr(0, eq));
    const absl::string_view value = eq == absl::string_view::npos ? "" : text.substr(eq + 1);
    const std::string name = absl::AsciiStrToLower(absl::StripPrefix(variable, "HARRIER_"));
    if (IsFileFlag(name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || flag->IsRetired() || IsUsageFlag(name) ||
        variable != absl::StrCat("HARRIER_", absl::AsciiStrToUpper(name))) {
      ignored.push_back(variable);
      continue;
    }
    std::string error;
    if (!ValueParses(*flag, value, &error)) {
      Die(absl::StrCat(variable, ": bad value '", value, "' for --", name, ": ", error));
    }
    from_environment.push_back(absl::StrCat("--", name, "=", value));
  }
  if (!ignored.empty()) {
    std::sort(ignored.begin(), ignored.end());
    std::fprintf(stderr, "%s: ignoring %s (no flag of %s by that name)\n", program_name.c_str(),
                 absl::StrJoin(ignored, ", ").c_str(), program_name.c_str());
  }

  std::vector<std::string> arguments = {argc > 0 ? argv[0] : program_name};
  for (const std::string& list : flagfiles) arguments.push_back(absl::StrCat("--flagfile=", list));
  arguments.insert(arguments.end(), from_environment.begin(), from_environment.end());
  arguments.insert(arguments.end(), rest.begin(), rest.end());
  std::vector<char*> pointers;
  for (std::string& argument : arguments) pointers.push_back(argument.data());
  pointers.push_back(nullptr);
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(arguments.size()), pointers.data());

  // After the parse, so that --help shows the values the sources set.
  if (help.wanted) {
    PrintHelp(usage, help);
    std::exit(0);
  }
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace harrier
