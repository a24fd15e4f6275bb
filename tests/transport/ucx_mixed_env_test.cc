// A shard and a worker on one host whose UCX environments differ (one with
// UCX_TLS=tcp, the other without, so left alone one would pick shared
// memory and the other tcp) still connect and train: the client's hello
// says which error mode its endpoint got, and the shard's endpoint back
// uses the same, as UCX requires of both ends.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/require_ok.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

// Sets or clears UCX_TLS / UCX_NET_DEVICES for what this process starts
// next (a shard inherits them; a client's UCX context reads them when made).
void UcxEnvironment(bool tcp) {
  if (tcp) {
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
  } else {
    unsetenv("UCX_TLS");
    unsetenv("UCX_NET_DEVICES");
  }
}

TEST_CASE("ucx: shard and worker with different UCX_TLS on one host train exactly") {
  const bool shard_tcp = GENERATE(false, true);
  INFO((shard_tcp ? "shard UCX_TLS=tcp, worker unset" : "shard unset, worker UCX_TLS=tcp"));
  UcxEnvironment(shard_tcp);
  auto servers = testing::StartCluster(2, 1, {"--ucx", "--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  UcxEnvironment(!shard_tcp);
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.transport = "ucx";
  options.rpc_timeout = absl::Seconds(20);
  options.connect_timeout = absl::Seconds(20);
  options.heartbeat_interval = absl::ZeroDuration();
  options.chunk_bytes = 1u << 20;
  auto client = Client::Create(options);
  REQUIRE_OK(client.status());
  // 3 MiB over two shards: eager and rendezvous messages both ways.
  const size_t n = 768u << 10;
  std::vector<float> init(n), grad(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    init[i] = static_cast<float>(i % 101);
    grad[i] = static_cast<float>(i % 7);
  }
  REQUIRE_OK((*client)->RegisterTensor("w", {static_cast<int64_t>(n)}, init));
  REQUIRE_OK((*client)->Push("w", grad));
  (*client)->Clock();
  REQUIRE_OK((*client)->Pull("w", absl::MakeSpan(out)));
  bool exact = true;
  for (size_t i = 0; i < n; ++i) exact = exact && out[i] == init[i] - grad[i];
  REQUIRE(exact);
  UcxEnvironment(false);
}

}  // namespace
}  // namespace harrier
