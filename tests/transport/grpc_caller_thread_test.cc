// The gRPC transport's two ways of running a call: a caller that waits
// for it (CallerWaitsScope: blocking client calls) has it run on its own
// thread, completed before Start returns; every other call completes on
// the thread of the transport's completion queue. Both give the shard's
// answer. Destroying the transport ends the calls still open, also when a
// call's completion destroys it on the queue's own thread.
#include <pthread.h>
#include <signal.h>

#include <catch2/catch.hpp>

#include <dirent.h>

#include <fstream>

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "testing/server_process.h"
#include "worker/transport/grpc/grpc_transport.h"

namespace harrier {
namespace {

struct Completion {
  absl::Notification done;
  absl::Status status;
  std::thread::id thread;
  std::string thread_name;
};

std::string ThisThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

CallDone CompleteInto(Completion& completion) {
  return [&completion](absl::Status status) {
    completion.status = std::move(status);
    completion.thread = std::this_thread::get_id();
    completion.thread_name = ThisThreadName();
    completion.done.Notify();
  };
}

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

// A sink that takes every reply chunk and keeps nothing.
LandedChunkSink IgnoreReplies() {
  return [](const proto::TensorChunk&, const PayloadView&, MemoryKind) { return absl::OkStatus(); };
}

TEST_CASE("grpc transport: a waiting caller's call runs on its thread, others on the queue's") {
  auto servers = testing::StartCluster(1, 1, {});
  REQUIRE(servers.ok());
  GrpcShardTransport transport(grpc::CreateChannel(testing::Addresses(*servers)[0],
                                                   grpc::InsecureChannelCredentials()));
  const proto::PullRequest request = UnknownPull();
  const LandedChunkSink sink = IgnoreReplies();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  const bool caller_waits = GENERATE(true, false);
  INFO((caller_waits ? "in a CallerWaitsScope" : "no scope"));

  CallCanceller canceller;
  Completion completion;
  const CallDone done = CompleteInto(completion);
  if (caller_waits) {
    CallerWaitsScope scope;
    transport.StartPull(request, nullptr, sink, deadline, canceller, done);
    // Completed before StartPull returned, on this thread; the scope's one
    // hint is spent.
    REQUIRE(completion.done.HasBeenNotified());
    REQUIRE(completion.thread == std::this_thread::get_id());
    REQUIRE_FALSE(TakeCallerWaits());
  } else {
    // The transport's own queue thread, not one of gRPC's callback threads;
    // or, where the shard answered before StartPull gave back its hold on
    // the call, this thread as StartPull returned. That race is rare: of
    // several calls, at least one completes on the queue's thread.
    constexpr int kCalls = 20;
    int on_queue = 0;
    for (int i = 0; i < kCalls; ++i) {
      Completion each;
      transport.StartPull(request, nullptr, sink, deadline, canceller, CompleteInto(each));
      REQUIRE(each.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
      INFO("call " << i << " completed on " << each.thread_name);
      REQUIRE((each.thread_name == "grpc-calls" || each.thread == std::this_thread::get_id()));
      if (each.thread_name == "grpc-calls") ++on_queue;
      INFO(each.status.ToString());
      REQUIRE_FALSE(each.status.ok());
      REQUIRE_FALSE(absl::IsUnavailable(each.status));
    }
    CHECK(on_queue >= 1);
    transport.StartPull(request, nullptr, sink, deadline, canceller, done);
    REQUIRE(completion.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  // The shard's own refusal reached the caller, whichever thread ran it.
  INFO(completion.status.ToString());
  REQUIRE_FALSE(completion.status.ok());
  REQUIRE_FALSE(absl::IsUnavailable(completion.status));
  REQUIRE_FALSE(absl::IsDeadlineExceeded(completion.status));
}

// The voluntary context switches so far of this process's threads named
// `name`, summed (from /proc/self/task/*/status).
int64_t VoluntarySwitches(const std::string& name) {
  int64_t total = 0;
  DIR* tasks = opendir("/proc/self/task");
  REQUIRE(tasks != nullptr);
  while (dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + entry->d_name;
    std::string comm;
    std::getline(std::ifstream(dir + "/comm"), comm);
    if (comm != name) continue;
    std::ifstream status(dir + "/status");
    for (std::string line; std::getline(status, line);) {
      int64_t count = 0;
      if (absl::StartsWith(line, "voluntary_ctxt_switches:") &&
          absl::SimpleAtoi(line.substr(line.find(':') + 1), &count)) {
        total += count;
      }
    }
  }
  closedir(tasks);
  return total;
}

TEST_CASE("grpc transport: a waiting caller's calls leave the queue's thread asleep") {
  auto servers = testing::StartCluster(1, 1, {});
  REQUIRE(servers.ok());
  GrpcShardTransport transport(grpc::CreateChannel(testing::Addresses(*servers)[0],
                                                   grpc::InsecureChannelCredentials()));
  const LandedChunkSink sink = IgnoreReplies();
  CallCanceller canceller;
  // One call on the queue first, so its thread has polled and gone back to
  // waiting for the next open call.
  Completion queued;
  transport.StartPull(UnknownPull(), nullptr, sink, absl::Now() + absl::Seconds(20), canceller,
                      CompleteInto(queued));
  REQUIRE(queued.done.WaitForNotificationWithTimeout(absl::Seconds(30)));

  // A thread waiting in the queue with no call of its own would take each
  // reply off the connection and hand it to the waiting caller: at least
  // one switch per call. Parked, it does not run at all.
  constexpr int kCalls = 200;
  const int64_t before = VoluntarySwitches("grpc-calls");
  for (int i = 0; i < kCalls; ++i) {
    Completion completion;
    CallerWaitsScope scope;
    transport.StartPull(UnknownPull(), nullptr, sink, absl::Now() + absl::Seconds(20), canceller,
                        CompleteInto(completion));
    REQUIRE(completion.done.HasBeenNotified());
    REQUIRE_FALSE(absl::IsUnavailable(completion.status));
  }
  const int64_t switches = VoluntarySwitches("grpc-calls") - before;
  INFO("the queue's thread switched " << switches << " times during " << kCalls
                                      << " waiting callers' calls");
  CHECK(switches < kCalls / 10);
}

std::vector<OutgoingChunk> OneChunk(const std::vector<float>& values) {
  std::vector<OutgoingChunk> chunks(1);
  chunks[0].header.set_job("caller-thread");
  chunks[0].header.set_key("w");
  chunks[0].header.set_num_elements(static_cast<int64_t>(values.size()));
  chunks[0].borrowed =
      absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  chunks[0].is_borrowed = true;
  return chunks;
}

TEST_CASE("grpc transport: destroying it ends the calls it still has open") {
  auto servers = testing::StartCluster(1, 1, {});
  REQUIRE(servers.ok());
  auto transport = std::make_unique<GrpcShardTransport>(grpc::CreateChannel(
      testing::Addresses(*servers)[0], grpc::InsecureChannelCredentials()));
  // A stopped shard answers nothing: every call below stays open until the
  // transport goes (their deadline is far off).
  (*servers)[0]->process().Signal(SIGSTOP);
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  const LandedChunkSink sink = IgnoreReplies();
  // 256 KiB: more than the stream's flow-control window, so the pushes
  // stall mid-write.
  const std::vector<float> values(64 << 10, 1.0f);
  const std::vector<OutgoingChunk> chunks = OneChunk(values);
  CallCanceller canceller;
  Completion pull, push, push_pull;
  transport->StartPull(UnknownPull(), nullptr, sink, deadline, canceller, CompleteInto(pull));
  transport->StartPush(chunks, deadline, canceller, CompleteInto(push));
  transport->StartPushPull(chunks, nullptr, sink, deadline, canceller, CompleteInto(push_pull));
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE_FALSE(pull.done.HasBeenNotified());
  REQUIRE_FALSE(push.done.HasBeenNotified());
  REQUIRE_FALSE(push_pull.done.HasBeenNotified());

  const absl::Time start = absl::Now();
  transport.reset();
  for (Completion* completion : {&pull, &push, &push_pull}) {
    REQUIRE(completion->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    INFO(completion->status.ToString());
    CHECK(absl::IsCancelled(completion->status));
  }
  // Cancelled at once, not left to their deadline.
  CHECK(absl::Now() - start < absl::Seconds(20));
  (*servers)[0]->process().Signal(SIGCONT);
}

TEST_CASE("grpc transport: a completion that destroys it still ends the other open calls") {
  auto servers = testing::StartCluster(1, 1, {});
  REQUIRE(servers.ok());
  auto transport = std::make_unique<GrpcShardTransport>(grpc::CreateChannel(
      testing::Addresses(*servers)[0], grpc::InsecureChannelCredentials()));
  (*servers)[0]->process().Signal(SIGSTOP);
  const LandedChunkSink sink = IgnoreReplies();
  // 80 MiB: past what the transport copies into its send buffers, so the
  // push lends its payload to gRPC, and its end waits for gRPC to give it
  // back (on the transport's timer, should gRPC still hold it) after the
  // transport is gone.
  const std::vector<float> values(20 << 20, 1.0f);
  const std::vector<OutgoingChunk> chunks = OneChunk(values);
  CallCanceller canceller;
  Completion push;
  transport->StartPush(chunks, absl::Now() + absl::Minutes(10), canceller, CompleteInto(push));

  // A pull with a short deadline: its completion runs on the queue's
  // thread and drops the transport there, the last owner of the queue. The
  // queue's thread must go back to its events for the push to end, so the
  // wait for the open calls has to leave it (the wait would otherwise sit
  // out its 10 s grace first).
  Completion pull;
  absl::Time destroyed;
  transport->StartPull(UnknownPull(), nullptr, sink, absl::Now() + absl::Milliseconds(300),
                       canceller, [&](absl::Status status) {
                         pull.status = std::move(status);
                         pull.thread_name = ThisThreadName();
                         destroyed = absl::Now();
                         transport.reset();
                         pull.done.Notify();
                       });
  REQUIRE(pull.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(pull.thread_name == "grpc-calls");
  INFO(pull.status.ToString());
  CHECK(absl::IsDeadlineExceeded(pull.status));

  REQUIRE(push.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  INFO(push.status.ToString());
  CHECK(absl::IsCancelled(push.status));
  CHECK(absl::Now() - destroyed < absl::Seconds(5));
  (*servers)[0]->process().Signal(SIGCONT);
}

}  // namespace
}  // namespace harrier
