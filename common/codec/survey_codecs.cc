#include "common/codec/survey_codecs.h"

namespace harrier {

const std::vector<SurveyCodec>& SurveyCodecs() {
  // Pulls: dense and quantised codecs pull fp16 (half the bytes, and the
  // shard's pull views carry its rounding over); sparse ones the top 10 %
  // of the change since the worker's view. Training: harrier-bench tta's
  // settings where tta has the codec (docs/experiments.md, from 5-epoch
  // runs), the others tuned for the grid from 150-step runs
  // (bench/README.md, "convergence").
  static const auto* codecs = [] {
    const std::vector<std::string> nesterov = {"--optimizer=nesterov", "--lr=0.05",
                                               "--momentum=0.9"};
    const std::vector<std::string> nesterov_08 = {"--optimizer=nesterov", "--lr=0.08",
                                                  "--momentum=0.9"};
    // Sign codecs send a scaled sign, much smaller than g: plain SGD with a
    // large lr, as in Karimireddy et al.
    const std::vector<std::string> sgd_07 = {"--optimizer=sgd", "--lr=0.7"};
    return new std::vector<SurveyCodec>{
        {"none", "none", "fp16", nesterov, {}},
        {"fp16", "fp16", "fp16", nesterov, {}},
        {"topk", "topk:ratio=0.01", "topk:ratio=0.1", nesterov_08, {}},
        // Unscaled: the client keeps what was not sent in its error
        // feedback, as for top-k; the scaled, unbiased form multiplies each
        // sent value by 100 at 1 %.
        {"randomk", "randomk:ratio=0.01,scale=0", "topk:ratio=0.1", nesterov_08, {}},
        // DGC: the momentum lives in the workers' correction (u = 0.9 u + g,
        // v += u), so the shards run plain SGD.
        {"dgc", "threshold:sample=0.01,ratio=0.01,momentum=0.9", "topk:ratio=0.1",
         {"--optimizer=sgd", "--lr=0.15"}, {}},
        {"qsgd4", "qsgd:levels=7,bucket=512", "fp16", nesterov, {}},
        {"qsgd8", "qsgd:levels=127,bucket=512", "fp16", nesterov, {}},
        {"terngrad", "terngrad", "fp16", nesterov, {}},
        {"signsgd", "sign:scale=1", "fp16", sgd_07, {}},
        {"efsign", "efsign", "fp16", sgd_07, {}},
        // The vote is +-1 per element: the lr is the step size itself.
        {"signum", "signum", "fp16", {"--optimizer=sgd", "--lr=0.001"},
         {"--signum_momentum=0.9"}},
        // 1-bit with error feedback, scaled like EF-sign.
        {"onebit", "onebit", "fp16", sgd_07, {}},
        {"powersgd2", "powersgd:rank=2", "fp16", nesterov, {}},
    };
  }();
  return *codecs;
}

const SurveyCodec* FindSurveyCodec(absl::string_view name) {
  for (const SurveyCodec& codec : SurveyCodecs()) {
    if (name == codec.name) return &codec;
  }
  return nullptr;
}

}  // namespace harrier
