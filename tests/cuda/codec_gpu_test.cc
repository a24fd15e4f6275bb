// The CUDA codecs against their CPU twins (common/codec). Runs only on a
// machine with a GPU: without one every test case fails (the target is
// tagged manual and gpu, so only GPU runs build and run it).
//
//   exact payload     none fp16 bf16 topk randomk threshold signum sign
//                     powersgd (also over several warm-started calls)
//   exact mask, scale within 1 ulp   sign:scale=1 efsign onebit
//   statistical       qsgd terngrad (bit-exact norms / unclipped scale, each
//                     element one of the two CPU-possible levels, Monte-Carlo
//                     mean close to g)
//   decode            GPU decode of the CPU payload == CPU decode, bitwise
//   error feedback    GPU residual == fl(g + e - D_cpu(p_gpu)), bitwise

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/codec.h"
#include "common/codec/error_feedback.h"
#include "cuda/device_codec.h"
#include "cuda/device_memory.h"

namespace harrier {
namespace {

using cuda::DeviceArray;
using cuda::DeviceCodec;

const std::vector<size_t> kSizes = {1, 7, 100, 4099, (1u << 20) + 3};

const std::vector<std::string> kExact = {
    "none", "fp16", "bf16", "topk:ratio=0.1", "topk:ratio=0.001",
    "randomk:ratio=0.1,seed=7", "randomk:ratio=0.1,scale=0",
    "threshold:tau=0.5", "threshold:sample=0.5,ratio=0.1",
    "threshold:sample=0.01,ratio=0.01", "signum", "sign", "powersgd:rank=2",
    "powersgd:rank=4,cols=64"};
const std::vector<std::string> kScaleUlp = {"sign:scale=1", "efsign", "onebit"};
const std::vector<std::string> kRandom = {"qsgd:levels=16,bucket=64",
                                          "qsgd:levels=3,bucket=512",
                                          "terngrad", "terngrad:clip=2.5"};

std::vector<float> RandomGradient(size_t d, uint64_t seed, bool ties = false) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(d);
  for (float& v : g) v = dist(gen);
  if (ties) {
    // Coarse values: many equal abs values and exact zeros (top-k ties,
    // sign(0)).
    for (float& v : g) v = std::round(v * 4.0f) / 4.0f;
  }
  return g;
}

CodecSpec Spec(const std::string& text) {
  absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
  INFO(text);
  REQUIRE(spec.ok());
  return *spec;
}

std::unique_ptr<Codec> CpuCodec(const std::string& text) {
  absl::StatusOr<std::unique_ptr<Codec>> c = CreateCodec(Spec(text));
  REQUIRE(c.ok());
  return std::move(*c);
}

std::unique_ptr<DeviceCodec> GpuCodec(const std::string& text) {
  absl::StatusOr<std::unique_ptr<DeviceCodec>> c =
      DeviceCodec::Create(Spec(text));
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(*c);
}

DeviceArray Upload(const std::vector<float>& v) {
  absl::StatusOr<DeviceArray> a = DeviceArray::Create(v.size());
  REQUIRE(a.ok());
  REQUIRE(a->CopyFromHost(v.data(), v.size()).ok());
  return std::move(*a);
}

std::vector<float> Download(const DeviceArray& a) {
  std::vector<float> v(a.size());
  REQUIRE(a.CopyToHost(v.data(), v.size()).ok());
  return v;
}

std::vector<float> CpuDecode(const Codec& codec, const std::string& payload,
                             size_t d) {
  std::vector<float> out(d);
  absl::Status st = codec.Decode(payload, absl::MakeSpan(out));
  INFO(st.ToString());
  REQUIRE(st.ok());
  return out;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Index of the first bitwise difference, or -1.
long FirstDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Bits(a[i]) != Bits(b[i])) return static_cast<long>(i);
  }
  return -1;
}

long FirstByteDiff(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return -2;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<long>(i);
  }
  return -1;
}

float LoadFloat(const std::string& p, size_t off) {
  float f;
  std::memcpy(&f, p.data() + off, 4);
  return f;
}

TEST_CASE("a CUDA device is present") {
  INFO("codec_gpu_test needs a GPU; it is tagged manual/gpu for that reason");
  REQUIRE(cuda::DeviceAvailable());
}

TEST_CASE("deterministic codecs: GPU payload equals CPU payload") {
  REQUIRE(cuda::DeviceAvailable());
  for (const std::string& text : kExact) {
    for (size_t d : kSizes) {
      for (bool ties : {false, true}) {
        INFO(text << " d=" << d << " ties=" << ties);
        std::vector<float> g = RandomGradient(d, d * 31 + ties, ties);
        DeviceArray dg = Upload(g);
        auto cpu = CpuCodec(text);
        auto gpu = GpuCodec(text);
        for (int call = 0; call < 3; ++call) {  // PowerSGD warm start
          CodecContext ctx{DeriveSeed("t", 0, call, 0, 0)};
          std::string want, got;
          REQUIRE(cpu->Encode(g, ctx, &want).ok());
          absl::Status st = gpu->Encode(dg.data(), d, ctx, &got);
          INFO(st.ToString() << " call=" << call);
          REQUIRE(st.ok());
          CHECK(FirstByteDiff(got, want) == -1);
        }
      }
    }
  }
}

