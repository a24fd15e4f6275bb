// Codec throughput benchmark, wired into //bench:harrier-bench as a
// subcommand.

#ifndef HARRIER_BENCH_CODEC_CODEC_BENCH_H_
#define HARRIER_BENCH_CODEC_CODEC_BENCH_H_

namespace harrier::bench {

// For every (codec, d) measures single-thread encode and decode throughput
// (GB/s of fp32 input), memcpy of the same buffer in the same run, their
// ratios and the compression ratio; prints one JSON line per pair to stdout.
// argv[0] is the subcommand's name. Flags:
//   --sizes=1000000,25000000   element counts
//   --codecs=topk:ratio=0.01;qsgd:levels=16,bucket=512   ';'-separated specs
//                              (',' separates a spec's parameters)
//   --min_time=0.2             seconds of repetitions per measurement
//   --help
// Returns 0 on success, 2 on a usage error (message on stderr).
int RunCodecBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_CODEC_CODEC_BENCH_H_
