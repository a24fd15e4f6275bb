#include "common/codec/pull_pairing.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace harrier {

CodecSpec PairedPullSpec(const CodecSpec& push) {
  CodecSpec pull;
  switch (push.id) {
    case CodecId::kNone:
    case CodecId::kFp16:
    case CodecId::kBf16:
    case CodecId::kOneBit:
    case CodecId::kEfSign:
      pull.id = push.id;
      break;
    case CodecId::kTopK:
    case CodecId::kRandomK:
      pull.id = CodecId::kTopK;
      pull.ratio = push.ratio;
      break;
    case CodecId::kThreshold:
      pull.id = CodecId::kTopK;
      pull.ratio = push.fixed_tau ? 0.01 : push.ratio;
      break;
    case CodecId::kQsgd: {
      pull.id = CodecId::kQsgd;
      pull.levels = push.levels;
      const uint64_t squared = static_cast<uint64_t>(push.levels) * push.levels;
      pull.bucket = static_cast<uint32_t>(std::min<uint64_t>(push.bucket, squared));
      break;
    }
    case CodecId::kTernGrad:
    case CodecId::kSign:
    case CodecId::kSignum:
      pull.id = CodecId::kEfSign;
      break;
    case CodecId::kPowerSgd:
      pull.id = CodecId::kPowerSgd;
      pull.rank = push.rank;
      break;
  }
  return pull;
}

absl::StatusOr<std::string> ResolvePullCodec(absl::string_view push_codec,
                                             absl::string_view pull_codec) {
  if (pull_codec != kPairedPullCodec) return std::string(pull_codec);
  auto push = CodecSpec::Parse(push_codec);
  if (!push.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull codec 'paired': push codec: ", push.status().message()));
  }
  return PairedPullSpec(*push).ToString();
}

}  // namespace harrier
