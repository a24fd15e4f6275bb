#include "common/codec/codec_backend.h"

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

}  // namespace harrier
