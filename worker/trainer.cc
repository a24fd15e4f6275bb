#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/json.h"

namespace harrier {
namespace {

absl::Status WaitAll(Client& client, const std::vector<Client::Handle>& handles) {
  absl::Status first;
  for (auto handle : handles) {
    auto status = client.Wait(handle);
    if (first.ok() && !status.ok()) first = status;
  }
  return first;
}

// Where the client reads and writes each tensor: the model's host
// parameters, or, for a device-resident model, its device buffers (the
// client then compresses on the device).
struct TensorBuffers {
  std::vector<std::string> names;
  std::vector<absl::Span<float>> params;
  std::vector<absl::Span<float>> grads;     // device models only
  std::vector<absl::Span<float>> momentum;  // device models, signum only
  std::vector<absl::Span<float>> scratch;   // device models, local SGD only
};

TensorBuffers HostBuffers(workload::Model& model) {
  TensorBuffers buffers;
  for (auto& param : model.params()) {
    buffers.names.push_back(param.name);
    buffers.params.push_back(absl::MakeSpan(param.values));
  }
  return buffers;
}

// The device buffers `which` of every tensor (sized as params()).
absl::Status DeviceBuffers(workload::Model& model, workload::DeviceResidentModel::Buffer which,
                           std::vector<absl::Span<float>>* out) {
  out->clear();
  auto& params = model.params();
  for (size_t k = 0; k < params.size(); ++k) {
    auto buffer = model.device()->buffer(k, which);
    if (!buffer.ok()) return buffer.status();
    if (*buffer == nullptr) {
      return absl::InternalError(absl::StrCat("device model: no buffer for '", params[k].name, "'"));
    }
    out->push_back(absl::MakeSpan(*buffer, params[k].values.size()));
  }
  return absl::OkStatus();
}

absl::Status PullAll(Client& client, const TensorBuffers& buffers) {
  std::vector<Client::Handle> handles;
  for (size_t k = 0; k < buffers.params.size(); ++k) {
    handles.push_back(client.PullAsync(buffers.names[k], buffers.params[k]));
  }
  return WaitAll(client, handles);
}

// Pushes `grads` for the current clock and receives the parameters of the
// next clock, one round trip per tensor and shard.
absl::Status PushPullAll(Client& client, const TensorBuffers& buffers,
                         const std::vector<absl::Span<const float>>& grads) {
  std::vector<Client::Handle> handles;
  for (size_t k = 0; k < buffers.params.size(); ++k) {
    handles.push_back(client.PushPullAsync(buffers.names[k], grads[k], buffers.params[k]));
  }
  return WaitAll(client, handles);
}

std::vector<absl::Span<const float>> ConstSpans(const workload::Gradients& grads) {
  std::vector<absl::Span<const float>> spans;
  for (const auto& g : grads) spans.push_back(absl::MakeConstSpan(g));
  return spans;
}

std::vector<absl::Span<const float>> ConstSpans(const std::vector<absl::Span<float>>& buffers) {
  std::vector<absl::Span<const float>> spans;
  for (const auto& b : buffers) spans.push_back(absl::MakeConstSpan(b.data(), b.size()));
  return spans;
}

// The model's accuracy with its current parameters: a device model's are
// its device buffers.
absl::StatusOr<double> EvaluateModel(workload::Model& model, const workload::Dataset& data) {
  if (model.device() != nullptr) return model.device()->Evaluate(data);
  return model.Evaluate(data);
}

// The trainer's clock for durations (step rates, evaluation time, time to
// target): monotonic, so a step of the system clock (NTP) during a run
// does not change them. Only differences of its values mean anything.
absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

// Rank 0's periodic evaluation after `steps_done` steps. Under BSP the other
// workers block in their next pull until rank 0 pushes again, so the whole
// job stands still while rank 0 evaluates: that time is not training time,
// and is taken off the wall time before it is compared with a target. The
// parameters evaluated are those the last push-pull returned (the global
// model of the next clock under BSP; rank 0's local model under local SGD).
// With the comm scheduler they are complete only once the next step's
// WaitParameters returned (its pulls write the buffers in the background),
// so Train evaluates there, or after Drain following the last step.
// `loss` is the mean training loss of this worker's steps since its
// previous eval line (-1 when there were none).
absl::Status EvaluatePeriodically(workload::Model& model, const workload::Dataset& test,
                                  const TrainerOptions& options, int64_t steps_done,
                                  absl::Time train_start, double loss, TrainResult* result) {
  const absl::Time eval_start = MonotonicNow();
  const double train_wall_s =
      absl::ToDoubleSeconds(eval_start - train_start) - result->eval_seconds;
  auto accuracy = EvaluateModel(model, test);
  result->eval_seconds += absl::ToDoubleSeconds(MonotonicNow() - eval_start);
  if (!accuracy.ok()) return accuracy.status();
  std::fprintf(stderr, "eval step=%lld accuracy=%.4f wall_s=%.3f loss=%.4f\n",
               static_cast<long long>(steps_done), *accuracy, train_wall_s, loss);
  if (options.target_accuracy > 0 && result->time_to_target_s < 0 &&
      *accuracy >= options.target_accuracy) {
    result->time_to_target_s = train_wall_s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainResult> Train(Client& client, workload::Model& model,
                                  const workload::Dataset& train, const workload::Dataset* test,
                                  const TrainerOptions& options) {
  if (options.batch_size < 1) return absl::InvalidArgumentError("--batch_size must be >= 1");
  if (options.epochs < 1) return absl::InvalidArgumentError("--epochs must be >= 1");
  if (options.eval_every_steps < 0) {
    return absl::InvalidArgumentError("--eval_every must be >= 0");
  }
  const int rank = client.rank();
  const int workers = client.num_workers();
  const workload::Dataset shard = workload::ShardOf(train, rank, workers);
  // Each worker runs its own shard's steps; shards may differ, and a worker
  // that finishes early leaves so no BSP round waits for it.
  const int64_t steps_per_epoch = shard.num_examples / options.batch_size;
  if (steps_per_epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", rank, "'s shard has ",
                                                   shard.num_examples,
                                                   " examples, fewer than one batch of ",
                                                   options.batch_size));
  }
  int64_t total_steps = steps_per_epoch * options.epochs;
  if (options.max_steps >= 0) total_steps = std::min(total_steps, options.max_steps);

  const bool local_sgd = client.sync().mode == "local";
  if (local_sgd && options.scheduler.has_value()) {
    return absl::InvalidArgumentError(
        "the comm scheduler (--techniques) needs --sync=bsp, ssp or asp: local SGD pushes one "
        "model delta per round, not per-layer gradients as backward produces them");
  }
  // A device-resident model: parameters and gradients stay in device
  // memory, the client pulls into and pushes from there and compresses on
  // the device.
  workload::DeviceResidentModel* const device = model.device();
  using Buffer = workload::DeviceResidentModel::Buffer;
  TensorBuffers buffers = HostBuffers(model);
  if (device != nullptr) {
    if (auto status = DeviceBuffers(model, Buffer::kParams, &buffers.params); !status.ok()) {
      return status;
    }
    if (auto status = DeviceBuffers(model, Buffer::kGrads, &buffers.grads); !status.ok()) {
      return status;
    }
    if (options.gradient_momentum > 0) {
      if (auto status = DeviceBuffers(model, Buffer::kMomentum, &buffers.momentum); !status.ok()) {
        return status;
      }
    }
    if (local_sgd) {
      if (auto status = DeviceBuffers(model, Buffer::kScratch, &buffers.scratch); !status.ok()) {
        return status;
      }
    }
  }
  // With a scheduler the scheduler registers the wire tensors (fused
  // buckets in place of their members).
  std::unique_ptr<CommScheduler> scheduler;
  if (options.scheduler.has_value()) {
    std::vector<ScheduledTensor> tensors;
    auto& params = model.params();
    for (size_t k = 0; k < params.size(); ++k) {
      ScheduledTensor tensor{params[k].name, params[k].shape, absl::MakeSpan(params[k].values)};
      if (device != nullptr) {
        // Device buffers; params() hold the initial values, in host memory.
        tensor.parameters = buffers.params[k];
        tensor.memory = MemoryKind::kDevice;
        tensor.initial_values = params[k].values;
      }
      tensors.push_back(std::move(tensor));
    }
    auto created = CommScheduler::Create(client, std::move(tensors), *options.scheduler);
    if (!created.ok()) return created.status();
    scheduler = std::move(*created);
  } else {
    // A device model's params() hold the initial values, in host memory.
    const MemoryKind memory = device != nullptr ? MemoryKind::kDevice : MemoryKind::kHost;
    for (auto& param : model.params()) {
      if (auto status = client.RegisterTensor(param.name, param.shape, param.values, memory);
          !status.ok()) {
        return status;
      }
    }
  }
  FILE* metrics = nullptr;
  if (!options.metrics_out.empty()) {
    metrics = std::fopen(options.metrics_out.c_str(), "w");
    if (metrics == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write --metrics_out=", options.metrics_out));
    }
  }
  const int64_t local_steps = local_sgd ? std::max<int64_t>(1, client.sync().local_steps) : 1;

  TrainResult result;
  workload::Gradients grads = device != nullptr ? workload::Gradients() : model.ZeroGradients();
  std::vector<std::vector<float>> round_start;  // local SGD: parameters at the round's start
  workload::Gradients momentum;                 // signum: the worker's momentum
  bool device_momentum_started = false;         // the same, on the device
  bool device_round_started = false;            // local SGD's round start, on the device
  std::mt19937_64 delay_rng(1234 + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<double> straggle(0.0, 1.0);
  const absl::Time start = MonotonicNow();
  absl::Time interval_start = start;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  // The eval line's loss: steps since the previous eval line.
  double eval_loss_sum = 0;
  int64_t eval_loss_steps = 0;
  auto take_eval_loss = [&eval_loss_sum, &eval_loss_steps] {
    const double mean = eval_loss_steps > 0 ? eval_loss_sum / eval_loss_steps : -1;
    eval_loss_sum = 0;
    eval_loss_steps = 0;
    return mean;
  };
  // The scheduler pulls step 0's parameters itself.
  absl::Status status = scheduler != nullptr ? absl::OkStatus() : PullAll(client, buffers);
  const int num_params = static_cast<int>(model.params().size());
  bool eval_due = false;  // scheduler: evaluate once the next step's waits returned
  // A worker that rejoined (restarted mid-job) or joined a resumed run goes
  // on from the clock the shards hold for its rank (Client::Create).
  const int64_t first_step = std::min(total_steps, client.clock() * local_steps);
  if (first_step > 0) {
    std::fprintf(stderr, "rank %d resumes at step %lld (clock %lld, from the shards)\n", rank,
                 static_cast<long long>(first_step), static_cast<long long>(client.clock()));
  }
  for (int64_t step = first_step; status.ok() && step < total_steps; ++step) {
    const int64_t in_epoch = step % steps_per_epoch;
    const int epoch = static_cast<int>(step / steps_per_epoch);
    const int64_t pull_clock = client.clock();
    const int64_t min_clock = client.stats().last_min_clock;
    result.max_staleness = std::max(result.max_staleness, pull_clock - min_clock);

    // With a scheduler part of the step's wait for the servers is here,
    // before forward.
    absl::Duration forward_wait;
    if (scheduler != nullptr) {
      const absl::Time wait_start = MonotonicNow();
      // Forward's order: the front tensor is back first under priority.
      for (int k = 0; status.ok() && k < num_params; ++k) status = scheduler->WaitParameters(k);
      if (!status.ok()) break;
      forward_wait = MonotonicNow() - wait_start;
      if (eval_due) {
        // Only now are the previous step's parameters all in the buffers
        // (the scheduler's pulls write them in the background).
        eval_due = false;
        if (metrics != nullptr) std::fflush(metrics);
        status = EvaluatePeriodically(model, *test, options, step, start, take_eval_loss(),
                                      &result);
        if (!status.ok()) break;
      }
    }
    const size_t offset = static_cast<size_t>(in_epoch * options.batch_size);
    auto loss = device != nullptr
                    ? device->ComputeGradients(shard.image(static_cast<int>(offset)),
                                               shard.labels.data() + offset, options.batch_size)
                    : model.ComputeGradients(shard.image(static_cast<int>(offset)),
                                             shard.labels.data() + offset, options.batch_size,
                                             &grads);
    if (!loss.ok()) {
      status = loss.status();
      break;
    }
    if (step == first_step) result.first_loss = *loss;
    interval_loss += *loss;
    ++interval_steps;
    eval_loss_sum += *loss;
    ++eval_loss_steps;
    if (options.step_delay_ms > 0 && straggle(delay_rng) < options.step_delay_probability) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options.step_delay_ms));
    }

