// harrier-bench: Harrier's benchmarks behind one binary,
//   harrier-bench <subcommand> [flags]
// Each subcommand prints one JSON line per measurement on stdout and
// diagnostics on stderr.
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/checkpoint_bench.h"
#include "bench/codec/codec_bench.h"
#include "bench/convergence_bench.h"
#include "bench/crc/crc_bench.h"
#include "bench/embedding_bench.h"
#include "bench/load_bench.h"
#include "bench/overlap_bench.h"
#include "bench/transport_bench.h"
#include "bench/tta_bench.h"
#include "common/process.h"

namespace {

// A subcommand receives the arguments from its name on (argv[0] is the
// subcommand's name, then its flags) and returns the process exit status.
struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

// New benchmarks (a `straggler` subcommand is planned) add one row here.
constexpr Subcommand kSubcommands[] = {
    {"transport",
     "push/pull/push-pull goodput and latency against real servers on loopback, "
     "versus raw TCP",
     harrier::bench::RunTransportBench},
    {"codec", "gradient codec encode/decode throughput versus memcpy",
     harrier::bench::RunCodecBench},
    {"crc", "CRC32C of every data message, and the copy that takes it, versus memcpy",
     harrier::bench::RunCrcBench},
    {"load",
     "many clients x seconds under ASP and BSP: errors, latency, and an exact check of "
     "every parameter",
     harrier::bench::RunLoadBench},
    {"overlap",
     "replayed models under BSP on emulated links (network namespaces + tbf), per overlap "
     "technique, versus the cost model's ideal",
     harrier::bench::RunOverlapBench},
    {"tta",
     "time to a test accuracy per codec, every shard and worker behind its own emulated "
     "link (network namespaces; root)",
     harrier::bench::RunTtaBench},
    {"convergence",
     "the survey's grid: loss and test accuracy vs steps and wall time, and bytes, per model x "
     "sync x codec x pulls x link on emulated links (resumable; root)",
     harrier::bench::RunConvergenceBench},
    {"embedding",
     "sparse embedding tables (Zipf ids, 8 tables) over the wire versus the same tables in "
     "process and memcpy; memory per row, row cache, row budget",
     harrier::bench::RunEmbeddingBench},
    {"checkpoint",
     "bytes per checkpoint of a sparse table against the rows changed: complete versus "
     "incremental, and the seconds to write each",
     harrier::bench::RunCheckpointBench},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: harrier-bench <subcommand> [flags]\n"
               "       harrier-bench <subcommand> --help\n"
               "subcommands:\n");
  for (const Subcommand& subcommand : kSubcommands) {
    std::fprintf(out, "  %-12s %s\n", subcommand.name, subcommand.summary);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Library logs go to stderr: stdout carries only the JSON lines.
  harrier::InitLogging("bench");
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  const char* name = argv[1];
  if (std::strcmp(name, "--help") == 0 || std::strcmp(name, "-h") == 0 ||
      std::strcmp(name, "help") == 0) {
    PrintUsage(stdout);
    return 0;
  }
  for (const Subcommand& subcommand : kSubcommands) {
    if (std::strcmp(name, subcommand.name) == 0) {
      // The subcommand's messages and absl's name it "harrier-bench NAME".
      std::string program = std::string("harrier-bench ") + name;
      argv[1] = program.data();
      return subcommand.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "harrier-bench: unknown subcommand '%s'\n", name);
  PrintUsage(stderr);
  return 2;
}
