// The CUDA codecs against their CPU twins (common/codec). Runs only on a
// machine with a GPU: without one every test case fails (the target is
// tagged manual and gpu, so only GPU runs build and run it).
//
//   exact payload     none fp16 bf16 topk randomk threshold signum sign
//                     powersgd (also over several warm-started calls)
//   exact mask, scale within 1 ulp   sign:scale=1 efsign onebit
//   exact payload     qsgd, unclipped terngrad (the CPU draws the same
//                     counter-based uniforms)
//   statistical       qsgd terngrad (bit-exact norms / unclipped scale, each
//                     element one of the two CPU-possible levels, Monte-Carlo
//                     mean close to g)
//   decode            GPU decode of the CPU payload == CPU decode, bitwise
//   error feedback    GPU residual == fl(g + e - D_cpu(p_gpu)), bitwise
//   decode-add        GPU DecodeAdd of the CPU payload == CPU DecodeAdd,
//                     bitwise, every codec (sparse ones keep -0.0 intact)
//   DGC momentum      GPU u, v and payloads == DgcMomentumCorrection's over
//                     several steps
//   CRC32C            DeviceCrc32c == Crc32c at many sizes and offsets
//   backend           the CUDA CodecBackend's push streams and pull mirrors
//                     == the host backend's over 5 steps

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/codec.h"
#include "common/codec/codec_backend.h"
#include "common/codec/error_feedback.h"
#include "common/codec/host_codec_backend.h"
#include "common/crc32c.h"
#include "common/payload_view.h"
#include "cuda/cuda_codec_backend.h"
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
      // Both draw float(Mix64(seed, i) >> 40) * 2^-24 for element i, so the
      // payloads are the same bytes; with clip, TernGrad's scale comes from
      // parallel double sums on the GPU and may differ in rounding.
      if (qsgd || !clipped) CHECK(got == want);
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


// An accumulator with exact zeros of both signs and ordinary values.
std::vector<float> Accumulator(size_t d, uint64_t seed) {
  std::vector<float> a = RandomGradient(d, seed);
  for (size_t i = 0; i < d; i += 3) a[i] = (i % 2) ? -0.0f : 0.0f;
  return a;
}

TEST_CASE("GPU DecodeAdd equals CPU DecodeAdd bitwise") {
  REQUIRE(cuda::DeviceAvailable());
  std::vector<std::string> all = kExact;
  all.insert(all.end(), kScaleUlp.begin(), kScaleUlp.end());
  all.insert(all.end(), kRandom.begin(), kRandom.end());
  for (const std::string& text : all) {
    auto cpu = CpuCodec(text);
    auto gpu = GpuCodec(text);
    for (size_t d : kSizes) {
      for (float scale : {1.0f, 0.37f, -2.5f}) {
        INFO(text << " d=" << d << " scale=" << scale);
        std::vector<float> g = RandomGradient(d, d + 17, true);
        std::string p;
        REQUIRE(cpu->Encode(g, CodecContext{11}, &p).ok());
        std::vector<float> want = Accumulator(d, d + 3);
        DeviceArray acc = Upload(want);
        REQUIRE(cpu->DecodeAdd(p, scale, absl::MakeSpan(want)).ok());
        absl::Status st = gpu->DecodeAdd(p, scale, acc.data(), d);
        INFO(st.ToString());
        REQUIRE(st.ok());
        CHECK(FirstDiff(Download(acc), want) == -1);
        // Refusals leave the accumulator untouched: a truncated payload,
        // a non-finite scale (the CPU's message), a wrong element count.
        const std::vector<float> before = Download(acc);
        CHECK_FALSE(gpu->DecodeAdd(p.substr(0, p.size() - 1), scale, acc.data(), d).ok());
        absl::Status bad_scale = gpu->DecodeAdd(p, std::nanf(""), acc.data(), d);
        absl::Status cpu_bad_scale =
            cpu->DecodeAdd(p, std::nanf(""), absl::MakeSpan(want));
        CHECK(bad_scale.code() == cpu_bad_scale.code());
        CHECK(bad_scale.message() == cpu_bad_scale.message());
        CHECK_FALSE(gpu->DecodeAdd(p, scale, acc.data(), d + 1).ok());
        CHECK(FirstDiff(Download(acc), before) == -1);
      }
    }
  }
}

