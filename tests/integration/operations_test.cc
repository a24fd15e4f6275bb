// Operations through real server processes: the Prometheus endpoint, and a
// shard killed with SIGKILL mid-training that restarts from its checkpoint
// while the workers retry and finish.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr size_t kElements = 16;

TEST_CASE("the metrics endpoint serves Prometheus text with the shard's counters") {
  const int metrics_port = testing::FreePort();
  auto servers =
      testing::StartCluster(1, 1, {"--lr=1", absl::StrCat("--metrics_port=", metrics_port)});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterTensor("w", {kElements}).ok());
  std::vector<float> w(kElements), g(kElements, 1.0f);
  REQUIRE((*client)->Push("w", g).ok());
  (*client)->Clock();
  REQUIRE((*client)->Pull("w", absl::MakeSpan(w)).ok());

  const std::string response = testing::HttpGet(metrics_port, "/metrics");
  INFO(response);
  REQUIRE(response.find("200 OK") != std::string::npos);
  REQUIRE(response.find("# TYPE harrier_server_pushes_total counter") != std::string::npos);
  REQUIRE(response.find("harrier_server_pushes_total{shard=\"0\"} 1") != std::string::npos);
  REQUIRE(response.find("harrier_server_bytes_in_total{shard=\"0\"} 64") != std::string::npos);
  REQUIRE(response.find("harrier_server_pull_seconds_count{shard=\"0\"} 1") != std::string::npos);
  REQUIRE(response.find("harrier_server_checkpoint_age_seconds{shard=\"0\"} -1") !=
          std::string::npos);
  REQUIRE(testing::HttpGet(metrics_port, "/healthz").find("200 OK") != std::string::npos);
}

TEST_CASE("a shard killed mid-training restarts from its checkpoint and training finishes") {
  const std::string dir = absl::StrCat(testing::TempDir(), "/checkpoints");
  const int port = testing::FreePort();
  const std::vector<std::string> flags = {
      "--shard=0", "--num_shards=1", "--num_workers=2", "--lr=1", "--sync=bsp",
      absl::StrCat("--port=", port), "--checkpoint_dir=" + dir, "--checkpoint_every_s=1"};
  auto server = testing::ServerProcess::Start(flags);
  REQUIRE(server.ok());
  const std::string address = (*server)->address();

  constexpr int kIterations = 60;
  std::atomic<int> progress{0};
  std::vector<absl::Status> results(2);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      ClientOptions options;
      options.servers = {address};
      options.rank = rank;
      options.rpc_timeout = absl::Seconds(20);
      options.retry_timeout = absl::Seconds(20);
      auto client = Client::Create(options);
      if (!client.ok()) {
        results[rank] = client.status();
        return;
      }
      results[rank] = (*client)->RegisterTensor("w", {kElements});
      std::vector<float> w(kElements), g(kElements, 1.0f);
      for (int t = 0; t < kIterations && results[rank].ok(); ++t) {
        results[rank] = (*client)->PushPull("w", g, absl::MakeSpan(w));
        (*client)->Clock();
        if (rank == 0) progress = t + 1;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  // Let a checkpoint or two be written, then kill the shard hard.
  while (progress < 30) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int killed_at = progress;
  (*server)->process().Signal(SIGKILL);
  REQUIRE((*server)->process().WaitForExit(5000) == 128 + SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto restarted = testing::ServerProcess::Start(flags);
  REQUIRE(restarted.ok());
  for (auto& worker : workers) worker.join();
  INFO(results[0].ToString() << " / " << results[1].ToString());
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());

  // Every applied round subtracts exactly 1; rounds since the last
  // checkpoint before the kill are lost: at most one interval (1 s, about
  // 20 iterations at 50 ms each) plus the round in flight.
  ClientOptions options;
  options.servers = {address};
  options.rank = 0;
  auto reader = Client::Create(options);
  REQUIRE(reader.ok());
  REQUIRE((*reader)->RegisterTensor("w", {kElements}).ok());
  std::vector<float> w(kElements);
  for (int t = 0; t < kIterations; ++t) (*reader)->Clock();
  REQUIRE((*reader)->Pull("w", absl::MakeSpan(w)).ok());
  const int applied = static_cast<int>(-w[0]);
  INFO("killed at iteration " << killed_at << ", rounds applied " << applied);
  REQUIRE(w[0] == -static_cast<float>(applied));
  REQUIRE(applied <= kIterations);
  REQUIRE(kIterations - applied <= 22);
}

}  // namespace
}  // namespace harrier
