#include "bench/zipf.h"

#include <cmath>

namespace harrier::bench {
namespace {

// log1p(x) / x, and its series near 0 where the quotient loses digits.
double Log1pOverX(double x) {
  if (std::fabs(x) > 1e-8) return std::log1p(x) / x;
  return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

// expm1(x) / x, likewise.
double Expm1OverX(double x) {
  if (std::fabs(x) > 1e-8) return std::expm1(x) / x;
  return 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x));
}

}  // namespace

ZipfSampler::ZipfSampler(uint64_t n, double s) : n_(n), s_(s) {
  h_integral_x1_ = H(1.5) - 1.0;
  h_integral_n_ = H(static_cast<double>(n_) + 0.5);
  s_bound_ = 2.0 - HInverse(H(2.5) - h(2.0));
}

// (x^(1-s) - 1) / (1 - s), written so that s = 1 (log x) needs no case.
double ZipfSampler::H(double x) const {
  const double log_x = std::log(x);
  return Expm1OverX((1.0 - s_) * log_x) * log_x;
}

double ZipfSampler::h(double x) const { return std::exp(-s_ * std::log(x)); }

double ZipfSampler::HInverse(double x) const {
  double t = x * (1.0 - s_);
  if (t < -1.0) t = -1.0;  // rounding at the far end of the support
  return std::exp(Log1pOverX(t) * x);
}

uint64_t ZipfSampler::Sample(std::mt19937_64& random) const {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  while (true) {
    const double u = h_integral_n_ + unit(random) * (h_integral_x1_ - h_integral_n_);
    const double x = HInverse(u);
    double k = std::floor(x + 0.5);
    if (k < 1.0) {
      k = 1.0;
    } else if (k > static_cast<double>(n_)) {
      k = static_cast<double>(n_);
    }
    // Accept at once inside the squeeze, else against the exact hat.
    if (k - x <= s_bound_ || u >= H(k + 0.5) - h(k)) return static_cast<uint64_t>(k);
  }
}

}  // namespace harrier::bench
