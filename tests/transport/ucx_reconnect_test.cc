// Over UCX (UCX_TLS=tcp, see BUILD): a shard killed with SIGKILL
// mid-training restarts from its checkpoint with a new UCX worker address;
// the workers' UCX transports reconnect (fetching the new address over
// gRPC) while the client retries, and training finishes. The gRPC version
// is in tests/integration/operations_test.cc.
#include <catch2/catch.hpp>

#include "tests/integration/kill_restart.h"

namespace harrier {
namespace {

TEST_CASE("over UCX, a shard killed mid-training restarts and the transports reconnect") {
  const testing::KillRestartResult result = testing::RunKillAndRestart("ucx", {"--ucx"});
  INFO(result.worker_errors[0] << " / " << result.worker_errors[1]);
  INFO(result.timeline);
  REQUIRE(result.worker_errors == std::vector<std::string>{"", ""});
  REQUIRE(result.completed == result.iterations);
  INFO("killed at iteration " << result.killed_at << ", rounds applied "
                              << result.rounds_applied);
  REQUIRE(result.final_value_exact);
  REQUIRE(result.rounds_applied <= result.iterations);
  REQUIRE(result.iterations - result.rounds_applied <= 22);
}

}  // namespace
}  // namespace harrier
