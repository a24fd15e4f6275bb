#include "bench/codec/codec_bench.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/codec/bench_common.h"
#include "common/codec/codec.h"

namespace harrier::bench {
namespace {

constexpr const char* kDefaultCodecs[] = {
    "none",
    "fp16",
    "bf16",
    "topk:ratio=0.01",
    "randomk:ratio=0.01",
    "threshold:sample=0.01,ratio=0.01",
    "qsgd:levels=16,bucket=512",
    "terngrad",
    "sign",
    "efsign",
    "signum",
    "onebit",
    "powersgd:rank=2",
};

constexpr const char* kUsage =
    "usage: harrier-bench codec [--sizes=1000000,25000000]\n"
    "                           [--codecs=SPEC;SPEC...] [--min_time=0.2]\n"
    "Encode/decode throughput of every gradient codec versus memcpy;\n"
    "one JSON line per (codec, size) on stdout.\n";

}  // namespace

int RunCodecBench(int argc, char** argv) {
  CodecBenchOptions opt;
  if (std::optional<int> exit_code =
          ParseCodecBenchFlags(argc, argv, kDefaultCodecs, kUsage, &opt)) {
    return *exit_code;
  }
  // Best of 2 to 20 repetitions.
  auto best_seconds = [&opt](auto fn) {
    return BestSeconds(opt.min_time, 2, 20, fn);
  };
  for (size_t d : opt.sizes) {
    const std::vector<float> input = BenchGradient(d);
    std::vector<float> out(d), copy(d);
    double memcpy_s = best_seconds([&] {
      std::memcpy(copy.data(), input.data(), 4 * d);
      return copy[d / 2] == input[d / 2];
    });
    for (const CodecSpec& spec : opt.specs) {
      absl::StatusOr<std::unique_ptr<Codec>> codec = CreateCodec(spec);
      if (!codec.ok()) {
        std::fprintf(stderr, "%s\n", std::string(codec.status().message()).c_str());
        return 2;
      }
      std::string payload;
      uint64_t clock = 0;
      double encode_s = best_seconds([&] {
        CodecContext ctx{DeriveSeed("bench", 0, static_cast<int64_t>(clock++), 0, 0)};
        return (*codec)->Encode(input, ctx, &payload).ok();
      });
      double decode_s = best_seconds([&] {
        return (*codec)->Decode(payload, absl::MakeSpan(out)).ok();
      });
      if (encode_s < 0 || decode_s < 0) {
        std::fprintf(stderr, "codec %s failed at d=%zu\n", spec.ToString().c_str(), d);
        return 1;
      }
      CodecBenchResult result;
      result.bench = "codec";
      result.spec = &spec;
      result.elements = d;
      result.encode_s = encode_s;
      result.decode_s = decode_s;
      result.memcpy_s = memcpy_s;
      result.wire_bytes = payload.size();
      result.with_compression_ratio = true;
      PrintCodecBenchLine(result);
    }
  }
  return 0;
}

}  // namespace harrier::bench
