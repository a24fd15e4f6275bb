// Calls in flight are completions, not threads: the client and the comm
// scheduler start shard calls and finish them from the transports' done
// callbacks, so the process's thread count does not depend on the number
// of shards or of calls in flight; and held calls can complete in any
// order.

#include <dirent.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/json.h"
#include "tests/worker/fake_cluster.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"
#include "worker/timeline.h"
#include "worker/transport/fake/fake_transport.h"

namespace harrier {
namespace {

// Threads of this process now.
int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  REQUIRE(dir != nullptr);
  int threads = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++threads;
  }
  closedir(dir);
  return threads;
}

ClientOptions Options(int shards) {
  ClientOptions options;
  for (int i = 0; i < shards; ++i) options.servers.push_back(absl::StrCat("fake:", i));
  options.heartbeat_interval = absl::ZeroDuration();
  options.rpc_timeout = absl::Seconds(30);
  // Every call in flight at once: the thread counts must not depend on it.
  options.max_calls_in_flight = 256;
  return options;
}

int Held(const FakeCluster& cluster) {
  int held = 0;
  for (const FakeShardTransport* shard : cluster.shards) held += shard->held_calls();
  return held;
}

// True once `n` calls are held over all shards.
bool AwaitHeld(const FakeCluster& cluster, int n) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (Held(cluster) < n) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

struct Measured {
  int threads = 0;  // of the process, while the calls were in flight
  int in_flight = 0;
};

// `tensors` tensors' pushes of one step through a comm scheduler over
// `shards` fake shards that hold every call: the threads while as many
// calls as the scheduler sends at once are in flight.
Measured SchedulerInFlight(int shards, int tensors) {
  FakeCluster cluster = MakeFakeCluster(Options(shards));
  std::vector<std::vector<float>> params(tensors, std::vector<float>(16, 0.0f));
  const std::vector<float> gradient(16, 1.0f);
  std::vector<ScheduledTensor> scheduled;
  for (int i = 0; i < tensors; ++i) {
    scheduled.push_back({absl::StrCat("t", i), {16}, absl::MakeSpan(params[i])});
  }
  CommSchedulerOptions options;
  options.wait_free_backprop = true;
  options.wait_timeout = absl::Seconds(30);
  auto scheduler = CommScheduler::Create(*cluster.client, scheduled, options);
  REQUIRE(scheduler.ok());
  for (int i = 0; i < tensors; ++i) REQUIRE((*scheduler)->WaitParameters(i).ok());
  for (FakeShardTransport* shard : cluster.shards) shard->Block();
  for (int i = tensors - 1; i >= 0; --i) REQUIRE((*scheduler)->GradientReady(i, gradient).ok());
  REQUIRE((*scheduler)->EndBackward().ok());
  // The scheduler keeps up to 2 * shards + 2 pushes on the wire.
  Measured measured;
  measured.in_flight = std::min(tensors, 2 * shards + 2);
  REQUIRE(AwaitHeld(cluster, measured.in_flight));
  absl::SleepFor(absl::Milliseconds(20));  // anything that would start, has
  measured.threads = ThreadCount();
  CHECK(Held(cluster) == measured.in_flight);
  for (FakeShardTransport* shard : cluster.shards) shard->Release();
  REQUIRE((*scheduler)->Drain().ok());
  return measured;
}

// `calls` async pushes straight through the client, all held at once.
Measured ClientInFlight(int shards, int calls) {
  FakeCluster cluster = MakeFakeCluster(Options(shards));
  const std::vector<float> gradient(16, 1.0f);
  REQUIRE(cluster.client->RegisterTensor("w", {16}).ok());
  for (FakeShardTransport* shard : cluster.shards) shard->Block();
  std::vector<Client::Handle> handles;
  for (int i = 0; i < calls; ++i) handles.push_back(cluster.client->PushAsync("w", gradient));
  Measured measured;
  measured.in_flight = calls;
  REQUIRE(AwaitHeld(cluster, calls));
  measured.threads = ThreadCount();
  for (FakeShardTransport* shard : cluster.shards) shard->Release();
  for (const Client::Handle& handle : handles) REQUIRE(cluster.client->Wait(handle).ok());
  return measured;
}

