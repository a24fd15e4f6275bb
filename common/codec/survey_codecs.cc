#include "common/codec/survey_codecs.h"

namespace harrier {

const std::vector<SurveyCodec>& SurveyCodecs() {
  // Dense and quantised codecs pull fp16 (half the bytes, and the shard's
  // pull views carry its rounding over); sparse ones pull the top 10 % of
  // the change since the worker's view.
  static const auto* codecs = new std::vector<SurveyCodec>{
      {"none", "none", "fp16"},
      {"fp16", "fp16", "fp16"},
      {"topk", "topk:ratio=0.01", "topk:ratio=0.1"},
      // Unscaled: the client keeps what was not sent in its error feedback,
      // as for top-k; the scaled, unbiased form multiplies each sent value
      // by 100 at 1 %.
      {"randomk", "randomk:ratio=0.01,scale=0", "topk:ratio=0.1"},
      {"dgc", "threshold:sample=0.01,ratio=0.01,momentum=0.9", "topk:ratio=0.1"},
      {"qsgd4", "qsgd:levels=7,bucket=512", "fp16"},
      {"qsgd8", "qsgd:levels=127,bucket=512", "fp16"},
      {"terngrad", "terngrad", "fp16"},
      {"signsgd", "sign:scale=1", "fp16"},
      {"efsign", "efsign", "fp16"},
      {"signum", "signum", "fp16"},
      {"onebit", "onebit", "fp16"},
      {"powersgd2", "powersgd:rank=2", "fp16"},
  };
  return *codecs;
}

const SurveyCodec* FindSurveyCodec(absl::string_view name) {
  for (const SurveyCodec& codec : SurveyCodecs()) {
    if (name == codec.name) return &codec;
  }
  return nullptr;
}

}  // namespace harrier
