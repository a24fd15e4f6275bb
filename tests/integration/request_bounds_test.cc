// The shard's bounds on what a call and a job may make it hold, through the
// real harrier-server over gRPC and over UCX: refused with
// RESOURCE_EXHAUSTED, and nothing changes.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "tests/integration/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

std::unique_ptr<Client> Connect(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers,
                                const std::string& transport) {
  ClientOptions options;
  options.servers = testing::Addresses(servers);
  options.rank = 0;
  options.transport = transport;
  options.chunk_bytes = 256u << 10;  // a 2 MiB tensor travels as 8 chunks in one call
  options.rpc_timeout = absl::Seconds(20);
  options.retry_timeout = absl::ZeroDuration();
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  return std::move(*client);
}

TEST_CASE("--max_request_bytes: a call over the bound is refused whole, on every transport") {
  for (const std::string transport : {"grpc", "ucx"}) {
    INFO("transport " << transport);
    auto servers = testing::StartCluster(
        1, 1, {"--sync=asp", "--lr=1", "--ucx", "--max_request_bytes=1048576"});
    REQUIRE(servers.ok());
    auto client = Connect(*servers, transport);
    const size_t big = (2u << 20) / sizeof(float);    // 2 MiB: over the bound
    const size_t small = (1u << 20) / sizeof(float);  // 1 MiB: at the bound
    REQUIRE(client->RegisterTensor("big", {static_cast<int64_t>(big)}).ok());
    REQUIRE(client->RegisterTensor("small", {static_cast<int64_t>(small)}).ok());

    const absl::Status refused = client->Push("big", std::vector<float>(big, 1.0f));
    INFO(refused.ToString());
    REQUIRE(absl::IsResourceExhausted(refused));
    REQUIRE(refused.message().find("--max_request_bytes") != absl::string_view::npos);
    std::vector<float> values(big, -7.0f);
    REQUIRE(client->Pull("big", absl::MakeSpan(values)).ok());
    REQUIRE(values == std::vector<float>(big, 0.0f));  // nothing applied

    REQUIRE(client->Push("small", std::vector<float>(small, 1.0f)).ok());
    std::vector<float> small_values(small);
    client->Clock();
    REQUIRE(client->Pull("small", absl::MakeSpan(small_values)).ok());
    REQUIRE(small_values == std::vector<float>(small, -1.0f));
  }
}

TEST_CASE("--max_chunks, --max_param_bytes, --max_chunk_bytes bound what a job may Init") {
  auto servers = testing::StartCluster(
      1, 1, {"--max_chunks=2", "--max_param_bytes=8192", "--max_chunk_bytes=4096"});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.rank = 0;
  options.chunk_bytes = 8192;
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  // One chunk of 8 KiB: over --max_chunk_bytes.
  REQUIRE(absl::IsResourceExhausted((*client)->RegisterTensor("wide", {2048})));
  REQUIRE((*client)->RegisterTensor("a", {1024}).ok());  // 4 KiB
  // 4 KiB more would be 8 KiB: at --max_param_bytes, allowed; then the chunk
  // count is full.
  REQUIRE((*client)->RegisterTensor("b", {1024}).ok());
  const absl::Status full = (*client)->RegisterTensor("c", {1});
  INFO(full.ToString());
  REQUIRE(absl::IsResourceExhausted(full));
  REQUIRE(full.message().find("--max_chunks") != absl::string_view::npos);
  // Registering an existing tensor again is not a new chunk.
  REQUIRE((*client)->RegisterTensor("a", {1024}).ok());

  auto bytes_bound = testing::StartCluster(1, 1, {"--max_param_bytes=8192"});
  REQUIRE(bytes_bound.ok());
  options.servers = testing::Addresses(*bytes_bound);
  auto second = Client::Create(options);
  REQUIRE(second.ok());
  REQUIRE((*second)->RegisterTensor("a", {1024}).ok());
  REQUIRE((*second)->RegisterTensor("b", {1024}).ok());
  const absl::Status over = (*second)->RegisterTensor("c", {1});
  INFO(over.ToString());
  REQUIRE(absl::IsResourceExhausted(over));
  REQUIRE(over.message().find("--max_param_bytes") != absl::string_view::npos);
}

TEST_CASE("gradients of 2^40 or more are refused: pushes of FLT_MAX leave the parameters finite") {
  auto servers = testing::StartCluster(1, 1, {"--sync=bsp", "--lr=1"});
  REQUIRE(servers.ok());
  auto client = Connect(*servers, "grpc");
  REQUIRE(client->RegisterTensor("w", {4}).ok());
  const std::vector<float> huge(4, std::numeric_limits<float>::max());
  for (int i = 0; i < 3; ++i) {
    const absl::Status refused = client->Push("w", huge);
    INFO(refused.ToString());
    REQUIRE(absl::IsInvalidArgument(refused));
  }
  std::vector<float> values(4, -1.0f);
  REQUIRE(client->Pull("w", absl::MakeSpan(values)).ok());
  REQUIRE(values == std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace harrier