    if (options.gradient_momentum > 0 && device != nullptr) {
      const float beta = options.gradient_momentum;
      for (size_t k = 0; status.ok() && k < buffers.grads.size(); ++k) {
        const size_t n = buffers.grads[k].size();
        // As on the host: the first step's momentum starts from g.
        if (!device_momentum_started) {
          status = device->Axpby(1.0f, buffers.grads[k].data(), 0.0f, buffers.momentum[k].data(), n);
        }
        if (status.ok()) {
          status = device->Axpby(1 - beta, buffers.grads[k].data(), beta,
                                 buffers.momentum[k].data(), n);
        }
      }
      device_momentum_started = true;
      if (!status.ok()) break;
    } else if (options.gradient_momentum > 0) {
      if (momentum.empty()) momentum = grads;
      const float beta = options.gradient_momentum;
      for (size_t k = 0; k < grads.size(); ++k) {
        for (size_t i = 0; i < grads[k].size(); ++i) {
          momentum[k][i] = beta * momentum[k][i] + (1 - beta) * grads[k][i];
        }
      }
    }
    const std::vector<absl::Span<const float>> to_push =
        device != nullptr
            ? ConstSpans(options.gradient_momentum > 0 ? buffers.momentum : buffers.grads)
            : ConstSpans(options.gradient_momentum > 0 ? momentum : grads);

