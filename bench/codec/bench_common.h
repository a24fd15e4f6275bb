// Plumbing shared by the CPU and GPU codec benchmarks (codec_bench,
// codec_gpu_bench): the common flags, the best-of-repetitions timer, the
// input gradient and the JSON result line. Single-threaded; output on
// stdout, usage errors on stderr.

#ifndef HARRIER_BENCH_CODEC_BENCH_COMMON_H_
#define HARRIER_BENCH_CODEC_BENCH_COMMON_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "common/codec/codec.h"

namespace harrier::bench {

struct CodecBenchOptions {
  std::vector<size_t> sizes = {1000000, 25000000};  // element counts
  std::vector<CodecSpec> specs;
  double min_time = 0.2;  // seconds of repetitions per measurement
};

// Parses --sizes=N,N  --codecs=SPEC;SPEC  --min_time=S  --help (argv[0]
// names the subcommand or binary; bench/flags.h); specs default to
// default_codecs. Returns
// nullopt to go on with *opt filled, or the exit status to return now: 0
// after printing usage for --help, 2 after a usage error (message and usage
// on stderr).
std::optional<int> ParseCodecBenchFlags(
    int argc, char** argv, absl::Span<const char* const> default_codecs,
    const char* usage, CodecBenchOptions* opt);

// Best wall time in seconds of fn() over at least min_reps and at most
// max_reps repetitions, repeating until min_time seconds have been spent;
// -1 as soon as fn() returns false.
template <typename Fn>
double BestSeconds(double min_time, int min_reps, int max_reps, Fn fn) {
  using Clock = std::chrono::steady_clock;
  double best = 1e30, spent = 0.0;
  for (int rep = 0; rep < max_reps && (rep < min_reps || spent < min_time);
       ++rep) {
    auto start = Clock::now();
    if (!fn()) return -1.0;
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, s);
    spent += s;
  }
  return best;
}

// d standard-normal floats, the same for every run with the same d.
std::vector<float> BenchGradient(size_t d);

// One measurement of one (codec, d) pair; times in seconds.
struct CodecBenchResult {
  const char* bench = "";  // "codec" or "codec_gpu"
  const CodecSpec* spec = nullptr;
  size_t elements = 0;
  double encode_s = 0, decode_s = 0, memcpy_s = 0;
  size_t wire_bytes = 0;
  bool with_compression_ratio = false;  // add "compression_ratio"
};

// Prints the result as one JSON line on stdout (throughput in GB/s of fp32
// input, and ratios to memcpy; breakeven_gbps, the link rate in Gbit/s
// below which compressing pays: (4 d - wire bytes) * 8 / (encode + decode
// seconds) / 1e9, 0 when nothing is saved) and flushes.
void PrintCodecBenchLine(const CodecBenchResult& r);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_CODEC_BENCH_COMMON_H_
