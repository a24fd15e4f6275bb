// The comm scheduler against real shards: 2 harrier-server processes, 2
// workers (threads, each its own Client), BSP with SGD on the shards. A
// model of 10 tensors (10.3 MiB: one of 8.4 MiB that partitioning splits,
// several under 64 KiB that fusion merges) trained for several steps with
// gradients that depend on the pulled parameters, so a stale or misplaced
// pull changes every later step. With 2 workers the shards' average does
// not depend on arrival order, so every technique, alone and together,
// must end on parameters bit-identical to plain Client PushPull calls.
// Then the MLP trainer with and without the scheduler, the same way.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "testing/server_process.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"
#include "worker/trainer.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/mlp.h"

namespace harrier {
namespace {

constexpr int kWorkers = 2;
constexpr int kSteps = 4;
constexpr float kLr = 0.125f;

// Front (input) layer first, as the scheduler takes them.
const std::vector<size_t>& TensorSizes() {
  static const std::vector<size_t> sizes = {432,       16,   4608,    32,  2200000,
                                            1000,      300000, 500, 10000, 10};
  return sizes;
}

uint32_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// In [-1, 1), seeded by everything that makes it unique.
float Noise(int rank, int step, size_t tensor, size_t i) {
  const uint64_t seed = (static_cast<uint64_t>(rank) << 56) ^ (static_cast<uint64_t>(step) << 48) ^
                        (static_cast<uint64_t>(tensor) << 40) ^ i;
  return static_cast<float>(Mix(seed) >> 8) / static_cast<float>(1 << 23) - 1.0f;
}

float Initial(size_t tensor, size_t i) { return Noise(7, 0, tensor, i); }

// The gradient reads the parameters the worker pulled for this step.
void Gradient(int rank, int step, size_t tensor, const std::vector<float>& params,
              std::vector<float>* grad) {
  for (size_t i = 0; i < params.size(); ++i) {
    (*grad)[i] = 0.5f * params[i] + Noise(rank, step, tensor, i);
  }
}

using Params = std::vector<std::vector<float>>;

struct RunResult {
  std::vector<std::string> failures = std::vector<std::string>(kWorkers);
  std::vector<Params> params = std::vector<Params>(kWorkers);
  std::vector<CommSchedulerStats> stats = std::vector<CommSchedulerStats>(kWorkers);
};

// One job on a fresh cluster; `scheduler` nullopt: PushPull per tensor.
RunResult RunJob(const std::optional<CommSchedulerOptions>& scheduler_options) {
  RunResult result;
  auto servers =
      testing::StartCluster(2, kWorkers, {"--optimizer=sgd", absl::StrCat("--lr=", kLr), "--sync=bsp"});
  REQUIRE(servers.ok());
  const std::vector<size_t>& sizes = TensorSizes();
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::string& failure = result.failures[w];
      ClientOptions options;
      options.servers = testing::Addresses(*servers);
      options.rpc_timeout = absl::Seconds(60);
      // A piece is one client chunk (what harrier-worker sets).
      if (scheduler_options && scheduler_options->partition_bytes > 0) {
        options.chunk_bytes = scheduler_options->partition_bytes;
      }
      auto client = Client::Create(options);
      if (!client.ok()) {
        failure = client.status().ToString();
        return;
      }
      const int rank = (*client)->rank();
      Params params(sizes.size()), grads(sizes.size());
      for (size_t k = 0; k < sizes.size(); ++k) {
        params[k].resize(sizes[k]);
        grads[k].resize(sizes[k]);
        for (size_t i = 0; i < sizes[k]; ++i) params[k][i] = Initial(k, i);
      }
      auto fail = [&](const absl::Status& status, const std::string& where) {
        failure = absl::StrCat(where, ": ", status.ToString());
      };
      if (!scheduler_options) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          auto status = (*client)->RegisterTensor(absl::StrCat("t", k),
                                                  {static_cast<int64_t>(sizes[k])}, params[k]);
          if (!status.ok()) return fail(status, "register");
        }
        for (size_t k = 0; k < sizes.size(); ++k) {
          auto status = (*client)->Pull(absl::StrCat("t", k), absl::MakeSpan(params[k]));
          if (!status.ok()) return fail(status, "first pull");
        }
        for (int step = 0; step < kSteps; ++step) {
          std::vector<Client::Handle> handles;
          for (size_t k = 0; k < sizes.size(); ++k) {
            Gradient(rank, step, k, params[k], &grads[k]);
            handles.push_back(
                (*client)->PushPullAsync(absl::StrCat("t", k), grads[k], absl::MakeSpan(params[k])));
          }
          for (const auto& handle : handles) {
            if (auto status = (*client)->Wait(handle, absl::Now() + absl::Seconds(60));
                !status.ok()) {
              return fail(status, absl::StrCat("push-pull at step ", step));
            }
          }
          (*client)->Clock();
        }
      } else {
        std::vector<ScheduledTensor> tensors;
        for (size_t k = 0; k < sizes.size(); ++k) {
          tensors.push_back(
              {absl::StrCat("t", k), {static_cast<int64_t>(sizes[k])}, absl::MakeSpan(params[k])});
        }
        auto scheduler = CommScheduler::Create(**client, std::move(tensors), *scheduler_options);
        if (!scheduler.ok()) return fail(scheduler.status(), "create");
        const int n = static_cast<int>(sizes.size());
        for (int step = 0; step < kSteps; ++step) {
          for (int k = 0; k < n; ++k) {
            if (auto status = (*scheduler)->WaitParameters(k); !status.ok()) {
              return fail(status, absl::StrCat("WaitParameters at step ", step));
            }
          }
          // Backward: each gradient computed just before it is handed over.
          for (int k = n - 1; k >= 0; --k) {
            Gradient(rank, step, k, params[k], &grads[k]);
            if (auto status = (*scheduler)->GradientReady(k, grads[k]); !status.ok()) {
              return fail(status, absl::StrCat("GradientReady at step ", step));
            }
          }
          if (auto status = (*scheduler)->EndBackward(); !status.ok()) {
            return fail(status, absl::StrCat("EndBackward at step ", step));
          }
        }
        if (auto status = (*scheduler)->Drain(); !status.ok()) return fail(status, "Drain");
        result.stats[w] = (*scheduler)->stats();
      }
      result.params[w] = std::move(params);
    });
  }
  for (auto& thread : threads) thread.join();
  return result;
}

