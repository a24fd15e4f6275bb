#include "worker/workload/replay.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "server/optimizer.h"
#include "worker/workload/replay_models.h"

namespace harrier::workload {
namespace {

constexpr uint64_t kSeed = 7;

ReplayModelSpec ResNet50() {
  absl::StatusOr<ReplayModelSpec> spec = FindReplayModel("resnet50");
  REQUIRE(spec.ok());
  return *std::move(spec);
}

// What the shards do under BSP with SGD: sum the round's pushes in float in
// arrival order, divide by the contributors, apply the server's own SGD.
// `skip_rank_at_step` drops one push (the shard then averages the rest);
// `pushers` says whose gradients arrive, so a doubled push can be played.
struct Shards {
  std::vector<std::vector<float>> params;
  std::unique_ptr<Optimizer> sgd;
  std::vector<OptimizerState> state;

  Shards(const ReplayModelSpec& spec, float lr) {
    OptimizerOptions options;
    options.kind = "sgd";
    options.lr = lr;
    auto created = CreateOptimizer(options);
    REQUIRE(created.ok());
    sgd = std::move(*created);
    const std::vector<const ReplayTensor*> tensors = FlattenTensors(spec);
    for (size_t k = 0; k < tensors.size(); ++k) {
      params.push_back(ReplayInitialValues(kSeed, static_cast<int>(k), tensors[k]->num_elements()));
    }
    state.resize(tensors.size());
  }

  void Round(int64_t step, const std::vector<const ReplayGradients*>& pushers) {
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<float> sum(params[k].size(), 0.0f);
      for (const ReplayGradients* g : pushers) {
        absl::Span<const float> grad = g->Get(static_cast<int>(k), step);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += grad[i];
      }
      for (float& v : sum) v /= static_cast<float>(pushers.size());
      sgd->Step(absl::MakeSpan(params[k]), sum, 1.0f, state[k]);
    }
  }

  std::vector<absl::Span<const float>> Views() const;
};

std::vector<absl::Span<const float>> Views(const std::vector<std::vector<float>>& params) {
  std::vector<absl::Span<const float>> out;
  for (const auto& p : params) out.push_back(absl::MakeConstSpan(p));
  return out;
}

std::vector<absl::Span<const float>> Shards::Views() const { return harrier::workload::Views(params); }

int IndexOf(const ReplayModelSpec& spec, const std::string& name) {
  const std::vector<const ReplayTensor*> tensors = FlattenTensors(spec);
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k]->name == name) return static_cast<int>(k);
  }
  FAIL("no tensor " << name);
  return -1;
}

// Generated once per worker count for the whole test binary (ResNet-50's
// 25.6 M floats x 3 buffers per rank).
const std::vector<ReplayGradients>& AllRanks(const ReplayModelSpec& spec, int workers) {
  static std::map<int, std::vector<ReplayGradients>>* cache =
      new std::map<int, std::vector<ReplayGradients>>();
  auto it = cache->find(workers);
  if (it != cache->end()) return it->second;
  std::vector<ReplayGradients> out;
  for (int r = 0; r < workers; ++r) {
    auto g = ReplayGradients::Create(spec, kSeed, r, workers);
    REQUIRE(g.ok());
    out.push_back(*std::move(g));
  }
  return cache->emplace(workers, std::move(out)).first->second;
}

TEST_CASE("the workers' gradients average exactly to the shared mean, for any worker count") {
  const ReplayModelSpec spec = ResNet50();
  for (int workers : {1, 3}) {
    const std::vector<ReplayGradients>& ranks = AllRanks(spec, workers);
    // fc.weight (2 M elements) and a BN bias: the mean, computed as the
    // shard does (float sum, then / n), equals ReplayMeanGradient exactly.
    for (int tensor : {159, 1}) {
      for (int64_t step : {0, 1, 2}) {
        const int64_t n = static_cast<int64_t>(ranks[0].Get(tensor, step).size());
        int64_t differing = 0, wrong = 0, zero = 0;
        for (int64_t i = 0; i < n; ++i) {
          float sum = 0;
          for (int r = workers - 1; r >= 0; --r) sum += ranks[r].Get(tensor, step)[i];
          const float mean = sum / static_cast<float>(workers);
          if (mean != ReplayMeanGradient(kSeed, tensor, i, step)) ++wrong;
          if (mean == 0.0f) ++zero;
          if (workers > 1 && ranks[0].Get(tensor, step)[i] != mean) ++differing;
        }
        CHECK(wrong == 0);
        CHECK(zero == 0);
        // The workers really differ from each other (a deviation of zero
        // has probability 1/7 per element).
        if (workers > 1) CHECK(differing > n / 2);
      }
    }
  }
  CHECK(!ReplayGradients::Create(spec, kSeed, 2, 2).ok());
}

