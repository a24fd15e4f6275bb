// What a client can make the shard hold, through the real harrier-server:
// push payloads counted as held (received slices and the aligned copy),
// unary calls without the job token refused before their body is read,
// Probe replies capped and charged, parked pulls charged. Each bound
// refuses with RESOURCE_EXHAUSTED naming its flag, and the shard's
// resident set stays well below what the unbounded case holds.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_limits.h"
#include "common/grpc_security.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/raw_http2.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t Rss(testing::ServerProcess& server) {
  const int64_t bytes = testing::ResidentBytes(server.process().pid());
  REQUIRE(bytes > 0);
  return bytes;
}

// Opens each (stream id, method) on `connection` and sends it a message
// that announces 60 MiB, all of it but the last byte (as far as the flow
// control windows let it within `per_stream`); returns the bytes sent.
size_t SendAllButLastByte(testing::RawHttp2Connection& connection,
                          const std::vector<std::pair<uint32_t, std::string>>& calls,
                          absl::Duration per_stream) {
  const uint32_t message = static_cast<uint32_t>(60 * kMiB);
  const std::string body =
      testing::RawHttp2Connection::MessagePrefix(message) + std::string(message - 1, '\x07');
  size_t sent = 0;
  for (const auto& [id, path] : calls) {
    REQUIRE(connection.OpenStream(id, path, {}));
    sent += connection.SendData(id, body, /*end_stream=*/false, absl::Now() + per_stream);
  }
  return sent;
}

// Eight push chunks of 15 MiB on one stream that never half-closes, within
// --max_request_bytes and --max_buffered_bytes (128 MiB): the shard copies
// each payload into aligned memory and lets the received slices go as it
// copies, so it holds about what the budget charged (120 MiB, and one
// message of slices it reuses), not twice that; a ninth chunk is over the
// budget and refused.
TEST_CASE("--max_buffered_bytes bounds what pushes hold: the slices go once copied") {
  auto servers = testing::StartCluster(
      1, 1, {"--sync=asp", "--max_request_bytes=134217728", "--max_buffered_bytes=134217728"});
  REQUIRE(servers.ok());
  testing::ServerProcess& shard = *(*servers)[0];
  auto channel = grpc::CreateCustomChannel(shard.address(), grpc::InsecureChannelCredentials(),
                                           MakeChannelArguments());
  auto stub = proto::ParameterService::NewStub(channel);
  const int64_t before = Rss(shard);

  proto::TensorChunk chunk;
  chunk.set_key("w");
  chunk.set_num_elements(static_cast<uint64_t>(15 * kMiB / 4));
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(static_cast<size_t>(15 * kMiB), '\x01');
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(8));
  proto::PushResponse response;
  auto writer = stub->Push(&context, &response);
  for (int i = 0; i < 8; ++i) REQUIRE(writer->Write(chunk));
  // Every chunk has reached the shard; no half-close.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t grown = Rss(shard) - before;
  INFO("RSS grew by " << grown / kMiB << " MiB");
  // Keeping the slices beside the copies, it held 240 MiB.
  REQUIRE(grown < 180 * kMiB);

  writer->Write(chunk);
  const grpc::Status status = writer->Finish();
  INFO("status " << status.error_code() << " " << status.error_message());
  REQUIRE(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(status.error_message().find("--max_buffered_bytes") != std::string::npos);
}

