#ifndef HARRIER_COMMON_FLAGS_H_
#define HARRIER_COMMON_FLAGS_H_

#include <string>
#include <vector>

namespace harrier {

// Parses a binary's flags from three sources, later ones winning:
//   1. a config file named by --config=FILE (lines "name = value" or
//      "--name=value"; '#' starts a comment),
//   2. environment variables HARRIER_<NAME> (flag name upper-cased),
//   3. the command line.
// --help lists the binary's own flags and exits 0. An unknown flag name or a
// bad value in the config file or the environment prints one line on stderr
// and exits with status 2, and so does a HARRIER_* variable that names no flag
// of this binary, unless it is one the other Harrier binary or the repo's
// scripts read (the list is in flags.cc: deploy/k8s gives servers and workers
// one environment). On the command line absl reports them, with status 1.
// Returns the positional arguments (argv[0] first).
std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage);

}  // namespace harrier

#endif  // HARRIER_COMMON_FLAGS_H_
