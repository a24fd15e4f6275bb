#include "bench/crc/crc_bench.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/bench_util.h"
#include "bench/codec/bench_common.h"
#include "bench/flags.h"
#include "bench/shared_flags.h"
#include "common/crc32c.h"
#include "common/json.h"

namespace harrier::bench {
namespace {

constexpr const char* kUsage =
    "usage: harrier-bench crc [--sizes=16K,48K,1M,4M,64M] [--min_time=0.2]\n"
    "CRC32C, the copy that takes it on the way, and memcpy, in cache and from\n"
    "memory; one JSON line per size on stdout (GB/s and ratios to memcpy).\n";

constexpr size_t kDefaultSizes[] = {16 << 10, 48 << 10, 1 << 20, 4 << 20, 64 << 20};
// Larger than any last-level cache here: cycling through this much, each
// pass finds its buffer in memory, not in cache.
constexpr size_t kColdSpanBytes = size_t{256} << 20;

// Bytes per second of fn(buffer index) in GB/s: the best of at least 3
// passes over `buffers` calls, repeated until min_time has been spent
// (BestSeconds, the codec benches' timer).
template <typename Fn>
double BestGbps(size_t bytes, size_t buffers, double min_time, Fn fn) {
  const double pass_s = BestSeconds(min_time, 3, 1000, [&] {
    for (size_t i = 0; i < buffers; ++i) fn(i);
    return true;
  });
  return static_cast<double>(bytes) * static_cast<double>(buffers) / pass_s / 1e9;
}

}  // namespace

int RunCrcBench(int argc, char** argv) {
  if (std::optional<int> exit_code = ParseBenchFlags(argc, argv, kUsage, {"sizes", "min_time"})) {
    return *exit_code;
  }
  std::vector<size_t> sizes(std::begin(kDefaultSizes), std::end(kDefaultSizes));
  if (const std::string text = absl::GetFlag(FLAGS_sizes); !text.empty()) {
    absl::StatusOr<std::vector<size_t>> parsed = ParseByteList(text);
    if (!parsed.ok()) {
      std::fprintf(stderr, "%s: --sizes: %s\n", argv[0], std::string(parsed.status().message()).c_str());
      return 2;
    }
    sizes = *parsed;
  }
  const double min_time = absl::GetFlag(FLAGS_min_time);
  if (!(min_time >= 0)) {
    std::fprintf(stderr, "%s: --min_time must be >= 0\n", argv[0]);
    return 2;
  }
  volatile uint32_t sink = 0;  // keeps every CRC computed
  for (size_t size : sizes) {
    // Sources and destinations for the cold runs, filled so that every page
    // is mapped before the timing.
    const size_t buffers = std::max<size_t>(2, kColdSpanBytes / 2 / size);
    std::vector<std::unique_ptr<unsigned char[]>> src(buffers), dst(buffers);
    for (size_t i = 0; i < buffers; ++i) {
      src[i].reset(new unsigned char[size]);
      dst[i].reset(new unsigned char[size]);
      for (size_t b = 0; b < size; ++b) src[i][b] = static_cast<unsigned char>(b * 131 + i);
      std::memset(dst[i].get(), 0, size);
    }
    const auto crc_of = [&](size_t i) { sink = sink ^ Crc32c(src[i].get(), size); };
    const auto copy_crc_of = [&](size_t i) {
      sink = sink ^ Crc32cCopy(0, dst[i].get(), src[i].get(), size);
    };
    const auto memcpy_of = [&](size_t i) {
      std::memcpy(dst[i].get(), src[i].get(), size);
      sink = sink ^ dst[i][size / 2];
    };
    const auto warm = [](auto fn) { return [fn](size_t) { fn(0); }; };
    const double crc_gbps = BestGbps(size, 1, min_time, warm(crc_of));
    const double copy_crc_gbps = BestGbps(size, 1, min_time, warm(copy_crc_of));
    const double memcpy_gbps = BestGbps(size, 1, min_time, warm(memcpy_of));
    const double crc_cold_gbps = BestGbps(size, buffers, min_time, crc_of);
    const double copy_crc_cold_gbps = BestGbps(size, buffers, min_time, copy_crc_of);
    const double memcpy_cold_gbps = BestGbps(size, buffers, min_time, memcpy_of);
    // The reference is slow: a few hundred KiB is enough for its rate.
    const size_t reference_bytes = std::min<size_t>(size, 256 << 10);
    const double reference_gbps = BestGbps(reference_bytes, 1, std::min(min_time, 0.05), [&](size_t) {
      sink = sink ^ Crc32cPortable(0, src[0].get(), reference_bytes);
    });
    const Json line = {
        {"bench", "crc"},
        {"size_bytes", size},
        {"crc_gbps", RoundTo(crc_gbps, 3)},
        {"crc_cold_gbps", RoundTo(crc_cold_gbps, 3)},
        {"copy_crc_gbps", RoundTo(copy_crc_gbps, 3)},
        {"copy_crc_cold_gbps", RoundTo(copy_crc_cold_gbps, 3)},
        {"memcpy_gbps", RoundTo(memcpy_gbps, 3)},
        {"memcpy_cold_gbps", RoundTo(memcpy_cold_gbps, 3)},
        {"crc_over_memcpy", RoundTo(crc_gbps / memcpy_gbps, 4)},
        {"copy_crc_cold_over_memcpy_cold", RoundTo(copy_crc_cold_gbps / memcpy_cold_gbps, 4)},
        {"reference_gbps", RoundTo(reference_gbps, 3)},
        {"crc_over_reference", RoundTo(crc_gbps / reference_gbps, 2)},
    };
    std::printf("%s\n", DumpJson(line).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace harrier::bench