// Raw HTTP/2 streams to ParameterService/Init without the job token, each
// announcing a 60 MiB message and sending all but its last byte: the shard
// ends each at its headers (UNAUTHENTICATED) and never takes the bodies in.
TEST_CASE("unary calls without the job token are refused before their body is read") {
  const std::string token_path = testing::TempDir() + "/memory_budget_token";
  {
    std::ofstream token(token_path);
    token << "memory-budget-token\n";
  }
  REQUIRE(chmod(token_path.c_str(), 0600) == 0);
  auto servers = testing::StartCluster(1, 1, {"--auth_token_file=" + token_path});
  REQUIRE(servers.ok());
  testing::ServerProcess& shard = *(*servers)[0];
  const int64_t before = Rss(shard);

  auto connection = testing::RawHttp2Connection::Connect(shard.port(), absl::Seconds(5));
  REQUIRE(connection != nullptr);
  // Four Init calls, and one each of the other services' unary methods
  // (shard 0 serves the ControlService).
  const std::vector<std::pair<uint32_t, std::string>> calls = {
      {1, "/harrier.proto.ParameterService/Init"},   {3, "/harrier.proto.ParameterService/Init"},
      {5, "/harrier.proto.ParameterService/Init"},   {7, "/harrier.proto.ParameterService/Init"},
      {9, "/harrier.proto.ControlService/Register"}, {11, "/harrier.proto.AdminService/Probe"}};
  SendAllButLastByte(*connection, calls, absl::Seconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t grown = Rss(shard) - before;
  INFO("RSS grew by " << grown / kMiB << " MiB");
  for (const auto& call : calls) {
    INFO("stream " << call.first);
    REQUIRE(connection->WaitEnded(call.first, absl::Now() + absl::Seconds(1)));
  }
  // Taken in, the bodies would be 6 x 60 MiB.
  REQUIRE(grown < 100 * kMiB);

  // A typed call without the token gets the refusal's status.
  auto stub = proto::ParameterService::NewStub(
      grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::InitResponse response;
  const grpc::Status refused = stub->Init(&context, proto::InitRequest(), &response);
  REQUIRE(refused.error_code() == grpc::StatusCode::UNAUTHENTICATED);

  // A worker with the token still initialises its tensors.
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.auth_token = "memory-budget-token";
  options.rpc_timeout = absl::Seconds(10);
  options.retry_timeout = absl::ZeroDuration();
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterTensor("w", {1 << 20}).ok());  // 4 MiB of initial values
}

// On a shard without a job token anyone may send unary calls: gRPC takes
// their bodies in before any handler runs, bounded by its resource quota
// (--grpc_memory_bytes). Six Init calls announcing 60 MiB each, all but the
// last byte sent, against a 128 MiB quota: gRPC stops reading and cancels
// streams, and the shard holds about the quota, not 360 MiB.
TEST_CASE("--grpc_memory_bytes bounds the unary bodies gRPC buffers") {
  auto servers = testing::StartCluster(1, 1, {"--grpc_memory_bytes=134217728"});
  REQUIRE(servers.ok());
  testing::ServerProcess& shard = *(*servers)[0];
  const int64_t before = Rss(shard);
  auto connection = testing::RawHttp2Connection::Connect(shard.port(), absl::Seconds(5));
  REQUIRE(connection != nullptr);
  std::vector<std::pair<uint32_t, std::string>> calls;
  for (uint32_t id : {1u, 3u, 5u, 7u, 9u, 11u}) {
    calls.emplace_back(id, "/harrier.proto.ParameterService/Init");
  }
  const size_t sent = SendAllButLastByte(*connection, calls, absl::Seconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t grown = Rss(shard) - before;
  INFO("sent " << sent / kMiB << " MiB; RSS grew by " << grown / kMiB << " MiB");
  REQUIRE(grown < 200 * kMiB);
}

proto::ProbeRequest ProbeFor(uint64_t reply_bytes) {
  proto::ProbeRequest request;
  request.set_reply_bytes(reply_bytes);
  return request;
}

// Probe asks the shard to build a reply: capped at 8 MiB, and the replies
// of clients that do not read are charged to --max_probe_bytes_in_flight.
TEST_CASE("Probe replies are capped and charged while in flight") {
  auto servers = testing::StartCluster(1, 1, {"--max_probe_bytes_in_flight=33554432"});
  REQUIRE(servers.ok());
  testing::ServerProcess& shard = *(*servers)[0];
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  auto stub = proto::AdminService::NewStub(
      grpc::CreateCustomChannel(shard.address(), grpc::InsecureChannelCredentials(), args));
  auto probe = [&stub](uint64_t reply_bytes) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    proto::ProbeResponse response;
    return stub->Probe(&context, ProbeFor(reply_bytes), &response);
  };
  const grpc::Status over = probe(64 * kMiB);
  INFO(over.error_message());
  REQUIRE(over.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(over.error_message().find("limit of 8388608 bytes") != std::string::npos);
  REQUIRE(probe(kMaxProbeReplyBytes).ok());

  // 16 connections each ask for an 8 MiB reply (a few bytes each) and read
  // none of it: two fit the 32 MiB budget, the others are refused.
  const int64_t before = Rss(shard);
  std::string request;
  REQUIRE(ProbeFor(kMaxProbeReplyBytes).SerializeToString(&request));
  std::vector<std::unique_ptr<testing::RawHttp2Connection>> readers_of_nothing;
  for (int i = 0; i < 16; ++i) {
    auto connection = testing::RawHttp2Connection::Connect(shard.port(), absl::Seconds(5));
    REQUIRE(connection != nullptr);
    REQUIRE(connection->OpenStream(1, "/harrier.proto.AdminService/Probe", {}));
    const std::string message =
        testing::RawHttp2Connection::MessagePrefix(static_cast<uint32_t>(request.size())) + request;
    REQUIRE(connection->SendData(1, message, /*end_stream=*/true, absl::Now() + absl::Seconds(5)) ==
            message.size());
    readers_of_nothing.push_back(std::move(connection));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const int64_t grown = Rss(shard) - before;
  const grpc::Status full = probe(kMiB);
  INFO(full.error_message() << "; RSS grew by " << grown / kMiB << " MiB");
  REQUIRE(full.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(full.error_message().find("--max_probe_bytes_in_flight") != std::string::npos);
  // Unbounded, the 16 replies held 16 x 16 MiB.
  REQUIRE(grown < 128 * kMiB);
  // The shard's status shows the budget full.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    proto::StatusResponse status;
    REQUIRE(stub->GetStatus(&context, proto::StatusRequest(), &status).ok());
    bool listed = false;
    for (const proto::MemoryBudget& budget : status.memory()) {
      if (budget.name() != "probes in flight") continue;
      listed = true;
      CHECK(budget.flag() == "--max_probe_bytes_in_flight");
      CHECK(budget.limit_bytes() == uint64_t{32} << 20);
      CHECK(budget.held_bytes() == uint64_t{32} << 20);  // two replies, each twice 8 MiB
    }
    REQUIRE(listed);
  }
  // The readers go: their replies are let go, probes are answered again.
  readers_of_nothing.clear();
  bool answered = false;
  for (int i = 0; i < 50 && !answered; ++i) {
    answered = probe(kMiB).ok();
    if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(answered);
}

// A pull that waits for its clock (BSP) holds its request while parked:
// charged to --max_parked_pull_bytes; over it the pull is refused at once.
TEST_CASE("parked pulls are charged to --max_parked_pull_bytes") {
  auto servers = testing::StartCluster(1, 2, {"--sync=bsp", "--max_parked_pull_bytes=1"});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.rank = 0;
  options.rpc_timeout = absl::Seconds(5);
  options.retry_timeout = absl::ZeroDuration();
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterTensor("w", {16}).ok());
  // Clock 0 is answered at once (nothing to wait for).
  std::vector<float> values(16);
  REQUIRE((*client)->Pull("w", absl::MakeSpan(values)).ok());
  REQUIRE((*client)->Push("w", std::vector<float>(16, 1.0f)).ok());
  (*client)->Clock();
  // Clock 1 waits for rank 1's push: it would park.
  const auto start = std::chrono::steady_clock::now();
  const absl::Status refused = (*client)->Pull("w", absl::MakeSpan(values));
  INFO(refused.ToString());
  REQUIRE(absl::IsResourceExhausted(refused));
  REQUIRE(refused.message().find("--max_parked_pull_bytes") != absl::string_view::npos);
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(4));
}

// What the shard's status says the parked-pull budget holds.
uint64_t ParkedPullBytes(const std::string& address) {
  auto stub = proto::AdminService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::StatusResponse status;
  REQUIRE(stub->GetStatus(&context, proto::StatusRequest(), &status).ok());
  for (const proto::MemoryBudget& budget : status.memory()) {
    if (budget.name() == "parked pulls") return budget.held_bytes();
  }
  FAIL("no parked pulls budget in the status");
  return 0;
}

// Within the budget a pull parks, is charged while it waits, and gives the
// bytes back once its round completes and it is answered.
TEST_CASE("a parked pull's charge is given back when it is answered") {
  auto servers = testing::StartCluster(1, 2, {"--sync=bsp", "--lr=1"});
  REQUIRE(servers.ok());
  std::vector<std::unique_ptr<Client>> clients;
  for (int rank = 0; rank < 2; ++rank) {
    ClientOptions options;
    options.servers = testing::Addresses(*servers);
    options.rank = rank;
    options.rpc_timeout = absl::Seconds(10);
    options.retry_timeout = absl::ZeroDuration();
    auto client = Client::Create(options);
    INFO(client.status().ToString());
    REQUIRE(client.ok());
    REQUIRE((*client)->RegisterTensor("w", {16}).ok());
    clients.push_back(std::move(*client));
  }
  REQUIRE(clients[0]->Push("w", std::vector<float>(16, 1.0f)).ok());
  clients[0]->Clock();
  std::vector<float> values(16);
  absl::Status pulled = absl::UnknownError("not answered");
  std::thread waiter([&] { pulled = clients[0]->Pull("w", absl::MakeSpan(values)); });
  const std::string address = (*servers)[0]->address();
  uint64_t held = 0;
  for (int i = 0; i < 100 && held == 0; ++i) {
    held = ParkedPullBytes(address);
    if (held == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(held > 0);
  REQUIRE(clients[1]->Push("w", std::vector<float>(16, 3.0f)).ok());
  waiter.join();
  INFO(pulled.ToString());
  REQUIRE(pulled.ok());
  REQUIRE(values == std::vector<float>(16, -2.0f));  // lr 1, the mean of 1 and 3
  REQUIRE(ParkedPullBytes(address) == 0);
}

}  // namespace
}  // namespace harrier
