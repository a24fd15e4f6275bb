// ClientOptions::grpc_connections: a large call over several gRPC
// connections to one shard gives the same answers as over one, and the
// connections are distinct TCP connections (gRPC would otherwise share one
// subchannel between channels with equal arguments).
// ClientOptions::pull_connection: pulls travel on a connection of their
// own, which pushes never open.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/require_ok.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

// Established TCP connections to `port` (the client's side of each
// connection to the shard), from /proc/net/tcp and tcp6. Not the shard's
// side: another test's client socket may have `port` as its own ephemeral
// local port, and would be counted with it.
int EstablishedTo(int port) {
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = remote.rfind(':');
      if (colon == std::string::npos || state != "01") continue;  // 01: ESTABLISHED
      if (std::stoi(remote.substr(colon + 1), nullptr, 16) == port) ++count;
    }
  }
  return count;
}

int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// One client of the test's shards: long deadlines, no heartbeats.
ClientOptions OptionsFor(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers) {
  ClientOptions options;
  options.servers = testing::Addresses(servers);
  options.transport = "grpc";
  options.rpc_timeout = absl::Seconds(30);
  options.heartbeat_interval = absl::ZeroDuration();
  return options;
}

TEST_CASE("grpc connections: large calls over 1 or 3 connections round trip exactly") {
  const int connections = GENERATE(1, 3);
  const bool pull_connection = GENERATE(true, false);
  INFO("connections " << connections << " pull connection " << pull_connection);
  auto servers = testing::StartCluster(1, 1, {"--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  ClientOptions options = OptionsFor(*servers);
  options.chunk_bytes = 1u << 20;
  options.grpc_connections = connections;
  options.pull_connection = pull_connection;
  auto client = Client::Create(options);
  REQUIRE_OK(client.status());
  // 12 MiB in 12 chunks: above the 8 MiB from which calls are split.
  const size_t n = 3u << 20;
  std::vector<float> init(n), grad(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    init[i] = static_cast<float>(i % 101);
    grad[i] = static_cast<float>(i % 7);
  }
  REQUIRE_OK((*client)->RegisterTensor("w", {static_cast<int64_t>(n)}, init));
  REQUIRE_OK((*client)->Pull("w", absl::MakeSpan(out)));
  REQUIRE(out == init);
  REQUIRE_OK((*client)->Push("w", grad));
  (*client)->Clock();
  REQUIRE_OK((*client)->Pull("w", absl::MakeSpan(out)));
  bool exact = true;
  for (size_t i = 0; i < n; ++i) exact = exact && out[i] == init[i] - grad[i];
  REQUIRE(exact);
  for (size_t i = 0; i < n; ++i) grad[i] = 1.0f;
  REQUIRE_OK((*client)->PushPull("w", grad, absl::MakeSpan(out)));
  for (size_t i = 0; i < n; ++i) exact = exact && out[i] == init[i] - (i % 7) - 1.0f;
  REQUIRE(exact);
  // Each of the client's channels is its own connection to the shard.
  REQUIRE(EstablishedTo(PortOf(options.servers[0])) == connections + (pull_connection ? 1 : 0));
}

TEST_CASE("grpc connections: pulls go on their own connection, pushes never open it") {
  auto servers = testing::StartCluster(1, 1, {"--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  ClientOptions options = OptionsFor(*servers);
  auto client = Client::Create(options);
  REQUIRE_OK(client.status());
  const int port = PortOf(options.servers[0]);
  const size_t n = 1u << 20;
  std::vector<float> init(n, 2.0f), grad(n, 0.5f), out(n);
  REQUIRE_OK((*client)->RegisterTensor("w", {static_cast<int64_t>(n)}, init));
  for (int step = 0; step < 3; ++step) {
    REQUIRE_OK((*client)->Push("w", grad));
    (*client)->Clock();
  }
  // Registration, pushes and control share one connection.
  REQUIRE(EstablishedTo(port) == 1);
  REQUIRE_OK((*client)->Pull("w", absl::MakeSpan(out)));
  REQUIRE(out == std::vector<float>(n, 2.0f - 3 * 0.5f));
  // The pull opened the second.
  REQUIRE(EstablishedTo(port) == 2);
  // Push-pulls stay on the first: nothing more opens.
  REQUIRE_OK((*client)->PushPull("w", grad, absl::MakeSpan(out)));
  REQUIRE(out == std::vector<float>(n, 2.0f - 4 * 0.5f));
  REQUIRE(EstablishedTo(port) == 2);
}

}  // namespace
}  // namespace harrier
