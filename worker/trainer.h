#ifndef HARRIER_WORKER_TRAINER_H_
#define HARRIER_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/model.h"

namespace harrier {

struct TrainerOptions {
  int epochs = 1;
  int batch_size = 64;
  int64_t max_steps = -1;       // stop after this many steps (-1: all epochs)
  int log_every = 100;          // steps between progress lines
  int step_delay_ms = 0;        // extra delay per step: a straggler
  // Probability that a step gets the delay (1: every step, a persistent
  // straggler; below 1: a transient one), drawn from a fixed seed.
  double step_delay_probability = 1.0;
  float local_lr = 0.1f;        // worker-side SGD lr for local SGD steps
  // signum (Bernstein et al. 2018): push the worker's momentum
  // m = beta m + (1 - beta) g instead of g, so the shard votes on the signs
  // of momenta. 0 pushes plain gradients.
  float gradient_momentum = 0.0f;
  std::string metrics_out;      // JSON lines file; empty: none
  bool evaluate = true;         // rank 0 evaluates the test set at the end
  // Rank 0 evaluates the test set every eval_every_steps steps (and after
  // the last one), printing `eval step=N accuracy=A wall_s=W loss=L` on
  // stderr (L: the mean training loss of rank 0's steps since its previous
  // eval line); 0: never. The first evaluation at or above target_accuracy (> 0) sets
  // TrainResult::time_to_target_s.
  int eval_every_steps = 0;
  double target_accuracy = 0;
  // Set: every step goes through a CommScheduler with these options
  // (WaitParameters for each tensor in order, gradients, GradientReady last
  // tensor first, EndBackward; Drain after the last step). Not with local
  // SGD (--sync=local): Train then fails with INVALID_ARGUMENT. nullopt:
  // one PushPull per tensor and step, no scheduler.
  std::optional<CommSchedulerOptions> scheduler;
  // Set (harrier-worker: on SIGTERM or SIGINT): the step in progress is
  // finished, what it pushed is drained, the worker leaves the job and
  // Train returns with TrainResult::stopped, without the final barrier or
  // evaluation (the other workers go on without it). Null: never.
  const std::atomic<bool>* stop_requested = nullptr;
};

struct TrainResult {
  int64_t steps = 0;
  double first_loss = 0;
  double last_loss = 0;        // mean over the last log interval
  double test_accuracy = -1;   // rank 0 with evaluate only
  double seconds = 0;
  double samples_per_second = 0;
  int64_t max_staleness = 0;   // max over steps of (pull clock - min clock seen)
  // Training wall seconds from the start of Train until the first periodic
  // evaluation that reached target_accuracy, with the time of every earlier
  // periodic evaluation subtracted; -1 if never reached (or not rank 0).
  double time_to_target_s = -1;
  // Seconds rank 0 spent in periodic evaluations (included in `seconds`).
  double eval_seconds = 0;
  // Stopped early through TrainerOptions::stop_requested, after `steps`.
  bool stopped = false;
};

// Runs data-parallel training of `model` on this worker's shard of `train`
// through `client`: pull parameters, compute gradients, push them, advance
// the clock, as the consistency model the control plane announced says.
// Registers the model's tensors first (the first worker's values win).
// A model with device() != nullptr trains in device memory: its tensors are
// registered as MemoryKind::kDevice (the client needs
// ClientOptions::device_backend), pulls and pushes use its kParams and
// kGrads buffers, signum's momentum and local SGD's round start its
// kMomentum and kScratch buffers, and evaluation its Evaluate; not with
// options.scheduler (INVALID_ARGUMENT).
// Progress goes to stderr every log_every steps and to metrics_out.
absl::StatusOr<TrainResult> Train(Client& client, workload::Model& model,
                                  const workload::Dataset& train, const workload::Dataset* test,
                                  const TrainerOptions& options);

}  // namespace harrier

#endif  // HARRIER_WORKER_TRAINER_H_
