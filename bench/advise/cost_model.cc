#include "bench/advise/cost_model.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/codec/survey_codecs.h"

namespace harrier::advise {
namespace {

struct CodecEntry {
  const char* name;    // as common/codec/survey_codecs.h, in its order
  double factor;       // steps relative to none (a guess, see README.md)
  const char* rate;    // the survey's rate for the family
};

// Factors: 1 where the survey gives the uncompressed rate outright (fp16,
// 8-bit QSGD), a little above 1 where error feedback restores it
// asymptotically (topk, DGC, EF-sign, onebit, PowerSGD), more where the
// rate carries the codec's variance (QSGD 4-bit, TernGrad, random-k at
// 1 %) or a bias without feedback (signSGD, signum).
const std::vector<CodecEntry>& CodecTable() {
  static const auto* table = new std::vector<CodecEntry>{
      {"none", 1.0, "O(1/sqrt(KT)) (mini-batch SGD)"},
      {"fp16", 1.0, "as SGD (rounding only)"},
      {"topk", 1.15, "O(1/sqrt(KT)) with error feedback"},
      {"randomk", 2.5, "O(sqrt(d/k)/sqrt(KT)): variance x d/k"},
      {"dgc", 1.15, "O(1/sqrt(KT)) with momentum correction"},
      {"qsgd4", 1.2, "O(sqrt(1+min(d/s^2,sqrt(d)/s))/sqrt(KT)), s=7"},
      {"qsgd8", 1.0, "O(sqrt(1+min(d/s^2,sqrt(d)/s))/sqrt(KT)), s=127"},
      {"terngrad", 1.3, "O(1/sqrt(T)) with ternary variance"},
      {"signsgd", 1.6, "O(1/sqrt(T)) under unimodal noise (biased, no feedback)"},
      {"efsign", 1.2, "O(1/sqrt(T)) as SGD, error feedback"},
      {"signum", 1.5, "O(1/sqrt(T)) (momentum, majority vote)"},
      {"onebit", 1.2, "error feedback, as SGD empirically"},
      {"powersgd2", 1.15, "O(1/sqrt(KT)) with error feedback (rank 2)"},
  };
  return *table;
}

struct SyncEntry {
  const char* name;
  double rounds;  // communication rounds per step
  double factor;
  const char* rate;
};

const std::vector<SyncEntry>& SyncTable() {
  static const auto* table = new std::vector<SyncEntry>{
      {"bsp", 1.0, 1.0, "O(1/sqrt(KT))"},
      {"ssp2", 1.0, 1.1, "O(sqrt((s+1)/T)), s=2"},
      {"asp", 1.0, 1.25, "O(1/sqrt(KT)) for staleness O(T^1/4), slower in practice"},
      {"local4", 0.25, 1.15, "O(1/sqrt(KT)) for H <= T^1/4 K^-3/4, H=4"},
  };
  return *table;
}

const CodecEntry* FindCodec(absl::string_view name) {
  for (const CodecEntry& entry : CodecTable()) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

const SyncEntry* FindSync(absl::string_view name) {
  for (const SyncEntry& entry : SyncTable()) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

int IndexOf(const std::vector<std::string>& names, const std::string& name) {
  auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? static_cast<int>(names.size()) : static_cast<int>(it - names.begin());
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

const std::vector<std::string>& SyncNames() {
  static const auto* names = [] {
    auto* out = new std::vector<std::string>;
    for (const SyncEntry& entry : SyncTable()) out->push_back(entry.name);
    return out;
  }();
  return *names;
}

const std::vector<std::string>& CodecNames() {
  static const auto* names = [] {
    auto* out = new std::vector<std::string>;
    for (const CodecEntry& entry : CodecTable()) out->push_back(entry.name);
    return out;
  }();
  return *names;
}

absl::StatusOr<std::string> CodecSpecFor(absl::string_view codec) {
  const SurveyCodec* entry = FindSurveyCodec(codec);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown codec '", codec, "'; the grid's codecs are ",
                                            absl::StrJoin(CodecNames(), ",")));
  }
  return entry->push_spec;
}

absl::StatusOr<std::string> PullCodecSpecFor(absl::string_view codec) {
  const SurveyCodec* entry = FindSurveyCodec(codec);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown codec '", codec, "'; the grid's codecs are ",
                                            absl::StrJoin(CodecNames(), ",")));
  }
  return entry->pull_spec;
}

