// Worker-side error feedback and DGC momentum correction.
//
// ErrorFeedback keeps the residual e of one tensor chunk and compresses
//   c = g + e;  p = C(c);  e = c - D(p)
// all in fp32, so that g + e_old = D(p) + e_new up to the single rounding of
// the subtraction (and bit-exactly wherever D(p)_i is 0, equals c_i, or is
// within a factor of two of c_i, which covers sparse codecs and casts).
//
// Ownership and threads: one object per (tensor, chunk) stream, used by one
// thread at a time, like the Codec it is used with. The residual survives
// re-bucketing because the caller keys these objects by tensor and chunk.

#ifndef HARRIER_COMMON_CODEC_ERROR_FEEDBACK_H_
#define HARRIER_COMMON_CODEC_ERROR_FEEDBACK_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec/codec.h"

namespace harrier {

class ErrorFeedback {
 public:
  // A zero residual of num_elements.
  explicit ErrorFeedback(size_t num_elements);

  // p = C(g + e); e = (g + e) - D(p). grad.size() must equal
  // num_elements(). On error (size mismatch, non-finite g + e, codec
  // failure) the residual is unchanged and *payload is empty.
  absl::Status Compress(Codec& codec, absl::Span<const float> grad,
                        const CodecContext& ctx, std::string* payload);

  size_t num_elements() const { return residual_.size(); }
  absl::Span<const float> residual() const { return residual_; }
  absl::Span<float> mutable_residual() { return absl::MakeSpan(residual_); }
  void Reset();

 private:
  std::vector<float> residual_;
  std::vector<float> corrected_;  // scratch: g + e
  std::vector<float> decoded_;    // scratch: D(p)
};

// Deep Gradient Compression momentum correction (Lin et al., ICLR 2018),
// meant for the threshold and top-k codecs (the client uses it for
// `threshold:...,momentum=M`, see codec_spec.cc):
//   u = momentum * u + g;  v = v + u;  p = C(v);
//   v = v - D(p);  u_i = 0 where D(p)_i != 0.
// For a sparse codec D(p)_i is either 0 or exactly v_i, so v becomes 0 where
// an element was sent, as in the paper. (A sent element whose value is
// exactly 0 cannot be told apart; its u is kept, which is harmless.)
// Same ownership and thread rules as ErrorFeedback.
class DgcMomentumCorrection {
 public:
  DgcMomentumCorrection(size_t num_elements, float momentum);

  absl::Status Compress(Codec& codec, absl::Span<const float> grad,
                        const CodecContext& ctx, std::string* payload);

  float momentum() const { return momentum_; }
  size_t num_elements() const { return velocity_.size(); }
  absl::Span<const float> velocity() const { return velocity_; }        // u
  absl::Span<const float> accumulation() const { return accumulation_; }  // v
  void Reset();

 private:
  float momentum_;
  std::vector<float> velocity_;
  std::vector<float> accumulation_;
  std::vector<float> next_u_;   // scratch
  std::vector<float> next_v_;   // scratch
  std::vector<float> decoded_;  // scratch
};

}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_ERROR_FEEDBACK_H_
