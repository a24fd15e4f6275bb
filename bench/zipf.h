// Zipf-distributed ranks for synthetic embedding lookups: rank k in
// [1, n] with probability proportional to 1 / k^s, drawn by rejection
// inversion (Hörmann and Derflinger, "Rejection-inversion to generate
// variates from monotone discrete distributions", 1996), so a draw costs
// O(1) time and the sampler O(1) memory whatever n is: 10^8 ids need no
// table of cumulative weights.

#ifndef HARRIER_BENCH_ZIPF_H_
#define HARRIER_BENCH_ZIPF_H_

#include <cstdint>
#include <random>

namespace harrier::bench {

// Not thread-safe (it keeps no state of its own but the generator's, which
// the caller passes in). Requires n >= 1 and s > 0.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s);

  // A rank in [1, n]; rank 1 is the most frequent.
  uint64_t Sample(std::mt19937_64& random) const;

  uint64_t n() const { return n_; }
  double exponent() const { return s_; }

 private:
  double H(double x) const;         // integral of h from 1 to x, shifted
  double h(double x) const;         // x^-s
  double HInverse(double x) const;  // inverse of H

  const uint64_t n_;
  const double s_;
  double h_integral_x1_ = 0;
  double h_integral_n_ = 0;
  double s_bound_ = 0;
};

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_ZIPF_H_
