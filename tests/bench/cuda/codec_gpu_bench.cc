#include "tests/bench/cuda/codec_gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/codec/codec.h"
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
    "Device encode/decode throughput of every codec versus a device-to-device\n"
    "cudaMemcpy; one JSON line per (codec, size) on stdout.\n";

using Clock = std::chrono::steady_clock;

template <typename Fn>
double BestSeconds(double min_time, Fn fn) {
  double best = 1e30, spent = 0.0;
  for (int rep = 0; rep < 50 && (rep < 3 || spent < min_time); ++rep) {
    auto start = Clock::now();
    if (!fn()) return -1.0;
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, s);
    spent += s;
  }
  return best;
}

struct Options {
  std::vector<size_t> sizes = {1000000, 25000000};
  std::vector<std::string> codecs;
  double min_time = 0.2;
};

bool ParseArgs(int argc, char** argv, Options* opt, bool* help) {
  for (const char* c : kDefaultCodecs) opt->codecs.emplace_back(c);
  for (int i = 0; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return true;
    }
    if (absl::ConsumePrefix(&arg, "--sizes=")) {
      opt->sizes.clear();
      for (absl::string_view s : absl::StrSplit(arg, ',')) {
        size_t v = 0;
        if (!absl::SimpleAtoi(s, &v) || v == 0) {
          std::fprintf(stderr, "bad size \"%.*s\"\n", static_cast<int>(s.size()),
                       s.data());
          return false;
        }
        opt->sizes.push_back(v);
      }
    } else if (absl::ConsumePrefix(&arg, "--codecs=")) {
      opt->codecs.clear();
      for (absl::string_view s : absl::StrSplit(arg, ';', absl::SkipEmpty())) {
        opt->codecs.emplace_back(s);
      }
    } else if (absl::ConsumePrefix(&arg, "--min_time=")) {
      if (!absl::SimpleAtod(arg, &opt->min_time) || !(opt->min_time >= 0)) {
        std::fprintf(stderr, "bad --min_time\n");
        return false;
      }
    } else {
      std::fprintf(stderr, "unknown flag \"%s\"\n", argv[i]);
      return false;
    }
  }
  return true;
}

int Fail(const absl::Status& st, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

}  // namespace

int RunCodecGpuBench(int argc, char** argv) {
  Options opt;
  bool help = false;
  if (!ParseArgs(argc, argv, &opt, &help)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::vector<CodecSpec> specs;
  for (const std::string& text : opt.codecs) {
    absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
    if (!spec.ok()) {
      std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
      return 2;
    }
    specs.push_back(*spec);
  }
  if (!cuda::DeviceAvailable()) {
    std::fprintf(stderr, "codec_gpu_bench: no CUDA device\n");
    return 1;
  }
  for (size_t d : opt.sizes) {
    std::vector<float> host(d);
    std::mt19937_64 gen(d);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& v : host) v = dist(gen);
    absl::StatusOr<cuda::DeviceArray> input = cuda::DeviceArray::Create(d);
    absl::StatusOr<cuda::DeviceArray> out = cuda::DeviceArray::Create(d);
    if (!input.ok()) return Fail(input.status(), "allocate");
    if (!out.ok()) return Fail(out.status(), "allocate");
    absl::Status st = input->CopyFromHost(host.data(), d);
    if (!st.ok()) return Fail(st, "upload");
    const double bytes = 4.0 * d;
    double memcpy_s = BestSeconds(opt.min_time, [&] {
      return cuda::CopyDeviceToDevice(out->data(), input->data(), 4 * d).ok() &&
             cuda::SynchronizeDevice().ok();
    });
    if (memcpy_s < 0) return Fail(absl::InternalError("copy failed"), "memcpy");
    const double memcpy_gbps = bytes / memcpy_s / 1e9;
    for (const CodecSpec& spec : specs) {
      absl::StatusOr<std::unique_ptr<cuda::DeviceCodec>> codec =
          cuda::DeviceCodec::Create(spec);
      if (!codec.ok()) return Fail(codec.status(), spec.ToString());
      std::string payload;
      uint64_t clock = 0;
      absl::Status last;
      double encode_s = BestSeconds(opt.min_time, [&] {
        CodecContext ctx{DeriveSeed("bench", 0, static_cast<int64_t>(clock++), 0, 0)};
        last = (*codec)->Encode(input->data(), d, ctx, &payload);
        return last.ok();
      });
      if (encode_s < 0) return Fail(last, spec.ToString() + " encode");
      double decode_s = BestSeconds(opt.min_time, [&] {
        last = (*codec)->Decode(payload, out->data(), d);
        return last.ok();
      });
      if (decode_s < 0) return Fail(last, spec.ToString() + " decode");
      const double encode_gbps = bytes / encode_s / 1e9;
      const double decode_gbps = bytes / decode_s / 1e9;
      std::printf(
          "{\"bench\":\"codec_gpu\",\"codec\":\"%s\",\"elements\":%zu,"
          "\"encode_gbps\":%.4f,\"decode_gbps\":%.4f,\"memcpy_gbps\":%.4f,"
          "\"encode_ratio\":%.5f,\"decode_ratio\":%.5f,\"wire_bytes\":%zu}\n",
          spec.ToString().c_str(), d, encode_gbps, decode_gbps, memcpy_gbps,
          encode_gbps / memcpy_gbps, decode_gbps / memcpy_gbps, payload.size());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace harrier::bench
