#include "common/codec/error_feedback.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace harrier {
namespace {

absl::Status SizeMismatch(absl::string_view who, size_t got, size_t want) {
  return absl::InvalidArgumentError(absl::StrCat(
      who, ": gradient has ", got, " elements, state has ", want));
}

}  // namespace

ErrorFeedback::ErrorFeedback(size_t num_elements)
    : residual_(num_elements, 0.0f),
      corrected_(num_elements),
      decoded_(num_elements) {}

absl::Status ErrorFeedback::Compress(Codec& codec, absl::Span<const float> grad,
                                     const CodecContext& ctx,
                                     std::string* payload) {
  payload->clear();
  const size_t d = residual_.size();
  if (grad.size() != d) return SizeMismatch("ErrorFeedback", grad.size(), d);
  for (size_t i = 0; i < d; ++i) corrected_[i] = grad[i] + residual_[i];
  absl::Status st = codec.Encode(corrected_, ctx, payload);
  if (st.ok()) st = codec.Decode(*payload, absl::MakeSpan(decoded_));
  if (!st.ok()) {
    payload->clear();
    return st;
  }
  for (size_t i = 0; i < d; ++i) residual_[i] = corrected_[i] - decoded_[i];
  return absl::OkStatus();
}

void ErrorFeedback::Reset() {
  std::fill(residual_.begin(), residual_.end(), 0.0f);
}

DgcMomentumCorrection::DgcMomentumCorrection(size_t num_elements,
                                             float momentum)
    : momentum_(momentum),
      velocity_(num_elements, 0.0f),
      accumulation_(num_elements, 0.0f),
      next_u_(num_elements),
      next_v_(num_elements),
      decoded_(num_elements) {}

absl::Status DgcMomentumCorrection::Compress(Codec& codec,
                                             absl::Span<const float> grad,
                                             const CodecContext& ctx,
                                             std::string* payload) {
  payload->clear();
  const size_t d = velocity_.size();
  if (grad.size() != d) {
    return SizeMismatch("DgcMomentumCorrection", grad.size(), d);
  }
  // Work on copies so that a refused encode leaves u and v as they were.
  for (size_t i = 0; i < d; ++i) {
    next_u_[i] = momentum_ * velocity_[i] + grad[i];
    next_v_[i] = accumulation_[i] + next_u_[i];
  }
  absl::Status st = codec.Encode(next_v_, ctx, payload);
  if (st.ok()) st = codec.Decode(*payload, absl::MakeSpan(decoded_));
  if (!st.ok()) {
    payload->clear();
    return st;
  }
  for (size_t i = 0; i < d; ++i) {
    const bool sent = decoded_[i] != 0.0f;
    accumulation_[i] = next_v_[i] - decoded_[i];
    velocity_[i] = sent ? 0.0f : next_u_[i];
  }
  return absl::OkStatus();
}

void DgcMomentumCorrection::Reset() {
  std::fill(velocity_.begin(), velocity_.end(), 0.0f);
  std::fill(accumulation_.begin(), accumulation_.end(), 0.0f);
}

}  // namespace harrier
