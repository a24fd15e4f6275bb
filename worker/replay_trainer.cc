#include "worker/replay_trainer.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/cpu_time.h"

namespace harrier {
namespace {

using workload::ReplayGradients;
using workload::ReplayLayer;
using workload::ReplayModelSpec;
using workload::ReplayTensor;

// First tensor index of every layer in the flat (forward) order.
std::vector<int> LayerStarts(const ReplayModelSpec& spec) {
  std::vector<int> starts;
  int k = 0;
  for (const ReplayLayer& layer : spec.layers) {
    starts.push_back(k);
    k += static_cast<int>(layer.tensors.size());
  }
  return starts;
}

// Waits for every handle, each against the same deadline; the first error
// wins, and the handles not yet waited for are dropped (which frees them).
absl::Status WaitAll(Client& client, const std::vector<Client::Handle>& handles,
                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const Client::Handle& h : handles) {
    if (absl::Status s = client.Wait(h, deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Counters at one instant, for per-step figures.
struct Bytes {
  uint64_t pushed = 0;
  uint64_t pulled = 0;
  std::vector<uint64_t> pushed_per_shard;
  std::vector<uint64_t> pulled_per_shard;
};

Bytes Snapshot(const Client& client) {
  ClientStats s = client.stats();
  return {s.bytes_pushed, s.bytes_pulled, std::move(s.bytes_pushed_per_shard),
          std::move(s.bytes_pulled_per_shard)};
}

// One instant of the timed span: wall clock, steady clock and this
// process's CPU.
struct Mark {
  absl::Time wall;
  std::chrono::steady_clock::time_point steady;
  double cpu_seconds = 0;
};

Mark MarkNow() { return {absl::Now(), std::chrono::steady_clock::now(), ProcessCpuSeconds()}; }

// What a run measured, whichever path it took.
struct Measured {
  Mark timed_start;
  // When each timed step began (the first at timed_start).
  std::vector<absl::Time> step_starts;
  Mark end;
  Bytes after_setup;  // once the initial parameters are in
  Bytes at_end;
  // The comm scheduler's forward-order tail: planned, and this worker's
  // own estimate where it measured one (-1: none).
  double forward_order_tail = 0;
  double measured_forward_order_tail = -1;
};

// Per-step bytes to (or from) each shard between two snapshots.
std::vector<int64_t> PerShardPerIter(const std::vector<uint64_t>& before,
                                     const std::vector<uint64_t>& after, int64_t steps) {
  std::vector<int64_t> per_iter;
  for (size_t s = 0; s < after.size(); ++s) {
    const uint64_t start = s < before.size() ? before[s] : 0;
    per_iter.push_back(static_cast<int64_t>(after[s] - start) / steps);
  }
  return per_iter;
}

// Today's path: after backward, push-pull every tensor, wait for all.
absl::StatusOr<Measured> RunDirect(Client& client, const ReplayModelSpec& spec,
                                   const ReplayGradients& grads,
                                   std::vector<std::vector<float>>& params,
                                   const ReplayTrainerOptions& options) {
  const std::vector<const ReplayTensor*> tensors = workload::FlattenTensors(spec);
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (absl::Status s = client.RegisterTensor(tensors[k]->name, tensors[k]->shape, params[k]);
        !s.ok()) {
      return s;
    }
  }
  std::vector<Client::Handle> handles;
  for (size_t k = 0; k < tensors.size(); ++k) {
    handles.push_back(client.PullAsync(tensors[k]->name, absl::MakeSpan(params[k])));
  }
  if (absl::Status s = WaitAll(client, handles, options.wait_timeout); !s.ok()) return s;
  Measured m;
  m.after_setup = Snapshot(client);
  const int64_t total = options.warmup_steps + options.steps;
  workload::ComputePacer pacer(options.compute_scale);
  m.timed_start = MarkNow();
  for (int64_t step = 0; step < total; ++step) {
    if (step == options.warmup_steps) m.timed_start = MarkNow();
    if (step >= options.warmup_steps) m.step_starts.push_back(absl::Now());
    for (const ReplayLayer& layer : spec.layers) {
      pacer.Run(layer.forward_ms);
    }
    for (auto layer = spec.layers.rbegin(); layer != spec.layers.rend(); ++layer) {
      pacer.Run(layer->backward_ms);
    }
    handles.clear();
    for (size_t k = 0; k < tensors.size(); ++k) {
      handles.push_back(client.PushPullAsync(tensors[k]->name,
                                             grads.Get(static_cast<int>(k), step),
                                             absl::MakeSpan(params[k])));
    }
    if (absl::Status s = WaitAll(client, handles, options.wait_timeout); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("replay step ", step, ": ", s.message()));
    }
    client.Clock();
  }
  m.end = MarkNow();
  m.at_end = Snapshot(client);
  return m;
}

// Through the comm scheduler: "I need tensor k now" before each layer's
// forward, "the gradient of k is ready" after each layer's backward.
absl::StatusOr<Measured> RunScheduled(Client& client, const ReplayModelSpec& spec,
                                      const ReplayGradients& grads,
                                      std::vector<std::vector<float>>& params,
                                      const ReplayTrainerOptions& options) {
  const std::vector<const ReplayTensor*> tensors = workload::FlattenTensors(spec);
  std::vector<ScheduledTensor> scheduled;
  for (size_t k = 0; k < tensors.size(); ++k) {
    scheduled.push_back(
        ScheduledTensor{tensors[k]->name, tensors[k]->shape, absl::MakeSpan(params[k])});
  }
  absl::StatusOr<std::unique_ptr<CommScheduler>> created =
      CommScheduler::Create(client, std::move(scheduled), *options.scheduler);
  if (!created.ok()) return created.status();
  CommScheduler& scheduler = **created;
  const std::vector<int> starts = LayerStarts(spec);
  const int64_t total = options.warmup_steps + options.steps;
  workload::ComputePacer pacer(options.compute_scale);
  Measured m;
  m.timed_start = MarkNow();
  for (int64_t step = 0; step < total; ++step) {
    if (step == options.warmup_steps) {
      // The warm-up's pushes and next-step pulls would otherwise run inside
      // the timed window (the direct path waits for them before its timer).
      if (step > 0) {
        if (absl::Status s = scheduler.Drain(); !s.ok()) return s;
      }
      m.timed_start = MarkNow();
    }
    bool began = false;
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      const ReplayLayer& layer = spec.layers[l];
      for (size_t j = 0; j < layer.tensors.size(); ++j) {
        if (absl::Status s = scheduler.WaitParameters(starts[l] + static_cast<int>(j)); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat("replay step ", step, ": ", s.message()));
        }
        // A step begins once its first parameters are in: the loop's wait
        // for them ends the step before (whose pushes and pulls run on
        // into it), as it would in a step without overlap.
        if (!began && step >= options.warmup_steps) {
          m.step_starts.push_back(step == options.warmup_steps ? m.timed_start.wall : absl::Now());
        }
        began = true;
      }
      pacer.Run(layer.forward_ms);
    }
    // After step 0's forward every initial parameter is in and no later
    // pull can have been answered (BSP holds them until step 0's pushes).
    if (step == 0) m.after_setup = Snapshot(client);
    for (size_t l = spec.layers.size(); l-- > 0;) {
      const ReplayLayer& layer = spec.layers[l];
      pacer.Run(layer.backward_ms);
      for (size_t j = layer.tensors.size(); j-- > 0;) {
        const int k = starts[l] + static_cast<int>(j);
        if (absl::Status s = scheduler.GradientReady(k, grads.Get(k, step)); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat("replay step ", step, ": ", s.message()));
        }
      }
    }
    if (absl::Status s = scheduler.EndBackward(); !s.ok()) return s;
  }
  // The parameters after the last step, as the next forward would want them.
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (absl::Status s = scheduler.WaitParameters(static_cast<int>(k)); !s.ok()) return s;
  }
  if (absl::Status s = scheduler.Drain(); !s.ok()) return s;
  m.end = MarkNow();
  m.at_end = Snapshot(client);
  const CommSchedulerStats stats = scheduler.stats();
  m.forward_order_tail = stats.forward_order_tail;
  m.measured_forward_order_tail = stats.measured_forward_order_tail;
  return m;
}

}  // namespace

