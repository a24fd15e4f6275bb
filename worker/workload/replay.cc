#include "worker/workload/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace harrier::workload {
namespace {

constexpr float kInitialUnit = 1.0f / 64;  // 2^-6
constexpr float kFirstUnit = 1.0f / 64;    // c_0
constexpr float kOddUnit = -1.0f / 128;    // c_t, t odd
constexpr float kEvenUnit = 1.0f / 128;    // c_t, t even > 0

float StepUnit(int64_t step) {
  return step == 0 ? kFirstUnit : (step % 2 == 1 ? kOddUnit : kEvenUnit);
}

uint64_t Mix(uint64_t x) {
  // splitmix64's finaliser: cheap, and every input bit reaches every output
  // bit, so neighbouring elements get unrelated values.
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One stream per (seed, purpose, tensor, rank); elements index into it.
uint64_t StreamKey(uint64_t seed, uint64_t purpose, int tensor, int rank) {
  return Mix(Mix(Mix(seed ^ (purpose << 56)) + static_cast<uint64_t>(tensor)) +
             static_cast<uint64_t>(rank));
}

uint64_t At(uint64_t key, int64_t index) {
  return Mix(key + static_cast<uint64_t>(index) * 0xd1b54a32d192ed03ULL);
}

enum Purpose : uint64_t { kInitial = 1, kBase = 2, kDeviation = 3 };

// b in {-7..-1, 1..7}: never zero, so every element's check sees the steps.
int Base(uint64_t key, int64_t index) {
  const int v = static_cast<int>(At(key, index) % 14);
  return v < 7 ? v - 7 : v - 6;
}

int Deviation(uint64_t key, int64_t index) { return static_cast<int>(At(key, index) % 7) - 3; }

}  // namespace

void ComputePacer::Run(double layer_ms) {
  const double ms = layer_ms * scale_;
  if (!(ms > 0)) return;
  const auto now = std::chrono::steady_clock::now();
  const auto restart = std::chrono::duration<double, std::milli>(kRestartMs);
  if (next_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(restart) < now) {
    next_ = now;
  }
  next_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::milli>(ms));
  if (next_ > now) std::this_thread::sleep_until(next_);
}

std::vector<const ReplayTensor*> FlattenTensors(const ReplayModelSpec& spec) {
  std::vector<const ReplayTensor*> out;
  for (const ReplayLayer& layer : spec.layers) {
    for (const ReplayTensor& t : layer.tensors) out.push_back(&t);
  }
  return out;
}

float ReplayInitialValue(uint64_t seed, int tensor, int64_t index) {
  const uint64_t key = StreamKey(seed, kInitial, tensor, 0);
  return static_cast<float>(static_cast<int>(At(key, index) % 129) - 64) * kInitialUnit;
}

std::vector<float> ReplayInitialValues(uint64_t seed, int tensor, int64_t num_elements) {
  std::vector<float> out(static_cast<size_t>(num_elements));
  const uint64_t key = StreamKey(seed, kInitial, tensor, 0);
  for (int64_t i = 0; i < num_elements; ++i) {
    out[i] = static_cast<float>(static_cast<int>(At(key, i) % 129) - 64) * kInitialUnit;
  }
  return out;
}

float ReplayMeanGradient(uint64_t seed, int tensor, int64_t index, int64_t step) {
  const int b = Base(StreamKey(seed, kBase, tensor, 0), index);
  return static_cast<float>(b) * StepUnit(step);
}

float ExpectedReplayValue(uint64_t seed, int tensor, int64_t index, int64_t steps, float lr) {
  float w = ReplayInitialValue(seed, tensor, index);
  const float means[3] = {ReplayMeanGradient(seed, tensor, index, 0),
                          ReplayMeanGradient(seed, tensor, index, 1),
                          ReplayMeanGradient(seed, tensor, index, 2)};
  for (int64_t t = 0; t < steps; ++t) w -= lr * means[t == 0 ? 0 : (t % 2 == 1 ? 1 : 2)];
  return w;
}

