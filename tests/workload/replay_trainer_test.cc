// RunReplay against real shards (2 harrier-server processes), 2 workers as
// threads with their own Clients, ResNet-50 at full size with no modelled
// compute: what the summary says under BSP and ASP, and that the check
// sees a worker whose gradients are not the ones it should push.
#include "worker/replay_trainer.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "testing/server_process.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"
#include "worker/workload/replay.h"
#include "worker/workload/replay_models.h"

namespace harrier {
namespace {

constexpr int kWorkers = 2;
constexpr int64_t kResNetBytes = int64_t{4} * 25557032;

struct Outcome {
  std::vector<absl::StatusOr<workload::ReplaySummary>> summaries;
};

// `seed_of_rank1`: rank 1's seed (the others use 1); a different one makes
// it push another model's gradients.
Outcome RunJob(const std::string& sync, const std::optional<CommSchedulerOptions>& scheduler,
               uint64_t seed_of_rank1 = 1) {
  auto servers =
      testing::StartCluster(2, kWorkers, {"--optimizer=sgd", "--lr=0.0625", "--sync=" + sync});
  REQUIRE(servers.ok());
  absl::StatusOr<workload::ReplayModelSpec> spec = workload::FindReplayModel("resnet50");
  REQUIRE(spec.ok());
  Outcome out;
  out.summaries.assign(kWorkers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions options;
      options.servers = testing::Addresses(*servers);
      options.rank = w;
      options.rpc_timeout = absl::Seconds(60);
      if (scheduler && scheduler->partition_bytes > 0) {
        options.chunk_bytes = scheduler->partition_bytes;
      }
      auto client = Client::Create(options);
      if (!client.ok()) {
        out.summaries[w] = client.status();
        return;
      }
      ReplayTrainerOptions replay;
      replay.compute_scale = 0;
      replay.steps = 2;
      replay.warmup_steps = 1;
      replay.seed = w == 1 ? seed_of_rank1 : 1;
      replay.scheduler = scheduler;
      replay.techniques = scheduler ? "priority" : "none";
      replay.lr = 0.0625f;
      replay.wait_timeout = absl::Seconds(60);
      out.summaries[w] = RunReplay(**client, *spec, replay);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST_CASE("under BSP through the scheduler's priority path: dense bytes and the check passes") {
  auto scheduler = ParseTechniques("priority");
  REQUIRE(scheduler.ok());
  Outcome out = RunJob("bsp", *scheduler);
  for (int w = 0; w < kWorkers; ++w) {
    INFO("rank " << w);
    REQUIRE(out.summaries[w].ok());
    const workload::ReplaySummary& s = *out.summaries[w];
    CHECK(s.checked);
    CHECK(s.rank == w);
    CHECK(s.workers == kWorkers);
    CHECK(s.shards == 2);
    CHECK(s.steps == 2);
    CHECK(s.bytes_pushed_per_iter == kResNetBytes);
    CHECK(s.bytes_pulled_per_iter == kResNetBytes);
    CHECK(s.compute_ms == 0);
    CHECK(s.iter_ms > 0);
    CHECK(s.techniques == "priority");
  }
}

TEST_CASE("under ASP the check does not run and the summary says so") {
  Outcome out = RunJob("asp", std::nullopt);
  for (int w = 0; w < kWorkers; ++w) {
    INFO("rank " << w);
    REQUIRE(out.summaries[w].ok());
    CHECK(!out.summaries[w]->checked);
    CHECK(out.summaries[w]->bytes_pushed_per_iter == kResNetBytes);
  }
}

TEST_CASE("a worker pushing another seed's gradients fails the check on every worker") {
  Outcome out = RunJob("bsp", std::nullopt, /*seed_of_rank1=*/2);
  for (int w = 0; w < kWorkers; ++w) {
    INFO("rank " << w);
    REQUIRE(!out.summaries[w].ok());
    CHECK(out.summaries[w].status().code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(out.summaries[w].status().message(), "replay check: "));
  }
}

}  // namespace
}  // namespace harrier