absl::StatusOr<workload::ReplaySummary> RunReplay(Client& client, const ReplayModelSpec& spec,
                                                  const ReplayTrainerOptions& options) {
  if (options.steps < 1 || options.warmup_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("replay: ", options.steps, " timed steps and ",
                                                   options.warmup_steps,
                                                   " warmup steps (need >= 1 and >= 0)"));
  }
  if (!(options.compute_scale >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay: compute_scale ", options.compute_scale, " (need >= 0)"));
  }
  absl::StatusOr<ReplayGradients> grads =
      ReplayGradients::Create(spec, options.seed, client.rank(), client.num_workers());
  if (!grads.ok()) return grads.status();
  const std::vector<const ReplayTensor*> tensors = workload::FlattenTensors(spec);
  std::vector<std::vector<float>> params;
  params.reserve(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    params.push_back(workload::ReplayInitialValues(options.seed, static_cast<int>(k),
                                                   tensors[k]->num_elements()));
  }

  absl::StatusOr<Measured> measured =
      options.scheduler.has_value() ? RunScheduled(client, spec, *grads, params, options)
                                    : RunDirect(client, spec, *grads, params, options);
  if (!measured.ok()) return measured.status();
  if (absl::Status s = client.Leave(); !s.ok()) return s;

  const int64_t total = options.warmup_steps + options.steps;
  workload::ReplaySummary summary;
  summary.model = spec.name;
  summary.techniques = options.techniques;
  summary.sync = client.sync().mode;
  summary.compute_scale = options.compute_scale;
  summary.rank = client.rank();
  summary.workers = client.num_workers();
  summary.shards = client.num_shards();
  summary.steps = options.steps;
  summary.warmup_steps = options.warmup_steps;
  summary.iter_ms = absl::ToDoubleMilliseconds(measured->end.wall - measured->timed_start.wall) /
                    static_cast<double>(options.steps);
  for (size_t i = 0; i < measured->step_starts.size(); ++i) {
    const absl::Time next =
        i + 1 < measured->step_starts.size() ? measured->step_starts[i + 1] : measured->end.wall;
    summary.step_ms.push_back(absl::ToDoubleMilliseconds(next - measured->step_starts[i]));
  }
  summary.cpu_seconds_per_iter =
      (measured->end.cpu_seconds - measured->timed_start.cpu_seconds) /
      static_cast<double>(options.steps);
  summary.timed_start_monotonic_ns = SteadyNanos(measured->timed_start.steady);
  summary.timed_end_monotonic_ns = SteadyNanos(measured->end.steady);
  summary.compute_ms = spec.compute_ms() * options.compute_scale;
  summary.bytes_pushed_per_iter =
      static_cast<int64_t>(measured->at_end.pushed - measured->after_setup.pushed) / total;
  summary.bytes_pulled_per_iter =
      static_cast<int64_t>(measured->at_end.pulled - measured->after_setup.pulled) / total;
  summary.bytes_per_iter = summary.bytes_pushed_per_iter + summary.bytes_pulled_per_iter;
  summary.bytes_pushed_per_shard_per_iter = PerShardPerIter(
      measured->after_setup.pushed_per_shard, measured->at_end.pushed_per_shard, total);
  summary.bytes_pulled_per_shard_per_iter = PerShardPerIter(
      measured->after_setup.pulled_per_shard, measured->at_end.pulled_per_shard, total);
  summary.forward_order_tail = measured->forward_order_tail;
  summary.measured_forward_order_tail = measured->measured_forward_order_tail;

  if (client.sync().mode == "bsp" && options.optimizer == "sgd") {
    workload::ReplayCheckOptions check;
    check.steps = total;
    check.lr = options.lr;
    std::vector<absl::Span<const float>> views;
    for (const auto& p : params) views.push_back(absl::MakeConstSpan(p));
    if (absl::Status s = workload::CheckReplayParameters(spec, options.seed, views, check);
        !s.ok()) {
      return s;
    }
    summary.checked = true;
  }
  return summary;
}

}  // namespace harrier
