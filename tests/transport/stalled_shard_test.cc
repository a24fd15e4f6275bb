// A shard that stops reading mid-push (SIGSTOP: its sockets stay open, so
// the kernel's buffers fill and the transport's sends stall) must not hang
// the worker: the call ends at its deadline and the transport's bounded
// wait for its payloads returns. Run for every backend (see BUILD).
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

TEST_CASE("a push to a stalled shard returns within its deadline plus the release grace") {
  const char* transport = std::getenv("HARRIER_TEST_TRANSPORT");
  const std::string backend = transport == nullptr ? "grpc" : transport;
  std::vector<std::string> flags = {"--lr=1"};
  if (backend == "ucx") flags.push_back("--ucx");
  if (backend == "tcp") flags.push_back("--tcp");
  auto servers = testing::StartCluster(1, 1, flags);
  REQUIRE(servers.ok());
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.transport = backend;
  options.rpc_timeout = absl::Seconds(1);
  options.retry_timeout = absl::ZeroDuration();
  options.heartbeat_interval = absl::ZeroDuration();
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  constexpr size_t kElements = 16u << 20;  // 64 MiB: more than the socket buffers hold
  REQUIRE((*client)->RegisterTensor("w", {static_cast<int64_t>(kElements)}).ok());
  std::vector<float> gradient(kElements, 1.0f);

  (*servers)[0]->process().Signal(SIGSTOP);
  const absl::Time start = absl::Now();
  const absl::Status status = (*client)->Push("w", gradient);
  const absl::Duration took = absl::Now() - start;
  (*servers)[0]->process().Signal(SIGKILL);
  INFO(status.ToString() << " after " << absl::FormatDuration(took));
  CHECK_FALSE(status.ok());
  // 1 s deadline + at most 5 s (gRPC), 2 x 2 s (UCX) or 2 s (tcp) for the
  // payloads;
  // a busy machine may stretch that, a hang would not end at all.
  CHECK(took < absl::Seconds(30));
}

}  // namespace
}  // namespace harrier
