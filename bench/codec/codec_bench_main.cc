// Standalone driver for RunCodecBench (the real entry point is the codec
// subcommand of harrier-bench).
#include "bench/codec/codec_bench.h"

int main(int argc, char** argv) {
  return harrier::bench::RunCodecBench(argc, argv);
}
