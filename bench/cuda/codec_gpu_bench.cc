#include "bench/cuda/codec_gpu_bench.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/codec/bench_common.h"
#include "common/codec/codec.h"
#include "common/json.h"
#include "cuda/device_codec.h"
#include "cuda/device_memory.h"

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
    "Device encode/decode/decode-add throughput of every codec versus a\n"
    "device-to-device cudaMemcpy of the same bytes, timed in the same run just\n"
    "before the codec; one JSON line per (codec, size) on stdout, plus one\n"
    "\"codec_gpu_dgc\" line per size for DGC's momentum correction\n"
    "(topk and sampled threshold). ratio_of_memcpy = encode throughput /\n"
    "memcpy throughput (memcpy time / encode time); ratio_of_d2h_memcpy the\n"
    "same against a device-to-host copy of the input.\n";

int Fail(const absl::Status& st, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

// The bench_common fields (bench, codec, elements, *_gbps, *_ratio,
// wire_bytes), then the memcpy of the same bytes measured for this line
// and what the GPU checks compare against it.
void PrintLine(const char* bench, const CodecSpec& spec, size_t d, double encode_s,
               double decode_s, double decode_add_s, double memcpy_s, double d2h_s,
               size_t wire_bytes) {
  const double bytes = 4.0 * d;
  const double memcpy_gbps = bytes / memcpy_s / 1e9;
  const double encode_gbps = bytes / encode_s / 1e9;
  Json line = {
      {"bench", bench},
      {"codec", spec.ToString()},
      {"elements", d},
      {"encode_gbps", RoundTo(encode_gbps, 4)},
      {"memcpy_gbps", RoundTo(memcpy_gbps, 4)},
      {"encode_ratio", RoundTo(encode_gbps / memcpy_gbps, 5)},
  };
  if (decode_s > 0) {
    const double decode_gbps = bytes / decode_s / 1e9;
    line["decode_gbps"] = RoundTo(decode_gbps, 4);
    line["decode_ratio"] = RoundTo(decode_gbps / memcpy_gbps, 5);
  }
  if (decode_add_s > 0) {
    const double gbps = bytes / decode_add_s / 1e9;
    line["decode_add_gbps"] = RoundTo(gbps, 4);
    line["decode_add_ratio"] = RoundTo(gbps / memcpy_gbps, 5);
  }
  line["memcpy_bytes"] = std::llround(bytes);
  line["memcpy_s"] = RoundTo(memcpy_s, 9);
  line["encode_s"] = RoundTo(encode_s, 9);
  line["ratio_of_memcpy"] = RoundTo(memcpy_s / encode_s, 5);
  line["d2h_memcpy_s"] = RoundTo(d2h_s, 9);
  line["ratio_of_d2h_memcpy"] = RoundTo(d2h_s / encode_s, 5);
  line["wire_bytes"] = wire_bytes;
  std::printf("%s\n", DumpJson(line).c_str());
  std::fflush(stdout);
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
    // Timed again before every codec, so each line's ratio compares with a
    // copy of the same bytes under the same clocks and load.
    auto time_memcpy = [&] {
      return best_seconds([&] {
        return cuda::CopyDeviceToDevice(out->data(), input->data(), 4 * d).ok() &&
               cuda::SynchronizeDevice().ok();
      });
    };
    // Every payload is a host string, so an encoder also moves its output
    // over PCIe: the device-to-host copy of the whole input (to pageable
    // memory, like the payload) is the other yardstick.
    std::vector<float> host_copy(d);
    auto time_d2h = [&] {
      return best_seconds([&] { return input->CopyToHost(host_copy.data(), d).ok(); });
    };
    for (const CodecSpec& spec : opt.specs) {
      const double memcpy_s = time_memcpy();
      if (memcpy_s < 0) return Fail(absl::InternalError("copy failed"), "memcpy");
      const double d2h_s = time_d2h();
      if (d2h_s < 0) return Fail(absl::InternalError("copy failed"), "d2h memcpy");
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
      // The pull mirror's operation; scale 0.5 keeps the accumulator finite
      // over many repetitions.
      double decode_add_s = best_seconds([&] {
        last = (*codec)->DecodeAdd(payload, 0.5f, out->data(), d);
        return last.ok();
      });
      if (decode_add_s < 0) return Fail(last, spec.ToString() + " decode-add");
      PrintLine("codec_gpu", spec, d, encode_s, decode_s, decode_add_s, memcpy_s, d2h_s,
                payload.size());
    }
    // DGC's momentum correction (u, v on the device) around the sparse
    // encoders it is meant for.
    absl::StatusOr<cuda::DeviceArray> u = cuda::DeviceArray::Create(d);
    absl::StatusOr<cuda::DeviceArray> v = cuda::DeviceArray::Create(d);
    if (!u.ok()) return Fail(u.status(), "allocate");
    if (!v.ok()) return Fail(v.status(), "allocate");
    for (const char* text : {"topk:ratio=0.01", "threshold:sample=0.01,ratio=0.01"}) {
      absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
      if (!spec.ok()) return Fail(spec.status(), text);
      absl::StatusOr<std::unique_ptr<cuda::DeviceCodec>> codec =
          cuda::DeviceCodec::Create(*spec);
      if (!codec.ok()) return Fail(codec.status(), text);
      if (!u->Fill(0.0f).ok() || !v->Fill(0.0f).ok()) {
        return Fail(absl::InternalError("fill failed"), "dgc");
      }
      const double memcpy_s = time_memcpy();
      const double d2h_s = time_d2h();
      std::string payload;
      uint64_t clock = 0;
      absl::Status last;
      double dgc_s = best_seconds([&] {
        CodecContext ctx{DeriveSeed("bench", 0, static_cast<int64_t>(clock++), 0, 0)};
        last = cuda::DgcMomentumOnDevice(**codec, 0.9f, input->data(), u->data(), v->data(),
                                         d, ctx, &payload);
        return last.ok();
      });
      if (dgc_s < 0) return Fail(last, std::string(text) + " dgc");
      PrintLine("codec_gpu_dgc", *spec, d, dgc_s, 0, 0, memcpy_s, d2h_s, payload.size());
    }
  }
  return 0;
}

}  // namespace harrier::bench
