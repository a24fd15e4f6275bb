#ifndef HARRIER_COMMON_FLAGS_H_
#define HARRIER_COMMON_FLAGS_H_

#include <string>
#include <vector>

namespace harrier {

// Parses a binary's absl flags from three sources, later ones winning:
//   1. flagfiles, absl's format: one `--name=value` a line, '#' starts a
//      comment line. Named by --flagfile=FILE or its alias --config=FILE on
//      the command line (several allowed, read in order), else by the
//      HARRIER_FLAGFILE or HARRIER_CONFIG environment variable;
//   2. environment variables HARRIER_<NAME>: one for every flag the binary
//      registers (the flag's name upper-cased), found through absl's flag
//      reflection, so a new flag gets its variable without a list to edit;
//   3. the rest of the command line (absl's --fromenv and --tryfromenv
//      included; they read FLAGS_<name>).
// A HARRIER_* variable that names no flag of this binary is ignored and
// named in one line on stderr: deploy/k8s gives servers and workers one
// environment, and scripts and tests keep their own HARRIER_* settings.
//
// --help (also -help, -h, --helpshort, --helppackage) prints `usage` and the
// binary's own flags (every flag not defined inside absl) and exits 0;
// --helpfull lists absl's flags as well, --help=TEXT the flags whose name or
// help contains TEXT. A flagfile line that is not a flag, names an unknown
// flag or holds a bad value, and a HARRIER_<NAME> with a bad value, print one
// line naming the file and line or the variable and exit with status 2;
// mistakes on the command line are reported by absl, with status 1.
//
// Call once, at the start of main, before any thread reads a flag. Returns
// the positional arguments (argv[0] first, then those after `--` or that
// are not flags).
std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage);

}  // namespace harrier

#endif  // HARRIER_COMMON_FLAGS_H_
