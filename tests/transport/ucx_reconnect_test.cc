// Over UCX (UCX_TLS=tcp, see BUILD): a shard killed with SIGKILL
// mid-training restarts from its checkpoint with a new UCX worker address;
// the workers' UCX transports reconnect (fetching the new address over
// gRPC) while the client retries, and training finishes. The gRPC version
// is in tests/integration/operations_test.cc.
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

ClientOptions UcxOptions(const std::string& address, int rank) {
  ClientOptions options;
  options.servers = {address};
  options.rank = rank;
  options.transport = "ucx";
  options.rpc_timeout = absl::Seconds(20);
  options.retry_timeout = absl::Seconds(20);
  return options;
}

TEST_CASE("over UCX, a shard killed mid-training restarts and the transports reconnect") {
  const std::string dir = absl::StrCat(testing::TempDir(), "/ucx_checkpoints");
  const int port = testing::FreePort();
  const std::vector<std::string> flags = {
      "--shard=0", "--num_shards=1", "--num_workers=2", "--lr=1", "--sync=bsp", "--ucx",
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
      auto client = Client::Create(UcxOptions(address, rank));
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
  REQUIRE(progress == kIterations);

  // Every applied round subtracts exactly 1; rounds since the last
  // checkpoint before the kill are lost: at most one interval (1 s, about
  // 20 iterations at 50 ms each) plus the round in flight.
  auto reader = Client::Create(UcxOptions(address, 0));
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