    const absl::Time comm_start = MonotonicNow();
    if (scheduler != nullptr) {
      // The MLP's backward produced every gradient at once; they are handed
      // over last tensor first, as a layer-by-layer backward would.
      for (int k = num_params - 1; status.ok() && k >= 0; --k) {
        status = scheduler->GradientReady(k, to_push[k]);
      }
      if (status.ok()) status = scheduler->EndBackward();  // advances the clock
      if (status.ok() && step + 1 == total_steps) status = scheduler->Drain();
    } else if (!local_sgd) {
      status = PushPullAll(client, buffers, to_push);
      client.Clock();
    } else if (device != nullptr) {
      const size_t tensors = buffers.params.size();
      if (!device_round_started || step % local_steps == 0) {
        for (size_t k = 0; status.ok() && k < tensors; ++k) {
          status = device->Axpby(1.0f, buffers.params[k].data(), 0.0f, buffers.scratch[k].data(),
                                 buffers.params[k].size());
        }
        device_round_started = true;
      }
      if (status.ok()) status = device->SgdStep(options.local_lr);
      if (status.ok() && (step % local_steps == local_steps - 1 || step + 1 == total_steps)) {
        // The round's model delta, round start - params, into the gradient
        // buffers (free until the next ComputeGradients).
        for (size_t k = 0; status.ok() && k < tensors; ++k) {
          const size_t n = buffers.params[k].size();
          status = device->Axpby(1.0f, buffers.scratch[k].data(), 0.0f, buffers.grads[k].data(), n);
          if (status.ok()) {
            status = device->Axpby(-1.0f, buffers.params[k].data(), 1.0f, buffers.grads[k].data(), n);
          }
        }
        if (status.ok()) status = PushPullAll(client, buffers, ConstSpans(buffers.grads));
        client.Clock();
      }
    } else {
      if (round_start.empty() || step % local_steps == 0) {
        round_start.clear();
        for (auto& param : model.params()) round_start.push_back(param.values);
      }
      status = model.SgdStep(grads, options.local_lr);
      if (status.ok() && (step % local_steps == local_steps - 1 || step + 1 == total_steps)) {
        // Push the round's model delta; the shard averages and subtracts it.
        auto& params = model.params();
        for (size_t k = 0; k < params.size(); ++k) {
          for (size_t i = 0; i < grads[k].size(); ++i) {
            grads[k][i] = round_start[k][i] - params[k].values[i];
          }
        }
        status = PushPullAll(client, buffers, ConstSpans(grads));
        client.Clock();
      }
    }
    const double wait_ms = absl::ToDoubleMilliseconds(MonotonicNow() - comm_start + forward_wait);
    ++result.steps;

