// The 13 codecs of the survey's grid by name (harrier-bench convergence's
// --codecs, contract B; harrier-advise's --codecs), with the push spec and
// the pull codec each runs with. One table, so the bench trains and the
// advisor times the same codecs.
#ifndef HARRIER_COMMON_CODEC_SURVEY_CODECS_H_
#define HARRIER_COMMON_CODEC_SURVEY_CODECS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace harrier {

struct SurveyCodec {
  std::string name;        // none, fp16, topk, ...
  std::string push_spec;   // a codec spec (codec.h), e.g. topk:ratio=0.01
  std::string pull_spec;   // the pull codec with compressed pulls
};

// In the grid's order: none fp16 topk randomk dgc qsgd4 qsgd8 terngrad
// signsgd efsign signum onebit powersgd2.
const std::vector<SurveyCodec>& SurveyCodecs();

// nullptr for a name not in the table.
const SurveyCodec* FindSurveyCodec(absl::string_view name);

}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_SURVEY_CODECS_H_