absl::StatusOr<double> RoundsPerStep(absl::string_view sync) {
  const SyncEntry* entry = FindSync(sync);
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown sync '", sync, "'; the grid's are ", absl::StrJoin(SyncNames(), ",")));
  }
  return entry->rounds;
}

absl::StatusOr<StepTerms> PredictStep(absl::string_view sync, const CodecCost& codec,
                                      const Link& link, const Cluster& cluster,
                                      double compute_s) {
  auto rounds = RoundsPerStep(sync);
  if (!rounds.ok()) return rounds.status();
  if (!(link.up_bytes_per_s > 0) || !(link.down_bytes_per_s > 0)) {
    return absl::InvalidArgumentError("the link's rates must be positive");
  }
  if (cluster.workers < 1 || cluster.shards < 1 || cluster.colocated_cores < 0) {
    return absl::InvalidArgumentError(
        "workers and shards must be at least 1, colocated cores not negative");
  }
  if (!(compute_s >= 0) || !(link.rtt_s >= 0) || codec.push_bytes < 0 || codec.pull_bytes < 0 ||
      codec.encode_push_s < 0 || codec.decode_push_s < 0 || codec.encode_pull_s < 0 ||
      codec.decode_pull_s < 0 || codec.chunks < 0 || link.cpu_s_per_byte < 0 ||
      link.cpu_s_per_call < 0) {
    return absl::InvalidArgumentError("times and byte counts must not be negative");
  }
  const double workers = cluster.workers;
  const double shards = cluster.shards;
  // Each shard link carries its 1/S share of every worker's bytes.
  const double shard_side = workers / shards;
  const double push_s =
      std::max(codec.push_bytes / link.up_bytes_per_s,
               shard_side * codec.push_bytes / link.up_bytes_per_s);
  const double pull_s =
      std::max(codec.pull_bytes / link.down_bytes_per_s,
               shard_side * codec.pull_bytes / link.down_bytes_per_s);
  const double rtt_s = kRoundTripsPerRound * link.rtt_s;
  // A compressed pull costs the shard an encode of the rank's difference
  // and a decode to advance the rank's view (ShardStore::CompressPullLocked),
  // for each of its W / S workers' share.
  const double shard_pull_s =
      codec.encode_pull_s > 0 ? codec.encode_pull_s + codec.decode_pull_s : 0.0;
  const double codec_round_s = codec.encode_push_s + codec.decode_pull_s +
                               shard_side * (codec.decode_push_s + shard_pull_s);

  StepTerms terms;
  terms.compute_s = compute_s;
  terms.codec_s = *rounds * codec_round_s;
  terms.comm_s = *rounds * (push_s + pull_s + rtt_s);
  terms.rtt_s = *rounds * rtt_s;
  if (cluster.colocated_cores > 0) {
    // Both ends of every call and byte run on the shared cores.
    const double transport_round_s =
        2.0 * ((codec.push_bytes + codec.pull_bytes) * link.cpu_s_per_byte +
               codec.chunks * link.cpu_s_per_call);
    const double worker_round_s = codec.encode_push_s + codec.decode_pull_s +
                                  codec.decode_push_s + shard_pull_s + transport_round_s;
    terms.cpu_bound_s =
        workers * (compute_s + *rounds * worker_round_s) / cluster.colocated_cores;
  }
  // The CPU part of a step: one worker's own path, or, on shared cores,
  // the cluster's CPU work over them when that is longer.
  const double cpu_s = std::max(terms.compute_s + terms.codec_s, terms.cpu_bound_s);
  if (sync == "ssp2" || sync == "asp") {
    terms.step_s = std::max(cpu_s, terms.comm_s);
  } else {
    terms.step_s = cpu_s + terms.comm_s;
  }
  return terms;
}

