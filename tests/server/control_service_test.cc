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
#include <string>
#include <thread>
#include <vector>

#include "proto/harrier.grpc.pb.h"
#include "server/control_service.h"
#include "server/membership.h"
#include "tests/slowdown.h"

namespace harrier {
namespace {

using Clock = std::chrono::steady_clock;

using testing::AtOnce;
using std::chrono::milliseconds;

// Polls `done` until it holds or `deadline` passes; says which.
template <typename Predicate>
bool WaitFor(std::chrono::milliseconds deadline, Predicate done) {
  const auto give_up = Clock::now() + deadline;
  while (!done()) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

constexpr milliseconds kNoDeadline = milliseconds::max();

class ControlFixture {
 public:
  explicit ControlFixture(int workers,
                          std::chrono::milliseconds max_barrier_wait = std::chrono::hours(1))
      : ControlFixture([&] {
          ControlOptions options;
          options.num_workers = workers;
          options.max_barrier_wait = max_barrier_wait;
          return options;
        }()) {}
  // `register_all`: every rank registers at once (barriers need sessions).
  explicit ControlFixture(const ControlOptions& options, bool register_all = true) {
    const int workers = options.num_workers;
    service_ = std::make_unique<ControlServiceImpl>(options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    queue_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
    // Barrier calls wait on a queue, as the shard's listener runs them.
    service_->StartCalls({queue_.get()});
    pollers_.Start({queue_.get()});
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
    // Every rank registers: barriers need its session.
    sessions_.resize(workers);
    for (int rank = 0; register_all && rank < workers; ++rank) {
      proto::RegisterResponse response;
      REQUIRE(Register(rank, &response).ok());
      sessions_[rank] = response.session();
    }
  }

  grpc::Status Register(int rank, proto::RegisterResponse* response,
                        const proto::Session* previous = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::RegisterRequest request;
    request.set_job("harrier");
    request.set_requested_rank(rank);
    if (previous != nullptr) *request.mutable_previous_session() = *previous;
    return Stub()->Register(&context, request, response);
  }

  grpc::Status Heartbeat(uint32_t rank, const proto::Session& session) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::HeartbeatRequest request;
    request.set_job("harrier");
    request.set_rank(rank);
    *request.mutable_session() = session;
    proto::HeartbeatResponse response;
    return Stub()->Heartbeat(&context, request, &response);
  }

  proto::Session& session(int rank) { return sessions_[rank]; }
  ~ControlFixture() {
    service_->Close();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    CHECK(service_->AwaitCallsDone(absl::Now() + absl::Seconds(10)));
    pollers_.ShutdownAndJoin();
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
    request.set_job("harrier");
    request.set_name("b");
    request.set_rank(rank);
    *request.mutable_session() = sessions_[rank];
    proto::BarrierResponse response;
    return Stub()->Barrier(context, request, &response);
  }

  ControlServiceImpl& service() { return *service_; }

 private:
  std::unique_ptr<ControlServiceImpl> service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  QueuePollers pollers_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<proto::Session> sessions_;
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
  // Woken by the arrival: without the wake-up rank 0 would be answered at
  // its 5 s deadline. The bound leaves a busy machine 20x a quiet one's
  // scheduling delay and still tells the two apart.
  REQUIRE(answered - arrived < AtOnce(1000));
}

TEST_CASE("control: a cancelled barrier stops counting its rank") {
  ControlFixture control(2);
  grpc::ClientContext context;
  auto first = std::async(std::launch::async,
                          [&] { return control.Barrier(0, milliseconds(10000), &context); });
  REQUIRE(WaitFor(std::chrono::seconds(5), [&] { return control.service().WaitingAt("b") == 1; }));
  context.TryCancel();
  REQUIRE(first.get().error_code() == grpc::StatusCode::CANCELLED);
  // The shard hears of the cancel after the client does; long before the
  // call's own 10 s deadline it must stop counting rank 0.
  REQUIRE(WaitFor(std::chrono::seconds(5), [&] { return control.service().WaitingAt("b") == 0; }));
  // Had rank 0 still counted, rank 1's arrival would complete the barrier.
  const grpc::Status second = control.Barrier(1, milliseconds(300));
  INFO(second.error_message());
  REQUIRE(second.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  // Rank 0 may wait again (it is not "already waiting"), once the shard has
  // withdrawn rank 1 at its deadline (its timer may trail the client's).
  REQUIRE(WaitFor(std::chrono::seconds(5), [&] { return control.service().WaitingAt("b") == 0; }));
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
  REQUIRE(Clock::now() - start < milliseconds(2000));  // 10x the deadline, not the 10 s below

  auto waiting = std::async(std::launch::async, [&] { return control.Barrier(1, milliseconds(10000)); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto closed_at = Clock::now();
  control.service().Close();
  const grpc::Status closed = waiting.get();
  REQUIRE(closed.error_code() == grpc::StatusCode::UNAVAILABLE);
  // Answered by Close, not by the waiter's 10 s deadline.
  REQUIRE(Clock::now() - closed_at < AtOnce(2000));
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

TEST_CASE("control: ranks handed out but never used are handed out again after the timeout") {
  ControlOptions options;
  options.num_workers = 2;
  // Long enough that a stalled test thread (a busy machine) does not let a
  // live session time out between two of its calls.
  options.heartbeat_timeout = AtOnce(1000);
  ControlFixture control(options, /*register_all=*/false);
  // A flood takes both ranks; the rest are refused. The flood stops well
  // inside the timeout, after which the unused ranks would be free again.
  proto::RegisterResponse first, response;
  const auto registered = Clock::now();
  REQUIRE(control.Register(-1, &first).ok());
  REQUIRE(control.Register(-1, &response).ok());
  int sent = 0, refused = 0;
  while (sent < 100 && Clock::now() - registered < options.heartbeat_timeout / 2) {
    ++sent;
    const grpc::Status status = control.Register(-1, &response);
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
  }
  REQUIRE(sent >= 5);
  REQUIRE(refused == sent);
  // Rank 0's holder uses its session; rank 1's never does.
  REQUIRE(control.Heartbeat(first.rank(), first.session()).ok());
  std::this_thread::sleep_for(options.heartbeat_timeout + AtOnce(100));
  REQUIRE(control.Heartbeat(first.rank(), first.session()).ok());
  proto::RegisterResponse late;
  const grpc::Status reclaimed = control.Register(-1, &late);
  INFO(reclaimed.error_message());
  REQUIRE(reclaimed.ok());
  REQUIRE(late.rank() == 1 - first.rank());
  REQUIRE(late.session().epoch() > first.session().epoch());
}

TEST_CASE("control: a rank held by a live session is refused; its holder gets a new epoch") {
  ControlOptions options;
  options.num_workers = 2;
  // Long enough that a stalled test thread (a busy machine) does not let the
  // holder's session time out before the refusals below.
  options.heartbeat_timeout = AtOnce(1000);
  ControlFixture control(options, /*register_all=*/false);
  proto::RegisterResponse held;
  REQUIRE(control.Register(1, &held).ok());
  REQUIRE(held.rank() == 1);
  REQUIRE(control.Heartbeat(1, held.session()).ok());

  proto::RegisterResponse response;
  const grpc::Status taken = control.Register(1, &response);
  INFO(taken.error_message());
  REQUIRE(taken.error_code() == grpc::StatusCode::ALREADY_EXISTS);
  REQUIRE(taken.error_message().find("rank 1 is held by a live session") != std::string::npos);
  // A forged previous session does not help.
  proto::Session forged = held.session();
  forged.mutable_credential()->assign(32, 'x');
  REQUIRE(control.Register(1, &response, &forged).error_code() ==
          grpc::StatusCode::ALREADY_EXISTS);

  // The holder itself re-registers: a new epoch; the old one is refused.
  proto::RegisterResponse renewed;
  REQUIRE(control.Register(1, &renewed, &held.session()).ok());
  REQUIRE(renewed.rank() == 1);
  REQUIRE(renewed.session().epoch() > held.session().epoch());
  const grpc::Status old = control.Heartbeat(1, held.session());
  INFO(old.error_message());
  REQUIRE(old.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(old.error_message().find("was replaced by epoch") != std::string::npos);
  REQUIRE(control.Heartbeat(1, renewed.session()).ok());

  // Silent for the timeout: a Register for the rank takes it over.
  std::this_thread::sleep_for(options.heartbeat_timeout + AtOnce(100));
  proto::RegisterResponse taken_over;
  REQUIRE(control.Register(1, &taken_over).ok());
  REQUIRE(taken_over.session().epoch() > renewed.session().epoch());
}

TEST_CASE("control: a heartbeat or barrier without a valid session is refused") {
  ControlFixture control(2);
  const grpc::Status none = control.Heartbeat(1, proto::Session());
  INFO(none.error_message());
  REQUIRE(none.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(none.error_message().find("rank 1: no session credential (register first)") !=
          std::string::npos);
  // Rank 0's session for rank 1, and rank 1's epoch with a made-up credential.
  REQUIRE(control.Heartbeat(1, control.session(0)).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
  proto::Session wrong = control.session(1);
  wrong.mutable_credential()->assign(32, 'x');
  REQUIRE(control.Heartbeat(1, wrong).error_code() == grpc::StatusCode::PERMISSION_DENIED);
  control.session(1) = wrong;
  const grpc::Status barrier = control.Barrier(1, milliseconds(2000));
  INFO(barrier.error_message());
  REQUIRE(barrier.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(barrier.error_message().find("rank 1: bad session credential") != std::string::npos);
}

TEST_CASE("control: a barrier completes once the missing rank has left the job") {
  Membership membership(3);
  ControlOptions options;
  options.num_workers = 3;
  options.membership = &membership;
  ControlFixture control(options);
  auto first = std::async(std::launch::async, [&] { return control.Barrier(0, milliseconds(5000)); });
  auto second = std::async(std::launch::async, [&] { return control.Barrier(1, milliseconds(5000)); });
  std::this_thread::sleep_for(milliseconds(100));
  control.service().ExpireBarriers();
  REQUIRE(first.wait_for(milliseconds(0)) == std::future_status::timeout);
  // Rank 2 leaves (or is lost under --on_worker_loss=continue): what the
  // shard's monitor runs next releases the survivors.
  membership.Depart(2);
  control.service().ExpireBarriers();
  REQUIRE(first.wait_for(std::chrono::seconds(2)) == std::future_status::ready);
  REQUIRE(first.get().ok());
  REQUIRE(second.get().ok());
  // The next barrier needs only the two ranks still in the job.
  auto again = std::async(std::launch::async, [&] { return control.Barrier(0, milliseconds(5000)); });
  std::this_thread::sleep_for(milliseconds(50));
  REQUIRE(control.Barrier(1, milliseconds(5000)).ok());
  REQUIRE(again.get().ok());
}

}  // namespace
}  // namespace harrier
