// The gRPC transport's two ways of running a call: a caller that waits
// for it (CallerWaitsScope: blocking client calls) has it run on its own
// thread, completed before Start returns; every other call completes on
// gRPC's callback threads. Both give the shard's answer.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "testing/server_process.h"
#include "worker/transport/grpc/grpc_transport.h"

namespace harrier {
namespace {

struct Completion {
  absl::Notification done;
  absl::Status status;
  std::thread::id thread;
};

// A pull of a tensor the shard does not hold: answered NOT_FOUND or
// refused for its missing session; either way by the shard, not the
// transport.
proto::PullRequest UnknownPull() {
  proto::PullRequest request;
  request.set_job("caller-thread");
  auto* chunk = request.add_chunks();
  chunk->set_key("no-such-tensor");
  chunk->set_num_elements(4);
  return request;
}

TEST_CASE("grpc transport: a waiting caller's call runs on its thread, others on gRPC's") {
  auto servers = testing::StartCluster(1, 1, {});
  REQUIRE(servers.ok());
  GrpcShardTransport transport(grpc::CreateChannel(testing::Addresses(*servers)[0],
                                                   grpc::InsecureChannelCredentials()));
  const proto::PullRequest request = UnknownPull();
  const LandedChunkSink sink = [](const proto::TensorChunk&, const PayloadView&, MemoryKind) {
    return absl::OkStatus();
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  const bool caller_waits = GENERATE(true, false);
  INFO((caller_waits ? "in a CallerWaitsScope" : "no scope"));

  CallCanceller canceller;
  Completion completion;
  auto done = [&completion](absl::Status status) {
    completion.status = std::move(status);
    completion.thread = std::this_thread::get_id();
    completion.done.Notify();
  };
  if (caller_waits) {
    CallerWaitsScope scope;
    transport.StartPull(request, nullptr, sink, deadline, canceller, done);
    // Completed before StartPull returned, on this thread; the scope's one
    // hint is spent.
    REQUIRE(completion.done.HasBeenNotified());
    REQUIRE(completion.thread == std::this_thread::get_id());
    REQUIRE_FALSE(TakeCallerWaits());
  } else {
    transport.StartPull(request, nullptr, sink, deadline, canceller, done);
    REQUIRE(completion.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    REQUIRE(completion.thread != std::this_thread::get_id());
  }
  // The shard's own refusal reached the caller, whichever thread ran it.
  INFO(completion.status.ToString());
  REQUIRE_FALSE(completion.status.ok());
  REQUIRE_FALSE(absl::IsUnavailable(completion.status));
  REQUIRE_FALSE(absl::IsDeadlineExceeded(completion.status));
}

}  // namespace
}  // namespace harrier
