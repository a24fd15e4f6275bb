// Round trips and exact wire sizes for known inputs, for every codec.

#include <cfloat>
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace {

using testing::MakeCodec;
using testing::MustDecode;
using testing::MustEncode;
using testing::RandomGradient;

TEST_CASE("header is 24 bytes and peekable", "[wire]") {
  CHECK(HeaderBytes() == 24);
  auto codec = MakeCodec("qsgd:levels=16,bucket=64");
  std::string p = MustEncode(*codec, RandomGradient(100, 1));
  absl::StatusOr<PayloadHeader> h = PeekPayloadHeader(p);
  REQUIRE(h.ok());
  CHECK(h->codec == CodecId::kQsgd);
  CHECK(h->version == kCodecWireVersion);
  CHECK(h->num_elements == 100);
  CHECK(h->param0 == 16);
  CHECK(h->param1 == 64);
}

TEST_CASE("exact wire sizes", "[wire]") {
  struct Case {
    const char* spec;
    size_t d;
    size_t bytes;
  } cases[] = {
      {"none", 100, 24 + 400},
      {"fp16", 100, 24 + 200},
      {"bf16", 100, 24 + 200},
      {"topk:ratio=0.1", 100, 24 + 8 * 10},
      {"topk:ratio=0.001", 100, 24 + 8 * 1},  // k >= 1
      {"randomk:ratio=0.1", 100, 24 + 8 + 4 * 10},
      {"qsgd:levels=16,bucket=64", 100, 24 + 4 * 2 + 75},  // 6 bits/elem
      {"qsgd:levels=1,bucket=512", 100, 24 + 4 + 25},      // 2 bits/elem
      {"qsgd:levels=255,bucket=512", 100, 24 + 4 + 113},   // 9 bits/elem
      {"terngrad", 100, 24 + 4 + 25},
      {"terngrad", 10, 24 + 4 + 3},
      {"sign", 100, 24 + 13},
      {"sign:scale=1", 100, 24 + 4 + 13},
      {"efsign", 100, 24 + 4 + 13},
      {"signum", 100, 24 + 13},
      {"onebit", 100, 24 + 8 + 13},
      {"powersgd:rank=2", 100, 24 + 4 * 2 * (10 + 10)},
      {"powersgd:rank=2", 2048, 24 + 4 * 2 * (32 + 64)},
      {"powersgd:rank=2,cols=128", 2048, 24 + 4 * 2 * (16 + 128)},
      {"powersgd:rank=2", 7, 24 + 4 * 7},   // prime: uncompressed
      {"powersgd:rank=4", 16, 24 + 4 * 16}, // r(m+n) >= d: uncompressed
  };
  for (const Case& c : cases) {
    INFO(c.spec << " d=" << c.d);
    auto codec = MakeCodec(c.spec);
    std::string p = MustEncode(*codec, RandomGradient(c.d, 3));
    CHECK(p.size() == c.bytes);
    std::vector<float> out = MustDecode(*codec, p, c.d);
  }
}

TEST_CASE("threshold wire size follows the number of passing elements",
          "[wire]") {
  auto codec = MakeCodec("threshold:tau=0.5");
  std::vector<float> g = {0.1f, -0.9f, 0.6f, 0.2f, -0.5f, 0.0f};
  std::string p = MustEncode(*codec, g);
  CHECK(p.size() == 24 + 8 * 2);  // 0.5 is not > 0.5
  CHECK(MustDecode(*codec, p, 6) ==
        std::vector<float>{0.0f, -0.9f, 0.6f, 0.0f, 0.0f, 0.0f});
}

TEST_CASE("empty tensors encode to a bare header", "[wire]") {
  for (const std::string& spec : testing::AllSpecs()) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    std::string p = MustEncode(*codec, {});
    CHECK(p.size() >= 24);
    std::vector<float> out;
    CHECK(codec->Decode(p, absl::MakeSpan(out)).ok());
  }
}

TEST_CASE("none round-trips bit-exactly", "[dense]") {
  auto codec = MakeCodec("none");
  std::vector<float> g = RandomGradient(1001, 5);
  g[3] = -0.0f;
  g[4] = FLT_MAX;
  g[5] = FLT_TRUE_MIN;
  CHECK(testing::BitwiseEqual(MustDecode(*codec, MustEncode(*codec, g), g.size()), g));
}