std::string OptionKey(absl::string_view sync, absl::string_view codec, absl::string_view pulls) {
  return absl::StrCat(sync, "/", codec, "/pull", pulls);
}

double SyncFactor(absl::string_view sync) {
  const SyncEntry* entry = FindSync(sync);
  return entry == nullptr ? 1.0 : entry->factor;
}

double CodecFactor(absl::string_view codec) {
  const CodecEntry* entry = FindCodec(codec);
  return entry == nullptr ? 1.0 : entry->factor;
}

std::string SyncRate(absl::string_view sync) {
  const SyncEntry* entry = FindSync(sync);
  return entry == nullptr ? "?" : entry->rate;
}

std::string CodecRate(absl::string_view codec) {
  const CodecEntry* entry = FindCodec(codec);
  return entry == nullptr ? "?" : entry->rate;
}

StepsEstimate EstimateSteps(const Calibration* calibration, absl::string_view sync,
                            absl::string_view codec, absl::string_view pulls,
                            double base_steps) {
  const double guess_factor = SyncFactor(sync) * CodecFactor(codec) *
                              (pulls != "off" ? kCompressedPullFactor : 1.0);
  StepsEstimate estimate;
  std::string base_note = absl::StrFormat("built-in base %.0f steps", base_steps);
  if (calibration != nullptr) {
    std::vector<double> reached, base;
    bool seen = false;
    for (const CalibrationRun& run : calibration->runs) {
      if (run.sync == "bsp" && run.codec == "none" && run.pulls == "off" &&
          run.steps_to_target >= 0) {
        base.push_back(run.steps_to_target);
      }
      if (run.sync != sync || run.codec != codec || run.pulls != pulls) continue;
      seen = true;
      if (run.steps_to_target >= 0) reached.push_back(run.steps_to_target);
    }
    if (!reached.empty()) {
      estimate.steps = Median(reached);
      estimate.source = StepsSource::kCalibration;
      estimate.note = absl::StrFormat("grid: median of %d run(s)", static_cast<int>(reached.size()));
      return estimate;
    }
    if (seen) {
      estimate.source = StepsSource::kNeverReached;
      estimate.note = "grid: never reached the target";
      return estimate;
    }
    if (!base.empty()) {
      base_steps = Median(base);
      base_note = absl::StrFormat("grid's bsp/none/off %.0f steps", base_steps);
    }
  }
  estimate.steps = base_steps * guess_factor;
  estimate.source = StepsSource::kSurveyGuess;
  estimate.note = absl::StrFormat("survey guess: %s x %.2f", base_note, guess_factor);
  return estimate;
}

void RankOptions(std::vector<OptionResult>* options) {
  for (OptionResult& option : *options) {
    option.time_to_target_s = option.steps.source == StepsSource::kNeverReached
                                  ? -1
                                  : option.steps.steps * option.terms.step_s;
  }
  const auto order = [](const OptionResult& o) {
    const bool never = o.steps.source == StepsSource::kNeverReached;
    return std::make_tuple(never, never ? o.terms.step_s : o.time_to_target_s,
                           IndexOf(SyncNames(), o.sync), IndexOf(CodecNames(), o.codec),
                           o.pulls == "off" ? 0 : (o.pulls == "on" ? 1 : 2));
  };
  std::stable_sort(options->begin(), options->end(),
                   [&order](const OptionResult& a, const OptionResult& b) {
                     return order(a) < order(b);
                   });
}

}  // namespace harrier::advise
