// //cuda:host_twin validates a whole payload up front, while the CPU decoders
// validate as they decode; this test (no GPU needed) checks that both accept
// and refuse the same payloads with the same messages. The CUDA codecs take
// the PRNG, random-k draw, k and PowerSGD shape rules from
// //common/codec:codec_internal; the second test pins those rules to the
// payloads the CPU encoders write and to known values.

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/codec.h"
#include "common/codec/internal.h"
#include "cuda/host_twin.h"

namespace harrier {
namespace {

namespace host = cuda::host;
namespace ci = codec_internal;

const std::vector<std::string> kSpecs = {
    "none", "fp16", "bf16", "topk:ratio=0.1", "randomk:ratio=0.1,seed=7",
    "randomk:ratio=0.3,scale=0", "threshold:tau=0.5",
    "threshold:sample=0.5,ratio=0.1", "qsgd:levels=16,bucket=64",
    "qsgd:levels=3,bucket=5", "terngrad", "terngrad:clip=2.5", "sign",
    "sign:scale=1", "efsign", "signum", "onebit", "powersgd:rank=2",
    "powersgd:rank=1,cols=8"};

std::vector<float> Gradient(size_t d, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(d);
  for (float& v : g) {
    v = dist(gen);
    if (v == 0.0f) v = 1.0f;
  }
  return g;
}

std::unique_ptr<Codec> Make(const std::string& text) {
  absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
  REQUIRE(spec.ok());
  absl::StatusOr<std::unique_ptr<Codec>> c = CreateCodec(*spec);
  REQUIRE(c.ok());
  return std::move(*c);
}

void ExpectSameVerdict(const Codec& codec, const std::string& payload,
                       size_t d) {
  std::vector<float> out(d);
  absl::Status cpu = codec.Decode(payload, absl::MakeSpan(out));
  absl::StatusOr<host::CheckedPayload> twin =
      host::CheckPayload(payload, codec.id(), false, d);
  INFO("cpu: " << cpu.ToString() << " twin: " << twin.status().ToString());
  REQUIRE(cpu.ok() == twin.ok());
  CHECK(cpu.message() == twin.status().message());
}

TEST_CASE("CheckPayload agrees with the CPU decoders") {
  for (const std::string& text : kSpecs) {
    for (size_t d : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{203}}) {
      INFO(text << " d=" << d);
      auto codec = Make(text);
      std::string p;
      REQUIRE(codec->Encode(Gradient(d, d + 1), CodecContext{9}, &p).ok());
      ExpectSameVerdict(*codec, p, d);
      if (d > 0) ExpectSameVerdict(*codec, p, d - 1);
      ExpectSameVerdict(*codec, p.substr(0, p.size() - 1), d);
      ExpectSameVerdict(*codec, p + "x", d);
      // Every single-byte corruption of the header and the first body bytes,
      // and a sample of the rest.
      for (size_t pos = 0; pos < p.size(); pos += pos < 64 ? 1 : 7) {
        for (uint8_t flip : {0x01, 0x80, 0xff}) {
          std::string bad = p;
          bad[pos] = static_cast<char>(bad[pos] ^ flip);
          INFO("pos=" << pos << " flip=" << int(flip));
          ExpectSameVerdict(*codec, bad, d);
        }
      }
    }
  }
}

TEST_CASE("shared rules: seed, k, random-k indices, PowerSGD shape") {
  const size_t d = 1000;
  std::vector<float> g = Gradient(d, 3);
  for (std::string text : {"randomk:ratio=0.1,seed=7", "randomk:ratio=1"}) {
    auto codec = Make(text);
    absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
    std::string p;
    REQUIRE(codec->Encode(g, CodecContext{11}, &p).ok());
    uint64_t seed;
    std::memcpy(&seed, p.data() + 24, 8);
    CHECK(seed == ci::Mix64(11, spec->seed));
    const size_t k = ci::KFromRatio(spec->ratio, d);
    CHECK(k == (spec->ratio == 1 ? d : 100));
    absl::StatusOr<host::CheckedPayload> checked =
        host::CheckPayload(p, CodecId::kRandomK, false, d);
    REQUIRE(checked.ok());
    CHECK(checked->k == k);
    CHECK(checked->seed == seed);
    std::vector<uint64_t> bitmap;
    std::vector<uint32_t> idx;
    ci::RandomKIndices(seed, d, k, &bitmap, &idx);
    // k distinct, increasing indices in range: the CUDA encoder scatters
    // through them without further checks.
    REQUIRE(idx.size() == k);
    for (size_t j = 0; j < k; ++j) {
      CHECK(idx[j] < d);
      if (j > 0) CHECK(idx[j - 1] < idx[j]);
    }
    // The encoder sent exactly g at those indices (times d/k when scaled).
    const float scale =
        spec->scaled ? static_cast<float>(static_cast<double>(d) / k) : 1.0f;
    for (size_t j = 0; j < k; ++j) {
      float v;
      std::memcpy(&v, p.data() + 32 + 4 * j, 4);
      CHECK(v == g[idx[j]] * scale);
    }
  }
  struct ShapeCase {
    size_t d;
    const char* spec;
    size_t m, n, r;
  };
  // m: largest divisor of d not above sqrt(d), or d / cols; r = 0 when the
  // matrix is too thin or r (m + n) >= d.
  const ShapeCase cases[] = {
      {4, "powersgd:rank=2", 0, 0, 0},    {97, "powersgd:rank=2", 0, 0, 0},
      {1000, "powersgd:rank=2", 25, 40, 2}, {4096, "powersgd:rank=2", 64, 64, 2},
      {4, "powersgd:rank=3,cols=8", 0, 0, 0},
      {97, "powersgd:rank=3,cols=8", 0, 0, 0},
      {1000, "powersgd:rank=3,cols=8", 125, 8, 3},
      {4096, "powersgd:rank=3,cols=8", 512, 8, 3}};
  for (const ShapeCase& t : cases) {
    INFO(t.spec << " d=" << t.d);
    absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(t.spec);
    REQUIRE(spec.ok());
    ci::PowerSgdShape s = ci::ChoosePowerSgdShape(t.d, spec->rank, spec->cols);
    CHECK(s.r == t.r);
    if (s.r != 0) {
      CHECK(s.m == t.m);
      CHECK(s.n == t.n);
    }
    auto codec = Make(t.spec);
    std::string p;
    REQUIRE(codec->Encode(Gradient(t.d, 5), CodecContext{1}, &p).ok());
    absl::StatusOr<host::CheckedPayload> checked =
        host::CheckPayload(p, CodecId::kPowerSgd, false, t.d);
    REQUIRE(checked.ok());
    CHECK(checked->r == t.r);
    CHECK(checked->m == t.m);
    CHECK(checked->n == t.n);
  }
}

}  // namespace
}  // namespace harrier