TEST_CASE("scaled sign codecs: exact mask, scale within one ulp") {
  REQUIRE(cuda::DeviceAvailable());
  for (const std::string& text : kScaleUlp) {
    for (size_t d : kSizes) {
      INFO(text << " d=" << d);
      std::vector<float> g = RandomGradient(d, d + 5, true);
      DeviceArray dg = Upload(g);
      std::string want, got;
      REQUIRE(CpuCodec(text)->Encode(g, CodecContext{1}, &want).ok());
      REQUIRE(GpuCodec(text)->Encode(dg.data(), d, CodecContext{1}, &got).ok());
      REQUIRE(got.size() == want.size());
      const size_t floats = text == "onebit" ? 2 : 1;
      CHECK(got.compare(0, 24, want, 0, 24) == 0);
      CHECK(got.compare(24 + 4 * floats, std::string::npos, want,
                        24 + 4 * floats, std::string::npos) == 0);
      for (size_t f = 0; f < floats; ++f) {
        float a = LoadFloat(got, 24 + 4 * f), b = LoadFloat(want, 24 + 4 * f);
        CHECK(std::abs(static_cast<int64_t>(Bits(a)) -
                       static_cast<int64_t>(Bits(b))) <= 1);
      }
    }
  }
}

TEST_CASE("random codecs: same layout, admissible codes, unbiased mean") {
  REQUIRE(cuda::DeviceAvailable());
  for (const std::string& text : kRandom) {
    const bool qsgd = text.rfind("qsgd", 0) == 0;
    const bool clipped = text.find("clip") != std::string::npos;
    for (size_t d : kSizes) {
      INFO(text << " d=" << d);
      std::vector<float> g = RandomGradient(d, d + 9);
      DeviceArray dg = Upload(g);
      auto cpu = CpuCodec(text);
      std::string want, got;
      REQUIRE(cpu->Encode(g, CodecContext{3}, &want).ok());
      REQUIRE(GpuCodec(text)->Encode(dg.data(), d, CodecContext{3}, &got).ok());
      REQUIRE(got.size() == want.size());
      CHECK(got.compare(0, 24, want, 0, 24) == 0);
      std::vector<float> dec_gpu = CpuDecode(*cpu, got, d);  // also validates
      std::vector<float> dec_cpu = CpuDecode(*cpu, want, d);
      if (qsgd) {
        const uint32_t s = Spec(text).levels, bucket = Spec(text).bucket;
        const size_t buckets = (d + bucket - 1) / bucket;
        CHECK(got.compare(24, 4 * buckets, want, 24, 4 * buckets) == 0);
        for (size_t i = 0; i < d; ++i) {
          float unit = LoadFloat(want, 24 + 4 * (i / bucket)) / s;
          // Both round abs(g_i) / unit to one of its two neighbours.
          REQUIRE(std::fabs(dec_gpu[i] - dec_cpu[i]) <= unit * 1.0001f);
          REQUIRE((dec_gpu[i] == 0.0f || (dec_gpu[i] < 0) == (g[i] < 0)));
        }
      } else {
        float sg = LoadFloat(got, 24), sc = LoadFloat(want, 24);
        if (clipped) {
          CHECK(std::fabs(sg - sc) <= 1e-5f * sc);
        } else {
          CHECK(Bits(sg) == Bits(sc));
        }
        for (size_t i = 0; i < d; ++i) {
          REQUIRE((dec_gpu[i] == 0.0f || std::fabs(dec_gpu[i]) == sg));
          REQUIRE((dec_gpu[i] == 0.0f || (dec_gpu[i] < 0) == (g[i] < 0)));
        }
      }
    }
    if (clipped) continue;  // biased by design
    // Monte-Carlo mean over fresh seeds: E[D(C(g))] = g.
    const size_t d = 1000;
    const int draws = 400;
    std::vector<float> g = RandomGradient(d, 77);
    DeviceArray dg = Upload(g);
    auto gpu = GpuCodec(text);
    auto cpu = CpuCodec(text);
    std::vector<double> mean(d, 0.0);
    for (int t = 0; t < draws; ++t) {
      std::string p;
      REQUIRE(gpu->Encode(dg.data(), d, CodecContext{DeriveSeed("mc", 0, t, 0, 0)},
                          &p).ok());
      std::vector<float> dec = CpuDecode(*cpu, p, d);
      for (size_t i = 0; i < d; ++i) mean[i] += dec[i] / draws;
    }
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < d; ++i) {
      err += (mean[i] - g[i]) * (mean[i] - g[i]);
      norm += static_cast<double>(g[i]) * g[i];
    }
    // Variance bound omega norm^2 with omega <= sqrt(d) (QSGD) or about
    // max|g| * norm1 / norm^2 (TernGrad); 6 sigma of the mean.
    INFO(text << " relative error of the mean " << std::sqrt(err / norm));
    CHECK(std::sqrt(err / norm) < 6.0 * std::sqrt(std::sqrt(double(d)) / draws));
  }
}