TEST_CASE("fp16 rounds to nearest even and refuses overflow", "[dense]") {
  auto codec = MakeCodec("fp16");
  std::vector<float> g = {1.0f, -2.5f, 65504.0f, 0x1p-24f, 0x1p-14f, 0.0f,
                          3e-8f, 2.9e-8f, 0.1f, 1.0f + 0x1p-11f,
                          1.0f + 0x1p-11f + 0x1p-20f};
  std::vector<float> want = {1.0f, -2.5f, 65504.0f, 0x1p-24f, 0x1p-14f, 0.0f,
                             0x1p-24f, 0.0f, 0.0999755859375f, 1.0f,
                             1.0f + 0x1p-10f};
  CHECK(MustDecode(*codec, MustEncode(*codec, g), g.size()) == want);
  std::vector<float> r = RandomGradient(10000, 9, 100.0f);
  std::vector<float> back = MustDecode(*codec, MustEncode(*codec, r), r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    CHECK(std::fabs(back[i] - r[i]) <=
          std::max(std::fabs(r[i]) * 0x1p-11f, 0x1p-25f));
#if defined(__FLT16_MAX__)
    CHECK(back[i] == static_cast<float>(static_cast<_Float16>(r[i])));
#endif
  }
  std::string payload = "unchanged";
  for (float bad : {65520.0f, -70000.0f, INFINITY, NAN}) {
    absl::Status st = codec->Encode({1.0f, bad}, CodecContext{}, &payload);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(payload.empty());
  }
}

TEST_CASE("bf16 round-trips within 2^-8 and refuses overflow", "[dense]") {
  auto codec = MakeCodec("bf16");
  std::vector<float> g = RandomGradient(10000, 11, 1e3f);
  std::vector<float> back = MustDecode(*codec, MustEncode(*codec, g), g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    CHECK(std::fabs(back[i] - g[i]) <= std::fabs(g[i]) * 0x1p-8f);
  }
  CHECK(MustDecode(*codec, MustEncode(*codec, {1.0f, -3.0f, 1e30f}), 3)[0] == 1.0f);
  std::string payload;
  CHECK(codec->Encode({FLT_MAX}, CodecContext{}, &payload).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("every codec refuses NaN and Inf input", "[dense]") {
  for (const std::string& spec : testing::AllSpecs()) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> g = RandomGradient(100, 2);
      g[37] = bad;
      std::string payload = "x";
      absl::Status st = codec->Encode(g, CodecContext{1}, &payload);
      CHECK(st.code() == absl::StatusCode::kInvalidArgument);
      CHECK(payload.empty());
    }
  }
}

TEST_CASE("sign family decodes to the documented values", "[sign]") {
  std::vector<float> g = {1.0f, -2.0f, 0.0f, -0.0f, 3.0f, -6.0f};
  CHECK(MustDecode(*MakeCodec("sign"), MustEncode(*MakeCodec("sign"), g), 6) ==
        std::vector<float>{1, -1, 1, 1, 1, -1});  // sign(0) = +1
  CHECK(MustDecode(*MakeCodec("signum"), MustEncode(*MakeCodec("signum"), g), 6) ==
        std::vector<float>{1, -1, 1, 1, 1, -1});
  // mean abs = 12 / 6 = 2
  CHECK(MustDecode(*MakeCodec("sign:scale=1"),
                   MustEncode(*MakeCodec("sign:scale=1"), g), 6) ==
        std::vector<float>{2, -2, 2, 2, 2, -2});
  CHECK(MustDecode(*MakeCodec("efsign"), MustEncode(*MakeCodec("efsign"), g), 6) ==
        std::vector<float>{2, -2, 2, 2, 2, -2});
  // negatives mean -4, non-negatives mean 1
  CHECK(MustDecode(*MakeCodec("onebit"), MustEncode(*MakeCodec("onebit"), g), 6) ==
        std::vector<float>{1, -4, 1, 1, 1, -4});
}

TEST_CASE("DecodeAdd equals accum + scale * Decode for every codec",
          "[decode_add]") {
  for (const std::string& spec : testing::AllSpecs()) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    std::vector<float> g = RandomGradient(300, 4);
    std::string p = MustEncode(*codec, g, 17);
    std::vector<float> dec = MustDecode(*codec, p, g.size());
    std::vector<float> accum = RandomGradient(300, 5);
    std::vector<float> want = accum;
    for (size_t i = 0; i < want.size(); ++i) want[i] += 0.5f * dec[i];
    REQUIRE(codec->DecodeAdd(p, 0.5f, absl::MakeSpan(accum)).ok());
    CHECK(testing::BitwiseEqual(accum, want));
    CHECK(codec->DecodeAdd(p, NAN, absl::MakeSpan(accum)).code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("encode is reproducible from the context seed", "[seed]") {
  for (const std::string& spec : testing::AllSpecs()) {
    INFO(spec);
    std::vector<float> g = RandomGradient(500, 8);
    CHECK(MustEncode(*MakeCodec(spec), g, 99) == MustEncode(*MakeCodec(spec), g, 99));
  }
  // Random codecs change with the seed.
  for (const char* spec : {"randomk:ratio=0.1", "qsgd:levels=4,bucket=64", "terngrad"}) {
    INFO(spec);
    std::vector<float> g = RandomGradient(500, 8);
    CHECK(MustEncode(*MakeCodec(spec), g, 1) != MustEncode(*MakeCodec(spec), g, 2));
  }
}

}  // namespace
}  // namespace harrier
