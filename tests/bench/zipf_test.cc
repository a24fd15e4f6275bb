// The Zipf sampler of harrier-bench embedding: every draw in [1, n], and
// the frequencies of the first ranks and of the tail against the exact
// probabilities k^-s / H(n, s), for s above, at and below 1 and for a
// support too large for a table of weights.
#include "bench/zipf.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace harrier::bench {
namespace {

// H(n, s) = sum of k^-s for k in [1, n]: exact up to 10^6 terms, then the
// Euler-Maclaurin tail (the integral plus the half end term), whose error is
// far below the sampling noise here.
double Harmonic(uint64_t n, double s) {
  const uint64_t exact = std::min<uint64_t>(n, 1000000);
  double sum = 0;
  for (uint64_t k = exact; k >= 1; --k) sum += std::pow(static_cast<double>(k), -s);
  if (n > exact) {
    const double a = static_cast<double>(exact), b = static_cast<double>(n);
    const double integral = std::fabs(s - 1.0) < 1e-12
                                ? std::log(b / a)
                                : (std::pow(b, 1.0 - s) - std::pow(a, 1.0 - s)) / (1.0 - s);
    sum += integral - 0.5 * std::pow(a, -s) + 0.5 * std::pow(b, -s);
  }
  return sum;
}

// Draws `draws` ranks of Zipf(n, s) and checks the range, ranks 1-5 and the
// mass above rank 100 against the exact probabilities, each within 5
// standard deviations of a binomial count.
void CheckFrequencies(uint64_t n, double s, int draws) {
  const ZipfSampler zipf(n, s);
  std::mt19937_64 random(42);
  std::vector<uint64_t> counts(6, 0);
  uint64_t tail = 0;
  for (int i = 0; i < draws; ++i) {
    const uint64_t k = zipf.Sample(random);
    REQUIRE(k >= 1);
    REQUIRE(k <= n);
    if (k <= 5) ++counts[k];
    if (k > 100) ++tail;
  }
  const double h = Harmonic(n, s);
  auto check = [&](double count, double p, const char* what) {
    const double expected = draws * p;
    const double sigma = std::sqrt(draws * p * (1.0 - p));
    INFO(what << ": n " << n << " s " << s << " count " << count << " expected " << expected);
    CHECK(std::fabs(count - expected) <= 5.0 * sigma + 1.0);
  };
  for (int k = 1; k <= 5 && static_cast<uint64_t>(k) <= n; ++k) {
    check(static_cast<double>(counts[k]), std::pow(k, -s) / h, "rank");
  }
  if (n > 100) check(static_cast<double>(tail), 1.0 - Harmonic(100, s) / h, "tail above 100");
}

TEST_CASE("Zipf draws follow k^-s / H(n, s)") {
  CheckFrequencies(1000, 1.05, 400000);
  CheckFrequencies(1000000, 1.05, 400000);
  CheckFrequencies(1000, 1.0, 400000);
  CheckFrequencies(1000, 0.5, 400000);
  CheckFrequencies(1000, 2.0, 400000);
}

TEST_CASE("Zipf over 10^8 ids needs no table") {
  CheckFrequencies(100000000, 1.05, 400000);
}

TEST_CASE("Zipf over one id always draws it") {
  const ZipfSampler zipf(1, 1.05);
  std::mt19937_64 random(1);
  for (int i = 0; i < 1000; ++i) REQUIRE(zipf.Sample(random) == 1);
}

}  // namespace
}  // namespace harrier::bench