TEST_CASE("DGC momentum correction on the device equals the CPU's") {
  REQUIRE(cuda::DeviceAvailable());
  for (const std::string text :
       {"threshold:sample=0.5,ratio=0.1", "threshold:sample=0.01,ratio=0.01",
        "topk:ratio=0.01", "threshold:tau=0.5"}) {
    for (size_t d : {size_t{7}, size_t{4099}, size_t{(1u << 20) + 3}}) {
      INFO(text << " d=" << d);
      auto cpu_codec = CpuCodec(text);
      auto gpu = GpuCodec(text);
      DgcMomentumCorrection cpu(d, 0.9f);
      DeviceArray du = Upload(std::vector<float>(d, 0.0f));
      DeviceArray dv = Upload(std::vector<float>(d, 0.0f));
      for (int step = 0; step < 5; ++step) {
        INFO("step " << step);
        std::vector<float> g = RandomGradient(d, 7 * d + step);
        DeviceArray dg = Upload(g);
        CodecContext ctx{DeriveSeed("dgc", 0, step, 0, 0)};
        std::string want, got;
        REQUIRE(cpu.Compress(*cpu_codec, g, ctx, &want).ok());
        absl::Status st = cuda::DgcMomentumOnDevice(*gpu, 0.9f, dg.data(), du.data(),
                                                    dv.data(), d, ctx, &got);
        INFO(st.ToString());
        REQUIRE(st.ok());
        CHECK(FirstByteDiff(got, want) == -1);
        CHECK(FirstDiff(Download(du), std::vector<float>(cpu.velocity().begin(),
                                                         cpu.velocity().end())) == -1);
        CHECK(FirstDiff(Download(dv), std::vector<float>(cpu.accumulation().begin(),
                                                         cpu.accumulation().end())) == -1);
      }
      // A refused encode (NaN gradient) leaves u and v as they were.
      const std::vector<float> u = Download(du), v = Download(dv);
      std::vector<float> g = RandomGradient(d, 5);
      g[d / 2] = std::nanf("");
      DeviceArray dg = Upload(g);
      std::string p = "junk";
      CHECK_FALSE(cuda::DgcMomentumOnDevice(*gpu, 0.9f, dg.data(), du.data(), dv.data(), d,
                                            CodecContext{1}, &p)
                      .ok());
      CHECK(p.empty());
      CHECK(FirstDiff(Download(du), u) == -1);
      CHECK(FirstDiff(Download(dv), v) == -1);
    }
  }
}

