// The default data path, through real harrier-server processes: shards
// serve tcp unless started with --tcp=false, and a client left at its
// default transport ("auto") carries pushes and pulls over tcp wherever a
// shard serves it and over gRPC where it does not, with exact values on
// both. (TLS keeps "auto" on gRPC: //tests/integration:security_test.)
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

// Spans both shards: 4 chunks of 64 KiB, placed round-robin.
constexpr size_t kElements = 64 << 10;

ClientOptions Options(const std::vector<std::string>& servers) {
  ClientOptions options;  // transport left at its default
  options.servers = servers;
  options.chunk_bytes = 64 << 10;
  options.rpc_timeout = absl::Seconds(30);
  options.heartbeat_interval = absl::ZeroDuration();
  return options;
}

// Two shards of one job (ASP, plain SGD at lr 1), each with its own extra flags.
std::vector<std::unique_ptr<testing::ServerProcess>> StartShards(
    const std::vector<std::string>& shard0_flags, const std::vector<std::string>& shard1_flags) {
  std::vector<std::unique_ptr<testing::ServerProcess>> servers;
  int shard = 0;
  for (const auto* extra : {&shard0_flags, &shard1_flags}) {
    std::vector<std::string> flags = {absl::StrCat("--shard=", shard++), "--num_shards=2",
                                      "--num_workers=1", "--sync=asp", "--lr=1"};
    flags.insert(flags.end(), extra->begin(), extra->end());
    auto server = testing::ServerProcess::Start(flags);
    INFO(server.status().ToString());
    REQUIRE(server.ok());
    servers.push_back(std::move(*server));
  }
  return servers;
}

// Three pushes of distinct gradients with pulls between: each element ends
// at -(sum of what was pushed to it), exact in fp32.
void TrainExactly(Client& client) {
  REQUIRE(client.RegisterTensor("w", {kElements}).ok());
  std::vector<float> g(kElements), w(kElements);
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < kElements; ++i) g[i] = static_cast<float>((i % 7) * step);
    REQUIRE(client.PushPull("w", g, absl::MakeSpan(w)).ok());
    client.Clock();
    for (size_t i = 0; i < kElements; i += 4099) {
      INFO("step " << step << " element " << i);
      REQUIRE(w[i] == -static_cast<float>((i % 7) * step * (step + 1) / 2));
    }
  }
  REQUIRE(client.Pull("w", absl::MakeSpan(w)).ok());
  REQUIRE(w[kElements - 1] == -static_cast<float>(((kElements - 1) % 7) * 6));
}

TEST_CASE("shards serve tcp by default and a default client carries its data over it") {
  auto servers = StartShards({}, {});
  auto client = Client::Create(Options(testing::Addresses(servers)));
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  REQUIRE((*client)->data_paths() == std::vector<std::string>{"tcp", "tcp"});
  TrainExactly(**client);
}

TEST_CASE("a shard started with --tcp=false gets gRPC from a default client, the other tcp") {
  auto servers = StartShards({}, {"--tcp=false"});
  auto client = Client::Create(Options(testing::Addresses(servers)));
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  REQUIRE((*client)->data_paths() == std::vector<std::string>{"tcp", "grpc"});
  TrainExactly(**client);
}

TEST_CASE("naming tcp for a shard started with --tcp=false fails and says so") {
  auto servers = StartShards({}, {"--tcp=false"});
  ClientOptions options = Options(testing::Addresses(servers));
  options.transport = "tcp";
  options.connect_timeout = absl::Seconds(10);
  auto client = Client::Create(options);
  REQUIRE_FALSE(client.ok());
  INFO(client.status().ToString());
  CHECK(absl::IsFailedPrecondition(client.status()));
  CHECK(absl::StrContains(client.status().message(), "--tcp"));
}

TEST_CASE("named transports are kept: grpc stays on gRPC where tcp is served") {
  auto servers = StartShards({}, {});
  ClientOptions options = Options(testing::Addresses(servers));
  options.transport = "grpc";
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  REQUIRE((*client)->data_paths() == std::vector<std::string>{"grpc", "grpc"});
  TrainExactly(**client);
}

}  // namespace
}  // namespace harrier
