#include "bench/allreduce/allreduce_replay.h"

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cpu_time.h"

namespace harrier::allreduce {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Gradients are a per-rank table of kTable values read at a per-step
// offset: g(i, r, s) = table_r[(i + offset_s) mod kTable]. Writing a layer's
// gradient is then a copy from a table that stays in cache (a hash per
// element cost 30-100 ms per ResNet-50 step here, most of a scaled-down
// backward), and the values still differ by rank, by step and along the
// tensor, so a sum of the wrong step, rank or range shows.
constexpr int64_t kTable = int64_t{1} << 16;

uint32_t RankKey(uint64_t seed, int rank) {
  return static_cast<uint32_t>(SplitMix64(seed ^ SplitMix64(0x5eed0000ull + rank)));
}

int64_t StepOffset(uint64_t seed, int step) {
  return static_cast<int64_t>(SplitMix64(seed * 31 + static_cast<uint64_t>(step)) % kTable);
}

// An integer in [-8, 7] times 2^-3: sums stay exact in float.
inline float TableEntry(int64_t k, uint32_t rank_key) {
  const uint32_t h = static_cast<uint32_t>(k) * 2654435761u + rank_key;
  return static_cast<float>(static_cast<int>(h >> 28) - 8) * 0.125f;
}

inline float Gradient(int64_t model_index, uint32_t rank_key, int64_t step_offset) {
  return TableEntry((model_index + step_offset) % kTable, rank_key);
}

// Writes g(model_index + j) for j in [0, count) from this rank's table.
void CopyGradient(const std::vector<float>& table, int64_t model_index, int64_t step_offset,
                  int64_t count, float* out) {
  int64_t k = (model_index + step_offset) % kTable;
  while (count > 0) {
    const int64_t run = std::min(count, kTable - k);
    std::memcpy(out, table.data() + k, static_cast<size_t>(run) * sizeof(float));
    out += run;
    count -= run;
    k = 0;
  }
}

inline float InitialParameter(int64_t model_index, uint64_t seed) {
  const uint32_t h = static_cast<uint32_t>(model_index) * 40503u + static_cast<uint32_t>(seed);
  return static_cast<float>(static_cast<int>(h >> 26) - 32);
}

// The one place the update rule lives: the run and the check both call it.
inline float SgdStep(float parameter, float gradient_sum, float world, float lr) {
  return parameter - lr * (gradient_sum / world);
}

// Payload bytes acknowledged by the peer and received, summed over every
// TCP socket of this process (gloo's pairs; the listener and the log
// descriptors count nothing). The kernel's own counters, so they measure
// the ring rather than restate its formula. False where no socket answers.
bool ReadTcpBytes(int64_t* sent, int64_t* received) {
  *sent = 0;
  *received = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  bool any = false;
  while (struct dirent* entry = readdir(dir)) {
    int fd = 0;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir)) continue;
    struct tcp_info info;
    socklen_t length = sizeof(info);
    std::memset(&info, 0, sizeof(info));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) continue;
    *sent += static_cast<int64_t>(info.tcpi_bytes_acked);
    *received += static_cast<int64_t>(info.tcpi_bytes_received);
    any = true;
  }
  closedir(dir);
  return any;
}

void SleepUntil(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left > absl::ZeroDuration()) absl::SleepFor(left);
}

// The communication thread: all-reduces the buckets of a step in ready
// order, one at a time (as DDP's single process group does), and applies
// SGD to each reduced bucket. The training thread hands buckets over with
// MarkReady and waits for them with WaitAllDone; both sides' waits are
// bounded by the run's timeout.
class BucketReducer {
 public:
  BucketReducer(const BucketPlan& plan, GlooRing& ring, const ReplayRunOptions& options,
                float* gradients, float* parameters)
      : plan_(plan), ring_(ring), options_(options), gradients_(gradients),
        parameters_(parameters), started_(plan.buckets.size()) {
    thread_ = std::thread([this] { Loop(); });
  }

