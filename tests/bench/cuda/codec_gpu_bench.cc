#include "tests/bench/cuda/codec_gpu_bench.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/codec/codec.h"
#include "cuda/device_codec.h"
#include "cuda/device_memory.h"
#include "tests/bench/codec/bench_common.h"

namespace harrier::bench {
namespace {

constexpr const char* kDefaultCodecs[] = {
    "none", "fp16", "bf16", "topk:ratio=0.01", "randomk:ratio=0.01",
    "threshold:tau=2.5", "threshold:sample=0.01,ratio=0.01",
    "qsgd:levels=16,bucket=512", "terngrad", "sign", "efsign", "signum",
    "onebit", "powersgd:rank=2"};

constexpr const char* kUsage =
    "usage: codec_gpu_bench [--sizes=1000000,25000000]\n"
    "                       [--codecs=SPEC;SPEC...] [--min_time=0.2]\n"
    "Device encode/decode throughput of every codec versus a device-to-device\n"
    "cudaMemcpy; one JSON line per (codec, size) on stdout.\n";

int Fail(const absl::Status& st, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

}  // namespace

int RunCodecGpuBench(int argc, char** argv) {
  CodecBenchOptions opt;
  if (std::optional<int> exit_code =
          ParseCodecBenchFlags(argc, argv, kDefaultCodecs, kUsage, &opt)) {
    return *exit_code;
  }
  if (!cuda::DeviceAvailable()) {
    std::fprintf(stderr, "codec_gpu_bench: no CUDA device\n");
    return 1;
  }
  // Best of 3 to 50 repetitions.
  auto best_seconds = [&opt](auto fn) {
    return BestSeconds(opt.min_time, 3, 50, fn);
  };
  for (size_t d : opt.sizes) {
    const std::vector<float> host = BenchGradient(d);
    absl::StatusOr<cuda::DeviceArray> input = cuda::DeviceArray::Create(d);
    absl::StatusOr<cuda::DeviceArray> out = cuda::DeviceArray::Create(d);
    if (!input.ok()) return Fail(input.status(), "allocate");
    if (!out.ok()) return Fail(out.status(), "allocate");
    absl::Status st = input->CopyFromHost(host.data(), d);
    if (!st.ok()) return Fail(st, "upload");
    double memcpy_s = best_seconds([&] {
      return cuda::CopyDeviceToDevice(out->data(), input->data(), 4 * d).ok() &&
             cuda::SynchronizeDevice().ok();
    });
    if (memcpy_s < 0) return Fail(absl::InternalError("copy failed"), "memcpy");
    for (const CodecSpec& spec : opt.specs) {
      absl::StatusOr<std::unique_ptr<cuda::DeviceCodec>> codec =
          cuda::DeviceCodec::Create(spec);
      if (!codec.ok()) return Fail(codec.status(), spec.ToString());
      std::string payload;
      uint64_t clock = 0;
      absl::Status last;
      double encode_s = best_seconds([&] {
        CodecContext ctx{DeriveSeed("bench", 0, static_cast<int64_t>(clock++), 0, 0)};
        last = (*codec)->Encode(input->data(), d, ctx, &payload);
        return last.ok();
      });
      if (encode_s < 0) return Fail(last, spec.ToString() + " encode");
      double decode_s = best_seconds([&] {
        last = (*codec)->Decode(payload, out->data(), d);
        return last.ok();
      });
      if (decode_s < 0) return Fail(last, spec.ToString() + " decode");
      CodecBenchResult result;
      result.bench = "codec_gpu";
      result.spec = &spec;
      result.elements = d;
      result.encode_s = encode_s;
      result.decode_s = decode_s;
      result.memcpy_s = memcpy_s;
      result.wire_bytes = payload.size();
      PrintCodecBenchLine(result);
    }
  }
  return 0;
}

}  // namespace harrier::bench