TEST_CASE("a worker's gradients of ResNet-50 are generated fast enough to do once") {
  const ReplayModelSpec spec = ResNet50();
  const auto start = std::chrono::steady_clock::now();
  auto g = ReplayGradients::Create(spec, kSeed, 1, 4);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(g.ok());
  CHECK(g->num_tensors() == 161);
  CHECK(g->Get(159, 0).size() == 2048000u);
  // Step 0 once, then -1/2 and +1/2 of it alternating: bounded drift, and
  // no later step looks like step 0.
  CHECK(g->Get(159, 1)[12345] == -0.5f * g->Get(159, 0)[12345]);
  CHECK(g->Get(159, 2)[12345] == 0.5f * g->Get(159, 0)[12345]);
  CHECK(g->Get(159, 4).data() == g->Get(159, 2).data());
  CHECK(g->Get(159, 3).data() == g->Get(159, 1).data());
  CHECK(s < 10.0);
}

TEST_CASE("the check passes on a BSP replay through the server's SGD and catches every fault") {
  const ReplayModelSpec spec = ResNet50();
  const int workers = 3;  // not a power of two: the division by n must be exact too
  const std::vector<ReplayGradients>& ranks = AllRanks(spec, workers);
  std::vector<const ReplayGradients*> all;
  for (const auto& r : ranks) all.push_back(&r);
  for (float lr : {0.01f, 0.0625f}) {
    ReplayCheckOptions check;
    check.lr = lr;
    check.steps = 3;
    Shards good(spec, lr);
    for (int64_t t = 0; t < check.steps; ++t) good.Round(t, all);
    REQUIRE(CheckReplayParameters(spec, kSeed, good.Views(), check).ok());
    // The faults once, at the server's default lr (the emulated-float case).
    if (lr != 0.01f) continue;

    {  // one element off by one ulp
      std::vector<std::vector<float>> bad = good.params;
      const int tensor = IndexOf(spec, "layer3.0.conv2.weight");
      // The last element: the sample always includes it.
      bad[tensor].back() = std::nextafter(bad[tensor].back(), 10.0f);
      const absl::Status status = CheckReplayParameters(spec, kSeed, Views(bad), check);
      CHECK(status.code() == absl::StatusCode::kDataLoss);
      CHECK(absl::StrContains(status.message(), "layer3.0.conv2.weight"));
    }
    {  // a small tensor with one wrong element anywhere
      std::vector<std::vector<float>> bad = good.params;
      bad[IndexOf(spec, "bn1.weight")][37] += 1.0f / 64;  // checked whole
      CHECK(CheckReplayParameters(spec, kSeed, Views(bad), check).code() ==
            absl::StatusCode::kDataLoss);
    }
    {  // one worker's push missing from one round
      Shards bad(spec, lr);
      for (int64_t t = 0; t < check.steps; ++t) {
        bad.Round(t, t == 1 ? std::vector<const ReplayGradients*>{all[0], all[2]} : all);
      }
      CHECK(!CheckReplayParameters(spec, kSeed, bad.Views(), check).ok());
    }
    {  // one worker's push counted twice
      Shards bad(spec, lr);
      for (int64_t t = 0; t < check.steps; ++t) {
        bad.Round(t, t == 2 ? std::vector<const ReplayGradients*>{all[0], all[1], all[1]} : all);
      }
      CHECK(!CheckReplayParameters(spec, kSeed, bad.Views(), check).ok());
    }
    {  // one worker a step ahead: it pushes steps 1..T where the others push 0..T-1
      Shards bad(spec, lr);
      for (int64_t t = 0; t < check.steps; ++t) {
        for (size_t k = 0; k < bad.params.size(); ++k) {
          std::vector<float> sum(bad.params[k].size(), 0.0f);
          for (int r = 0; r < workers; ++r) {
            absl::Span<const float> g = all[r]->Get(static_cast<int>(k), r == 1 ? t + 1 : t);
            for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
          }
          for (float& v : sum) v /= static_cast<float>(workers);
          bad.sgd->Step(absl::MakeSpan(bad.params[k]), sum, 1.0f, bad.state[k]);
        }
      }
      CHECK(!CheckReplayParameters(spec, kSeed, bad.Views(), check).ok());
    }
    {  // a step fewer or more
      ReplayCheckOptions other = check;
      other.steps = check.steps - 1;
      CHECK(!CheckReplayParameters(spec, kSeed, good.Views(), other).ok());
      other.steps = check.steps + 1;
      CHECK(!CheckReplayParameters(spec, kSeed, good.Views(), other).ok());
    }
    {  // another learning rate
      ReplayCheckOptions other = check;
      other.lr = lr * 2;
      CHECK(!CheckReplayParameters(spec, kSeed, good.Views(), other).ok());
    }
  }
}

