// Both transports through one request path, checked through the real
// harrier-server binary: the latency histograms on /metrics move for gRPC
// and for UCX alike, and a gRPC client's cancel wakes the shard's blocked
// pull at once. UCX runs over tcp on loopback (see BUILD).
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "proto/harrier.grpc.pb.h"
#include "common/transport/framing.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "tests/transport/raw_ucx_client.h"
#include "tests/slowdown.h"
#include "worker/client.h"

namespace harrier {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kElements = 16;

ClientOptions Options(const std::string& address, const std::string& transport) {
  ClientOptions options;
  options.servers = {address};
  options.transport = transport;
  options.rpc_timeout = absl::Seconds(30);
  options.heartbeat_interval = absl::ZeroDuration();
  return options;
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

// One push, one pull and one push-pull through `client`.
void Exercise(Client& client) {
  std::vector<float> w(kElements), g(kElements, 1.0f);
  REQUIRE(client.Push("w", g).ok());
  client.Clock();
  REQUIRE(client.Pull("w", absl::MakeSpan(w)).ok());
  REQUIRE(client.PushPull("w", g, absl::MakeSpan(w)).ok());
  client.Clock();
}

TEST_CASE("the latency histograms count calls over gRPC and over UCX alike") {
  const int metrics_port = testing::FreePort();
  auto server = testing::ServerProcess::Start(
      {"--num_workers=2", "--sync=asp", "--ucx", absl::StrCat("--metrics_port=", metrics_port)});
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  auto grpc_client = Client::Create(Options((*server)->address(), "grpc"));
  REQUIRE(grpc_client.ok());
  auto ucx_client = Client::Create(Options((*server)->address(), "ucx"));
  INFO(ucx_client.status().ToString());
  REQUIRE(ucx_client.ok());
  REQUIRE((*grpc_client)->RegisterTensor("w", {kElements}).ok());
  REQUIRE((*ucx_client)->RegisterTensor("w", {kElements}).ok());

  Exercise(**grpc_client);
  std::string metrics = testing::HttpGet(metrics_port, "/metrics");
  INFO(metrics);
  // A Push and a PushPull (whose push half counts as a push too).
  REQUIRE(Has(metrics, "harrier_server_push_seconds_count{shard=\"0\"} 2\n"));
  REQUIRE(Has(metrics, "harrier_server_pull_seconds_count{shard=\"0\"} 2\n"));

  Exercise(**ucx_client);
  metrics = testing::HttpGet(metrics_port, "/metrics");
  INFO(metrics);
  // The same series, whichever transport carried the call.
  REQUIRE(Has(metrics, "harrier_server_push_seconds_count{shard=\"0\"} 4\n"));
  REQUIRE(Has(metrics, "harrier_server_pull_seconds_count{shard=\"0\"} 4\n"));
}

// Many calls end while others start: a reply's last chunk, its status and
// the end of the call race with the next call on every worker.
TEST_CASE("concurrent push-pulls are each answered with their own chunk, over both transports") {
  constexpr int kWorkersPerTransport = 4;
  // Three transports' workers; ASP scales a push by 1/16, exact in fp32.
  constexpr int kWorkers = 16;
  auto server = testing::ServerProcess::Start(
      {absl::StrCat("--num_workers=", kWorkers), "--sync=asp", "--lr=1", "--ucx", "--tcp"});
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  int rank = 0;
  for (const char* transport : {"grpc", "ucx", "tcp"}) {
    INFO(transport);
    std::vector<std::future<std::string>> workers;
    for (int i = 0; i < kWorkersPerTransport; ++i, ++rank) {
      workers.push_back(std::async(std::launch::async, [&, transport, rank]() -> std::string {
        auto client = Client::Create(Options((*server)->address(), transport));
        if (!client.ok()) return client.status().ToString();
        const std::string name = absl::StrCat("w", rank);
        if (auto s = (*client)->RegisterTensor(name, {kElements}); !s.ok()) return s.ToString();
        std::vector<float> w(kElements), g(kElements, 1.0f);
        for (int t = 0; t < 300; ++t) {
          if (auto s = (*client)->PushPull(name, g, absl::MakeSpan(w)); !s.ok()) return s.ToString();
          (*client)->Clock();
          // Each worker alone steps its own tensor, by 1/16 (ASP scales by
          // 1/workers): exact in fp32.
          if (w[0] != -0.0625f * static_cast<float>(t + 1)) {
            return absl::StrCat("step ", t, ": ", w[0]);
          }
        }
        return "";
      }));
    }
    for (auto& worker : workers) REQUIRE(worker.get() == "");
  }
}

// The shard's blocked-pull gauge, or -1 if absent.
int BlockedPulls(int metrics_port) {
  const std::string metrics = testing::HttpGet(metrics_port, "/metrics");
  const std::string prefix = "harrier_server_blocked_pulls{shard=\"0\"} ";
  const size_t at = metrics.find(prefix);
  if (at == std::string::npos) return -1;
  return std::stoi(metrics.substr(at + prefix.size()));
}

bool AwaitBlockedPulls(int metrics_port, int n, milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (BlockedPulls(metrics_port) != n) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// Creates "w" over gRPC with rank 0's session, as a worker's registration
// does.
void InitOverGrpc(proto::ParameterService::Stub& stub, testing::Sessions& sessions) {
  std::vector<float> zeros(kElements, 0.0f);
  proto::InitRequest init;
  init.set_rank(0);
  sessions.Attach(&init);
  init.set_key("w");
  init.add_shape(kElements);
  init.set_num_elements(kElements);
  init.set_dtype(proto::DTYPE_FLOAT32);
  init.set_initial_values(std::string(reinterpret_cast<const char*>(zeros.data()), kElements * 4));
  init.set_checksum(Crc32c(init.initial_values().data(), kElements * 4));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::InitResponse created;
  const grpc::Status status = stub.Init(&context, init, &created);
  INFO(status.error_message());
  REQUIRE(status.ok());
}

// Under BSP with 2 workers, clock 1 waits for both workers' first push:
// blocked until its deadline, a minute away, unless the cancel reaches the
// store.
proto::PullRequest BlockedPull(testing::Sessions& sessions) {
  proto::PullRequest request;
  request.set_rank(0);
  sessions.Attach(&request);
  request.set_clock(1);
  proto::ChunkRef* ref = request.add_chunks();
  ref->set_key("w");
  ref->set_num_elements(kElements);
  return request;
}

// A BSP shard of 2 workers serving gRPC and UCX, with "w" created.
struct BspShard {
  BspShard() {
    auto started = testing::ServerProcess::Start(
        {"--num_workers=2", "--sync=bsp", "--ucx", absl::StrCat("--metrics_port=", metrics_port)});
    INFO(started.status().ToString());
    REQUIRE(started.ok());
    server = std::move(*started);
    auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
    stub = proto::ParameterService::NewStub(channel);
    sessions = std::make_unique<testing::Sessions>(channel);
    InitOverGrpc(*stub, *sessions);
  }

  const int metrics_port = testing::FreePort();
  std::unique_ptr<testing::ServerProcess> server;
  std::unique_ptr<proto::ParameterService::Stub> stub;
  std::unique_ptr<testing::Sessions> sessions;  // registers ranks with the shard
};

// kElements ones: the gradient the pushes below send, as payload bytes.
std::string OnesPayload() {
  const std::vector<float> ones(kElements, 1.0f);
  return std::string(reinterpret_cast<const char*>(ones.data()), kElements * sizeof(float));
}

// A dense chunk of "w" from `rank` with `session`, carrying the checksum of
// `payload` but not the payload (gRPC puts it in the message, UCX beside it).
proto::TensorChunk DenseChunk(uint32_t rank, const proto::Session& session,
                              const std::string& payload) {
  proto::TensorChunk chunk;
  chunk.set_job("harrier");
  chunk.set_rank(rank);
  *chunk.mutable_session() = session;
  chunk.set_key("w");
  chunk.set_num_elements(kElements);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.set_checksum(Crc32c(payload.data(), payload.size()));
  return chunk;
}

struct GrpcPush {
  grpc::Status status;
  proto::PushResponse response;
};

// `chunk` with `payload` in it, pushed whole in one gRPC stream.
GrpcPush PushOverGrpc(proto::ParameterService::Stub& stub, proto::TensorChunk chunk,
                      const std::string& payload) {
  chunk.set_payload(payload);
  GrpcPush push;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto writer = stub.Push(&context, &push.response);
  writer->Write(chunk);
  writer->WritesDone();
  push.status = writer->Finish();
  return push;
}

// `chunk` pushed over UCX, `payload` beside it.
absl::Status PushOverUcx(testing::RawUcxClient& ucx, const proto::TensorChunk& chunk,
                         const std::string& payload) {
  transport::Frame frame;
  frame.op = transport::Op::kPush;
  frame.count = 1;
  frame.payload_bytes = payload.size();
  frame.arg = 10000;
  return ucx.Call(frame, chunk.SerializeAsString(), payload);
}

TEST_CASE("a gRPC client's cancel wakes the shard's blocked pull at once") {
  BspShard shard;
  const int metrics_port = shard.metrics_port;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto pull = std::async(std::launch::async, [&] {
    auto reader = shard.stub->Pull(&context, BlockedPull(*shard.sessions));
    proto::TensorChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  });
  REQUIRE(AwaitBlockedPulls(metrics_port, 1, milliseconds(5000)));
  context.TryCancel();
  REQUIRE(pull.get().error_code() == grpc::StatusCode::CANCELLED);
  // Long before the call's 60 s deadline (returns as soon as it is seen).
  REQUIRE(AwaitBlockedPulls(metrics_port, 0, milliseconds(5000)));
}

TEST_CASE("a UCX client's kCancel wakes the shard's blocked pull at once") {
  BspShard shard;
  auto ucx = testing::RawUcxClient::Connect(shard.server->address());
  INFO(ucx.status().ToString());
  REQUIRE(ucx.ok());

  transport::Frame frame;
  frame.op = transport::Op::kPull;
  frame.arg = 60000;  // the client's remaining milliseconds
  const auto start = Clock::now();
  const absl::Status status = (*ucx)->CallAndCancel(frame, BlockedPull(*shard.sessions).SerializeAsString(), "",
                                                    absl::Milliseconds(300));
  const auto answered = Clock::now() - start;
  INFO(status.ToString());
  // The shard's own answer to the cancelled request, not the deadline's.
  REQUIRE(absl::IsCancelled(status));
  INFO("answered after " << std::chrono::duration_cast<milliseconds>(answered).count() << " ms");
  // Not before the cancel was sent (the client's wait may end a hair early),
  // and long before the request's 60 s (a busy machine may delay the
  // answer by far more than a quiet one's milliseconds).
  REQUIRE(answered >= milliseconds(290));
  REQUIRE(answered < milliseconds(300) + testing::AtOnce(5000));
  REQUIRE(AwaitBlockedPulls(shard.metrics_port, 0, testing::AtOnce(5000)));
}

TEST_CASE("both transports refuse a call of more than 256 chunks alike") {
  BspShard shard;
  const std::string expected = "more than 256 chunks in one call";

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::PushResponse response;
  auto writer = shard.stub->Push(&context, &response);
  proto::TensorChunk chunk;
  chunk.set_key("w");
  for (int i = 0; i < 257 && writer->Write(chunk); ++i) {
  }
  writer->WritesDone();
  const grpc::Status over_grpc = writer->Finish();
  INFO(over_grpc.error_message());
  REQUIRE(over_grpc.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(over_grpc.error_message() == expected);

  auto ucx = testing::RawUcxClient::Connect(shard.server->address());
  REQUIRE(ucx.ok());
  transport::Frame frame;
  frame.op = transport::Op::kPush;
  frame.count = 257;
  frame.arg = 10000;
  const absl::Status over_ucx = (*ucx)->Call(frame, chunk.SerializeAsString(), "");
  INFO(over_ucx.ToString());
  REQUIRE(absl::IsResourceExhausted(over_ucx));
  REQUIRE(over_ucx.message() == expected);
}

TEST_CASE("both transports refuse a push or pull without a valid session alike") {
  BspShard shard;
  auto ucx = testing::RawUcxClient::Connect(shard.server->address());
  INFO(ucx.status().ToString());
  REQUIRE(ucx.ok());
  const std::string payload = OnesPayload();
  auto chunk_of = [&](uint32_t rank, const proto::Session& session) {
    return DenseChunk(rank, session, payload);
  };
  auto push_over_ucx = [&](const proto::TensorChunk& chunk) {
    return PushOverUcx(**ucx, chunk, payload);
  };
  auto push_over_grpc = [&](const proto::TensorChunk& chunk) {
    return FromGrpcStatus(PushOverGrpc(*shard.stub, chunk, payload).status);
  };
  // Rank 1 never registered; rank 0 did, and its session is stolen for
  // rank 1, or its credential garbled.
  const proto::Session real = shard.sessions->For(0);
  proto::Session garbled = real;
  (*garbled.mutable_credential())[0] ^= 1;
  for (const auto& [name, chunk, needle] :
       std::vector<std::tuple<std::string, proto::TensorChunk, std::string>>{
           {"none", chunk_of(1, proto::Session()), "rank 1: no session credential (register first)"},
           {"stolen", chunk_of(1, real), "rank 1: bad session credential"},
           {"garbled", chunk_of(0, garbled), "rank 0: bad session credential"}}) {
    INFO(name);
    for (const absl::Status& status : {push_over_ucx(chunk), push_over_grpc(chunk)}) {
      INFO(status.ToString());
      REQUIRE(absl::IsPermissionDenied(status));
      REQUIRE(status.message().find(needle) != absl::string_view::npos);
    }
  }
  proto::PullRequest pull = BlockedPull(*shard.sessions);
  pull.set_clock(0);
  *pull.mutable_session() = garbled;
  transport::Frame frame;
  frame.op = transport::Op::kPull;
  frame.arg = 10000;
  const absl::Status refused_pull = (*ucx)->Call(frame, pull.SerializeAsString(), "");
  INFO(refused_pull.ToString());
  REQUIRE(absl::IsPermissionDenied(refused_pull));
  // The same frames with rank 0's own session go through: the refusals
  // were the session's.
  REQUIRE(push_over_ucx(chunk_of(0, real)).ok());
  *pull.mutable_session() = real;
  REQUIRE((*ucx)->Call(frame, pull.SerializeAsString(), "").ok());
}

TEST_CASE("both transports acknowledge a retried push as a duplicate and apply it once") {
  BspShard shard;
  const std::string payload = OnesPayload();
  // gRPC: rank 0's push, then its retry; the response says so.
  for (uint32_t expected_duplicates : {0u, 1u}) {
    const GrpcPush push =
        PushOverGrpc(*shard.stub, DenseChunk(0, shard.sessions->For(0), payload), payload);
    INFO(push.status.error_message());
    REQUIRE(push.status.ok());
    REQUIRE(push.response.chunks_accepted() == 1);
    REQUIRE(push.response.chunks_duplicate() == expected_duplicates);
  }
  // UCX: rank 1's push and its retry, both OK (UCX replies carry a status).
  auto ucx = testing::RawUcxClient::Connect(shard.server->address());
  REQUIRE(ucx.ok());
  for (int attempt = 0; attempt < 2; ++attempt) {
    const absl::Status status =
        PushOverUcx(**ucx, DenseChunk(1, shard.sessions->For(1), payload), payload);
    INFO(status.ToString());
    REQUIRE(status.ok());
  }
  const std::string metrics = testing::HttpGet(shard.metrics_port, "/metrics");
  INFO(metrics);
  REQUIRE(Has(metrics, "harrier_server_duplicate_pushes_total{shard=\"0\"} 2\n"));
  REQUIRE(Has(metrics, "harrier_server_pushes_total{shard=\"0\"} 2\n"));
}

TEST_CASE("a gRPC push the client cancels before closing it is never applied") {
  BspShard shard;
  const std::string payload = OnesPayload();
  proto::TensorChunk chunk = DenseChunk(0, shard.sessions->For(0), payload);
  {
    // The chunk arrives whole, then the stream breaks instead of closing:
    // the shard's read fails, and that must not read as the end of a push.
    proto::TensorChunk whole = chunk;
    whole.set_payload(payload);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PushResponse response;
    auto writer = shard.stub->Push(&context, &response);
    REQUIRE(writer->Write(whole));
    std::this_thread::sleep_for(testing::AtOnce(200));
    context.TryCancel();
    REQUIRE(writer->Finish().error_code() == grpc::StatusCode::CANCELLED);
  }
  std::this_thread::sleep_for(testing::AtOnce(500));
  std::string metrics = testing::HttpGet(shard.metrics_port, "/metrics");
  INFO(metrics);
  REQUIRE(Has(metrics, "harrier_server_pushes_total{shard=\"0\"} 0\n"));
  // The same push sent whole is the first of its clock, not a duplicate.
  const GrpcPush push = PushOverGrpc(*shard.stub, chunk, payload);
  INFO(push.status.error_message());
  REQUIRE(push.status.ok());
  REQUIRE(push.response.chunks_accepted() == 1);
  REQUIRE(push.response.chunks_duplicate() == 0);
  metrics = testing::HttpGet(shard.metrics_port, "/metrics");
  REQUIRE(Has(metrics, "harrier_server_pushes_total{shard=\"0\"} 1\n"));
}

}  // namespace
}  // namespace harrier