TEST_CASE("DeviceCrc32c equals Crc32c") {
  REQUIRE(cuda::DeviceAvailable());
  const size_t kMax = (40u << 20) + 64;
  std::vector<unsigned char> bytes(kMax);
  uint64_t state = 88172645463325252ull;
  for (auto& b : bytes) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    b = static_cast<unsigned char>(state);
  }
  void* dev = nullptr;
  absl::StatusOr<DeviceArray> buf = DeviceArray::Create(kMax / 4);
  REQUIRE(buf.ok());
  REQUIRE(buf->CopyFromHost(reinterpret_cast<const float*>(bytes.data()), kMax / 4).ok());
  dev = buf->data();
  const size_t sizes[] = {0,     1,     3,          4,          7,           1023,
                          1024,  1025,  4096 * 3 + 7, 65536,    (1u << 20) + 5,
                          16u << 20, (16u << 20) + 1, (40u << 20) + 3};
  for (size_t size : sizes) {
    for (size_t offset : {size_t{0}, size_t{1}, size_t{4}}) {
      if (offset + size > kMax) continue;
      INFO("size " << size << " offset " << offset);
      absl::StatusOr<uint32_t> got =
          cuda::DeviceCrc32c(static_cast<const char*>(dev) + offset, size);
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      CHECK(*got == Crc32c(bytes.data() + offset, size));
    }
  }
  // Host memory is refused rather than faulting.
  CHECK(cuda::DeviceCrc32c(bytes.data(), 100).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

std::shared_ptr<CodecBackend> CudaBackend() {
  absl::StatusOr<std::shared_ptr<CodecBackend>> b = cuda::NewCudaCodecBackend();
  INFO(b.status().ToString());
  REQUIRE(b.ok());
  return *b;
}

// The tensor a layer of the quickstart MLP pushes: 784 x 256.
constexpr size_t kLayer = 784 * 256;

TEST_CASE("CUDA backend push streams equal the host backend's") {
  REQUIRE(cuda::DeviceAvailable());
  auto host = NewHostCodecBackend();
  auto gpu = CudaBackend();
  REQUIRE(gpu->memory() == MemoryKind::kDevice);
  REQUIRE(gpu->name() == "cuda");
  // Deterministic codecs, with error feedback (topk, threshold, unscaled
  // randomk, powersgd), DGC (momentum) and none (fp16, signum).
  for (const std::string text :
       {"topk:ratio=0.01", "fp16", "signum", "threshold:tau=0.5",
        "randomk:ratio=0.1,scale=0", "powersgd:rank=2,cols=256", "powersgd:rank=2",
        "threshold:sample=0.5,ratio=0.1,momentum=0.9"}) {
    for (size_t d : {size_t{4099}, kLayer}) {
      INFO(text << " d=" << d);
      const CodecSpec spec = Spec(text);
      auto hs = host->NewPushStream(spec, d);
      auto gs = gpu->NewPushStream(spec, d);
      REQUIRE(hs.ok());
      INFO(gs.status().ToString());
      REQUIRE(gs.ok());
      for (int step = 0; step < 5; ++step) {
        INFO("step " << step);
        std::vector<float> g = RandomGradient(d, 3 * d + step);
        DeviceArray dg = Upload(g);
        CodecContext ctx{DeriveSeed("backend", 0, step, 0, 0)};
        std::string want, got;
        REQUIRE((*hs)->Encode(g.data(), d, ctx, &want).ok());
        absl::Status st = (*gs)->Encode(dg.data(), d, ctx, &got);
        INFO(st.ToString());
        REQUIRE(st.ok());
        REQUIRE(FirstByteDiff(got, want) == -1);
        if (spec.id == CodecId::kPowerSgd && spec.cols > 0 && d == kLayer) {
          absl::StatusOr<PayloadHeader> h = PeekPayloadHeader(got);
          REQUIRE(h.ok());
          CHECK(h->param1 == 784);  // m = d / cols: the layer's own shape
        }
      }
      std::string p;
      CHECK((*gs)->Encode(nullptr, d + 1, CodecContext{1}, &p).code() ==
            absl::StatusCode::kInvalidArgument);
    }
  }
  // efsign's scale is a parallel double sum (within an ulp of the CPU's), so
  // with error feedback the streams drift apart by roundings: the first
  // payload's mask is exact, the decodes stay close.
  for (size_t d : {size_t{4099}, kLayer}) {
    INFO("efsign d=" << d);
    auto hs = host->NewPushStream(Spec("efsign"), d);
    auto gs = gpu->NewPushStream(Spec("efsign"), d);
    REQUIRE(hs.ok());
    REQUIRE(gs.ok());
    auto cpu = CpuCodec("efsign");
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g = RandomGradient(d, 5 * d + step);
      DeviceArray dg = Upload(g);
      std::string want, got;
      REQUIRE((*hs)->Encode(g.data(), d, CodecContext{1}, &want).ok());
      REQUIRE((*gs)->Encode(dg.data(), d, CodecContext{1}, &got).ok());
      REQUIRE(got.size() == want.size());
      if (step == 0) CHECK(got.compare(28, std::string::npos, want, 28, std::string::npos) == 0);
      std::vector<float> a = CpuDecode(*cpu, got, d), b = CpuDecode(*cpu, want, d);
      size_t differ = 0;
      for (size_t i = 0; i < d; ++i) differ += a[i] != b[i] && std::fabs(a[i] - b[i]) > 1e-5f * std::fabs(b[i]);
      CHECK(differ <= d / 1000);
    }
  }
}