  ~BucketReducer() {
    {
      absl::MutexLock lock(&mutex_);
      stop_ = true;
    }
    thread_.join();
  }

  // Buckets [0, count) of the current step are complete.
  void MarkReady(int count) {
    absl::MutexLock lock(&mutex_);
    ready_ = std::max(ready_, count);
  }

  // Returns once every bucket of the step is reduced and applied, then
  // starts the next step's count. `started` gets when each bucket's
  // all-reduce began.
  absl::Status WaitAllDone(std::vector<absl::Time>* started) {
    absl::MutexLock lock(&mutex_);
    const int total = static_cast<int>(plan_.buckets.size());
    auto finished = [this, total]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return done_ == total || !error_.ok();
    };
    if (!mutex_.AwaitWithTimeout(absl::Condition(&finished), options_.timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", ring_.rank(), ": ", done_, " of ", total,
                       " buckets reduced after ", absl::FormatDuration(options_.timeout)));
    }
    if (!error_.ok()) return error_;
    *started = started_;
    ready_ = 0;
    done_ = 0;
    return absl::OkStatus();
  }

 private:
  void Loop() {
    const float world = static_cast<float>(ring_.world());
    for (;;) {
      int bucket = 0;
      {
        absl::MutexLock lock(&mutex_);
        auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
          return stop_ || ready_ > done_;
        };
        if (!mutex_.AwaitWithTimeout(absl::Condition(&work), options_.timeout)) {
          error_ = absl::DeadlineExceededError(
              absl::StrCat("rank ", ring_.rank(), ": no bucket handed over in ",
                           absl::FormatDuration(options_.timeout)));
          return;
        }
        if (stop_) return;
        bucket = done_;
        started_[bucket] = absl::Now();
      }
      const Bucket& b = plan_.buckets[bucket];
      float* grad = gradients_ + b.buffer_offset;
      absl::Status status;
      if (bucket != options_.fault_skip_bucket) {
        status = ring_.AllreduceSum(grad, static_cast<size_t>(b.elements),
                                    static_cast<uint32_t>(bucket));
      }
      if (status.ok()) {
        float* param = parameters_ + b.buffer_offset;
        for (int64_t i = 0; i < b.elements; ++i) {
          param[i] = SgdStep(param[i], grad[i], world, options_.lr);
        }
      }
      absl::MutexLock lock(&mutex_);
      if (!status.ok()) {
        error_ = status;
        return;
      }
      ++done_;
    }
  }

  const BucketPlan& plan_;
  GlooRing& ring_;
  const ReplayRunOptions& options_;
  float* const gradients_;
  float* const parameters_;

  absl::Mutex mutex_;
  int ready_ ABSL_GUARDED_BY(mutex_) = 0;
  int done_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mutex_);
  std::vector<absl::Time> started_ ABSL_GUARDED_BY(mutex_);
  std::thread thread_;
};

