#include "common/codec/codec_backend.h"

#include "absl/strings/str_cat.h"

namespace harrier {

absl::string_view MemoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kDevice ? "device" : "host";
}

bool NeedsErrorFeedback(const CodecSpec& spec) {
  switch (spec.id) {
    case CodecId::kTopK:
    case CodecId::kThreshold:
    case CodecId::kEfSign:
    case CodecId::kOneBit:
    case CodecId::kPowerSgd:
      return true;
    case CodecId::kRandomK:
      return !spec.scaled;
    default:
      return false;
  }
}

PushState PushStateFor(const CodecSpec& spec) {
  if (spec.momentum > 0.0) return PushState::kMomentum;
  return NeedsErrorFeedback(spec) ? PushState::kErrorFeedback : PushState::kNone;
}

absl::Status PullMirror::SetDenseFrom(const float* /*values*/, float* /*out*/) {
  return absl::UnimplementedError("this pull mirror takes dense replies from host memory only");
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> CodecBackend::NewBuffer(size_t /*n*/) {
  return absl::UnimplementedError(absl::StrCat("the ", name(), " codec backend has no buffers"));
}

absl::Status CodecBackend::CopyWithin(const float* /*from*/, size_t /*n*/, float* /*to*/) {
  return absl::UnimplementedError(absl::StrCat("the ", name(), " codec backend has no buffers"));
}

}  // namespace harrier