TEST_CASE("the comm scheduler's threads do not grow with shards or calls in flight") {
  const Measured base = SchedulerInFlight(1, 4);
  const Measured many_tensors = SchedulerInFlight(1, 64);
  const Measured many_shards = SchedulerInFlight(8, 4);
  const Measured both = SchedulerInFlight(8, 64);
  WARN("threads with calls in flight: 1 shard, 4 tensors: " << base.threads
       << "; 1 shard, 64 tensors: " << many_tensors.threads << "; 8 shards, 4 tensors: "
       << many_shards.threads << "; 8 shards, 64 tensors: " << both.threads << " ("
       << both.in_flight << " calls in flight)");
  CHECK(both.in_flight == 18);
  CHECK(many_tensors.threads == base.threads);
  CHECK(many_shards.threads == base.threads);
  CHECK(both.threads == base.threads);
}

TEST_CASE("the client holds calls in flight without a thread each") {
  const Measured few = ClientInFlight(1, 4);
  const Measured many = ClientInFlight(1, 64);
  const Measured sharded = ClientInFlight(8, 64);
  WARN("client threads with 4 calls in flight: " << few.threads << "; 64: " << many.threads
       << "; 64 over 8 shards: " << sharded.threads);
  CHECK(many.threads == few.threads);
  CHECK(sharded.threads == few.threads);
}

// Tensors "a", "b" and "c" of 4 floats on the first shard, which refuses
// pushes of "b" and answers everything else as the default does.
void RegisterABCRefusingPushesOfB(FakeCluster& cluster) {
  for (const char* name : {"a", "b", "c"}) {
    REQUIRE(cluster.client->RegisterTensor(name, {4}).ok());
  }
  cluster.shards[0]->SetResponder(
      [](const FakeShardTransport::Call& call, const ChunkViewSink* sink) {
        if (call.kind == FakeShardTransport::CallKind::kPush && call.chunks[0].key() == "b") {
          return absl::InvalidArgumentError("fake: 'b' refused");
        }
        return FakeShardTransport::DefaultResponse(call, sink);
      });
}

TEST_CASE("held calls completed in reverse order give each operation its own outcome") {
  FakeCluster cluster = MakeFakeCluster(Options(1));
  FakeShardTransport& shard = *cluster.shards[0];
  RegisterABCRefusingPushesOfB(cluster);
  shard.Block();
  const std::vector<float> gradient(4, 1.0f);
  std::vector<float> pulled(4, -1.0f);
  Client::Handle push_a = cluster.client->PushAsync("a", gradient);
  REQUIRE(shard.AwaitHeld(1, absl::Seconds(5)));
  Client::Handle push_b = cluster.client->PushAsync("b", gradient);
  REQUIRE(shard.AwaitHeld(2, absl::Seconds(5)));
  Client::Handle pull_c = cluster.client->PullAsync("c", absl::MakeSpan(pulled));
  REQUIRE(shard.AwaitHeld(3, absl::Seconds(5)));

  // Outcomes through callbacks, as the comm scheduler takes them.
  std::vector<std::string> finished;
  absl::Mutex mutex;
  absl::Status b_status;
  cluster.client->WhenDone(push_b, absl::InfiniteFuture(), [&](absl::Status status) {
    absl::MutexLock lock(&mutex);
    finished.push_back("b");
    b_status = status;
  });

  std::vector<FakeShardTransport::Call> held = shard.held();
  REQUIRE(held.size() == 3);
  CHECK(held[0].chunks[0].key() == "a");
  CHECK(held[2].kind == FakeShardTransport::CallKind::kPull);
  for (auto it = held.rbegin(); it != held.rend(); ++it) REQUIRE(shard.CompleteHeld(it->id));
  CHECK_FALSE(shard.CompleteHeld(held[0].id));  // each completes once
  CHECK(shard.held_calls() == 0);

  REQUIRE(cluster.client->Wait(pull_c, absl::Now() + absl::Seconds(5)).ok());
  for (size_t i = 0; i < pulled.size(); ++i) CHECK(pulled[i] == static_cast<float>(i));
  CHECK(cluster.client->Wait(push_a, absl::Now() + absl::Seconds(5)).ok());
  {
    absl::MutexLock lock(&mutex);
    REQUIRE(finished.size() == 1);
    CHECK(absl::IsInvalidArgument(b_status));
    CHECK(b_status.message().find("'b' refused") != absl::string_view::npos);
  }
  // Consumed by WhenDone, as by Wait.
  CHECK(absl::IsNotFound(cluster.client->Wait(push_b)));
}

