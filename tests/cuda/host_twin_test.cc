// //cuda:host_twin restates private helpers of common/codec; this test (no
// GPU needed) keeps the two in step: payload validation accepts and refuses
// exactly what the CPU decoders do, with the same messages, and the PRNG,
// random-k draws, k and PowerSGD shape rules agree.

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/codec.h"
#include "cuda/host_twin.h"

namespace harrier {
namespace {

namespace host = cuda::host;

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

TEST_CASE("header, k, seed and random-k indices match the CPU codec") {
  const size_t d = 1000;
  std::vector<float> g = Gradient(d, 3);
  for (std::string text : {"randomk:ratio=0.1,seed=7", "randomk:ratio=1"}) {
    auto codec = Make(text);
    absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
    std::string p;
    REQUIRE(codec->Encode(g, CodecContext{11}, &p).ok());
    uint64_t seed;
    std::memcpy(&seed, p.data() + 24, 8);
    CHECK(seed == host::Mix64(11, spec->seed));
    const size_t k = host::KFromRatio(spec->ratio, d);
    std::string header;
    host::StartPayload(CodecId::kRandomK, d, static_cast<uint32_t>(k), 0, 0,
                       &header);
    CHECK(p.compare(0, 24, header) == 0);
    std::vector<float> out(d);
    REQUIRE(codec->Decode(p, absl::MakeSpan(out)).ok());
    std::vector<uint32_t> idx;
    host::RandomKIndices(seed, d, k, &idx);
    std::vector<uint32_t> nonzero;
    for (size_t i = 0; i < d; ++i) {
      if (out[i] != 0.0f) nonzero.push_back(static_cast<uint32_t>(i));
    }
    CHECK(idx == nonzero);
  }
  for (size_t dd : {size_t{4}, size_t{97}, size_t{1000}, size_t{4096}}) {
    for (std::string text : {"powersgd:rank=2", "powersgd:rank=3,cols=8"}) {
      auto codec = Make(text);
      absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
      std::string p;
      REQUIRE(codec->Encode(Gradient(dd, 5), CodecContext{1}, &p).ok());
      absl::StatusOr<PayloadHeader> h = PeekPayloadHeader(p);
      REQUIRE(h.ok());
      host::MatrixShape s = host::ChoosePowerSgdShape(dd, spec->rank, spec->cols);
      CHECK(h->param0 == s.r);
      CHECK(h->param1 == (s.r ? s.m : 0));
    }
  }
}

}  // namespace
}  // namespace harrier
