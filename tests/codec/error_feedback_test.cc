// The error-feedback identity g + e_old = D(p) + e_new, for every codec.
//
// What "exactly" can mean in fp32: with c = fl(g + e_old) and
// e_new = fl(c - D), the residual is by construction the rounded
// difference, so (1) e_new is bitwise fl(c - D); (2) whenever c - D is
// representable (always for sparse codecs, where D_i is 0 or c_i, and for
// casts by Sterbenz' lemma) fl(D + e_new) == c bitwise; (3) otherwise the
// real-number identity is off by at most half an ulp of e_new:
// abs(D + e_new - c) <= 2^-24 abs(c - D), computed exactly in double.

#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/error_feedback.h"
#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace {

using testing::Bits;
using testing::MakeCodec;
using testing::MustDecode;
using testing::RandomGradient;

// Codecs where every element must satisfy statement (2).
bool ExactEverywhere(const std::string& spec) {
  for (const char* prefix : {"none", "fp16", "bf16", "topk", "threshold",
                             "randomk:ratio=0.1,scale=0"}) {
    if (spec.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

TEST_CASE("error feedback identity holds as exactly as fp32 allows",
          "[error_feedback]") {
  const size_t d = 400;
  for (const std::string& spec : testing::AllSpecs()) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    ErrorFeedback ef(d);
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g = RandomGradient(d, 50 + step);
      std::vector<float> e_old(ef.residual().begin(), ef.residual().end());
      std::string p;
      REQUIRE(ef.Compress(*codec, g, CodecContext{uint64_t(step)}, &p).ok());
      std::vector<float> dec = MustDecode(*codec, p, d);
      std::vector<float> e_new(ef.residual().begin(), ef.residual().end());
      size_t exact = 0;
      for (size_t i = 0; i < d; ++i) {
        const float c = g[i] + e_old[i];
        REQUIRE(Bits(e_new[i]) == Bits(c - dec[i]));                   // (1)
        const double diff = static_cast<double>(c) - dec[i];          // exact
        if (static_cast<double>(e_new[i]) == diff) {
          REQUIRE(Bits(dec[i] + e_new[i]) == Bits(c + 0.0f));        // (2)
          ++exact;
        } else {
          REQUIRE(std::fabs(dec[i] + static_cast<double>(e_new[i]) - c) <=
                  0x1p-24 * std::fabs(diff));                          // (3)
        }
      }
      if (ExactEverywhere(spec)) CHECK(exact == d);
    }
  }
}

TEST_CASE("error feedback with topk delivers everything eventually",
          "[error_feedback]") {
  // Sum of decodes + final residual == sum of gradients (exact here since
  // all values are small dyadic rationals).
  auto codec = MakeCodec("topk:ratio=0.25");
  ErrorFeedback ef(4);
  std::vector<float> total(4, 0.0f);
  std::string p;
  for (int step = 0; step < 8; ++step) {
    std::vector<float> g = {1.0f, 0.5f, -0.25f, 0.125f};
    REQUIRE(ef.Compress(*codec, g, CodecContext{}, &p).ok());
    std::vector<float> dec = MustDecode(*codec, p, 4);
    for (size_t i = 0; i < 4; ++i) total[i] += dec[i];
  }
  for (size_t i = 0; i < 4; ++i) total[i] += ef.residual()[i];
  CHECK(total == std::vector<float>{8.0f, 4.0f, -2.0f, 1.0f});
}

TEST_CASE("error feedback refuses bad input without touching the residual",
          "[error_feedback]") {
  auto codec = MakeCodec("sign");
  ErrorFeedback ef(3);
  std::string p;
  REQUIRE(ef.Compress(*codec, std::vector<float>{1, -2, 0.5f}, CodecContext{}, &p).ok());
  std::vector<float> before(ef.residual().begin(), ef.residual().end());
  CHECK(ef.Compress(*codec, std::vector<float>{1, NAN, 0}, CodecContext{}, &p).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(p.empty());
  CHECK(ef.Compress(*codec, std::vector<float>{1, 2}, CodecContext{}, &p).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(std::vector<float>(ef.residual().begin(), ef.residual().end()) == before);
}

}  // namespace
}  // namespace harrier
