// A binary with a few flags of each kind, parsed by harrier::ParseFlags; it
// prints their values and its positional arguments, one `name=value` a line,
// for flags_test.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/flags.h"

ABSL_FLAG(int, steps, 1, "Steps to run.");
ABSL_FLAG(std::string, label, "none", "A label.");
ABSL_FLAG(bool, verbose, false, "Talk more.");
ABSL_FLAG(double, rate, 0.5, "A rate.");

int main(int argc, char** argv) {
  const std::vector<std::string> positional = harrier::ParseFlags(
      argc, argv, "flags_probe: prints its flags.\nUsage: flags_probe [flags] [args]");
  std::printf("steps=%d\n", absl::GetFlag(FLAGS_steps));
  std::printf("label=%s\n", absl::GetFlag(FLAGS_label).c_str());
  std::printf("verbose=%d\n", absl::GetFlag(FLAGS_verbose) ? 1 : 0);
  std::printf("rate=%g\n", absl::GetFlag(FLAGS_rate));
  std::string args;
  for (size_t i = 1; i < positional.size(); ++i) args += (i > 1 ? "," : "") + positional[i];
  std::printf("args=%s\n", args.c_str());
  return 0;
}
