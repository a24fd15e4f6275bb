// PowerSGD (Vogels et al., NeurIPS 2019), single-round form.
//
// The d-element chunk is viewed as a row-major m x n matrix M. One power
// iteration from the warm-start Q (n x r): P = M Q, orthonormalise P's
// columns, Q = M^T P; the payload carries both P (m x r) and Q (n x r) and
// decodes to P Q^T. The paper's two-round aggregated protocol (all-reduce P,
// then Q, so that the server sums factors instead of decoding) is NOT
// implemented: here every worker sends its own P and Q and the server
// decodes each payload before averaging.
//
// Shape: with spec cols = N > 0, n = N and m = d / N (when N divides d);
// otherwise m is the largest divisor of d not above sqrt(d). A chunk that
// does not factor usefully (m < 2, or r (m + n) >= d) is sent uncompressed.
//
// Header: param0 = effective rank r (0 = uncompressed), param1 = m.
// Body: P row-major (m x r fp32), then Q row-major (n x r fp32); or, when
// uncompressed, the d fp32 values.
//
// Warm start: the codec keeps Q between calls (one codec per tensor chunk),
// initialised from a normal draw seeded by CodecContext::seed the first time
// and whenever the shape changes.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {

PowerSgdShape ChoosePowerSgdShape(size_t d, uint32_t rank, uint64_t cols) {
  PowerSgdShape s;
  if (d == 0) return s;
  size_t m = 0;
  if (cols > 0) {
    if (d % cols == 0) m = d / cols;
  } else {
    for (size_t c = 1; c * c <= d; ++c) {
      if (d % c == 0) m = c;
    }
  }
  if (m < 2 || d / m < 2) return s;
  size_t n = d / m;
  size_t r = std::min<size_t>(rank, std::min(m, n));
  if (r * (m + n) >= d) return s;
  s.m = m;
  s.n = n;
  s.r = r;
  return s;
}

absl::StatusOr<PowerSgdShape> CheckPowerSgdHeader(const PayloadHeader& header,
                                                  size_t d) {
  constexpr CodecId id = CodecId::kPowerSgd;
  PowerSgdShape s;
  s.r = header.param0;
  s.m = header.param1;
  if (s.r == 0) {
    if (s.m != 0) return Invalid(id, "uncompressed payload with m != 0");
    return s;
  }
  if (s.m < 2 || d % s.m != 0 || d / s.m < 2) {
    return Invalid(id, absl::StrCat("m = ", s.m, " does not divide ", d,
                                    " into a matrix"));
  }
  s.n = d / s.m;
  if (s.r > std::min(s.m, s.n) || s.r > 64) {
    return Invalid(id, absl::StrCat("rank ", s.r, " too large for ", s.m,
                                    " x ", s.n));
  }
  return s;
}

void OrthonormalizeColumns(size_t m, size_t r, double* p) {
  // Modified Gram-Schmidt.
  for (size_t c = 0; c < r; ++c) {
    for (size_t prev = 0; prev < c; ++prev) {
      double dot = 0.0;
      for (size_t i = 0; i < m; ++i) dot += p[i * r + c] * p[i * r + prev];
      for (size_t i = 0; i < m; ++i) p[i * r + c] -= dot * p[i * r + prev];
    }
    double norm = 0.0;
    for (size_t i = 0; i < m; ++i) norm += p[i * r + c] * p[i * r + c];
    norm = std::sqrt(norm);
    double inv = norm > 1e-30 ? 1.0 / norm : 0.0;
    for (size_t i = 0; i < m; ++i) p[i * r + c] *= inv;
  }
}

