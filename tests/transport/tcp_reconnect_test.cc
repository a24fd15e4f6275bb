// Over the tcp data path: a shard killed with SIGKILL mid-training restarts
// from its checkpoint on a new tcp port; the workers' tcp transports
// reconnect (fetching the new address and a fresh hello secret over gRPC)
// while the client retries, and training finishes with every applied round
// counted exactly. Under "auto", a shard that comes back without tcp gets
// the same calls over gRPC.
#include <catch2/catch.hpp>

#include "tests/integration/kill_restart.h"

namespace harrier {
namespace {

TEST_CASE("over tcp, a shard killed mid-training restarts and the transports reconnect") {
  const testing::KillRestartResult result = testing::RunKillAndRestart("tcp", {"--tcp"});
  INFO(result.worker_errors[0] << " / " << result.worker_errors[1]);
  INFO(result.timeline);
  REQUIRE(result.worker_errors == std::vector<std::string>{"", ""});
  REQUIRE(result.completed == result.iterations);
  INFO("killed at iteration " << result.killed_at << ", rounds applied " << result.rounds_applied);
  REQUIRE(result.final_value_exact);
  REQUIRE(result.rounds_applied <= result.iterations);
  REQUIRE(result.iterations - result.rounds_applied <= 22);
}

TEST_CASE("auto: a shard restarted without tcp gets the workers' calls over gRPC") {
  // The shard first serves tcp (its default), which "auto" takes; after the
  // kill it comes back with --tcp=false, and the clients go on over gRPC.
  const testing::KillRestartResult result =
      testing::RunKillAndRestart("auto", {}, 60, 30, {"--tcp=false"});
  INFO(result.worker_errors[0] << " / " << result.worker_errors[1]);
  INFO(result.timeline);
  REQUIRE(result.worker_errors == std::vector<std::string>{"", ""});
  REQUIRE(result.completed == result.iterations);
  CHECK(result.data_paths_at_end == "grpc");
  INFO("killed at iteration " << result.killed_at << ", rounds applied " << result.rounds_applied);
  REQUIRE(result.final_value_exact);
  REQUIRE(result.rounds_applied <= result.iterations);
  REQUIRE(result.iterations - result.rounds_applied <= 22);
}

}  // namespace
}  // namespace harrier
