// Standalone driver for RunCodecGpuBench.
#include "bench/cuda/codec_gpu_bench.h"

int main(int argc, char** argv) {
  return harrier::bench::RunCodecGpuBench(argc, argv);
}
