// ControlService's barriers over a real in-process gRPC server: they hold
// no thread, the last arrival answers everyone, and a cancelled or expired
// waiter stops counting at once (no 50 ms poll).
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <thread>

#include "proto/harrier.grpc.pb.h"
#include "server/control_service.h"

namespace harrier {
namespace {

using Clock = std::chrono::steady_clock;

// A bound on how soon something happens "at once", times
// HARRIER_TEST_SLOWDOWN (set by the sanitizer configs in .bazelrc: TSan runs
// this code several times slower). Still far below the deadlines that the
// bounds tell apart (seconds).
std::chrono::milliseconds AtOnce(int ms) {
  const char* slowdown = std::getenv("HARRIER_TEST_SLOWDOWN");
  const int factor = slowdown != nullptr ? std::max(1, std::atoi(slowdown)) : 1;
  return std::chrono::milliseconds(ms * factor);
}
using std::chrono::milliseconds;

constexpr milliseconds kNoDeadline = milliseconds::max();

class ControlFixture {
 public:
  explicit ControlFixture(int workers,
                          std::chrono::milliseconds max_barrier_wait = std::chrono::hours(1)) {
    ControlOptions options;
    options.num_workers = workers;
    options.max_barrier_wait = max_barrier_wait;
    service_ = std::make_unique<ControlServiceImpl>(options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }
  ~ControlFixture() {
    service_->Close();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }

  // A fresh stub per caller: each barrier call is independent.
  std::unique_ptr<proto::ControlService::Stub> Stub() {
    return proto::ControlService::NewStub(channel_);
  }

  grpc::Status Barrier(uint32_t rank, milliseconds timeout, grpc::ClientContext* context = nullptr) {
    grpc::ClientContext own;
    if (context == nullptr) context = &own;
    if (timeout != kNoDeadline) context->set_deadline(std::chrono::system_clock::now() + timeout);
    proto::BarrierRequest request;
    request.set_name("b");
    request.set_rank(rank);
    proto::BarrierResponse response;
    return Stub()->Barrier(context, request, &response);
  }

  ControlServiceImpl& service() { return *service_; }

 private:
  std::unique_ptr<ControlServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_CASE("control: the last worker's arrival answers every waiting barrier at once") {
  ControlFixture control(2);
  auto first = std::async(std::launch::async, [&] {
    const grpc::Status status = control.Barrier(0, milliseconds(5000));
    return std::make_pair(status.error_code(), Clock::now());
  });
  std::this_thread::sleep_for(milliseconds(100));
  const auto arrived = Clock::now();
  REQUIRE(control.Barrier(1, milliseconds(5000)).ok());
  const auto [code, answered] = first.get();
  REQUIRE(code == grpc::StatusCode::OK);
  REQUIRE(answered - arrived < AtOnce(50));
}

TEST_CASE("control: a cancelled barrier stops counting its rank at once") {
  ControlFixture control(2);
  grpc::ClientContext context;
  auto first = std::async(std::launch::async,
                          [&] { return control.Barrier(0, milliseconds(10000), &context); });
  // Just after a tick of a 50 ms poll (which would notice it 40 ms later).
  std::this_thread::sleep_for(milliseconds(110));
  context.TryCancel();
  REQUIRE(first.get().error_code() == grpc::StatusCode::CANCELLED);
  // Well inside that poll: had rank 0 still counted, rank 1's arrival would
  // complete the barrier.
  std::this_thread::sleep_for(milliseconds(25));
  const grpc::Status second = control.Barrier(1, milliseconds(300));
  INFO(second.error_message());
  REQUIRE(second.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  // Rank 0 may wait again (it is not "already waiting"). First let the
  // shard's own timer for rank 1's deadline fire: it may trail the client's
  // (more so under a sanitizer on loaded cores).
  std::this_thread::sleep_for(AtOnce(100));
  auto again = std::async(std::launch::async, [&] { return control.Barrier(0, milliseconds(5000)); });
  std::this_thread::sleep_for(milliseconds(50));
  REQUIRE(control.Barrier(1, milliseconds(5000)).ok());
  REQUIRE(again.get().ok());
}

TEST_CASE("control: a barrier ends at its deadline, and Close answers the waiters") {
  ControlFixture control(3);
  const auto start = Clock::now();
  const grpc::Status expired = control.Barrier(0, milliseconds(200));
  REQUIRE(expired.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  REQUIRE(Clock::now() - start < milliseconds(1000));

  auto waiting = std::async(std::launch::async, [&] { return control.Barrier(1, milliseconds(10000)); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto closed_at = Clock::now();
  control.service().Close();
  const grpc::Status closed = waiting.get();
  REQUIRE(closed.error_code() == grpc::StatusCode::UNAVAILABLE);
  REQUIRE(Clock::now() - closed_at < AtOnce(100));
}

TEST_CASE("control: a barrier without a client deadline still ends at the shard's cap") {
  ControlFixture control(2, milliseconds(100));
  auto waiting = std::async(std::launch::async, [&] { return control.Barrier(0, kNoDeadline); });
  std::this_thread::sleep_for(milliseconds(150));
  // What the shard's monitor does every 200 ms.
  control.service().ExpireBarriers();
  REQUIRE(waiting.wait_for(std::chrono::seconds(2)) == std::future_status::ready);
  const grpc::Status expired = waiting.get();
  INFO(expired.error_message());
  REQUIRE(expired.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  REQUIRE(expired.error_message() == "barrier 'b': 0 of 2 workers arrived");
}

}  // namespace
}  // namespace harrier
