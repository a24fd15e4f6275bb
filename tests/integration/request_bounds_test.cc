// The shard's bounds on what a call and a job may make it hold, through the
// real harrier-server over gRPC and over UCX: refused with
// RESOURCE_EXHAUSTED, and nothing changes.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

namespace harrier {
namespace {

std::unique_ptr<Client> Connect(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers,
                                const std::string& transport,
                                size_t chunk_bytes = 256u << 10) {
  ClientOptions options;
  options.servers = testing::Addresses(servers);
  options.rank = 0;
  options.transport = transport;
  options.chunk_bytes = chunk_bytes;  // default: a 2 MiB tensor travels as 8 chunks in one call
  options.rpc_timeout = absl::Seconds(20);
  options.retry_timeout = absl::ZeroDuration();
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  return std::move(*client);
}

TEST_CASE("--max_request_bytes: a call over the bound is refused whole, on every transport") {
  for (const std::string transport : {"grpc", "ucx", "tcp"}) {
    INFO("transport " << transport);
    auto servers = testing::StartCluster(
        1, 1, {"--sync=asp", "--lr=1", "--ucx", "--tcp", "--max_request_bytes=1048576"});
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

// Rank 1's push of `value` everywhere (the client of the test is rank 0).
proto::TensorChunk DensePush(testing::Sessions& sessions, const std::string& key, size_t n,
                             float value) {
  std::vector<float> gradient(n, value);
  proto::TensorChunk chunk;
  chunk.set_rank(1);
  sessions.Attach(&chunk);
  chunk.set_key(key);
  chunk.set_num_elements(n);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(reinterpret_cast<const char*>(gradient.data()),
                                  n * sizeof(float));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

// Two push streams on one connection, each under --max_request_bytes but
// together over --max_connection_bytes, both left open: the second one the
// shard reads is refused at once, the other is applied, and once both
// ended the connection's bytes are free again.
TEST_CASE("--max_connection_bytes: unfinished calls of one connection are bounded together") {
  // Two workers under ASP: each push moves the parameters by -lr * g / 2.
  auto servers = testing::StartCluster(
      1, 2, {"--sync=asp", "--lr=1", "--max_request_bytes=4194304",
             "--max_connection_bytes=6291456"});
  REQUIRE(servers.ok());
  auto client = Connect(*servers, "grpc", 4u << 20);
  const size_t n = (4u << 20) / sizeof(float);  // 4 MiB, one chunk: at --max_request_bytes
  for (const char* key : {"a", "b", "c"}) {
    REQUIRE(client->RegisterTensor(key, {static_cast<int64_t>(n)}).ok());
  }
  // One channel: one HTTP/2 connection for every stream below.
  auto channel = grpc::CreateCustomChannel(testing::Addresses(*servers)[0],
                                           grpc::InsecureChannelCredentials(),
                                           MakeChannelArguments());
  auto stub = proto::ParameterService::NewStub(channel);
  testing::Sessions sessions(channel);
  struct Stream {
    grpc::ClientContext context;
    proto::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<proto::TensorChunk>> writer;
  };
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(20);
  Stream first, second;
  for (Stream* stream : {&first, &second}) {
    stream->context.set_deadline(deadline);
    stream->writer = stub->Push(&stream->context, &stream->response);
  }
  REQUIRE(first.writer->Write(DensePush(sessions, "a", n, 2.0f)));
  second.writer->Write(DensePush(sessions, "b", n, 2.0f));
  // Both chunks reach the shard before either call is complete.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  first.writer->WritesDone();
  second.writer->WritesDone();
  const grpc::Status first_status = first.writer->Finish();
  const grpc::Status second_status = second.writer->Finish();
  INFO("first: " << first_status.error_message() << " second: " << second_status.error_message());
  REQUIRE(first_status.ok() != second_status.ok());
  const grpc::Status& refused = first_status.ok() ? second_status : first_status;
  REQUIRE(refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(refused.error_message().find("--max_connection_bytes") != std::string::npos);

  // The refused call changed nothing; the other was applied once.
  std::vector<float> a(n), b(n);
  REQUIRE(client->Pull("a", absl::MakeSpan(a)).ok());
  REQUIRE(client->Pull("b", absl::MakeSpan(b)).ok());
  const std::vector<float> applied(n, -1.0f), untouched(n, 0.0f);
  REQUIRE((first_status.ok() ? a : b) == applied);
  REQUIRE((first_status.ok() ? b : a) == untouched);

  // Both calls ended: their bytes are free, a new 4 MiB call goes through.
  Stream third;
  third.context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  third.writer = stub->Push(&third.context, &third.response);
  REQUIRE(third.writer->Write(DensePush(sessions, "c", n, 4.0f)));
  third.writer->WritesDone();
  const grpc::Status third_status = third.writer->Finish();
  INFO(third_status.error_message());
  REQUIRE(third_status.ok());
  std::vector<float> c(n);
  REQUIRE(client->Pull("c", absl::MakeSpan(c)).ok());
  REQUIRE(c == std::vector<float>(n, -2.0f));
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