// Where two runs' parameters first differ ("" if bit-identical).
std::string FirstDifference(const Params& a, const Params& b) {
  if (a.size() != b.size()) return "tensor counts differ";
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size()) return absl::StrCat("t", k, ": sizes differ");
    for (size_t i = 0; i < a[k].size(); ++i) {
      if (std::memcmp(&a[k][i], &b[k][i], sizeof(float)) != 0) {
        return absl::StrCat("t", k, "[", i, "] = ", a[k][i], " vs ", b[k][i]);
      }
    }
  }
  return "";
}

void CheckRun(const RunResult& run) {
  for (int w = 0; w < kWorkers; ++w) {
    INFO("worker " << w << ": " << run.failures[w]);
    REQUIRE(run.failures[w].empty());
  }
}

TEST_CASE("every technique, alone and together, ends bit-identical to plain PushPull") {
  const RunResult baseline = RunJob(std::nullopt);
  CheckRun(baseline);
  // Both workers agree, and the job moved the parameters.
  REQUIRE(FirstDifference(baseline.params[0], baseline.params[1]).empty());
  size_t moved = 0;
  for (size_t i = 0; i < TensorSizes()[4]; ++i) moved += baseline.params[0][4][i] != Initial(4, i);
  REQUIRE(moved > TensorSizes()[4] * 9 / 10);

  struct Case {
    std::string techniques;
    size_t fusion_bytes = 0, partition_bytes = 0, max_inflight_bytes = 0;
  };
  const std::vector<Case> cases = {
      {"plain"},
      {"wfbp"},
      {"fusion", 64u << 10},
      {"partition", 0, 1u << 20},
      {"credits", 0, 0, 2u << 20},
      {"priority", 0, 1u << 20, 2u << 20},
      {"all", 64u << 10, 1u << 20, 2u << 20},
  };
  for (const Case& c : cases) {
    INFO("techniques " << c.techniques);
    auto options =
        ParseTechniques(c.techniques, c.fusion_bytes, c.partition_bytes, c.max_inflight_bytes);
    REQUIRE(options.ok());
    options->wait_timeout = absl::Seconds(60);
    const RunResult run = RunJob(*options);
    CheckRun(run);
    for (int w = 0; w < kWorkers; ++w) {
      INFO("worker " << w);
      CHECK(FirstDifference(run.params[w], baseline.params[0]) == "");
      const CommSchedulerStats& stats = run.stats[w];
      if (c.fusion_bytes > 0) {
        // Buckets {0..3} and {7, 8, 9}: 6 wire tensors instead of 10.
        CHECK(stats.push_calls % kSteps == 0);
      }
      if (c.partition_bytes > 0) {
        // t4 (8.4 MiB) in 9 pieces and t6 (1.1 MiB) in 2: more calls than
        // tensors.
        CHECK(stats.push_calls >= kSteps * (9 + 2));
      } else if (c.fusion_bytes == 0) {
        CHECK(stats.push_calls == kSteps * 10);
      }
      if (c.max_inflight_bytes > 0) {
        // A piece above the cap (t4 unpartitioned) goes alone.
        const size_t largest = c.partition_bytes > 0 ? c.partition_bytes : TensorSizes()[4] * 4;
        CHECK(stats.peak_inflight_push_bytes <=
              static_cast<int64_t>(std::max(c.max_inflight_bytes, largest)));
      }
    }
  }
}