TEST_CASE("GPU decode equals CPU decode bitwise") {
  REQUIRE(cuda::DeviceAvailable());
  std::vector<std::string> all = kExact;
  all.insert(all.end(), kScaleUlp.begin(), kScaleUlp.end());
  all.insert(all.end(), kRandom.begin(), kRandom.end());
  for (const std::string& text : all) {
    for (size_t d : kSizes) {
      INFO(text << " d=" << d);
      std::vector<float> g = RandomGradient(d, d + 13, true);
      auto cpu = CpuCodec(text);
      std::string p;
      REQUIRE(cpu->Encode(g, CodecContext{5}, &p).ok());
      std::vector<float> want = CpuDecode(*cpu, p, d);
      absl::StatusOr<DeviceArray> out = DeviceArray::Create(d);
      REQUIRE(out.ok());
      REQUIRE(out->Fill(-7.0f).ok());
      absl::Status st = cuda::DecodeOnDevice(p, out->data(), d);
      INFO(st.ToString());
      REQUIRE(st.ok());
      CHECK(FirstDiff(Download(*out), want) == -1);
      // A hostile (truncated) payload is refused and leaves out untouched.
      REQUIRE(out->Fill(-7.0f).ok());
      CHECK_FALSE(cuda::DecodeOnDevice(p.substr(0, p.size() - 1), out->data(), d)
                      .ok());
      CHECK(Download(*out) == std::vector<float>(d, -7.0f));
    }
  }
}

TEST_CASE("error feedback on the device") {
  REQUIRE(cuda::DeviceAvailable());
  std::vector<std::string> all = kExact;
  all.insert(all.end(), kScaleUlp.begin(), kScaleUlp.end());
  all.insert(all.end(), kRandom.begin(), kRandom.end());
  for (const std::string& text : all) {
    for (size_t d : {size_t{7}, size_t{4099}, size_t{(1u << 20) + 3}}) {
      INFO(text << " d=" << d);
      auto cpu = CpuCodec(text);       // decodes the GPU payloads
      auto cpu_ef_codec = CpuCodec(text);
      auto gpu = GpuCodec(text);
      ErrorFeedback cpu_ef(d);
      std::vector<float> e(d, 0.0f);
      DeviceArray de = Upload(e);
      const bool exact =
          std::find(kExact.begin(), kExact.end(), text) != kExact.end();
      for (int step = 0; step < 3; ++step) {
        std::vector<float> g = RandomGradient(d, 100 * d + step);
        DeviceArray dg = Upload(g);
        CodecContext ctx{DeriveSeed("ef", 0, step, 0, 0)};
        std::string p;
        absl::Status st =
            cuda::ErrorFeedbackOnDevice(*gpu, dg.data(), de.data(), d, ctx, &p);
        INFO(st.ToString() << " step=" << step);
        REQUIRE(st.ok());
        std::vector<float> c(d), want(d);
        for (size_t i = 0; i < d; ++i) c[i] = g[i] + e[i];
        std::vector<float> dec = CpuDecode(*cpu, p, d);
        for (size_t i = 0; i < d; ++i) want[i] = c[i] - dec[i];
        e = Download(de);
        CHECK(FirstDiff(e, want) == -1);
        if (exact) {
          std::string cpu_p;
          REQUIRE(cpu_ef.Compress(*cpu_ef_codec, g, ctx, &cpu_p).ok());
          CHECK(FirstByteDiff(p, cpu_p) == -1);
          std::vector<float> cpu_e(cpu_ef.residual().begin(),
                                   cpu_ef.residual().end());
          CHECK(FirstDiff(e, cpu_e) == -1);
        }
      }
    }
  }
}

TEST_CASE("refusals match the CPU codec") {
  REQUIRE(cuda::DeviceAvailable());
  std::vector<float> g = RandomGradient(100, 1);
  g[42] = std::nanf("");
  DeviceArray dg = Upload(g);
  for (std::string text : {"none", "topk:ratio=0.1", "qsgd", "sign"}) {
    INFO(text);
    std::string want, got = "junk";
    absl::Status cs = CpuCodec(text)->Encode(g, CodecContext{1}, &want);
    absl::Status gs = GpuCodec(text)->Encode(dg.data(), 100, CodecContext{1}, &got);
    CHECK_FALSE(gs.ok());
    CHECK(gs.code() == cs.code());
    CHECK(gs.message() == cs.message());
    CHECK(got.empty());
  }
  std::vector<float> big(10, 1e6f);
  DeviceArray db = Upload(big);
  std::string p;
  CHECK(GpuCodec("fp16")->Encode(db.data(), 10, CodecContext{1}, &p).code() ==
        absl::StatusCode::kInvalidArgument);
  // Host memory is refused rather than faulting.
  CHECK(GpuCodec("none")->Encode(big.data(), 10, CodecContext{1}, &p).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace harrier
