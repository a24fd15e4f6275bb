// The fused pass (server/fused_apply.h) against the two-pass reference it
// replaces: Crc32c, the finiteness/limit check on the bits, then
// Optimizer::Step or the round sum's loop. Bit for bit, for every size,
// thread count and kernel.

#include "server/fused_apply.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/crc32c.h"
#include "common/parallel_for.h"
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

// `bytes` cut at random points, a float often split over two pieces, with
// empty and one-byte pieces among them.
std::vector<absl::string_view> Cut(absl::string_view bytes, uint32_t seed, size_t max_piece) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> length(0, max_piece);
  std::vector<absl::string_view> pieces;
  size_t at = 0;
  while (at < bytes.size()) {
    size_t take = std::min(length(rng), bytes.size() - at);
    if (pieces.size() % 7 == 3) take = std::min<size_t>(1, bytes.size() - at);
    pieces.push_back(bytes.substr(at, take));
    at += take;
  }
  pieces.push_back(absl::string_view());
  return pieces;
}

TEST_CASE("fused pass: a payload split over pieces gives the contiguous results bit for bit") {
  ParallelForPool pool(3);
  for (bool scalar : {false, true}) {
    SetFusedScalarForTesting(scalar);
    for (size_t n : {size_t{1}, size_t{4099}, size_t{(1u << 20) + 5}}) {
      // Pieces up to about a gRPC read slice (64 KiB: blocks within one
      // piece are read in place, the others gathered), up to 16 KiB (nearly
      // every block gathered) and tiny ones.
      for (size_t max_piece : {size_t{65536 + 3}, size_t{16384 + 9}, size_t{37}}) {
        if (max_piece < 100 && n > 5000) continue;  // a million tiny pieces tell nothing new
        for (int threads : {1, 3}) {
          CAPTURE(scalar, n, max_piece, threads);
          const std::vector<float> g = Random(n, 11 + n, 3.0f);
          const std::vector<float> w = Random(n, 12 + n, 1.0f);
          // The payload at an odd address, as a frame's bytes may be.
          std::string storage(n * 4 + 1, '\0');
          std::memcpy(&storage[1], g.data(), n * 4);
          const std::vector<absl::string_view> pieces =
              Cut(absl::string_view(storage).substr(1), static_cast<uint32_t>(n + max_piece),
                  max_piece);
          for (FusedStep step :
               {FusedStep::kCheck, FusedStep::kCopy, FusedStep::kAdd, FusedStep::kSgd}) {
            CAPTURE(static_cast<int>(step));
            FusedArgs whole;
            whole.step = step;
            whole.gradient = g.data();
            whole.n = n;
            whole.limit_bits = kLimit;
            whole.lr = 0.037f;
            whole.scale = 0.5f;
            whole.weight_decay = 0.01f;
            std::vector<float> expect(n, -1.0f), out(n, -2.0f);
            if (step != FusedStep::kCheck) {
              whole.base = step == FusedStep::kCopy ? nullptr : w.data();
              whole.out = expect.data();
            }
            const FusedResult reference = Run(whole, &pool, threads);
            FusedArgs split = whole;
            split.gradient = nullptr;
            split.gradient_pieces = pieces;
            if (step != FusedStep::kCheck) split.out = out.data();
            const FusedResult result = Run(split, &pool, threads);
            CHECK(result.crc == reference.crc);
            CHECK(result.crc == Crc32c(g.data(), n * 4));
            CHECK(result.within);
            if (step != FusedStep::kCheck) CHECK(SameBits(out, expect));
          }
        }
      }
    }
  }
  SetFusedScalarForTesting(false);
}

TEST_CASE("fused pass: a split payload's bad element or flipped byte is seen where it straddles") {
  ParallelForPool pool(3);
  const size_t n = (1u << 20) + 5;
  for (int threads : {1, 3}) {
    std::vector<float> g = Random(n, 13, 1.0f);
    std::string storage(n * 4, '\0');
    std::memcpy(storage.data(), g.data(), n * 4);
    // One piece ends two bytes into element `at`: the element is gathered
    // from two pieces.
    const size_t at = 300000;
    const absl::string_view bytes(storage);
    const std::vector<absl::string_view> pieces = {bytes.substr(0, at * 4 + 2),
                                                   bytes.substr(at * 4 + 2)};
    FusedArgs args;
    args.gradient_pieces = pieces;
    args.n = n;
    args.limit_bits = kLimit;
    CAPTURE(threads);
    CHECK(Run(args, &pool, threads).within);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(&storage[at * 4], &nan, 4);
    FusedResult bad = Run(args, &pool, threads);
    CHECK_FALSE(bad.within);
    g[at] = nan;
    CHECK(bad.crc == Crc32c(g.data(), n * 4));
    storage.back() ^= 1;
    CHECK(Run(args, &pool, threads).crc != bad.crc);
  }
}

}  // namespace
}  // namespace harrier