// A synthetic data set of `n` 28x28 images: enough for gradients that
// differ per example and per worker.
workload::Dataset Synthetic(int n) {
  workload::Dataset data;
  data.num_examples = n;
  data.rows = 28;
  data.cols = 28;
  data.images.resize(static_cast<size_t>(n) * 784);
  data.labels.resize(n);
  for (size_t i = 0; i < data.images.size(); ++i) {
    data.images[i] = static_cast<float>(Mix(i * 31 + 5) % 256) / 255.0f;
  }
  for (int i = 0; i < n; ++i) data.labels[i] = static_cast<uint8_t>(Mix(i * 7 + 1) % 10);
  return data;
}

struct TrainOutcome {
  std::vector<Params> params = std::vector<Params>(kWorkers);
  double accuracy = -1;  // rank 0's, after the final barrier and pull
};

TrainOutcome TrainJob(const std::optional<CommSchedulerOptions>& scheduler_options) {
  auto servers =
      testing::StartCluster(2, kWorkers, {"--optimizer=sgd", "--lr=0.1", "--sync=bsp"});
  REQUIRE(servers.ok());
  const workload::Dataset train = Synthetic(512);
  TrainOutcome outcome;
  std::vector<Params>& params = outcome.params;
  std::vector<std::string> failures(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions options;
      options.servers = testing::Addresses(*servers);
      if (scheduler_options && scheduler_options->partition_bytes > 0) {
        options.chunk_bytes = scheduler_options->partition_bytes;
      }
      auto client = Client::Create(options);
      if (!client.ok()) {
        failures[w] = client.status().ToString();
        return;
      }
      workload::MlpOptions mlp_options;
      mlp_options.layer_sizes = {784, 128, 64, 10};
      auto model = workload::Mlp::Create(mlp_options);
      if (!model.ok()) {
        failures[w] = model.status().ToString();
        return;
      }
      TrainerOptions trainer;
      trainer.batch_size = 32;
      trainer.max_steps = 6;
      trainer.log_every = 1000;
      trainer.scheduler = scheduler_options;
      auto trained = Train(**client, *model, train, &train, trainer);
      if (!trained.ok()) {
        failures[w] = trained.status().ToString();
        return;
      }
      if (trained->steps != 6) failures[w] = absl::StrCat(trained->steps, " steps");
      if ((*client)->rank() == 0) outcome.accuracy = trained->test_accuracy;
      for (const auto& param : model->params()) params[w].push_back(param.values);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int w = 0; w < kWorkers; ++w) {
    INFO("worker " << w << ": " << failures[w]);
    REQUIRE(failures[w].empty());
  }
  return outcome;
}

TEST_CASE("the MLP trainer ends on the same parameters with the scheduler as without") {
  const TrainOutcome without = TrainJob(std::nullopt);
  // fc0.weight (392 KiB) in pieces of 64 KiB; the biases and fc2 fused.
  auto options = ParseTechniques("all", 16u << 10, 64u << 10, 256u << 10);
  REQUIRE(options.ok());
  const TrainOutcome with = TrainJob(*options);
  for (int w = 0; w < kWorkers; ++w) {
    INFO("worker " << w);
    CHECK(FirstDifference(with.params[w], without.params[w]) == "");
  }
  CHECK(FirstDifference(without.params[0], without.params[1]) == "");
  // Rank 0 evaluated what it pulled after the final barrier (the scheduler's
  // Refresh): the same model, the same accuracy.
  CHECK(without.accuracy >= 0);
  CHECK(with.accuracy == without.accuracy);
}

TEST_CASE("the trainer refuses the scheduler under local SGD") {
  auto servers = testing::StartCluster(1, 1, {"--optimizer=sgd", "--sync=local", "--local_steps=2"});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  auto model = workload::Mlp::Create(workload::MlpOptions{{784, 16, 10}, 1});
  REQUIRE(model.ok());
  TrainerOptions trainer;
  trainer.max_steps = 2;
  trainer.scheduler = CommSchedulerOptions{};
  auto trained = Train(**client, *model, Synthetic(64), nullptr, trainer);
  CHECK(absl::IsInvalidArgument(trained.status()));
  CHECK(std::string(trained.status().message()).find("--sync") != std::string::npos);
}

}  // namespace
}  // namespace harrier