namespace {

class PowerSgdCodec : public Codec {
 public:
  explicit PowerSgdCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext& ctx,
                      std::string* payload) override {
    const size_t d = input.size();
    const PowerSgdShape s = ChoosePowerSgdShape(d, spec().rank, spec().cols);
    if (s.r == 0) {
      char* body = StartPayload(id(), d, 0, 0, 4 * d, payload);
      if (d) std::memcpy(body, input.data(), 4 * d);
      return absl::OkStatus();
    }
    if (s.m > 0xffffffffu) {
      return Invalid(id(), absl::StrCat("matrix rows ", s.m, " exceed 32 bits"));
    }
    const size_t m = s.m, n = s.n, r = s.r;
    Rng rng(Mix64(ctx.seed, 0x504f574552ULL));
    if (q_.size() != n * r || m_ != m) {
      m_ = m;
      q_.resize(n * r);
      for (float& v : q_) v = static_cast<float>(rng.Normal());
    }
    const float* a = input.data();
    // P = M Q, accumulated in double for a stable orthonormalisation. Each
    // entry is summed over j in order (the CUDA twin's order); four rows at
    // a time give the adder 4r independent chains instead of r. Row ranges
    // run on threads: each owns its rows of P.
    std::vector<double> p(m * r, 0.0);
    const float* qf = q_.data();
    ParallelRanges(m, 4, [&](size_t, size_t i0, size_t i1) {
      size_t i = i0;
      for (; i + 4 <= i1; i += 4) {
        const float* row0 = a + i * n;
        const float* row1 = row0 + n;
        const float* row2 = row1 + n;
        const float* row3 = row2 + n;
        double* p0 = &p[i * r];
        double* p1 = p0 + r;
        double* p2 = p1 + r;
        double* p3 = p2 + r;
        for (size_t j = 0; j < n; ++j) {
          const float* qrow = qf + j * r;
          const double x0 = row0[j], x1 = row1[j], x2 = row2[j], x3 = row3[j];
          for (size_t c = 0; c < r; ++c) {
            const double qc = qrow[c];
            p0[c] += x0 * qc;
            p1[c] += x1 * qc;
            p2[c] += x2 * qc;
            p3[c] += x3 * qc;
          }
        }
      }
      for (; i < i1; ++i) {
        const float* row = a + i * n;
        double* prow = &p[i * r];
        for (size_t j = 0; j < n; ++j) {
          const double x = row[j];
          const float* qrow = qf + j * r;
          for (size_t c = 0; c < r; ++c) prow[c] += x * qrow[c];
        }
      }
    }, d);
    OrthonormalizeColumns(m, r, p.data());
    std::vector<float> pf(p.begin(), p.end());
    // Q = M^T P: entry (j, c) summed over i in order. Accumulated transposed
    // (qt[c][j], contiguous in j) so that the update over a row vectorises;
    // column ranges run on threads, each owning its columns of Q.
    std::vector<double> qt(r * n, 0.0);
    ParallelRanges(n, 8, [&](size_t, size_t j0, size_t j1) {
      for (size_t i = 0; i < m; ++i) {
        const float* row = a + i * n;
        for (size_t c = 0; c < r; ++c) {
          const double pc = pf[i * r + c];
          double* qc = &qt[c * n];
          for (size_t j = j0; j < j1; ++j) {
            qc[j] += static_cast<double>(row[j]) * pc;
          }
        }
      }
    }, d);
    std::vector<double> q(n * r);
    for (size_t c = 0; c < r; ++c) {
      for (size_t j = 0; j < n; ++j) q[j * r + c] = qt[c * n + j];
    }
    char* body = StartPayload(id(), d, static_cast<uint32_t>(r),
                              static_cast<uint32_t>(m), 4 * r * (m + n),
                              payload);
    std::memcpy(body, pf.data(), 4 * m * r);
    for (size_t j = 0; j < n * r; ++j) {
      float v = static_cast<float>(q[j]);
      if (!std::isfinite(v)) {
        return Invalid(id(), "Q overflows fp32");
      }
      q_[j] = v;
      Store<float>(body + 4 * (m * r + j), v);
    }
    // A zero column of Q would stay zero forever under warm start; redraw it.
    for (size_t c = 0; c < r; ++c) {
      bool zero = true;
      for (size_t j = 0; j < n && zero; ++j) zero = q_[j * r + c] == 0.0f;
      if (zero) {
        for (size_t j = 0; j < n; ++j) q_[j * r + c] = static_cast<float>(rng.Normal());
      }
    }
    return absl::OkStatus();
  }

  // The warm-start Q (n x r, row-major); empty before the first Encode.
  const std::vector<float>& warm_start() const { return q_; }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id(), out.size());
    if (!h.ok()) return h.status();
    const size_t d = out.size();
    absl::StatusOr<PowerSgdShape> shape = CheckPowerSgdHeader(*h, d);
    if (!shape.ok()) return shape.status();
    const size_t m = shape->m, n = shape->n, r = shape->r;
    absl::string_view body = payload.substr(kCodecHeaderBytes);
    const size_t floats = r == 0 ? d : r * (m + n);
    absl::Status st = CheckBodySize(id(), body.size(), 4 * floats);
    if (!st.ok()) return st;
    // Copy out of the (possibly unaligned) payload once; this also serves
    // the finiteness check.
    std::vector<float> f(floats);
    if (floats) std::memcpy(f.data(), body.data(), 4 * floats);
    if (!AllFinite(f.data(), floats)) {
      return Invalid(id(), "payload holds NaN or Inf");
    }
    if (r == 0) {
      for (size_t i = 0; i < d; ++i) Emit(out.data(), i, f[i], scale, accumulate);
      return absl::OkStatus();
    }
    const float* p = f.data();
    const float* q = f.data() + m * r;
    // out(i, j) = sum over c in order of P(i, c) Q(j, c) in fp32. Q is
    // transposed once (contiguous in j) so that a row vectorises over j.
    std::vector<float> qt(r * n);
    for (size_t j = 0; j < n; ++j) {
      for (size_t c = 0; c < r; ++c) qt[c * n + j] = q[j * r + c];
    }
    ParallelRanges(m, 1, [&](size_t, size_t i0, size_t i1) {
      std::vector<float> v(n);
      for (size_t i = i0; i < i1; ++i) {
        const float* prow = p + i * r;
        std::fill(v.begin(), v.end(), 0.0f);
        for (size_t c = 0; c < r; ++c) {
          const float pc = prow[c];
          const float* qc = &qt[c * n];
          for (size_t j = 0; j < n; ++j) v[j] += pc * qc[j];
        }
        float* o = out.data() + i * n;
        if (accumulate) {
          for (size_t j = 0; j < n; ++j) o[j] += scale * v[j];
        } else {
          for (size_t j = 0; j < n; ++j) o[j] = scale * v[j];
        }
      }
    }, d);
    return absl::OkStatus();
  }

  uint64_t RetainedBytes() const override { return q_.capacity() * sizeof(float); }

 private:
  size_t m_ = 0;
  std::vector<float> q_;
};

}  // namespace

std::unique_ptr<Codec> CreatePowerSgdCodec(const CodecSpec& spec) {
  if (spec.id != CodecId::kPowerSgd) return nullptr;
  return std::make_unique<PowerSgdCodec>(spec);
}

}  // namespace codec_internal
}  // namespace harrier
