#ifndef HARRIER_WORKER_WORKLOAD_REPLAY_H_
#define HARRIER_WORKER_WORKLOAD_REPLAY_H_

// What a replayed model computes: a compute-time model (sleeps standing in
// for a GPU's kernels, during which the CPU is free, as it is while a GPU
// computes), seeded synthetic gradients, and the exact check of the final
// parameters under BSP with SGD.
//
// Why the check can be exact: every value is a small integer times a power
// of two. Initial values are k * 2^-6 (|k| <= 64); worker r's gradient of
// an element is (b + d_r) times c_t, with b in +-[1, 7] shared by all
// workers, deviations d_r that sum to zero over the workers, and c_0 = 2^-6,
// then c_t = -2^-7 on odd and +2^-7 on even steps. The shard's float sum of
// the n pushes is then exact in any order, and so is its division by n: the
// BSP mean is b * c_t. A lost, doubled or foreign push moves the mean off
// b; a lost or extra step moves the sum of the means (c_t is never 0), and
// so does a worker a step ahead or behind (c_0 is used once, never again);
// all show in the final value. After step 0 the signs alternate, so the
// parameters stay within lr * b * 2^-7 of w0 - lr * b * 2^-6 however long
// the run. (An SGD sum cannot see the order of its steps: that is the one
// fault of this kind the check cannot catch.)

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/workload/replay_models.h"

namespace harrier::workload {

// Models a layer's compute (layer_ms * compute_scale) by sleeping, as a GPU
// computes while the host CPU is free. Paces one thread: each layer's time is added to a
// deadline the thread sleeps until, so a short sleep's overshoot (tens of
// microseconds, more on a loaded machine) is taken off the next layer
// instead of adding up over a model's hundred-odd layer phases. A gap of
// more than kRestart since the last deadline is time spent waiting on the
// network, not overshoot: compute then restarts from now. Each Run sleeps
// at most its own layer's time plus what earlier layers still owe.
class ComputePacer {
 public:
  static constexpr double kRestartMs = 1.0;
  explicit ComputePacer(double compute_scale) : scale_(compute_scale) {}
  void Run(double layer_ms);

 private:
  double scale_;
  std::chrono::steady_clock::time_point next_{};
};

// Tensors of a spec flattened in forward order: index k is the k-th tensor
// of the first layer that has it; this is also its comm priority.
std::vector<const ReplayTensor*> FlattenTensors(const ReplayModelSpec& spec);

// The initial value of element `index` of tensor `tensor` (every worker
// computes the same ones, so whoever registers first initialises the same
// model).
float ReplayInitialValue(uint64_t seed, int tensor, int64_t index);
std::vector<float> ReplayInitialValues(uint64_t seed, int tensor, int64_t num_elements);

// The BSP mean of the workers' gradients of an element at `step` (the same
// for any number of workers).
float ReplayMeanGradient(uint64_t seed, int tensor, int64_t index, int64_t step);

// The value of an element after `steps` BSP steps of the shard's SGD
// (w -= lr * mean, in float, as server/optimizer.cc computes it with no
// weight decay) from its initial value.
float ExpectedReplayValue(uint64_t seed, int tensor, int64_t index, int64_t steps, float lr);

// One worker's gradients of every tensor, generated once (a VGG-16 is 138 M
// floats: generating them per step would cost more than the modelled
// compute) as three buffers: step 0's, the odd steps' and the later even
// steps'.
class ReplayGradients {
 public:
  // INVALID_ARGUMENT unless 0 <= rank < num_workers.
  static absl::StatusOr<ReplayGradients> Create(const ReplayModelSpec& spec, uint64_t seed,
                                                int rank, int num_workers);
  // Tensor `tensor`'s gradient at `step`: valid as long as this object.
  absl::Span<const float> Get(int tensor, int64_t step) const;
  int num_tensors() const { return static_cast<int>(first_.size()); }

 private:
  ReplayGradients() = default;
  std::vector<std::vector<float>> first_;
  std::vector<std::vector<float>> odd_;
  std::vector<std::vector<float>> even_;
};

struct ReplayCheckOptions {
  int64_t steps = 0;        // BSP steps every worker ran (warmup included)
  float lr = 0.01f;         // the shards' SGD learning rate
  // Tensors up to this many elements are checked whole; larger ones at
  // `samples` positions spread over the tensor, first and last included.
  int64_t check_all_below = 4096;
  int64_t samples = 1024;
};

// Checks `parameters[k]` (tensor k in FlattenTensors order) against
// ExpectedReplayValue, bit for bit. DATA_LOSS naming the tensor, the
// element, the expected and the actual value at the first mismatch;
// INVALID_ARGUMENT when sizes disagree with the spec.
absl::Status CheckReplayParameters(const ReplayModelSpec& spec, uint64_t seed,
                                   const std::vector<absl::Span<const float>>& parameters,
                                   const ReplayCheckOptions& options);

// The end-of-run figures of a replayed model, for harrier-worker and the
// all-reduce baseline alike (one `replay_summary` line format for both).
struct ReplaySummary {
  std::string model;
  std::string techniques;
  std::string sync;  // the shards' consistency model: bsp, ssp, asp or local
  double compute_scale = 1.0;
  int rank = 0;
  int workers = 0;
  int shards = 0;
  int64_t steps = 0;          // timed
  int64_t warmup_steps = 0;
  double iter_ms = 0;         // mean wall time of a timed step
  // Each timed step's wall time, from its start to the next one's (the
  // last: to the end, its pushes and the pulls after them drained). Through
  // the comm scheduler a step starts when its first parameters are in.
  std::vector<double> step_ms;
  double compute_ms = 0;      // modelled compute of one step at compute_scale
  int64_t bytes_pushed_per_iter = 0;
  int64_t bytes_pulled_per_iter = 0;
  int64_t bytes_per_iter = 0;
  bool checked = false;       // the exact check ran and passed
  // This worker's payload bytes pushed to each shard per step, in shard
  // order: how evenly the shards' links are loaded.
  std::vector<int64_t> bytes_pushed_per_shard_per_iter;
  std::vector<int64_t> bytes_pulled_per_shard_per_iter;
  // CPU (user + system, every thread) this process spent per timed step.
  double cpu_seconds_per_iter = 0;
  // The timed steps' span on the steady clock (CLOCK_MONOTONIC, the same in
  // every process of the machine), so that a bench can take the shards' CPU
  // over the same span.
  int64_t timed_start_monotonic_ns = 0;
  int64_t timed_end_monotonic_ns = 0;
  // The comm scheduler's forward-order tail (CommSchedulerStats): the one
  // planned (0: none), and this worker's own estimate where the workers
  // measured it (-1: not measured).
  double forward_order_tail = 0;
  double measured_forward_order_tail = -1;
};

// `replay_summary {...}`: one line, no newline, the JSON object's fields in
// the order the overlap bench reads them in.
std::string FormatReplaySummary(const ReplaySummary& summary);

}  // namespace harrier::workload

#endif  // HARRIER_WORKER_WORKLOAD_REPLAY_H_