    const bool last = step + 1 == total_steps;
    if (!status.ok()) break;
    if (rank == 0 && test != nullptr && options.eval_every_steps > 0 &&
        ((step + 1) % options.eval_every_steps == 0 || last)) {
      if (scheduler == nullptr || last) {  // after the last step Drain copied them out
        // A bench may stop the job once an eval line shows the target: the
        // traffic so far must be on disk by then.
        if (metrics != nullptr) std::fflush(metrics);
        status = EvaluatePeriodically(model, *test, options, step + 1, start, take_eval_loss(),
                                      &result);
        if (!status.ok()) break;
      } else {
        eval_due = true;
      }
    }
    const ClientStats stats = client.stats();
    if (metrics != nullptr) {
      // One line per step: the clock it pulled at, the min clock it saw, how
      // long it waited for the servers, and cumulative traffic.
      Json line;
      line["rank"] = rank;
      line["epoch"] = epoch;
      line["step"] = step + 1;
      line["loss"] = RoundTo(*loss, 6);
      line["pull_clock"] = pull_clock;
      line["min_clock"] = min_clock;
      line["staleness"] = pull_clock - min_clock;
      line["wait_ms"] = RoundTo(wait_ms, 3);
      line["bytes_pushed"] = stats.bytes_pushed;
      line["bytes_pulled"] = stats.bytes_pulled;
      line["elapsed_s"] = RoundTo(absl::ToDoubleSeconds(MonotonicNow() - start), 3);
      std::fprintf(metrics, "%s\n", DumpJson(line).c_str());
    }
    if ((step + 1) % options.log_every == 0 || last) {
      const absl::Time now = MonotonicNow();
      const double seconds = absl::ToDoubleSeconds(now - interval_start);
      const double rate = seconds > 0 ? interval_steps * options.batch_size / seconds : 0;
      result.last_loss = interval_loss / interval_steps;
      std::fprintf(stderr,
                   "[worker %d] epoch %d step %lld/%lld loss %.4f samples/s %.0f pushed %.1f MiB "
                   "pulled %.1f MiB push_wait %.2f s pull_wait %.2f s\n",
                   rank, epoch, static_cast<long long>(step + 1),
                   static_cast<long long>(total_steps), result.last_loss, rate,
                   stats.bytes_pushed / 1048576.0, stats.bytes_pulled / 1048576.0,
                   absl::ToDoubleSeconds(stats.push_wait), absl::ToDoubleSeconds(stats.pull_wait));
      interval_start = now;
      interval_loss = 0;
      interval_steps = 0;
    }
    if (!last && options.stop_requested != nullptr && options.stop_requested->load()) {
      result.stopped = true;
      // The scheduler drains after the last step only: this one is now the last.
      if (scheduler != nullptr) status = scheduler->Drain();
      break;
    }
  }
  if (metrics != nullptr) std::fclose(metrics);
  if (!status.ok()) return status;
  result.seconds = absl::ToDoubleSeconds(MonotonicNow() - start);
  result.samples_per_second =
      result.seconds > 0 ? result.steps * options.batch_size / result.seconds : 0;

  if (auto left = client.Leave(); !left.ok()) return left;
  if (result.stopped) return result;  // the others finish without this worker
  // Everyone has pushed its last clock once all reach the barrier; the final
  // pull then sees every update under any consistency model.
  if (auto barrier = client.Barrier("train-done"); !barrier.ok()) return barrier;
  if (options.evaluate && rank == 0 && test != nullptr) {
    if (auto pulled = scheduler != nullptr ? scheduler->Refresh() : PullAll(client, buffers);
        !pulled.ok()) {
      return pulled;
    }
    auto accuracy = EvaluateModel(model, *test);
    if (!accuracy.ok()) return accuracy.status();
    result.test_accuracy = *accuracy;
  }
  return result;
}

}  // namespace harrier
