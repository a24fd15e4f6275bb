#ifndef HARRIER_WORKER_REPLAY_TRAINER_H_
#define HARRIER_WORKER_REPLAY_TRAINER_H_

// The step loop of a replayed model (--workload=replay:NAME): the model's
// real tensors go over the wire with seeded gradients while its compute is
// modelled by sleeps, so a large model's communication runs for real on a
// CPU machine and its final parameters are checked exactly.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"
#include "worker/workload/replay.h"
#include "worker/workload/replay_models.h"

namespace harrier {

struct ReplayTrainerOptions {
  double compute_scale = 1.0;   // multiplies every layer's modelled time
  int64_t steps = 5;            // timed steps
  int64_t warmup_steps = 1;     // run first, not timed
  uint64_t seed = 1;            // initial values and gradients
  // nullopt: today's trainer path (after backward, push-pull every tensor
  // and wait for all). Otherwise every step goes through a CommScheduler
  // with these options.
  std::optional<CommSchedulerOptions> scheduler;
  std::string techniques = "none";  // as given on the command line, for the summary
  // The shards' optimizer, which the exact check assumes: it runs only
  // under BSP with "sgd" (and no weight decay on the shards).
  std::string optimizer = "sgd";
  float lr = 0.01f;
  // Bound of every wait on the servers (each step's push-pulls, the
  // initial pull); the scheduler has its own (CommSchedulerOptions).
  absl::Duration wait_timeout = absl::Seconds(120);
};

// Registers every tensor of `spec` (all workers give the same seeded
// initial values, so whoever registers first initialises the same model;
// through the scheduler, which registers its wire tensors), runs
// warmup_steps + steps steps and Leave()s. Per step, in forward order: the
// layer's parameters are waited for, then its forward compute sleeps; in
// backward order: its backward sleeps, then its gradients are handed over.
//
// The summary's iter_ms is the wall time from the first timed step's start
// to the moment the parameters after the last step are all in, over steps.
// Bytes are this worker's payload bytes of every step (warmup included:
// every step moves the same tensors, and a pipelined step has no sharp
// boundary) per step. Under BSP with SGD the final parameters are checked
// (CheckReplayParameters): a mismatch is DATA_LOSS; otherwise checked is
// false. One thread; `client` must be exclusively this loop's.
absl::StatusOr<workload::ReplaySummary> RunReplay(Client& client,
                                                  const workload::ReplayModelSpec& spec,
                                                  const ReplayTrainerOptions& options);

}  // namespace harrier

#endif  // HARRIER_WORKER_REPLAY_TRAINER_H_