TEST_CASE("with a power-of-two lr the expected value is exact real arithmetic, and bounded") {
  // w0 - lr * b * (1/64 - (1/128 if the step count is even)): no rounding.
  for (int64_t i = 0; i < 1000; ++i) {
    const double w0 = ReplayInitialValue(kSeed, 5, i);
    const double b = ReplayMeanGradient(kSeed, 5, i, 0) * 64;
    REQUIRE(b == std::round(b));
    REQUIRE(std::abs(b) >= 1);
    REQUIRE(std::abs(b) <= 7);
    for (int64_t steps : {1, 2, 7, 100, 1001}) {
      const double exact = w0 - 0.0625 * b * (1.0 / 64 - (steps % 2 == 0 ? 1.0 / 128 : 0.0));
      REQUIRE(ExpectedReplayValue(kSeed, 5, i, steps, 0.0625f) == exact);
    }
  }
}

TEST_CASE("the compute pacer never runs short, and restarts after a wait on the network") {
  using Clock = std::chrono::steady_clock;
  const auto ms = [](Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  // 200 layers of 0.05 ms at scale 2: at least 20 ms in all.
  ComputePacer pacer(2.0);
  auto start = Clock::now();
  for (int i = 0; i < 200; ++i) pacer.Run(0.05);
  CHECK(ms(Clock::now() - start) >= 20.0);
  // A wait longer than kRestartMs is not credited to the next layer.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  start = Clock::now();
  pacer.Run(1.5);
  CHECK(ms(Clock::now() - start) >= 3.0);
  // Scale 0 and negative times cost nothing: far from the 10 s that 1000
  // layers of 10 ms would take, however busy the machine.
  ComputePacer none(0.0);
  start = Clock::now();
  for (int i = 0; i < 1000; ++i) none.Run(10.0);
  CHECK(ms(Clock::now() - start) < 2000.0);
}

TEST_CASE("the summary line has its documented fields in order") {
  ReplaySummary s;
  s.model = "resnet50";
  s.techniques = "all";
  s.compute_scale = 1.0;
  s.rank = 0;
  s.workers = 2;
  s.shards = 2;
  s.steps = 5;
  s.warmup_steps = 1;
  s.iter_ms = 123.4;
  s.compute_ms = 100.0;
  s.bytes_pushed_per_iter = 102228128;
  s.bytes_pulled_per_iter = 102228128;
  s.bytes_per_iter = 204456256;
  s.checked = true;
  s.sync = "bsp";
  s.bytes_pushed_per_shard_per_iter = {51114064, 51114064};
  s.bytes_pulled_per_shard_per_iter = {51114000, 51114128};
  s.cpu_seconds_per_iter = 0.25;
  s.timed_start_monotonic_ns = 1000000000;
  s.timed_end_monotonic_ns = 1617000000;
  s.step_ms = {130.5, 121.0, 122.25, 123.75, 119.5};
  s.forward_order_tail = 0.3125;
  s.measured_forward_order_tail = 0.28;
  CHECK(FormatReplaySummary(s) ==
        "replay_summary {\"model\":\"resnet50\",\"techniques\":\"all\",\"sync\":\"bsp\","
        "\"compute_scale\":1.0,"
        "\"rank\":0,\"workers\":2,\"shards\":2,\"steps\":5,\"warmup_steps\":1,\"iter_ms\":123.400,"
        "\"compute_ms\":100.000,\"bytes_pushed_per_iter\":102228128,\"bytes_pulled_per_iter\":"
        "102228128,\"bytes_per_iter\":204456256,\"checked\":true,"
        "\"bytes_pushed_per_shard_per_iter\":[51114064,51114064],"
        "\"bytes_pulled_per_shard_per_iter\":[51114000,51114128],\"cpu_seconds_per_iter\":0.250000,"
        "\"timed_start_monotonic_ns\":1000000000,\"timed_end_monotonic_ns\":1617000000,"
        "\"step_ms\":[130.5,121.0,122.2,123.8,119.5],\"forward_order_tail\":0.3125,"
        "\"measured_forward_order_tail\":0.28}");
  s.compute_scale = 0.01;
  CHECK(absl::StrContains(FormatReplaySummary(s), "\"compute_scale\":0.01,"));
}

}  // namespace
}  // namespace harrier::workload
