// The all-reduce baseline's training loop over a replayed model (the PS
// replay workload's counterpart, DDP-style): per step, forward of every
// layer (modelled compute), backward in reverse producing each layer's
// seeded gradient, buckets handed to a communication thread that ring
// all-reduces each one as soon as it is complete while backward continues,
// and applies SGD with the averaged gradient to the bucket's parameters;
// the next forward waits for every bucket. At the end a sample of the
// parameters is checked exactly against the arithmetic expectation.
//
// Gradients are small integers times 2^-3, so float sums over up to 2^20
// ranks are exact whatever order the ring adds them in; the expectation
// runs the same float operations and must match bit for bit.

#ifndef HARRIER_BENCH_ALLREDUCE_ALLREDUCE_REPLAY_H_
#define HARRIER_BENCH_ALLREDUCE_ALLREDUCE_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/allreduce/bucket_plan.h"
#include "bench/allreduce/gloo_ring.h"

namespace harrier::allreduce {

struct ReplayRunOptions {
  // Bucket cap in bytes (PyTorch DDP's default 25 MiB); 0 = one all-reduce
  // of every gradient after backward.
  int64_t bucket_bytes = 25 << 20;
  // Multiplies every layer's forward_ms and backward_ms.
  double compute_scale = 1.0;
  // Steps run, warm-up included; the first warmup_steps are not timed.
  int steps = 5;
  int warmup_steps = 1;
  float lr = 1.0f / 16;
  uint64_t seed = 1;
  // Bounds every wait: each all-reduce, the wait for the buckets, the
  // communication thread's wait for work.
  absl::Duration timeout = absl::Seconds(120);
  // Elements checked at the end besides the first, middle and last of each
  // bucket.
  int check_samples = 4096;
  // Fault injection for the test that the check catches a broken
  // reduction: this bucket (index in ready order) is never all-reduced,
  // its parameters step with the local gradient alone. -1 = none.
  int fault_skip_bucket = -1;
};

struct ReplayRunResult {
  int steps = 0;
  int warmup_steps = 0;
  int buckets = 0;
  int64_t model_bytes = 0;
  double iter_ms = 0;       // mean wall time of a timed step
  double compute_ms = 0;    // modelled compute of one step at this scale
  // Mean time the next forward waited for the buckets after backward ended:
  // the communication left exposed.
  double exposed_comm_ms = 0;
  // Mean number of buckets per timed step whose all-reduce began before
  // backward ended: 0 means no overlap at all.
  double overlapped_buckets = 0;
  // Mean time per timed step by which forward + backward outlasted the
  // modelled compute: writing the synthetic gradients, sleep overshoot, and
  // this CPU's cores shared with the ring's reductions and copies. Near 0
  // means the replay ran at the modelled speed.
  double compute_overrun_ms = 0;
  std::vector<double> step_ms;  // every step, warm-up included
  // From the algorithm (RingBytesPerRank summed over the buckets).
  int64_t bytes_sent_per_iter = 0;
  int64_t bytes_received_per_iter = 0;
  // Measured over the timed steps: the kernel's TCP_INFO byte counters
  // (bytes acknowledged by the peer, bytes received) summed over this
  // process's sockets, which include gloo's small per-message headers; -1
  // where they cannot be read. Received is complete when the step ends;
  // the last sent segments may still await their acknowledgement, so sent
  // can read up to two segments (2 MiB) per run low.
  int64_t measured_bytes_sent_per_iter = -1;
  int64_t measured_bytes_received_per_iter = -1;
  // CPU (user + system, every thread) per timed step spent on the
  // all-reduce and the SGD step: the process's CPU less the time writing the
  // synthetic gradients, which stands in for backward (a PS worker's replay
  // makes its gradients before the run).
  double cpu_seconds_per_iter = 0;
  double gradient_write_cpu_seconds_per_iter = 0;
  // The timed steps' span on the steady clock (CLOCK_MONOTONIC).
  int64_t timed_start_monotonic_ns = 0;
  int64_t timed_end_monotonic_ns = 0;
  bool checked = false;
  int64_t checked_elements = 0;
  int64_t mismatches = 0;
  std::string first_mismatch;  // empty when checked
};

// Runs options.steps steps over `ring`. An error (a failed or timed-out
// all-reduce, a wait past its deadline) stops the run; a failed check is
// not an error: result.checked is false and first_mismatch says where.
absl::StatusOr<ReplayRunResult> RunAllreduceReplay(const std::vector<LayerShape>& layers,
                                                   GlooRing& ring,
                                                   const ReplayRunOptions& options);

}  // namespace harrier::allreduce

#endif  // HARRIER_BENCH_ALLREDUCE_ALLREDUCE_REPLAY_H_
