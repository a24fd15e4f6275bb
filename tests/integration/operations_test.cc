// Operations through real server processes: the Prometheus endpoint, and a
// shard killed with SIGKILL mid-training that restarts from its checkpoint
// while the workers retry and finish.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/kill_restart.h"
#include "testing/server_process.h"
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
  const testing::KillRestartResult result = testing::RunKillAndRestart("grpc", {});
  INFO(result.worker_errors[0] << " / " << result.worker_errors[1]);
  INFO(result.timeline);
  REQUIRE(result.worker_errors == std::vector<std::string>{"", ""});
  REQUIRE(result.completed == result.iterations);
  // Rounds since the last checkpoint before the kill are lost: at most one
  // interval (1 s, about 20 iterations at 50 ms each) plus the round in
  // flight.
  INFO("killed at iteration " << result.killed_at << ", rounds applied "
                              << result.rounds_applied);
  REQUIRE(result.final_value_exact);
  REQUIRE(result.rounds_applied <= result.iterations);
  REQUIRE(result.iterations - result.rounds_applied <= 22);
}

}  // namespace
}  // namespace harrier