TEST_CASE("CUDA backend pull mirror equals the host mirror") {
  REQUIRE(cuda::DeviceAvailable());
  auto host = NewHostCodecBackend();
  auto gpu = CudaBackend();
  for (const std::string text : {"topk:ratio=0.01", "fp16", "powersgd:rank=2,cols=256",
                                 "randomk:ratio=0.1", "qsgd:levels=16,bucket=512"}) {
    const size_t d = kLayer;
    INFO(text);
    const CodecSpec spec = Spec(text);
    auto hm = host->NewPullMirror(spec, d);
    auto gm = gpu->NewPullMirror(spec, d);
    REQUIRE(hm.ok());
    REQUIRE(gm.ok());
    REQUIRE((*gm)->empty());
    std::vector<float> host_out(d);
    DeviceArray out = Upload(std::vector<float>(d, -3.0f));
    std::string p;
    auto cpu = CpuCodec(text);
    REQUIRE(cpu->Encode(RandomGradient(d, 1), CodecContext{1}, &p).ok());
    CHECK((*gm)->AddCompressed(p, out.data()).code() == absl::StatusCode::kFailedPrecondition);
    CHECK(FirstDiff(Download(out), std::vector<float>(d, -3.0f)) == -1);
    // The dense reply in two pieces, as gRPC slices arrive.
    std::vector<float> initial = RandomGradient(d, 2);
    absl::string_view bytes(reinterpret_cast<const char*>(initial.data()), 4 * d);
    PayloadView dense;
    dense.Append(bytes.substr(0, 1001));
    dense.Append(bytes.substr(1001));
    PayloadView short_reply(bytes.substr(0, 4 * d - 4));
    CHECK((*gm)->SetDense(short_reply, out.data()).code() == absl::StatusCode::kInvalidArgument);
    REQUIRE((*hm)->SetDense(dense, host_out.data()).ok());
    REQUIRE((*gm)->SetDense(dense, out.data()).ok());
    REQUIRE_FALSE((*gm)->empty());
    CHECK(FirstDiff(Download(out), initial) == -1);
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      REQUIRE(cpu->Encode(RandomGradient(d, 10 + step), CodecContext{uint64_t(step)}, &p).ok());
      REQUIRE((*hm)->AddCompressed(p, host_out.data()).ok());
      absl::Status st = (*gm)->AddCompressed(p, out.data());
      INFO(st.ToString());
      REQUIRE(st.ok());
      CHECK(FirstDiff(Download(out), host_out) == -1);
    }
    // A refused reply writes neither the mirror nor out.
    DeviceArray sentinel = Upload(std::vector<float>(d, 9.0f));
    CHECK_FALSE((*gm)->AddCompressed(p.substr(0, p.size() - 1), sentinel.data()).ok());
    CHECK(FirstDiff(Download(sentinel), std::vector<float>(d, 9.0f)) == -1);
    REQUIRE(cpu->Encode(RandomGradient(d, 99), CodecContext{99}, &p).ok());
    REQUIRE((*hm)->AddCompressed(p, host_out.data()).ok());
    REQUIRE((*gm)->AddCompressed(p, out.data()).ok());
    CHECK(FirstDiff(Download(out), host_out) == -1);
  }
}

TEST_CASE("CUDA backend staging copies and CRC") {
  REQUIRE(cuda::DeviceAvailable());
  auto gpu = CudaBackend();
  const size_t d = 100003;
  std::vector<float> v = RandomGradient(d, 4);
  DeviceArray dv = Upload(std::vector<float>(d, 0.0f));
  absl::string_view bytes(reinterpret_cast<const char*>(v.data()), 4 * d);
  PayloadView pieces;
  pieces.Append(bytes.substr(0, 6));
  pieces.Append(bytes.substr(6, 4000));
  pieces.Append(bytes.substr(4006));
  REQUIRE(gpu->CopyFromHost(pieces, dv.data()).ok());
  std::vector<float> back(d, 0.0f);
  REQUIRE(gpu->CopyToHost(dv.data(), d, back.data()).ok());
  CHECK(FirstDiff(back, v) == -1);
  absl::StatusOr<uint32_t> crc = gpu->Crc32c(dv.data(), 4 * d);
  REQUIRE(crc.ok());
  CHECK(*crc == Crc32c(v.data(), 4 * d));
  absl::StatusOr<uint32_t> host_crc = NewHostCodecBackend()->Crc32c(v.data(), 4 * d);
  REQUIRE(host_crc.ok());
  CHECK(*crc == *host_crc);
}

}  // namespace
}  // namespace harrier
