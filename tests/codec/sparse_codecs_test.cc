// top-k, random-k, threshold and the DGC momentum-correction helper.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/error_feedback.h"
#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace {

using testing::MakeCodec;
using testing::MustDecode;
using testing::MustEncode;
using testing::RandomGradient;

std::vector<uint32_t> NonZeroIndices(const std::vector<float>& v) {
  std::vector<uint32_t> idx;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0.0f) idx.push_back(static_cast<uint32_t>(i));
  }
  return idx;
}

// The first k of a full stable sort by descending abs value.
std::vector<uint32_t> SortTopK(const std::vector<float>& g, size_t k) {
  std::vector<uint32_t> order(g.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(g[a]) > std::fabs(g[b]);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST_CASE("topk keeps exactly the full sort's index set and is contractive",
          "[topk]") {
  for (size_t d : {1, 7, 100, 1000, 50000}) {
    for (double ratio : {0.001, 0.01, 0.1, 0.5, 0.99}) {
      INFO("d=" << d << " ratio=" << ratio);
      auto codec = MakeCodec("topk:ratio=" + std::to_string(ratio));
      std::vector<float> g = RandomGradient(d, d + 1);
      for (float& v : g) if (v == 0.0f) v = 1e-3f;  // keep zero meaning "not sent"
      std::string p = MustEncode(*codec, g);
      size_t k = std::max<size_t>(1, std::min<size_t>(d, std::llround(ratio * d)));
      CHECK(p.size() == 24 + 8 * k);
      std::vector<float> dec = MustDecode(*codec, p, d);
      std::vector<uint32_t> sent = NonZeroIndices(dec);
      CHECK(sent == SortTopK(g, k));
      for (uint32_t i : sent) CHECK(dec[i] == g[i]);
      CHECK(testing::DiffNorm2Sq(dec, g) <=
            (1.0 - static_cast<double>(k) / d) * testing::Norm2Sq(g) + 1e-12);
    }
  }
}

TEST_CASE("topk breaks ties toward the lower index", "[topk]") {
  auto codec = MakeCodec("topk:ratio=0.3");  // k = 3 of 10
  std::vector<float> g = {1, -2, 2, 0.5, -2, 2, 1, 1, 0, 2};
  std::vector<float> dec = MustDecode(*codec, MustEncode(*codec, g), 10);
  CHECK(NonZeroIndices(dec) == std::vector<uint32_t>{1, 2, 4});
  // Many equal values: still the lowest indices, with the sampled threshold.
  std::vector<float> flat(10000, 0.25f);
  flat[9999] = -1.0f;
  auto codec2 = MakeCodec("topk:ratio=0.01");
  std::vector<float> dec2 = MustDecode(*codec2, MustEncode(*codec2, flat), flat.size());
  CHECK(NonZeroIndices(dec2) == SortTopK(flat, 100));
  CHECK(dec2[9999] == -1.0f);
}

TEST_CASE("topk ratio=1 and randomk ratio=1 reproduce the input exactly",
          "[degenerate]") {
  std::vector<float> g = RandomGradient(777, 12);
  for (const char* spec : {"topk:ratio=1", "randomk:ratio=1",
                           "randomk:ratio=1,scale=0", "threshold:tau=0"}) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    CHECK(testing::BitwiseEqual(MustDecode(*codec, MustEncode(*codec, g, 3), g.size()), g));
  }
}

TEST_CASE("randomk draws k distinct indices reproducibly from the seed",
          "[randomk]") {
  auto codec = MakeCodec("randomk:ratio=0.05,scale=0");
  std::vector<float> g = RandomGradient(2000, 13);
  for (float& v : g) if (v == 0.0f) v = 1.0f;
  std::string a = MustEncode(*codec, g, DeriveSeed("w", 0, 3, 1, 0));
  std::string b = MustEncode(*codec, g, DeriveSeed("w", 0, 3, 1, 0));
  std::string c = MustEncode(*codec, g, DeriveSeed("w", 0, 4, 1, 0));
  CHECK(a == b);
  CHECK(a != c);
  std::vector<float> dec = MustDecode(*codec, a, g.size());
  std::vector<uint32_t> idx = NonZeroIndices(dec);
  CHECK(idx.size() == 100);
  for (uint32_t i : idx) CHECK(dec[i] == g[i]);
  // Roughly uniform coverage over many seeds.
  std::vector<int> hits(g.size(), 0);
  for (uint64_t s = 0; s < 400; ++s) {
    for (uint32_t i : NonZeroIndices(MustDecode(*codec, MustEncode(*codec, g, s), g.size()))) {
      ++hits[i];
    }
  }
  // Expected 20 hits per element; no element is never or always chosen.
  CHECK(*std::min_element(hits.begin(), hits.end()) > 2);
  CHECK(*std::max_element(hits.begin(), hits.end()) < 50);
}

TEST_CASE("scaled randomk is unbiased with variance (d/k - 1) norm^2",
          "[randomk][unbiased]") {
  const size_t d = 200, n = 4000;
  auto codec = MakeCodec("randomk:ratio=0.1");
  const double omega = 200.0 / 20.0 - 1.0;
  std::vector<float> g = RandomGradient(d, 14);
  std::vector<double> mean(d, 0.0);
  double var = 0.0;
  for (size_t t = 0; t < n; ++t) {
    std::vector<float> c = MustDecode(*codec, MustEncode(*codec, g, t), d);
    for (size_t i = 0; i < d; ++i) mean[i] += c[i] / static_cast<double>(n);
    var += testing::DiffNorm2Sq(c, g) / n;
  }
  double norm2 = testing::Norm2Sq(g), err = 0.0;
  for (size_t i = 0; i < d; ++i) err += (mean[i] - g[i]) * (mean[i] - g[i]);
  CHECK(std::sqrt(err) <= 3.0 * std::sqrt(omega / n) * std::sqrt(norm2));
  // Equality holds in expectation for random-k; allow Monte-Carlo noise.
  CHECK(var <= omega * norm2 * 1.05);
  CHECK(var >= omega * norm2 * 0.95);
}

TEST_CASE("threshold with estimated tau sends about ratio * d", "[threshold]") {
  auto codec = MakeCodec("threshold:sample=0.05,ratio=0.01");
  std::vector<float> g = RandomGradient(100000, 15);
  std::vector<float> dec = MustDecode(*codec, MustEncode(*codec, g, 5), g.size());
  std::vector<uint32_t> idx = NonZeroIndices(dec);
  CHECK(idx.size() > 500);
  CHECK(idx.size() < 2000);
  float smallest_sent = 1e30f;
  for (uint32_t i : idx) {
    CHECK(dec[i] == g[i]);
    smallest_sent = std::min(smallest_sent, std::fabs(g[i]));
  }
  // Everything not sent is below everything sent: a threshold, not a sample.
  for (size_t i = 0; i < g.size(); ++i) {
    if (dec[i] == 0.0f) CHECK(std::fabs(g[i]) < smallest_sent);
  }
  // All-zero gradient sends nothing.
  std::string p = MustEncode(*codec, std::vector<float>(1000, 0.0f));
  CHECK(p.size() == 24);
}

TEST_CASE("DGC momentum correction accumulates and clears sent entries",
          "[threshold][dgc]") {
  auto codec = MakeCodec("threshold:tau=1.5");
  DgcMomentumCorrection dgc(4, 0.5f);
  std::string p;
  REQUIRE(dgc.Compress(*codec, std::vector<float>{1, -1, 0.25f, 2}, CodecContext{}, &p).ok());
  // u = g; v = g; only element 3 (2 > 1.5) is sent.
  CHECK(MustDecode(*codec, p, 4) == std::vector<float>{0, 0, 0, 2});
  CHECK(std::vector<float>(dgc.velocity().begin(), dgc.velocity().end()) ==
        std::vector<float>{1, -1, 0.25f, 0});
  CHECK(std::vector<float>(dgc.accumulation().begin(), dgc.accumulation().end()) ==
        std::vector<float>{1, -1, 0.25f, 0});
  REQUIRE(dgc.Compress(*codec, std::vector<float>{1, 0, 0, 0}, CodecContext{}, &p).ok());
  // u = 0.5 u + g = {1.5, -0.5, 0.125, 0}; v += u = {2.5, -1.5, 0.375, 0}.
  CHECK(MustDecode(*codec, p, 4) == std::vector<float>{2.5f, 0, 0, 0});
  CHECK(std::vector<float>(dgc.velocity().begin(), dgc.velocity().end()) ==
        std::vector<float>{0, -0.5f, 0.125f, 0});
  CHECK(std::vector<float>(dgc.accumulation().begin(), dgc.accumulation().end()) ==
        std::vector<float>{0, -1.5f, 0.375f, 0});
  // Size mismatch is refused without touching state.
  CHECK(dgc.Compress(*codec, std::vector<float>{1, 2}, CodecContext{}, &p).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dgc.accumulation()[1] == -1.5f);
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

// What an encoder keeps between calls is what a shard charges to its memory
// account for each rank's pull encoder (server/pull_views.h).
TEST_CASE("RetainedBytes says what an encoder keeps between calls", "[topk]") {
  const std::vector<float> g = testing::RandomGradient(100000, 7);
  auto fp16 = testing::MakeCodec("fp16");
  testing::MustEncode(*fp16, g);
  CHECK(fp16->RetainedBytes() == 0);
  for (const char* spec : {"topk:ratio=0.01", "randomk:ratio=0.01", "threshold:tau=0.5"}) {
    INFO(spec);
    auto codec = testing::MakeCodec(spec);
    CHECK(codec->RetainedBytes() == 0);
    testing::MustEncode(*codec, g);
    const uint64_t kept = codec->RetainedBytes();
    CHECK(kept > 0);
    // Reused, not grown, by the next call of the same size.
    testing::MustEncode(*codec, g);
    CHECK(codec->RetainedBytes() == kept);
  }
  // PowerSGD keeps its warm-start factor Q: columns x rank floats.
  auto powersgd = testing::MakeCodec("powersgd:rank=4,cols=100");
  testing::MustEncode(*powersgd, g);
  CHECK(powersgd->RetainedBytes() == 100 * 4 * sizeof(float));
}

}  // namespace
}  // namespace harrier