TEST_CASE("WhenDone cancels an operation at its deadline") {
  FakeCluster cluster = MakeFakeCluster(Options(1));
  FakeShardTransport& shard = *cluster.shards[0];
  REQUIRE(cluster.client->RegisterTensor("w", {4}).ok());
  shard.Block();
  const std::vector<float> gradient(4, 1.0f);
  Client::Handle push = cluster.client->PushAsync("w", gradient);
  REQUIRE(shard.AwaitHeld(1, absl::Seconds(5)));
  absl::Notification done;
  absl::Status outcome;
  cluster.client->WhenDone(push, absl::Now() + absl::Milliseconds(50), [&](absl::Status status) {
    outcome = status;
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(absl::IsDeadlineExceeded(outcome));
  CHECK(shard.cancelled_calls() == 1);
}

TEST_CASE("the client's timeline: operations on lanes of their kind, blocked waits, errors") {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/client_timeline.json";
  auto opened = Timeline::Open(path, 5, 1 << 20);
  REQUIRE(opened.ok());
  std::shared_ptr<Timeline> timeline = std::move(*opened);
  FakeCluster cluster = MakeFakeCluster(Options(1));
  FakeShardTransport& shard = *cluster.shards[0];
  RegisterABCRefusingPushesOfB(cluster);
  cluster.client->SetTimeline(timeline);
  const std::vector<float> gradient(4, 1.0f);
  std::vector<float> pulled(4, -1.0f);
  // "a" is held until its wait's deadline cancels it: a wait that blocked.
  shard.SetHoldIf([](const FakeShardTransport::Call& call) {
    return call.kind == FakeShardTransport::CallKind::kPush && call.chunks[0].key() == "a";
  });
  Client::Handle push_a = cluster.client->PushAsync("a", gradient);
  REQUIRE(shard.AwaitHeld(1, absl::Seconds(5)));
  Client::Handle push_b = cluster.client->PushAsync("b", gradient);
  Client::Handle pull_c = cluster.client->PullAsync("c", absl::MakeSpan(pulled));
  CHECK(
      absl::IsDeadlineExceeded(cluster.client->Wait(push_a, absl::Now() + absl::Milliseconds(50))));
  CHECK(absl::IsInvalidArgument(cluster.client->Wait(push_b, absl::Now() + absl::Seconds(10))));
  REQUIRE(cluster.client->Wait(pull_c, absl::Now() + absl::Seconds(10)).ok());
  // A call its caller records itself (the comm scheduler's) is left off.
  shard.SetHoldIf(nullptr);
  CallScope scope;
  scope.on_timeline = false;
  REQUIRE(
      cluster.client
          ->Wait(cluster.client->PushAsync("c", gradient, scope), absl::Now() + absl::Seconds(10))
          .ok());
  // Off the timeline again: not recorded.
  cluster.client->SetTimeline(nullptr);
  REQUIRE(cluster.client
              ->Wait(cluster.client->PullAsync("c", absl::MakeSpan(pulled)),
                     absl::Now() + absl::Seconds(10))
              .ok());
  REQUIRE(timeline->Close().ok());

  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const Json events = ParseJson(text.str());
  std::map<int, std::string> tracks;
  std::map<std::string, Json> spans;  // by name
  int span_count = 0;
  for (const Json& event : events) {
    CHECK(event["pid"] == 5);
    if (event["name"] == "thread_name") {
      tracks[event["tid"].get<int>()] = event["args"]["name"].get<std::string>();
    }
    if (event["ph"] == "X") {
      if (event["cat"] != "wait") ++span_count;
      spans[event["name"].get<std::string>()] = event;
    }
  }
  CHECK(span_count == 3);  // the operations, each once
  REQUIRE(spans.count("push of 'a'") == 1);
  REQUIRE(spans.count("push of 'b'") == 1);
  REQUIRE(spans.count("pull of 'c'") == 1);
  REQUIRE(spans.count("wait for push of 'a'") == 1);
  const Json& a = spans["push of 'a'"];
  const Json& b = spans["push of 'b'"];
  // In flight together: separate lanes of pushes.
  CHECK(tracks[a["tid"].get<int>()] == "push 1");
  CHECK(tracks[b["tid"].get<int>()] == "push 2");
  CHECK(tracks[spans["pull of 'c'"]["tid"].get<int>()] == "pull 1");
  CHECK(a["cat"] == "push");
  CHECK(a["args"].contains("error"));
  CHECK(b["args"]["error"].get<std::string>().find("'b' refused") != std::string::npos);
  CHECK_FALSE(spans["pull of 'c'"]["args"].contains("error"));
  const Json& wait = spans["wait for push of 'a'"];
  CHECK(tracks[wait["tid"].get<int>()] == "waits");
  CHECK(wait["args"]["operation"] == a["args"]["operation"]);
  // The wait began after the operation and lasted until it ended (at its
  // deadline, by the cancel): timing-independent, unlike a bound on its
  // length, which the caller's own delay before Wait would shorten.
  CHECK(wait["ts"].get<int64_t>() >= a["ts"].get<int64_t>());
  CHECK(wait["ts"].get<int64_t>() + wait["dur"].get<int64_t>() >=
        a["ts"].get<int64_t>() + a["dur"].get<int64_t>());
}

TEST_CASE("StartTimeline and StopTimeline: the client's own timeline file") {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/started_timeline.json";
  FakeCluster cluster = MakeFakeCluster(Options(1));
  RegisterABCRefusingPushesOfB(cluster);
  std::vector<float> pulled(4, -1.0f);
  auto pull_c = [&] {
    return cluster.client->Wait(cluster.client->PullAsync("c", absl::MakeSpan(pulled)),
                                absl::Now() + absl::Seconds(10));
  };
  CHECK(cluster.client->StopTimeline().ok());  // none: nothing to do
  CHECK(absl::IsInvalidArgument(cluster.client->StartTimeline("/nonexistent-dir/t.json")));
  CHECK(cluster.client->timeline() == nullptr);
  REQUIRE(cluster.client->StartTimeline(path).ok());
  REQUIRE(cluster.client->timeline() != nullptr);
  CHECK(absl::IsFailedPrecondition(cluster.client->StartTimeline(path + ".2")));
  REQUIRE(pull_c().ok());
  REQUIRE(cluster.client->StopTimeline().ok());
  CHECK(cluster.client->timeline() == nullptr);
  REQUIRE(pull_c().ok());  // not recorded
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  int pulls = 0;
  for (const Json& event : ParseJson(text.str())) {
    if (event["ph"] == "X" && event["name"] == "pull of 'c'") ++pulls;
  }
  CHECK(pulls == 1);
}

}  // namespace
}  // namespace harrier
