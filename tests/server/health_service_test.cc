// grpc.health.v1 as the shard serves it (server/grpc/health_service.h),
// through a real grpc::Server on loopback and gRPC's generic client: Check
// for the whole server and for unknown names, malformed and oversized
// requests, and Watch's first status, its change and its end.
#include "server/grpc/health_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/health_watch.h"

namespace harrier {
namespace {

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

std::string String(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  REQUIRE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& slice : slices) out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return out;
}

// HealthCheckRequest { service = name } as wire bytes (name under 128 bytes).
std::string Request(const std::string& name) {
  if (name.empty()) return "";
  return std::string("\x0a", 1) + static_cast<char>(name.size()) + name;
}

// HealthCheckResponse { status } as wire bytes.
std::string Response(uint32_t status) { return std::string{'\x08', static_cast<char>(status)}; }

struct HealthServer {
  explicit HealthServer(int max_watches = HealthService::kDefaultMaxWatches) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    HealthService::Install(builder, max_watches);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                  grpc::InsecureChannelCredentials());
  }
  ~HealthServer() { server->Shutdown(std::chrono::system_clock::now()); }

  // On this thread through a completion queue it owns: with the callback
  // API the call's completion ran on a gRPC thread, and TSan, which does
  // not see into Debian's uninstrumented gRPC, now and then reported the
  // hand-off of gRPC's own callback tag as a data race.
  grpc::Status Check(const std::string& request, std::string* reply) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue queue;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
        stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", Bytes(request), &queue);
    call->StartCall();
    grpc::ByteBuffer out;
    grpc::Status status;
    call->Finish(&out, &status, &status);
    void* tag = nullptr;
    bool ok = false;
    // The context's deadline bounds this wait.
    const bool got = queue.Next(&tag, &ok);
    queue.Shutdown();
    for (void* rest; queue.Next(&rest, &ok);) {
    }
    REQUIRE(got);
    REQUIRE(tag == &status);
    if (status.ok()) *reply = String(out);
    return status;
  }

  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
};

TEST_CASE("Check answers for the whole server as SetServingStatus says") {
  HealthServer health;
  std::string reply;
  REQUIRE(health.Check(Request(""), &reply).ok());
  REQUIRE(reply == Response(HealthService::kServing));
  health.server->GetHealthCheckService()->SetServingStatus(false);
  REQUIRE(health.Check(Request(""), &reply).ok());
  REQUIRE(reply == Response(HealthService::kNotServing));
  health.server->GetHealthCheckService()->SetServingStatus(true);
  REQUIRE(health.Check(Request(""), &reply).ok());
  REQUIRE(reply == Response(HealthService::kServing));
}

TEST_CASE("Check says NOT_FOUND for a name never set, and answers one once set") {
  HealthServer health;
  std::string reply;
  REQUIRE(health.Check(Request("harrier.proto.ParameterService"), &reply).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  health.server->GetHealthCheckService()->SetServingStatus("harrier.proto.ParameterService",
                                                           false);
  REQUIRE(health.Check(Request("harrier.proto.ParameterService"), &reply).ok());
  REQUIRE(reply == Response(HealthService::kNotServing));
}

TEST_CASE("Check refuses a malformed request and a name past the bound") {
  HealthServer health;
  std::string reply;
  // Field 1 says 5 bytes, 2 follow.
  REQUIRE(health.Check(std::string("\x0a\x05" "ab", 4), &reply).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
  const std::string long_name(HealthService::kMaxServiceNameBytes + 1, 'x');
  std::string request("\x0a", 1);
  request += static_cast<char>(0x80 | (long_name.size() & 0x7f));
  request += static_cast<char>(long_name.size() >> 7);
  request += long_name;
  const grpc::Status status = health.Check(request, &reply);
  INFO(status.error_message());
  REQUIRE(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  // Unknown fields are skipped.
  REQUIRE(health.Check(std::string("\x10\x07", 2), &reply).ok());
  REQUIRE(reply == Response(HealthService::kServing));
}

TEST_CASE("Watch sends the status at once, then each change, until the client cancels") {
  HealthServer health;
  grpc::GenericStub stub(health.channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::CompletionQueue queue;
  auto call = stub.PrepareCall(&context, "/grpc.health.v1.Health/Watch", &queue);
  void* tag;
  bool ok;
  auto next = [&](intptr_t expected) {
    REQUIRE(queue.Next(&tag, &ok));
    REQUIRE(reinterpret_cast<intptr_t>(tag) == expected);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  REQUIRE(next(1));
  call->WriteLast(Bytes(Request("")), grpc::WriteOptions(), reinterpret_cast<void*>(2));
  REQUIRE(next(2));
  grpc::ByteBuffer message;
  call->Read(&message, reinterpret_cast<void*>(3));
  REQUIRE(next(3));
  REQUIRE(String(message) == Response(HealthService::kServing));
  health.server->GetHealthCheckService()->SetServingStatus(false);
  call->Read(&message, reinterpret_cast<void*>(4));
  REQUIRE(next(4));
  REQUIRE(String(message) == Response(HealthService::kNotServing));
  context.TryCancel();
  call->Read(&message, reinterpret_cast<void*>(5));
  REQUIRE_FALSE(next(5));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(6));
  next(6);
  REQUIRE(status.error_code() == grpc::StatusCode::CANCELLED);
}

TEST_CASE("Watch streams past the cap are refused, and one that ends frees its place") {
  HealthServer health(/*max_watches=*/2);
  std::vector<std::unique_ptr<testing::HealthWatch>> watches;
  for (int i = 0; i < 2; ++i) {
    watches.push_back(std::make_unique<testing::HealthWatch>(health.channel));
    uint32_t serving = 0;
    REQUIRE(watches.back()->Open(absl::Now() + absl::Seconds(10), &serving).ok());
    REQUIRE(serving == HealthService::kServing);
  }
  testing::HealthWatch third(health.channel);
  uint32_t serving = 0;
  const grpc::Status refused = third.Open(absl::Now() + absl::Seconds(10), &serving);
  INFO(refused.error_message());
  REQUIRE(refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(refused.error_message().find("at most 2") != std::string::npos);
  // Check is not a Watch: still answered.
  std::string reply;
  REQUIRE(health.Check(Request(""), &reply).ok());
  REQUIRE(reply == Response(HealthService::kServing));
  watches.front()->Close();
  REQUIRE(testing::OpenAdmittedWatch(health.channel, absl::Seconds(10)) != nullptr);
}

}  // namespace
}  // namespace harrier