absl::StatusOr<ReplayGradients> ReplayGradients::Create(const ReplayModelSpec& spec,
                                                        uint64_t seed, int rank,
                                                        int num_workers) {
  if (num_workers < 1 || rank < 0 || rank >= num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay gradients: rank ", rank, " of ", num_workers, " workers"));
  }
  ReplayGradients out;
  const std::vector<const ReplayTensor*> tensors = FlattenTensors(spec);
  out.first_.resize(tensors.size());
  out.odd_.resize(tensors.size());
  out.even_.resize(tensors.size());
  const bool last = rank == num_workers - 1;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const int tensor = static_cast<int>(k);
    const int64_t n = tensors[k]->num_elements();
    const uint64_t base_key = StreamKey(seed, kBase, tensor, 0);
    // The last rank's deviation cancels the others', so the sum is n * b.
    std::vector<uint64_t> keys;
    if (last) {
      for (int r = 0; r + 1 < num_workers; ++r) keys.push_back(StreamKey(seed, kDeviation, tensor, r));
    } else {
      keys.push_back(StreamKey(seed, kDeviation, tensor, rank));
    }
    std::vector<float>& first = out.first_[k];
    std::vector<float>& odd = out.odd_[k];
    std::vector<float>& even = out.even_[k];
    first.resize(static_cast<size_t>(n));
    odd.resize(static_cast<size_t>(n));
    even.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      int d = 0;
      for (uint64_t key : keys) d += Deviation(key, i);
      if (last) d = -d;
      const float v = static_cast<float>(Base(base_key, i) + d);
      first[i] = v * kFirstUnit;
      odd[i] = v * kOddUnit;
      even[i] = v * kEvenUnit;
    }
  }
  return out;
}

absl::Span<const float> ReplayGradients::Get(int tensor, int64_t step) const {
  const std::vector<float>& v =
      step == 0 ? first_[tensor] : (step % 2 == 1 ? odd_[tensor] : even_[tensor]);
  return absl::MakeConstSpan(v);
}

absl::Status CheckReplayParameters(const ReplayModelSpec& spec, uint64_t seed,
                                   const std::vector<absl::Span<const float>>& parameters,
                                   const ReplayCheckOptions& options) {
  const std::vector<const ReplayTensor*> tensors = FlattenTensors(spec);
  if (parameters.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("replay check: ", parameters.size(),
                                                   " tensors given, ", spec.name, " has ",
                                                   tensors.size()));
  }
  for (size_t k = 0; k < tensors.size(); ++k) {
    const int64_t n = tensors[k]->num_elements();
    if (static_cast<int64_t>(parameters[k].size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("replay check: tensor ", tensors[k]->name,
                                                     " has ", parameters[k].size(),
                                                     " elements, expected ", n));
    }
    const bool whole = n <= options.check_all_below || n <= options.samples;
    const int64_t count = whole ? n : std::max<int64_t>(options.samples, 2);
    for (int64_t s = 0; s < count; ++s) {
      // Spread over the tensor, first and last included, so every chunk of
      // a large tensor (and so every shard) is sampled.
      const int64_t i = whole ? s : s * (n - 1) / (count - 1);
      const float expected = ExpectedReplayValue(seed, static_cast<int>(k), i, options.steps,
                                                 options.lr);
      const float actual = parameters[k][i];
      if (!(actual == expected)) {
        return absl::DataLossError(absl::StrFormat(
            "replay check: %s[%d] is %.9g, expected %.9g after %d BSP steps at lr %g",
            tensors[k]->name, i, actual, expected, options.steps, options.lr));
      }
    }
  }
  return absl::OkStatus();
}

std::string FormatReplaySummary(const ReplaySummary& s) {
  std::string scale = absl::StrFormat("%.6g", s.compute_scale);
  if (scale.find_first_of(".en") == std::string::npos) scale += ".0";
  return absl::StrFormat(
      "replay_summary {\"model\":\"%s\",\"techniques\":\"%s\",\"sync\":\"%s\","
      "\"compute_scale\":%s,\"rank\":%d,"
      "\"workers\":%d,\"shards\":%d,\"steps\":%d,\"warmup_steps\":%d,\"iter_ms\":%.3f,"
      "\"compute_ms\":%.3f,\"bytes_pushed_per_iter\":%d,\"bytes_pulled_per_iter\":%d,"
      "\"bytes_per_iter\":%d,\"checked\":%s,\"bytes_pushed_per_shard_per_iter\":[%s],"
      "\"bytes_pulled_per_shard_per_iter\":[%s],\"cpu_seconds_per_iter\":%.6f,"
      "\"timed_start_monotonic_ns\":%d,\"timed_end_monotonic_ns\":%d,\"step_ms\":[%s],"
      "\"forward_order_tail\":%.6g,\"measured_forward_order_tail\":%.6g}",
      s.model, s.techniques, s.sync, scale, s.rank, s.workers, s.shards, s.steps, s.warmup_steps,
      s.iter_ms, s.compute_ms, s.bytes_pushed_per_iter, s.bytes_pulled_per_iter, s.bytes_per_iter,
      s.checked ? "true" : "false", absl::StrJoin(s.bytes_pushed_per_shard_per_iter, ","),
      absl::StrJoin(s.bytes_pulled_per_shard_per_iter, ","), s.cpu_seconds_per_iter,
      s.timed_start_monotonic_ns, s.timed_end_monotonic_ns,
      absl::StrJoin(s.step_ms, ",",
                    [](std::string* out, double ms) { absl::StrAppendFormat(out, "%.1f", ms); }),
      s.forward_order_tail, s.measured_forward_order_tail);
}

}  // namespace harrier::workload
