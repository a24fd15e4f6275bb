// PowerSGD (single-round): low-rank reconstruction, warm start, fallback.

#include <cmath>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace {

using testing::MakeCodec;
using testing::MustDecode;
using testing::MustEncode;
using testing::RandomGradient;

TEST_CASE("PowerSGD reconstructs a rank-r matrix", "[powersgd]") {
  const size_t m = 32, n = 64;
  std::vector<float> u = RandomGradient(2 * m, 1), v = RandomGradient(2 * n, 2);
  std::vector<float> g(m * n, 0.0f);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      g[i * n + j] = u[i] * v[j] + 0.5f * u[m + i] * v[n + j];
    }
  }
  auto codec = MakeCodec("powersgd:rank=2");
  std::string p = MustEncode(*codec, g, 3);
  CHECK(p.size() == 24 + 4 * 2 * (m + n));
  absl::StatusOr<PayloadHeader> h = PeekPayloadHeader(p);
  CHECK(h->param0 == 2);
  CHECK(h->param1 == m);
  std::vector<float> dec = MustDecode(*codec, p, g.size());
  CHECK(testing::DiffNorm2Sq(dec, g) <= 1e-8 * testing::Norm2Sq(g));
  // P's columns are orthonormal.
  std::vector<float> pm(m * 2);
  std::memcpy(pm.data(), p.data() + 24, 4 * m * 2);
  double d00 = 0, d01 = 0, d11 = 0;
  for (size_t i = 0; i < m; ++i) {
    d00 += pm[2 * i] * pm[2 * i];
    d01 += pm[2 * i] * pm[2 * i + 1];
    d11 += pm[2 * i + 1] * pm[2 * i + 1];
  }
  CHECK(d00 == Approx(1.0).margin(1e-5));
  CHECK(d11 == Approx(1.0).margin(1e-5));
  CHECK(d01 == Approx(0.0).margin(1e-5));
}

TEST_CASE("PowerSGD warm start improves the approximation over calls",
          "[powersgd]") {
  std::vector<float> g = RandomGradient(64 * 64, 7);
  auto codec = MakeCodec("powersgd:rank=1");
  double first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    std::vector<float> dec = MustDecode(*codec, MustEncode(*codec, g, 1), g.size());
    double err = testing::DiffNorm2Sq(dec, g);
    if (step == 0) first = err;
    last = err;
  }
  CHECK(last < first);
  // A fresh codec starts from the same seeded Q: deterministic.
  CHECK(MustEncode(*MakeCodec("powersgd:rank=1"), g, 1) ==
        MustEncode(*MakeCodec("powersgd:rank=1"), g, 1));
}

TEST_CASE("PowerSGD sends small and 1-D chunks uncompressed, exactly",
          "[powersgd][degenerate]") {
  auto codec = MakeCodec("powersgd:rank=2");
  for (size_t d : {1, 7, 13, 16}) {
    INFO("d=" << d);
    std::vector<float> g = RandomGradient(d, d);
    std::string p = MustEncode(*codec, g);
    CHECK(p.size() == 24 + 4 * d);
    CHECK(PeekPayloadHeader(p)->param0 == 0);
    CHECK(testing::BitwiseEqual(MustDecode(*codec, p, d), g));
  }
  // cols that does not divide d falls back too.
  auto cols = MakeCodec("powersgd:rank=1,cols=7");
  std::vector<float> g = RandomGradient(100, 1);
  CHECK(MustEncode(*cols, g).size() == 24 + 400);
}

TEST_CASE("PowerSGD survives an all-zero chunk and recovers", "[powersgd]") {
  auto codec = MakeCodec("powersgd:rank=1");
  std::vector<float> zero(100, 0.0f);
  std::vector<float> dec = MustDecode(*codec, MustEncode(*codec, zero), 100);
  for (float v : dec) CHECK(v == 0.0f);
  // Rank-1 input after the zero step is still reconstructed (Q redrawn).
  std::vector<float> g(100);
  for (size_t i = 0; i < 10; ++i)
    for (size_t j = 0; j < 10; ++j) g[i * 10 + j] = float(i + 1) * float(j) - 3.0f * (i + 1);
  dec = MustDecode(*codec, MustEncode(*codec, g), 100);
  CHECK(testing::DiffNorm2Sq(dec, g) <= 1e-8 * testing::Norm2Sq(g));
}

}  // namespace
}  // namespace harrier