// Checks `parameters` at a sample of buffer positions against the
// arithmetic: every rank's gradients of every step, summed, stepped.
void Check(const BucketPlan& plan, const float* parameters, int world,
           const ReplayRunOptions& options, ReplayRunResult* result) {
  std::vector<int64_t> positions;
  for (const Bucket& b : plan.buckets) {
    positions.push_back(b.buffer_offset);
    positions.push_back(b.buffer_offset + b.elements / 2);
    positions.push_back(b.buffer_offset + b.elements - 1);
  }
  std::mt19937_64 random(options.seed * 7919 + 17);
  std::uniform_int_distribution<int64_t> any(0, plan.total_elements - 1);
  for (int i = 0; i < options.check_samples; ++i) positions.push_back(any(random));

  std::vector<uint32_t> keys;
  for (int r = 0; r < world; ++r) keys.push_back(RankKey(options.seed, r));
  result->mismatches = 0;
  for (int64_t position : positions) {
    // The tensor holding this buffer position: slots are in buffer order.
    auto it = std::upper_bound(plan.tensors.begin(), plan.tensors.end(), position,
                               [](int64_t p, const TensorSlot& t) { return p < t.buffer_offset; });
    const TensorSlot& slot = *(it - 1);
    const int64_t model_index = slot.model_offset + (position - slot.buffer_offset);
    float expected = InitialParameter(model_index, options.seed);
    for (int s = 0; s < options.steps; ++s) {
      float sum = 0;
      const int64_t offset = StepOffset(options.seed, s);
      for (int r = 0; r < world; ++r) sum += Gradient(model_index, keys[r], offset);
      expected = SgdStep(expected, sum, static_cast<float>(world), options.lr);
    }
    const float actual = parameters[position];
    if (std::memcmp(&expected, &actual, sizeof(float)) != 0) {
      if (result->mismatches == 0) {
        result->first_mismatch = absl::StrCat("element ", model_index, " (layer ", slot.layer,
                                              ", buffer position ", position, "): ", actual,
                                              " where ", expected, " was expected");
      }
      ++result->mismatches;
    }
  }
  result->checked_elements = static_cast<int64_t>(positions.size());
  result->checked = result->mismatches == 0;
}

}  // namespace

