// harrier-advise's cost model: from measured inputs (the link, the codecs'
// speed and bytes on this host, the compute per step) and the steps each
// option needs to reach the target accuracy, a predicted time to target
// per option (sync x codec x pulls), and their ranking. Pure arithmetic:
// no I/O, no clocks, so the unit test checks it with hand-computed cases.
//
// Step time: cpu = compute + codec (one worker's own path), combined with
// the communication per sync mode:
//   bsp     cpu + comm (every worker waits for every other each step, so
//           nothing overlaps).
//   ssp2,   max(cpu, comm): the push and pull of step t run while step
//   asp     t+1 computes (the staleness bound lets the worker go on), so in
//           the steady state the slower of the two sets the pace. A simple
//           bound, not a simulation.
//   local4  as bsp, with codec and comm a quarter: one push and pull of
//           the model's delta every 4 local steps.
// Communication of one round (a push, then a pull):
//   push: max(push_bytes / up, W x push_bytes / (S x up)): each worker's own
//         link, or the shards' links, which carry W / S workers' bytes
//         each: the slower side sets the time; the same for the pull with
//         the down rate; plus kRoundTripsPerRound x rtt.
// Codec time of one round: encode of the push and decode of the pull on
// the worker, and the shard's work for its share of every worker
// (W / S x): a decode of each push and, with compressed pulls, an encode
// of each pull and a decode to advance that worker's view.
// Shared cores (Cluster::colocated_cores = C > 0, one host running every
// worker and shard, as the grid of harrier-bench convergence does): the
// cluster's CPU work of a step, W x (compute + every codec's work of a
// worker's round + the transport's CPU at both ends of each call and byte),
// over C, bounds cpu from below. That is what a 2-core test bed runs into
// at 10 Gbit/s: not the link but the cores that move the bytes.
#ifndef HARRIER_BENCH_ADVISE_COST_MODEL_H_
#define HARRIER_BENCH_ADVISE_COST_MODEL_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace harrier::advise {

// The grid's names (harrier-bench convergence's runs.jsonl), in its order.
const std::vector<std::string>& SyncNames();   // bsp, ssp2, asp, local4
const std::vector<std::string>& CodecNames();  // none, fp16, topk, ...
// The codec spec (common/codec/codec.h) a grid codec name stands for, and
// its pull codec, from the grid's own table (common/codec/survey_codecs.h),
// as this tool measures them when the calibration names none. NOT_FOUND
// naming the known names for another.
absl::StatusOr<std::string> CodecSpecFor(absl::string_view codec);
absl::StatusOr<std::string> PullCodecSpecFor(absl::string_view codec);

// Rounds of communication per step: 1 (bsp, ssp2, asp) or 1/4 (local4).
// INVALID_ARGUMENT for an unknown name.
absl::StatusOr<double> RoundsPerStep(absl::string_view sync);

// A push and a pull per round, each one round trip (the calls of one round
// to every shard go out together).
inline constexpr int kRoundTripsPerRound = 2;

struct Link {
  double up_bytes_per_s = 0;    // this host to a shard
  double down_bytes_per_s = 0;  // a shard to this host
  double rtt_s = 0;
  // CPU seconds one end of a connection spends per byte moved (measured
  // with the probes); counts only when the cluster shares cores.
  double cpu_s_per_byte = 0;
  double cpu_s_per_call = 0;  // and per call, whatever its size
};

struct Cluster {
  int workers = 4;
  int shards = 2;
  // The cores every worker and shard process shares (one host running the
  // whole job, as the grid does); 0: each process has cores of its own.
  int colocated_cores = 0;
};

// One codec (and pull setting) on this host for the whole model, per
// communication round of one worker.
struct CodecCost {
  double push_bytes = 0;     // payload bytes one worker pushes
  double pull_bytes = 0;     // payload bytes one worker pulls (dense or compressed)
  double encode_push_s = 0;  // every chunk's push encode
  double decode_push_s = 0;  // every chunk's decode (one worker's push)
  double encode_pull_s = 0;  // 0 when pulls are dense
  double decode_pull_s = 0;  // 0 when pulls are dense
  int chunks = 0;            // the round's exchanges with the shards (calls)
};

struct StepTerms {
  double compute_s = 0;
  double codec_s = 0;  // per step (local4: a quarter of a round's)
  double comm_s = 0;   // per step, round trips included
  double rtt_s = 0;    // of comm_s, the round trips' share
  // Co-located clusters only (else 0): every process's CPU work of one
  // step (W computes, codecs on both sides, the transport at both ends of
  // every byte) over the shared cores: no step is shorter.
  double cpu_bound_s = 0;
  double step_s = 0;   // as the sync mode combines them
};

// INVALID_ARGUMENT for an unknown sync, a non-positive rate, workers or
// shards, or a negative time.
absl::StatusOr<StepTerms> PredictStep(absl::string_view sync, const CodecCost& codec,
                                      const Link& link, const Cluster& cluster,
                                      double compute_s);

// Steps to the target from a convergence grid: runs.jsonl lines of one
// model, keyed by OptionKey. A run that never reached the target has
// steps_to_target -1.
struct CalibrationRun {
  std::string sync, codec, pulls;  // pulls: "off" | "on"
  std::string codec_spec, pull_codec;
  double link_gbps = 0;
  double steps_to_target = -1;
  double step_s = -1;
  double time_to_target_s = -1;
};
struct Calibration {
  std::string model;
  std::vector<CalibrationRun> runs;  // status ok only
};
std::string OptionKey(absl::string_view sync, absl::string_view codec, absl::string_view pulls);

// Where an option's steps come from.
enum class StepsSource {
  kCalibration,   // the median over the grid's links of steps_to_target
  kNeverReached,  // in the grid, but no run reached the target: ranked last
  kSurveyGuess,   // not in the grid (or no grid): base x survey factors
};
struct StepsEstimate {
  double steps = -1;  // -1 for kNeverReached
  StepsSource source = StepsSource::kSurveyGuess;
  std::string note;   // how it was found, one line
};

// The built-in factors relative to BSP with no compression, from the
// convergence rates Tang et al.'s survey gives (see README.md): steps of an
// option ~ base x SyncFactor x CodecFactor x (pulls on: kCompressedPullFactor).
double SyncFactor(absl::string_view sync);
double CodecFactor(absl::string_view codec);
inline constexpr double kCompressedPullFactor = 1.1;
// The survey's rate behind each factor, for the output ("O(1/sqrt(KT))").
std::string SyncRate(absl::string_view sync);
std::string CodecRate(absl::string_view codec);

// `base_steps`: steps of bsp/none/off when the grid lacks it (the model's
// built-in guess). With a calibration holding bsp/none/off, the guess of an
// option missing from it scales that run's steps instead.
StepsEstimate EstimateSteps(const Calibration* calibration, absl::string_view sync,
                            absl::string_view codec, absl::string_view pulls,
                            double base_steps);

struct OptionResult {
  std::string sync, codec, pulls;
  StepTerms terms;
  StepsEstimate steps;
  double time_to_target_s = -1;  // -1: never reached in the grid
};

// Fills time_to_target_s and sorts: least predicted time first, options
// that never reached the target last (among themselves by step time);
// ties by the grid's order of sync, codec and pulls, so the order is
// deterministic.
void RankOptions(std::vector<OptionResult>* options);

}  // namespace harrier::advise

#endif  // HARRIER_BENCH_ADVISE_COST_MODEL_H_
