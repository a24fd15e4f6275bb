// The fused pass (server/fused_apply.h) against the two-pass reference it
// replaces: Crc32c, the finiteness/limit check on the bits, then
// Optimizer::Step or the round sum's loop. Bit for bit, for every size,
// thread count and kernel.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/crc32c.h"
#include "common/parallel_for.h"
#include "server/fused_apply.h"
#include "server/optimizer.h"

namespace harrier {
namespace {

constexpr uint32_t kLimit = (127u + 40u) << 23;  // 2^40, as the shard's

bool ReferenceWithin(const std::vector<float>& g) {
  for (float v : g) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if ((bits & 0x7f800000u) >= kLimit) return false;
  }
  return true;
}

std::vector<float> Random(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-spread, spread);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty vector.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

FusedResult Run(const FusedArgs& args, ParallelForPool* pool, int threads) {
  // min_parallel_bytes 0: every size splits, so 4099 elements take 1 part
  // and 1M + 5 several.
  return FusedApplyParallel(args, pool, threads, 0);
}

TEST_CASE("fused pass: bit-identical to CRC + check + Optimizer::Step and the round sum") {
  ParallelForPool pool(3);
  OptimizerOptions options;
  options.lr = 0.037f;
  options.weight_decay = 0.01f;
  auto sgd = *CreateOptimizer(options);
  for (bool scalar : {false, true}) {
    SetFusedScalarForTesting(scalar);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{(1u << 20) + 5}}) {
      for (int threads : {1, 2, 3}) {
        CAPTURE(scalar, n, threads);
        const std::vector<float> g = Random(n, 1 + n, 3.0f);
        const std::vector<float> w = Random(n, 2 + n, 1.0f);
        const uint32_t crc = Crc32c(g.data(), n * 4);

        FusedArgs args;
        args.gradient = g.data();
        args.n = n;
        args.limit_bits = kLimit;
        args.step = FusedStep::kCheck;
        FusedResult check = Run(args, &pool, threads);
        CHECK(check.crc == crc);
        CHECK(check.within);

        std::vector<float> expect = w;
        OptimizerState state;
        sgd->Step(absl::MakeSpan(expect), absl::MakeConstSpan(g), 0.5f, state);
        std::vector<float> out(n, -1.0f);
        args.step = FusedStep::kSgd;
        args.base = w.data();
        args.out = out.data();
        args.lr = options.lr;
        args.scale = 0.5f;
        args.weight_decay = options.weight_decay;
        FusedResult step = Run(args, &pool, threads);
        CHECK(step.crc == crc);
        CHECK(step.within);
        CHECK(SameBits(out, expect));

        std::vector<float> sum = w;
        for (size_t i = 0; i < n; ++i) sum[i] += g[i];
        args.step = FusedStep::kAdd;
        CHECK(Run(args, &pool, threads).crc == crc);
        CHECK(SameBits(out, sum));

        args.step = FusedStep::kCopy;
        std::fill(out.begin(), out.end(), 0.0f);
        CHECK(Run(args, &pool, threads).crc == crc);
        CHECK(SameBits(out, g));
      }
    }
  }
  SetFusedScalarForTesting(false);
}

TEST_CASE("fused pass: a bad element anywhere is seen, first and last included") {
  ParallelForPool pool(3);
  const size_t n = (1u << 20) + 5;
  for (bool scalar : {false, true}) {
    SetFusedScalarForTesting(scalar);
    for (size_t at : {size_t{0}, size_t{4098}, n / 2, n - 6, n - 1}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(), -std::ldexp(1.0f, 40),
                        std::ldexp(1.0f, 40)}) {
        for (int threads : {1, 3}) {
          CAPTURE(scalar, at, bad, threads);
          std::vector<float> g = Random(n, 7, 1.0f);
          // Just below 2^40 passes.
          g[at] = std::nextafter(std::ldexp(1.0f, 40), 0.0f);
          FusedArgs args;
          args.gradient = g.data();
          args.n = n;
          args.limit_bits = kLimit;
          CHECK(Run(args, &pool, threads).within);
          g[at] = bad;
          const FusedResult result = Run(args, &pool, threads);
          CHECK_FALSE(result.within);
          CHECK(result.crc == Crc32c(g.data(), n * 4));
        }
      }
    }
  }
  SetFusedScalarForTesting(false);
}

TEST_CASE("fused pass: the CRC sees a flip in the very last byte") {
  ParallelForPool pool(3);
  const size_t n = (1u << 20) + 5;
  std::vector<float> g = Random(n, 9, 1.0f);
  const uint32_t before = Crc32c(g.data(), n * 4);
  reinterpret_cast<unsigned char*>(g.data())[n * 4 - 1] ^= 1;
  FusedArgs args;
  args.gradient = g.data();
  args.n = n;
  for (int threads : {1, 2, 3}) CHECK(Run(args, &pool, threads).crc != before);
}

}  // namespace
}  // namespace harrier
