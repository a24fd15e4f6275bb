// The 13 codecs of the survey's grid by name (harrier-bench convergence's
// --codecs and runs.jsonl; harrier-advise's --codecs), with the push spec, the
// pull codec and the training settings each ran with. One table, so the
// bench trains, and the advisor times and recommends, the same recipe.
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
  // harrier-server flags that train well with it (the shard's optimizer;
  // local SGD replaces it with the shard's delta optimizer), and any
  // harrier-worker flags the codec needs.
  std::vector<std::string> server_flags;
  std::vector<std::string> worker_flags;
};

// In the grid's order: none fp16 topk randomk dgc qsgd4 qsgd8 terngrad
// signsgd efsign signum onebit powersgd2.
const std::vector<SurveyCodec>& SurveyCodecs();

// nullptr for a name not in the table.
const SurveyCodec* FindSurveyCodec(absl::string_view name);

}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_SURVEY_CODECS_H_