absl::StatusOr<ReplayRunResult> RunAllreduceReplay(const std::vector<LayerShape>& layers,
                                                   GlooRing& ring,
                                                   const ReplayRunOptions& options) {
  if (options.steps < 1 || options.warmup_steps < 0 || options.warmup_steps >= options.steps) {
    return absl::InvalidArgumentError(absl::StrCat("steps ", options.steps, " must exceed warmup_steps ",
                                                   options.warmup_steps, " (and be >= 1)"));
  }
  if (options.compute_scale < 0) {
    return absl::InvalidArgumentError(absl::StrCat("compute_scale ", options.compute_scale, " < 0"));
  }
  absl::StatusOr<BucketPlan> plan_or = PlanBuckets(layers, options.bucket_bytes);
  if (!plan_or.ok()) return plan_or.status();
  const BucketPlan plan = *std::move(plan_or);
  if (options.fault_skip_bucket >= static_cast<int>(plan.buckets.size())) {
    return absl::InvalidArgumentError(absl::StrCat("fault_skip_bucket ", options.fault_skip_bucket,
                                                   " but only ", plan.buckets.size(), " buckets"));
  }

  ReplayRunResult result;
  result.steps = options.steps;
  result.warmup_steps = options.warmup_steps;
  result.buckets = static_cast<int>(plan.buckets.size());
  result.model_bytes = plan.total_elements * static_cast<int64_t>(sizeof(float));
  for (const LayerShape& layer : layers) {
    result.compute_ms += (layer.forward_ms + layer.backward_ms) * options.compute_scale;
  }
  for (const Bucket& b : plan.buckets) {
    result.bytes_sent_per_iter +=
        RingBytesPerRank(b.elements * static_cast<int64_t>(sizeof(float)), ring.world());
  }
  result.bytes_received_per_iter = result.bytes_sent_per_iter;

  std::unique_ptr<float[]> parameters(new float[plan.total_elements]);
  std::unique_ptr<float[]> gradients(new float[plan.total_elements]);
  for (const TensorSlot& slot : plan.tensors) {
    for (int64_t j = 0; j < slot.elements; ++j) {
      parameters[slot.buffer_offset + j] = InitialParameter(slot.model_offset + j, options.seed);
    }
  }
  std::vector<float> table(kTable);
  const uint32_t rank_key = RankKey(options.seed, ring.rank());
  for (int64_t k = 0; k < kTable; ++k) table[k] = TableEntry(k, rank_key);
  // Slots of each layer, so backward of layer l writes just its tensors.
  std::vector<std::vector<const TensorSlot*>> slots_of_layer(layers.size());
  for (const TensorSlot& slot : plan.tensors) slots_of_layer[slot.layer].push_back(&slot);

  BucketReducer reducer(plan, ring, options, gradients.get(), parameters.get());
  const double scale = options.compute_scale;
  int64_t sent0 = 0, received0 = 0;
  bool tcp_ok = false;
  double exposed_ms_sum = 0;
  double timed_ms_sum = 0;
  double overlapped_sum = 0;
  double overrun_ms_sum = 0;
  double cpu_start = 0;
  double gradient_write_cpu = 0;
  std::chrono::steady_clock::time_point timed_start;
  for (int step = 0; step < options.steps; ++step) {
    const bool timed_step = step >= options.warmup_steps;
    if (step == options.warmup_steps) {
      tcp_ok = ReadTcpBytes(&sent0, &received0);
      timed_start = std::chrono::steady_clock::now();
      cpu_start = ProcessCpuSeconds();
    }
    const absl::Time step_start = absl::Now();
    for (const LayerShape& layer : layers) {
      SleepUntil(absl::Now() + absl::Milliseconds(layer.forward_ms * scale));
    }
    const int64_t step_offset = StepOffset(options.seed, step);
    int ready = 0;
    // Taken before the last hand-over: the bucket that completes with layer
    // 0 starts after backward, not before it.
    absl::Time backward_end;
    for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
      // Writing the gradient is part of the layer's modelled time, not
      // added to it (unless it takes longer).
      const absl::Time layer_end = absl::Now() + absl::Milliseconds(layers[l].backward_ms * scale);
      const double write_start = timed_step ? ThreadCpuSeconds() : 0;
      for (const TensorSlot* slot : slots_of_layer[l]) {
        CopyGradient(table, slot->model_offset, step_offset, slot->elements,
                     gradients.get() + slot->buffer_offset);
      }
      if (timed_step) gradient_write_cpu += ThreadCpuSeconds() - write_start;
      SleepUntil(layer_end);
      backward_end = absl::Now();
      int now_ready = ready;
      while (now_ready < result.buckets && plan.buckets[now_ready].ready_after_layer >= l) {
        ++now_ready;
      }
      if (now_ready > ready) {
        ready = now_ready;
        reducer.MarkReady(ready);
      }
    }
    std::vector<absl::Time> started;
    absl::Status status = reducer.WaitAllDone(&started);
    if (!status.ok()) return status;
    int overlapped = 0;
    for (absl::Time t : started) overlapped += t < backward_end ? 1 : 0;
    const absl::Time step_end = absl::Now();
    const double step_ms = absl::ToDoubleMilliseconds(step_end - step_start);
    result.step_ms.push_back(step_ms);
    if (step >= options.warmup_steps) {
      timed_ms_sum += step_ms;
      exposed_ms_sum += absl::ToDoubleMilliseconds(step_end - backward_end);
      overlapped_sum += overlapped;
      overrun_ms_sum += absl::ToDoubleMilliseconds(backward_end - step_start) - result.compute_ms;
    }
  }
  const int timed = options.steps - options.warmup_steps;
  result.timed_start_monotonic_ns = SteadyNanos(timed_start);
  result.timed_end_monotonic_ns = SteadyNanos(std::chrono::steady_clock::now());
  result.gradient_write_cpu_seconds_per_iter = gradient_write_cpu / timed;
  result.cpu_seconds_per_iter =
      std::max(0.0, ProcessCpuSeconds() - cpu_start - gradient_write_cpu) / timed;
  result.iter_ms = timed_ms_sum / timed;
  result.exposed_comm_ms = exposed_ms_sum / timed;
  result.overlapped_buckets = overlapped_sum / timed;
  result.compute_overrun_ms = overrun_ms_sum / timed;
  int64_t sent1 = 0, received1 = 0;
  if (tcp_ok && ReadTcpBytes(&sent1, &received1)) {
    result.measured_bytes_sent_per_iter = (sent1 - sent0) / timed;
    result.measured_bytes_received_per_iter = (received1 - received0) / timed;
  }
  Check(plan, parameters.get(), ring.world(), options, &result);
  return result;
}

}  // namespace harrier::allreduce
