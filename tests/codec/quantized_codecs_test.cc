// QSGD and TernGrad: unbiasedness and variance bounds by Monte Carlo.

#include <algorithm>
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

struct MonteCarlo {
  double mean_error = 0.0;  // norm(mean of C(g) - g)
  double variance = 0.0;    // mean of norm(C(g) - g)^2
};

MonteCarlo Run(Codec& codec, const std::vector<float>& g, size_t n) {
  std::vector<double> mean(g.size(), 0.0);
  MonteCarlo mc;
  for (size_t t = 0; t < n; ++t) {
    std::vector<float> c =
        MustDecode(codec, MustEncode(codec, g, DeriveSeed("t", 0, t, 0, 1)), g.size());
    for (size_t i = 0; i < g.size(); ++i) mean[i] += c[i] / static_cast<double>(n);
    mc.variance += testing::DiffNorm2Sq(c, g) / n;
  }
  for (size_t i = 0; i < g.size(); ++i) {
    mc.mean_error += (mean[i] - g[i]) * (mean[i] - g[i]);
  }
  mc.mean_error = std::sqrt(mc.mean_error);
  return mc;
}

TEST_CASE("QSGD is unbiased with variance <= min(d/s^2, sqrt(d)/s) norm^2",
          "[qsgd][unbiased]") {
  const size_t d = 256, n = 2000;
  for (uint32_t s : {1u, 4u, 16u}) {
    INFO("levels=" << s);
    // One bucket covering the tensor, so omega uses d.
    auto codec = MakeCodec("qsgd:levels=" + std::to_string(s) + ",bucket=256");
    std::vector<float> g = RandomGradient(d, 21 + s);
    const double omega = std::min(d / double(s * s), std::sqrt(double(d)) / s);
    const double norm = std::sqrt(testing::Norm2Sq(g));
    MonteCarlo mc = Run(*codec, g, n);
    CHECK(mc.mean_error <= 3.0 * std::sqrt(omega / n) * norm);
    CHECK(mc.variance <= omega * norm * norm);
  }
}

TEST_CASE("QSGD with buckets obeys the per-bucket bound", "[qsgd]") {
  const size_t d = 1000, n = 1000, bucket = 64;
  auto codec = MakeCodec("qsgd:levels=8,bucket=64");
  std::vector<float> g = RandomGradient(d, 31);
  const double omega = std::min(bucket / 64.0, std::sqrt(double(bucket)) / 8);
  const double norm = std::sqrt(testing::Norm2Sq(g));
  MonteCarlo mc = Run(*codec, g, n);
  CHECK(mc.mean_error <= 3.0 * std::sqrt(omega / n) * norm);
  CHECK(mc.variance <= omega * norm * norm);
}

TEST_CASE("QSGD values sit on the level grid; zero bucket decodes to zero",
          "[qsgd]") {
  auto codec = MakeCodec("qsgd:levels=4,bucket=4");
  std::vector<float> g = {3.0f, -4.0f, 0.0f, 0.0f, 0, 0, 0, 0};
  std::vector<float> dec = MustDecode(*codec, MustEncode(*codec, g, 5), g.size());
  // norm 5, unit 1.25: |g| = 3 -> level 2 or 3; 4 -> 3 or 4.
  CHECK((dec[0] == 2.5f || dec[0] == 3.75f));
  CHECK((dec[1] == -3.75f || dec[1] == -5.0f));
  for (size_t i = 2; i < 8; ++i) CHECK(dec[i] == 0.0f);
  // Large level counts (>= 128 does not fit int8) work too.
  auto big = MakeCodec("qsgd:levels=1000,bucket=512");
  std::vector<float> r = RandomGradient(1000, 3);
  std::vector<float> back = MustDecode(*big, MustEncode(*big, r), r.size());
  CHECK(testing::DiffNorm2Sq(back, r) < 0.01 * testing::Norm2Sq(r));
}

TEST_CASE("TernGrad without clipping is unbiased", "[terngrad][unbiased]") {
  const size_t d = 256, n = 2000;
  auto codec = MakeCodec("terngrad");
  std::vector<float> g = RandomGradient(d, 41);
  double norm1 = 0.0, max_abs = 0.0;
  for (float v : g) {
    norm1 += std::fabs(v);
    max_abs = std::max(max_abs, double(std::fabs(v)));
  }
  const double norm2 = testing::Norm2Sq(g);
  // E norm(C(g) - g)^2 = sum abs(g_i) (max - abs(g_i)) = max norm1 - norm2^2.
  const double omega = max_abs * norm1 / norm2 - 1.0;
  MonteCarlo mc = Run(*codec, g, n);
  CHECK(mc.mean_error <= 3.0 * std::sqrt(omega / n) * std::sqrt(norm2));
  CHECK(mc.variance <= omega * norm2 * 1.05);
}

TEST_CASE("TernGrad values are 0 or +-scale; clipping shrinks the scale",
          "[terngrad]") {
  std::vector<float> g = RandomGradient(1000, 42);
  g[10] = 50.0f;  // outlier
  auto plain = MakeCodec("terngrad");
  auto clipped = MakeCodec("terngrad:clip=2.5");
  std::vector<float> a = MustDecode(*plain, MustEncode(*plain, g), g.size());
  std::vector<float> b = MustDecode(*clipped, MustEncode(*clipped, g), g.size());
  float sa = 0, sb = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    CHECK((a[i] == 0.0f || std::fabs(a[i]) == 50.0f));
    if (a[i] != 0.0f) CHECK(std::signbit(a[i]) == std::signbit(g[i]));
    sa = std::max(sa, std::fabs(a[i]));
    sb = std::max(sb, std::fabs(b[i]));
  }
  CHECK(sa == 50.0f);
  CHECK(sb < 10.0f);
  CHECK(a[10] == 50.0f);  // probability 1 for the maximum
}

}  // namespace
}  // namespace harrier
