// The comm scheduler over a client on a fake control plane and fake shards:
// what it sends, in which order, in which pieces and buckets, under which
// cap, and that two workers with differently ordered queues never deadlock
// on shards that hold each pull until every worker has pushed (BSP).
#include "worker/comm_scheduler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/json.h"
#include "common/partitioner.h"
#include "tests/worker/fake_cluster.h"
#include "worker/fake_control_client.h"
#include "worker/timeline.h"
#include "worker/transport/fake/fake_transport.h"

namespace harrier {
namespace {


ClientOptions TestOptions(int num_shards, size_t chunk_bytes) {
  ClientOptions options;
  for (int i = 0; i < num_shards; ++i) options.servers.push_back(absl::StrCat("fake:", i));
  options.heartbeat_interval = absl::ZeroDuration();
  options.rpc_timeout = absl::Seconds(20);
  options.chunk_bytes = chunk_bytes;
  return options;
}


// A model: tensor i has sizes[i] floats, parameters and gradients owned here.
struct Model {
  explicit Model(const std::vector<size_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      params.emplace_back(sizes[i], static_cast<float>(i));
      grads.emplace_back(sizes[i]);
      for (size_t e = 0; e < sizes[i]; ++e) grads[i][e] = static_cast<float>(i * 100000 + e);
    }
  }
  std::vector<ScheduledTensor> Tensors() {
    std::vector<ScheduledTensor> tensors;
    for (size_t i = 0; i < params.size(); ++i) {
      tensors.push_back({absl::StrCat("t", i), {static_cast<int64_t>(params[i].size())},
                         absl::MakeSpan(params[i])});
    }
    return tensors;
  }
  std::vector<std::vector<float>> params, grads;
};

CommSchedulerOptions BaseOptions() {
  CommSchedulerOptions options;
  options.keep_dispatch_log = true;
  options.wait_timeout = absl::Seconds(10);
  return options;
}

// One training step as the header prescribes.
absl::Status Step(CommScheduler& scheduler, Model& model) {
  const int n = static_cast<int>(model.params.size());
  for (int i = 0; i < n; ++i) {
    if (auto status = scheduler.WaitParameters(i); !status.ok()) return status;
  }
  for (int i = n - 1; i >= 0; --i) {
    if (auto status = scheduler.GradientReady(i, model.grads[i]); !status.ok()) return status;
  }
  return scheduler.EndBackward();
}

std::vector<DispatchRecord> Pushes(const CommScheduler& scheduler) {
  std::vector<DispatchRecord> pushes;
  for (const DispatchRecord& record : scheduler.dispatch_log_for_testing()) {
    if (record.kind == DispatchRecord::kPush) pushes.push_back(record);
  }
  return pushes;
}

// (first tensor, first chunk) of each push, in dispatch order.
std::vector<std::pair<int, uint32_t>> PushOrder(const CommScheduler& scheduler) {
  std::vector<std::pair<int, uint32_t>> order;
  for (const DispatchRecord& record : Pushes(scheduler)) {
    order.emplace_back(record.tensors.front(), record.first_chunk);
  }
  return order;
}

TEST_CASE("ParseTechniques: each technique alone, the implied ones, defaults, unknown names") {
  auto plain = ParseTechniques("plain");
  REQUIRE(plain.ok());
  CHECK(!plain->wait_free_backprop);
  CHECK(plain->fusion_bytes == 0);
  CHECK(plain->partition_bytes == 0);
  CHECK(!plain->priority);
  CHECK(plain->max_inflight_bytes == 0);

  auto wfbp = ParseTechniques("wfbp");
  REQUIRE(wfbp.ok());
  CHECK(wfbp->wait_free_backprop);
  CHECK(wfbp->fusion_bytes == 0);

  auto fusion = ParseTechniques("fusion", 1234);
  REQUIRE(fusion.ok());
  CHECK(fusion->wait_free_backprop);
  CHECK(fusion->fusion_bytes == 1234);
  CHECK(fusion->partition_bytes == 0);

  auto priority = ParseTechniques("priority");
  REQUIRE(priority.ok());
  CHECK(priority->priority);
  CHECK(priority->wait_free_backprop);
  CHECK(priority->partition_bytes == kDefaultPartitionBytes);
  CHECK(priority->max_inflight_bytes == kDefaultMaxInflightBytes);
  CHECK(priority->fusion_bytes == 0);

  auto all = ParseTechniques("all", 0, 1 << 20, 1 << 22);
  REQUIRE(all.ok());
  CHECK(all->fusion_bytes == kDefaultFusionBytes);
  CHECK(all->partition_bytes == (1u << 20));
  CHECK(all->max_inflight_bytes == (1u << 22));

  auto joined = ParseTechniques("wfbp+fusion");
  REQUIRE(joined.ok());
  CHECK(joined->fusion_bytes == kDefaultFusionBytes);
  CHECK(!joined->priority);

  for (const char* bad : {"", "none", "wfbp+magic", "all+"}) {
    INFO(bad);
    auto parsed = ParseTechniques(bad);
    CHECK(absl::IsInvalidArgument(parsed.status()));
  }
  CHECK(std::string(ParseTechniques("wfbp+magic").status().message()).find("'magic'") !=
        std::string::npos);
}

TEST_CASE("fusion: small tensors, in backward order, share a bucket of at most fusion_bytes "
          "on the shard with the fewest bytes so far; a tensor above it goes alone") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, 32u << 20));
  // Bytes: 400, 200, 1200, 240, 240, 400, 160. t2 is above the threshold
  // and goes alone, to shard 1 where fnv1a puts it: loads 0 / 1200.
  // Backward, each small tensor to the lighter shard: 6, 5, 4 to shard 0
  // (800, the threshold exactly: 800 / 1200); 3 to shard 0 (1040), which
  // closes {4, 5, 6}; 1 to shard 0 (1240, with 3: 440 bytes); 0 to shard 1
  // (1600), alone in its bucket, so unfused.
  Model model({100, 50, 300, 60, 60, 100, 40});
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.fusion_bytes = 800;
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  REQUIRE(Step(**scheduler, model).ok());
  REQUIRE((*scheduler)->Drain().ok());

  const std::vector<DispatchRecord> pushes = Pushes(**scheduler);
  std::vector<std::vector<int>> buckets;
  for (const DispatchRecord& record : pushes) {
    buckets.push_back(record.tensors);
    if (record.tensors.size() > 1) {
      CHECK(record.bytes <= 800);
      CHECK(record.wire_name.rfind("harrier.fused/", 0) == 0);
      // Both buckets go to shard 0, the lighter one when each was filled.
      CHECK(record.shard == 0);
    } else {
      CHECK(record.wire_name == absl::StrCat("t", record.tensors[0]));
    }
  }
  // Dispatched as they became ready (backward order, FIFO).
  const std::vector<std::vector<int>> expected = {{4, 5, 6}, {2}, {1, 3}, {0}};
  CHECK(buckets == expected);

  // A bucket's payload is its members' gradients side by side, in index
  // order; pulled values go back to each member.
  std::map<std::string, std::string> payloads;
  for (FakeShardTransport* shard : cluster.shards) {
    for (const FakeShardTransport::Call& call : shard->calls()) {
      if (call.kind != FakeShardTransport::CallKind::kPush) continue;
      payloads[call.chunks[0].key()] = call.payloads[0];
    }
  }
  for (const DispatchRecord& record : pushes) {
    std::string want;
    for (int member : record.tensors) {
      want.append(reinterpret_cast<const char*>(model.grads[member].data()),
                  model.grads[member].size() * sizeof(float));
    }
    INFO(record.wire_name);
    CHECK(payloads.at(record.wire_name) == want);
  }
  // The fake answers element e of chunk 0 with e: member k of a bucket sees
  // its offset in the bucket plus its own index.
  auto check_bucket = [&](std::initializer_list<int> members) {
    size_t offset = 0;
    for (int member : members) {
      for (size_t e = 0; e < model.params[member].size(); ++e) {
        REQUIRE(model.params[member][e] == static_cast<float>(offset + e));
      }
      offset += model.params[member].size();
    }
  };
  check_bucket({4, 5, 6});
  check_bucket({1, 3});
  CHECK(model.params[0][99] == 99.0f);
  CHECK(model.params[2][299] == 299.0f);
}

TEST_CASE("partitioning: a large tensor goes in pieces of partition_bytes spread over every shard") {
  constexpr size_t kChunk = 64 * sizeof(float);
  FakeCluster cluster = MakeFakeCluster(TestOptions(3, kChunk));
  Model model({16, 64 * 10 + 5});  // tensor 1: 11 chunks, the last 5 elements
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.partition_bytes = kChunk;
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  REQUIRE(Step(**scheduler, model).ok());
  REQUIRE((*scheduler)->Drain().ok());

  const HashPartitioner partitioner(3);
  std::map<int, int> per_shard;
  std::set<uint32_t> chunks;
  size_t bytes = 0;
  for (const DispatchRecord& record : Pushes(**scheduler)) {
    if (record.tensors.front() != 1) continue;
    CHECK(record.num_chunks == 1);
    CHECK(record.shard == partitioner.ShardFor("t1", record.first_chunk));
    CHECK(record.bytes == (record.first_chunk == 10 ? 5 : 64) * sizeof(float));
    per_shard[record.shard]++;
    chunks.insert(record.first_chunk);
    bytes += record.bytes;
  }
  CHECK(chunks.size() == 11);
  CHECK(bytes == (64 * 10 + 5) * sizeof(float));
  REQUIRE(per_shard.size() == 3);
  for (const auto& [shard, count] : per_shard) CHECK((count == 3 || count == 4));
  // One call per piece on the wire: every push call carries one chunk.
  int calls = 0;
  for (FakeShardTransport* shard : cluster.shards) {
    for (const FakeShardTransport::Call& call : shard->calls()) {
      if (call.kind == FakeShardTransport::CallKind::kPull) {
        CHECK(call.pull.chunks_size() == 1);
      } else {
        CHECK(call.chunks.size() == 1);
        ++calls;
      }
    }
  }
  CHECK(calls == 12);

  // Without partitioning the same tensor is one call (over every shard).
  FakeCluster whole = MakeFakeCluster(TestOptions(3, kChunk));
  Model again({16, 64 * 10 + 5});
  CommSchedulerOptions no_partition = BaseOptions();
  no_partition.wait_free_backprop = true;
  auto unsplit = CommScheduler::Create(*whole.client, again.Tensors(), no_partition);
  REQUIRE(unsplit.ok());
  REQUIRE(Step(**unsplit, again).ok());
  REQUIRE((*unsplit)->Drain().ok());
  CHECK(Pushes(**unsplit).size() == 2);
}

TEST_CASE("even shards: a step's bytes on each of 4 shards are within 1 % of the even share") {
  // A model shaped like a CNN's: two large tensors that are no multiple of
  // the piece size, and many small ones of uneven sizes (biases, norms).
  constexpr size_t kPiece = size_t{256} << 10;
  std::vector<size_t> sizes = {3 * (kPiece / sizeof(float)) + 5, 1000003};
  for (size_t i = 0; i < 120; ++i) sizes.push_back(64 + (i * 7919) % 3000);
  for (const bool fusion : {true, false}) {
    INFO("fusion " << fusion);
    FakeCluster cluster = MakeFakeCluster(TestOptions(4, kPiece));
    Model model(sizes);
    CommSchedulerOptions options = BaseOptions();
    options.wait_free_backprop = true;
    options.partition_bytes = kPiece;
    if (fusion) options.fusion_bytes = 64 << 10;
    auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
    REQUIRE(scheduler.ok());
    REQUIRE(Step(**scheduler, model).ok());
    REQUIRE((*scheduler)->Drain().ok());
    // What each shard received, from the shards' side.
    std::vector<double> received;
    double total = 0;
    for (FakeShardTransport* shard : cluster.shards) {
      double bytes = 0;
      for (const FakeShardTransport::Call& call : shard->calls()) {
        if (call.kind != FakeShardTransport::CallKind::kPush) continue;
        for (const std::string& payload : call.payloads) bytes += payload.size();
      }
      received.push_back(bytes);
      total += bytes;
    }
    size_t model_bytes = 0;
    for (size_t size : sizes) model_bytes += size * sizeof(float);
    REQUIRE(total == static_cast<double>(model_bytes));
    for (size_t s = 0; s < received.size(); ++s) {
      INFO("shard " << s << " received " << received[s] << " of " << total);
      // Unfused small tensors are hashed whole; fused ones balance.
      CHECK(std::abs(received[s] / (total / 4) - 1) < (fusion ? 0.01 : 0.05));
    }
  }
}

// Pushes held one at a time (a cap below one piece), a back tensor in four
// pieces queued, then the front tensor's gradient: `priority` decides
// whether it overtakes the queued pieces.
std::vector<std::pair<int, uint32_t>> OrderWithLateFront(bool priority, int num_workers = 1,
                                                         bool across_workers = false) {
  constexpr size_t kChunk = 256 * sizeof(float);
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, kChunk), num_workers);
  Model model({8, 4 * 256});
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.partition_bytes = kChunk;
  options.max_inflight_bytes = 1;
  options.priority = priority;
  options.priority_across_workers = across_workers;
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  REQUIRE((*scheduler)->WaitParameters(0).ok());
  REQUIRE((*scheduler)->WaitParameters(1).ok());
  for (FakeShardTransport* shard : cluster.shards) shard->Block();
  REQUIRE((*scheduler)->GradientReady(1, model.grads[1]).ok());
  // t1's piece 0 is on the wire (held), the other three queued.
  const int first_shard = HashPartitioner(2).ShardFor("t1", 0);
  REQUIRE(cluster.shards[first_shard]->AwaitHeld(1, absl::Seconds(10)));
  REQUIRE(cluster.shards[0]->held_calls() + cluster.shards[1]->held_calls() == 1);
  REQUIRE((*scheduler)->GradientReady(0, model.grads[0]).ok());
  REQUIRE((*scheduler)->EndBackward().ok());
  absl::SleepFor(absl::Milliseconds(50));  // nothing else may go while one is in flight
  CHECK(Pushes(**scheduler).size() == 1);
  for (FakeShardTransport* shard : cluster.shards) shard->Release();
  REQUIRE((*scheduler)->Drain().ok());
  CHECK((*scheduler)->stats().peak_inflight_push_bytes == static_cast<int64_t>(kChunk));
  return PushOrder(**scheduler);
}

TEST_CASE("priority: a late front tensor overtakes queued back pieces, not the one in flight") {
  const std::vector<std::pair<int, uint32_t>> expected = {{1, 0}, {0, 0}, {1, 1}, {1, 2}, {1, 3}};
  CHECK(OrderWithLateFront(true) == expected);
}

TEST_CASE(
    "priority under BSP with several workers keeps the order gradients became ready, "
    "unless asked to reorder across workers") {
  // The fake control plane's job is BSP.
  const std::vector<std::pair<int, uint32_t>> ready_order = {
      {1, 0}, {1, 1}, {1, 2}, {1, 3}, {0, 0}};
  const std::vector<std::pair<int, uint32_t>> priority_order = {
      {1, 0}, {0, 0}, {1, 1}, {1, 2}, {1, 3}};
  CHECK(OrderWithLateFront(true, 2) == ready_order);
  CHECK(OrderWithLateFront(true, 2, true) == priority_order);
}

// Every pull slot (2 x shards + 2 = 6) held by a pull of the back tensor
// waiting for its round and the other six of its pieces' pulls queued
// behind them, then the front tensor's pull queued last: where the front
// tensor's pull goes among the 13 pulls of step 1 as the slots are given
// back one by one (6: right after the six held, 12: last).
int FrontPullPosition(int num_workers, bool across_workers) {
  constexpr size_t kChunk = 256 * sizeof(float);
  constexpr size_t kBackPieces = 12;
  constexpr size_t kSlots = 6;
  ClientOptions client_options = TestOptions(2, kChunk);
  client_options.max_calls_in_flight = 64;  // the scheduler's slots decide
  FakeCluster cluster = MakeFakeCluster(client_options, num_workers);
  Model model({256, kBackPieces * 256});
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.partition_bytes = kChunk;
  options.priority = true;
  options.max_inflight_bytes = 1 << 20;
  options.priority_across_workers = across_workers;
  absl::Mutex mutex;
  std::vector<std::pair<FakeShardTransport*, uint64_t>> held;
  for (FakeShardTransport* shard : cluster.shards) {
    shard->SetHoldIf([&mutex, &held, shard](const FakeShardTransport::Call& call) {
      if (call.kind != FakeShardTransport::CallKind::kPull || call.pull.clock() == 0) return false;
      absl::MutexLock lock(&mutex);
      held.emplace_back(shard, call.id);
      return true;
    });
  }
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  REQUIRE((*scheduler)->WaitParameters(0).ok());
  REQUIRE((*scheduler)->WaitParameters(1).ok());
  auto held_count = [&] {
    absl::MutexLock lock(&mutex);
    return held.size();
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto await = [&](auto done) {
    while (!done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    return done();
  };
  REQUIRE((*scheduler)->GradientReady(1, model.grads[1]).ok());
  // Every back piece pushed, six of its pulls held and six queued.
  REQUIRE(await([&] {
    return held_count() == kSlots &&
           (*scheduler)->queued_pulls_for_testing() == kBackPieces - kSlots;
  }));
  REQUIRE((*scheduler)->GradientReady(0, model.grads[0]).ok());
  REQUIRE((*scheduler)->EndBackward().ok());
  REQUIRE(
      await([&] { return (*scheduler)->queued_pulls_for_testing() == kBackPieces + 1 - kSlots; }));
  for (size_t next = 0; next < kBackPieces + 1; ++next) {
    std::pair<FakeShardTransport*, uint64_t> call{nullptr, 0};
    REQUIRE(await([&] {
      absl::MutexLock lock(&mutex);
      if (next < held.size()) call = held[next];
      return next < held.size();
    }));
    REQUIRE(call.first->CompleteHeld(call.second));
  }
  REQUIRE((*scheduler)->Drain().ok());
  std::vector<int> tensors;
  for (const DispatchRecord& record : (*scheduler)->dispatch_log_for_testing()) {
    if (record.kind == DispatchRecord::kPull && record.step == 1) {
      tensors.push_back(record.tensors.front());
    }
  }
  REQUIRE(tensors.size() == kBackPieces + 1);
  return static_cast<int>(std::find(tensors.begin(), tensors.end(), 0) - tensors.begin());
}

TEST_CASE(
    "pulls under BSP with several workers go in the order their pushes completed, "
    "by priority otherwise") {
  CHECK(FrontPullPosition(2, false) == 12);
  CHECK(FrontPullPosition(2, true) == 6);
  CHECK(FrontPullPosition(1, false) == 6);
}

// One tensor of 16 one-chunk pieces over 2 shards that hold every pull of
// step 1 (its round "not complete"), pushed under a round window of 4
// pieces: how many pieces go out before any pull is let through, and the
// scheduler to release them (the rest of the step runs in `finish`).
struct WindowRun {
  static constexpr size_t kChunk = 256 * sizeof(float);
  static constexpr size_t kPieces = 16;
  static constexpr size_t kWindowPieces = 4;

  explicit WindowRun(int num_workers)
      : cluster(MakeFakeCluster(
            [] {
              ClientOptions options = TestOptions(2, kChunk);
              options.max_calls_in_flight = 64;
              return options;
            }(),
            num_workers)),
        model({kPieces * 256}) {
    for (FakeShardTransport* shard : cluster.shards) {
      shard->SetHoldIf([this, shard](const FakeShardTransport::Call& call) {
        if (call.kind != FakeShardTransport::CallKind::kPull || call.pull.clock() == 0) {
          return false;
        }
        absl::MutexLock lock(&mutex);
        held.emplace_back(shard, call.id);
        return true;
      });
    }
    CommSchedulerOptions options = BaseOptions();
    options.wait_free_backprop = true;
    options.partition_bytes = kChunk;
    options.max_inflight_bytes = 1 << 20;  // no cap in the way
    options.round_window_bytes = kWindowPieces * kChunk;
    auto created = CommScheduler::Create(*cluster.client, model.Tensors(), options);
    REQUIRE(created.ok());
    scheduler = *std::move(created);
  }
  int64_t PushedPieces() const {
    return scheduler->stats().bytes_pushed / static_cast<int64_t>(kChunk);
  }
  size_t Held() {
    absl::MutexLock lock(&mutex);
    return held.size();
  }
  void ReleaseAll() {
    for (size_t next = 0; next < kPieces; ++next) {
      std::pair<FakeShardTransport*, uint64_t> call{nullptr, 0};
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (call.first == nullptr && absl::Now() < deadline) {
        {
          absl::MutexLock lock(&mutex);
          if (next < held.size()) call = held[next];
        }
        if (call.first == nullptr) absl::SleepFor(absl::Milliseconds(1));
      }
      REQUIRE(call.first != nullptr);
      REQUIRE(call.first->CompleteHeld(call.second));
    }
  }

  FakeCluster cluster;
  Model model;
  absl::Mutex mutex;
  std::vector<std::pair<FakeShardTransport*, uint64_t>> held ABSL_GUARDED_BY(mutex);
  std::unique_ptr<CommScheduler> scheduler;
};

bool AwaitTrue(const std::function<bool()>& done, absl::Duration within = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + within;
  while (!done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return done();
}

TEST_CASE(
    "the round window: under BSP with several workers a push waits for the rounds of "
    "the pushes before it to come back") {
  WindowRun run(2);
  REQUIRE(run.scheduler->WaitParameters(0).ok());
  REQUIRE(run.scheduler->GradientReady(0, run.model.grads[0]).ok());
  REQUIRE(run.scheduler->EndBackward().ok());
  // The window's four pieces go out; their pulls wait for the round.
  REQUIRE(AwaitTrue([&] { return run.Held() == WindowRun::kWindowPieces; }));
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(run.PushedPieces() == static_cast<int64_t>(WindowRun::kWindowPieces));
  // Each round that comes back lets one more piece go.
  run.ReleaseAll();
  REQUIRE(run.scheduler->Drain().ok());
  CHECK(run.PushedPieces() == static_cast<int64_t>(WindowRun::kPieces));
  CHECK(run.scheduler->stats().peak_unreturned_push_bytes ==
        static_cast<int64_t>(WindowRun::kWindowPieces * WindowRun::kChunk));
  CHECK(run.scheduler->options().round_window_bytes ==
        WindowRun::kWindowPieces * WindowRun::kChunk);
}

TEST_CASE("the round window: one worker has none") {
  WindowRun run(1);
  REQUIRE(run.scheduler->WaitParameters(0).ok());
  REQUIRE(run.scheduler->GradientReady(0, run.model.grads[0]).ok());
  REQUIRE(run.scheduler->EndBackward().ok());
  // Every piece pushed while the first pulls wait (in the pull slots).
  CHECK(AwaitTrue([&] { return run.PushedPieces() == static_cast<int64_t>(WindowRun::kPieces); }));
  run.ReleaseAll();
  REQUIRE(run.scheduler->Drain().ok());
}

TEST_CASE("the round window turns itself off when no round comes back for long") {
  // As when another worker waits for this one's push of a piece this one
  // pushes late: the rounds never complete while the window holds.
  WindowRun run(2);
  REQUIRE(run.scheduler->WaitParameters(0).ok());
  REQUIRE(run.scheduler->GradientReady(0, run.model.grads[0]).ok());
  REQUIRE(run.scheduler->EndBackward().ok());
  absl::Status drained;
  const absl::Time began = absl::Now();
  std::thread training([&] { drained = run.scheduler->Drain(); });  // waits in the scheduler
  const bool all_pushed =
      AwaitTrue([&] { return run.PushedPieces() == static_cast<int64_t>(WindowRun::kPieces); });
  const absl::Duration took = absl::Now() - began;
  run.ReleaseAll();
  training.join();
  CHECK(all_pushed);
  CHECK(took >= absl::Milliseconds(2400));  // a quarter of the wait_timeout, 10 s
  CHECK(drained.ok());
  CHECK(run.PushedPieces() == static_cast<int64_t>(WindowRun::kPieces));
}

// The tail cases' model and options: tensors of 1, 1, 2 and 4 pieces of
// kTailPiece bytes, wait-free backprop and priority.
constexpr size_t kTailPiece = 256 * sizeof(float);
Model TailModel() { return Model({256, 256, 2 * 256, 4 * 256}); }
CommSchedulerOptions TailOptions() {
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.partition_bytes = kTailPiece;
  options.priority = true;
  return options;
}

// Two steps of a 4-tensor model (t3 in 4 pieces, t2 in 2, t1 and t0 in
// one) on one of two BSP workers with priority and a forward-order tail of
// `tail`; t0's gradient comes last and late. The pushes of both steps in
// dispatch order, and how many had gone before t0's gradient was given.
std::pair<std::vector<std::pair<int, uint32_t>>, size_t> OrderWithTail(double tail) {
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, kTailPiece), /*num_workers=*/2);
  Model model = TailModel();
  CommSchedulerOptions options = TailOptions();
  options.forward_order_tail = tail;
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  size_t before_front = 0;
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 4; ++i) REQUIRE((*scheduler)->WaitParameters(i).ok());
    for (int i = 3; i >= 1; --i) REQUIRE((*scheduler)->GradientReady(i, model.grads[i]).ok());
    // Whatever may go without t0 has gone by now.
    absl::SleepFor(absl::Milliseconds(100));
    if (step == 0) before_front = Pushes(**scheduler).size();
    REQUIRE((*scheduler)->GradientReady(0, model.grads[0]).ok());
    REQUIRE((*scheduler)->EndBackward().ok());
  }
  REQUIRE((*scheduler)->Drain().ok());
  return {PushOrder(**scheduler), before_front};
}

// OrderWithTail(tail): both steps' pushes must follow `step_order`, and
// `before_front` pushes must have gone before t0's gradient was given.
void CheckTail(double tail, const std::vector<std::pair<int, uint32_t>>& step_order,
               size_t before_front) {
  INFO("forward_order_tail " << tail);
  const auto [order, gone] = OrderWithTail(tail);
  std::vector<std::pair<int, uint32_t>> two_steps = step_order;
  two_steps.insert(two_steps.end(), step_order.begin(), step_order.end());
  CHECK(order == two_steps);
  CHECK(gone == before_front);
}

TEST_CASE(
    "a forward-order tail: under BSP with several workers the front share of the bytes goes "
    "last, front first, every step, and a piece never goes ahead of its plan") {
  // t1's gradient was ready before t0's, but t0 is planned before it.
  CheckTail(0.25, {{3, 0}, {3, 1}, {3, 2}, {3, 3}, {2, 0}, {2, 1}, {0, 0}, {1, 0}}, 6);
  // The split may fall inside a tensor: t2's second piece goes last.
  CheckTail(0.375, {{3, 0}, {3, 1}, {3, 2}, {3, 3}, {2, 0}, {0, 0}, {1, 0}, {2, 1}}, 5);
  // No tail: the order gradients became ready.
  CheckTail(0, {{3, 0}, {3, 1}, {3, 2}, {3, 3}, {2, 0}, {2, 1}, {1, 0}, {0, 0}}, 7);

  FakeCluster cluster = MakeFakeCluster(TestOptions(2, 1024), 2);
  Model model({256});
  CommSchedulerOptions options = BaseOptions();
  options.forward_order_tail = 1.5;
  auto refused = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  CHECK(absl::IsInvalidArgument(refused.status()));
}

TEST_CASE(
    "a measured forward-order tail: each worker times step 1, sends its estimate to the "
    "workers' average, and plans what comes back from step 2 on") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, kTailPiece), /*num_workers=*/2);
  // The shards answer the average with 0.25, as if the other worker had
  // measured something else; what this worker sent is kept.
  auto sent = std::make_shared<std::vector<float>>();
  auto sent_mutex = std::make_shared<absl::Mutex>();
  for (FakeShardTransport* shard : cluster.shards) {
    shard->SetResponder(
        [sent, sent_mutex](const FakeShardTransport::Call& call, const ChunkViewSink* sink) {
          if (call.kind != FakeShardTransport::CallKind::kPushPull ||
              !absl::StartsWith(call.chunks[0].key(), kForwardOrderTailTensor)) {
            return FakeShardTransport::DefaultResponse(call, sink);
          }
          float estimate = -1;
          if (call.payloads[0].size() == sizeof(float)) {
            std::memcpy(&estimate, call.payloads[0].data(), sizeof(float));
          }
          {
            absl::MutexLock lock(sent_mutex.get());
            sent->push_back(estimate);
          }
          const float average = 0.25f;
          return FakeShardTransport::ReplyDense(*sink, call.chunks[0],
                                                absl::MakeConstSpan(&average, 1));
        });
  }
  Model model = TailModel();
  CommSchedulerOptions options = TailOptions();
  options.measure_forward_order_tail = true;
  auto created = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(created.ok());
  CommScheduler& scheduler = **created;
  CHECK(scheduler.stats().measured_forward_order_tail == -1);
  for (int step = 0; step < 4; ++step) {
    for (int i = 0; i < 4; ++i) REQUIRE(scheduler.WaitParameters(i).ok());
    // Step 1: backward takes at least 100 ms and its pushes are held 300
    // ms after it, so this worker's estimate lies strictly inside (0, 1).
    if (step == 1) {
      for (FakeShardTransport* shard : cluster.shards) shard->Block();
    }
    for (int i = 3; i >= 1; --i) REQUIRE(scheduler.GradientReady(i, model.grads[i]).ok());
    if (step == 1) absl::SleepFor(absl::Milliseconds(100));
    REQUIRE(scheduler.GradientReady(0, model.grads[0]).ok());
    REQUIRE(scheduler.EndBackward().ok());
    if (step == 1) {
      absl::SleepFor(absl::Milliseconds(300));
      for (FakeShardTransport* shard : cluster.shards) shard->Release();
    }
  }
  REQUIRE(scheduler.Drain().ok());
  const CommSchedulerStats stats = scheduler.stats();
  {
    absl::MutexLock lock(sent_mutex.get());
    REQUIRE(sent->size() == 1);
    CHECK(sent->front() == static_cast<float>(stats.measured_forward_order_tail));
  }
  CHECK(stats.measured_forward_order_tail > 0);
  CHECK(stats.measured_forward_order_tail < 1);
  CHECK(stats.forward_order_tail == 0.25);
  CHECK(stats.forward_order_tail_from_step == 2);
  // Steps 0 and 1 in the order gradients became ready, 2 and 3 as a tail
  // of 0.25 plans them (see the case above).
  const std::vector<std::pair<int, uint32_t>> ready = {{3, 0}, {3, 1}, {3, 2}, {3, 3},
                                                       {2, 0}, {2, 1}, {1, 0}, {0, 0}};
  const std::vector<std::pair<int, uint32_t>> planned = {{3, 0}, {3, 1}, {3, 2}, {3, 3},
                                                         {2, 0}, {2, 1}, {0, 0}, {1, 0}};
  std::vector<std::pair<int, uint32_t>> expected;
  for (const auto* order : {&ready, &ready, &planned, &planned}) {
    expected.insert(expected.end(), order->begin(), order->end());
  }
  CHECK(PushOrder(scheduler) == expected);
}

TEST_CASE(
    "a measured forward-order tail: when the average never comes back (a worker that does not "
    "measure), step 2 fails by the wait_timeout, naming the tail") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, kTailPiece), /*num_workers=*/2);
  for (FakeShardTransport* shard : cluster.shards) {
    shard->SetHoldIf([](const FakeShardTransport::Call& call) {
      return call.kind == FakeShardTransport::CallKind::kPushPull &&
             absl::StartsWith(call.chunks[0].key(), kForwardOrderTailTensor);
    });
  }
  Model model = TailModel();
  CommSchedulerOptions options = TailOptions();
  options.measure_forward_order_tail = true;
  options.wait_timeout = absl::Seconds(1);
  auto created = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(created.ok());
  for (int step = 0; step < 2; ++step) REQUIRE(Step(**created, model).ok());
  const absl::Time began = absl::Now();
  absl::Status status = Step(**created, model);
  CHECK(absl::Now() - began < absl::Seconds(30));
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(absl::StrContains(status.message(), "forward-order tail"));
}

TEST_CASE("a measured forward-order tail: one worker plans none and sends nothing") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, 1024), 1);
  Model model({256, 256});
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.priority = true;
  options.measure_forward_order_tail = true;
  auto created = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(created.ok());
  for (int step = 0; step < 3; ++step) REQUIRE(Step(**created, model).ok());
  REQUIRE((*created)->Drain().ok());
  CHECK((*created)->stats().measured_forward_order_tail == -1);
  CHECK((*created)->stats().forward_order_tail == 0);
  for (FakeShardTransport* shard : cluster.shards) {
    for (const FakeShardTransport::Call& call : shard->calls()) {
      for (const proto::TensorChunk& chunk : call.chunks) {
        CHECK(!absl::StartsWith(chunk.key(), kForwardOrderTailTensor));
      }
    }
  }
  // A tail given and one to measure: refused.
  options.forward_order_tail = 0.5;
  auto refused = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  CHECK(absl::IsInvalidArgument(refused.status()));
}

TEST_CASE("without priority pushes go in the order gradients became ready") {
  const std::vector<std::pair<int, uint32_t>> expected = {{1, 0}, {1, 1}, {1, 2}, {1, 3}, {0, 0}};
  CHECK(OrderWithLateFront(false) == expected);
}

TEST_CASE("plain: nothing is pushed before EndBackward, then every tensor in tensor order") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, 1u << 20));
  Model model({10, 20, 30, 40});
  CommSchedulerOptions options = BaseOptions();
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  for (int i = 0; i < 4; ++i) REQUIRE((*scheduler)->WaitParameters(i).ok());
  for (int i = 3; i >= 0; --i) REQUIRE((*scheduler)->GradientReady(i, model.grads[i]).ok());
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(Pushes(**scheduler).empty());
  REQUIRE((*scheduler)->EndBackward().ok());
  REQUIRE((*scheduler)->Drain().ok());
  const std::vector<std::pair<int, uint32_t>> expected = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
  CHECK(PushOrder(**scheduler) == expected);

  // The positive control: with wfbp the back tensor goes before EndBackward.
  FakeCluster eager = MakeFakeCluster(TestOptions(2, 1u << 20));
  Model model2({10, 20, 30, 40});
  options.wait_free_backprop = true;
  auto wfbp = CommScheduler::Create(*eager.client, model2.Tensors(), options);
  REQUIRE(wfbp.ok());
  for (int i = 0; i < 4; ++i) REQUIRE((*wfbp)->WaitParameters(i).ok());
  REQUIRE((*wfbp)->GradientReady(3, model2.grads[3]).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Pushes(**wfbp).empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  CHECK(PushOrder(**wfbp) == std::vector<std::pair<int, uint32_t>>{{3, 0}});
}

TEST_CASE("plain waits for every tensor's pull before forward; wfbp only for the one asked") {
  for (bool wfbp : {false, true}) {
    INFO("wfbp " << wfbp);
    FakeCluster cluster = MakeFakeCluster(TestOptions(1, 1u << 20));
    // Pulls of t3 for step 1 are held until `release`.
    auto release = std::make_shared<absl::Notification>();
    cluster.shards[0]->SetResponder(
        [release](const FakeShardTransport::Call& call, const ChunkViewSink* sink) {
          if (call.kind == FakeShardTransport::CallKind::kPull && call.pull.clock() == 1 &&
              call.pull.chunks(0).key() == "t3") {
            release->WaitForNotificationWithTimeout(absl::Seconds(10));
          }
          return FakeShardTransport::DefaultResponse(call, sink);
        });
    Model model({10, 20, 30, 40});
    CommSchedulerOptions options = BaseOptions();
    options.wait_free_backprop = wfbp;
    auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
    REQUIRE(scheduler.ok());
    REQUIRE(Step(**scheduler, model).ok());
    absl::Notification returned;
    absl::Status first;
    std::thread forward([&] {
      first = (*scheduler)->WaitParameters(0);
      returned.Notify();
    });
    // wfbp: t0's own pull suffices (returns however long a busy machine
    // takes); plain: t0 waits for t3's, held until the release below.
    if (wfbp) {
      CHECK(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
    } else {
      CHECK_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
    }
    release->Notify();
    forward.join();
    CHECK(first.ok());
    CHECK((*scheduler)->WaitParameters(3).ok());
    CHECK((*scheduler)->Drain().ok());
  }
}

// Shards shared by two workers that answer a pull at clock t only once
// both workers pushed that chunk at t - 1 (BSP), or fail at the call's
// deadline: a scheduler whose cap or order made workers wait on each other
// would fail here by timeout, not hang. A pull that must wait is held by
// its fake shard (no thread waits) and completed by the push that
// completes its round.
class BspShards {
 public:
  explicit BspShards(int workers) : workers_(workers) {}

  void Serve(FakeShardTransport* shard) {
    shard->SetHoldIf([this, shard](const FakeShardTransport::Call& call) {
      if (call.kind != FakeShardTransport::CallKind::kPull) return false;
      absl::MutexLock lock(&mutex_);
      if (AllPushed(call)) return false;
      waiting_.push_back({shard, call});
      return true;
    });
    shard->SetResponder([this](const FakeShardTransport::Call& call, const ChunkViewSink* sink) {
      if (call.kind == FakeShardTransport::CallKind::kPush) {
        std::vector<std::pair<FakeShardTransport*, uint64_t>> ready;
        {
          absl::MutexLock lock(&mutex_);
          for (const proto::TensorChunk& chunk : call.chunks) {
            pushed_[{chunk.key(), chunk.chunk(), chunk.clock()}]++;
          }
          for (auto it = waiting_.begin(); it != waiting_.end();) {
            if (AllPushed(it->second)) {
              ready.emplace_back(it->first, it->second.id);
              it = waiting_.erase(it);
            } else {
              ++it;
            }
          }
        }
        // A pull held past its deadline has ended already: nothing to do.
        for (auto& [shard, id] : ready) shard->CompleteHeld(id);
        return absl::OkStatus();
      }
      return FakeShardTransport::DefaultResponse(call, sink);
    });
  }

 private:
  bool AllPushed(const FakeShardTransport::Call& call) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (call.pull.clock() == 0) return true;
    for (const proto::ChunkRef& ref : call.pull.chunks()) {
      auto it = pushed_.find({ref.key(), ref.chunk(), call.pull.clock() - 1});
      if (it == pushed_.end() || it->second < workers_) return false;
    }
    return true;
  }

  const int workers_;
  absl::Mutex mutex_;
  std::map<std::tuple<std::string, uint32_t, int64_t>, int> pushed_ ABSL_GUARDED_BY(mutex_);
  std::list<std::pair<FakeShardTransport*, FakeShardTransport::Call>> waiting_
      ABSL_GUARDED_BY(mutex_);
};

TEST_CASE("credits: the cap is never exceeded and two workers in different orders never "
          "deadlock, for caps from 1 byte to unbounded") {
  constexpr size_t kChunk = 128 * sizeof(float);
  // Largest piece: one chunk (512 bytes). Wires: t6, t5, t4 (3 pieces), the
  // bucket of t3 and t2 (32 bytes each, both to the lighter shard), t1 (4
  // pieces), t0 (would take that bucket past 64 bytes): 11 pushes a step.
  const std::vector<size_t> sizes = {16, 4 * 128, 8, 8, 3 * 128, 100, 128};
  for (size_t cap : {size_t{1}, size_t{100}, kChunk, 3 * kChunk, size_t{1} << 20, size_t{0}}) {
    INFO("cap " << cap);
    BspShards bsp(2);
    std::vector<FakeCluster> clusters;
    for (int w = 0; w < 2; ++w) {
      ClientOptions client_options = TestOptions(2, kChunk);
      client_options.rpc_timeout = absl::Seconds(5);
      clusters.push_back(MakeFakeCluster(client_options, 2));
      for (FakeShardTransport* shard : clusters.back().shards) {
        bsp.Serve(shard);
      }
    }
    std::vector<absl::Status> results(2);
    std::vector<CommSchedulerStats> stats(2);
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        Model model(sizes);
        CommSchedulerOptions options = BaseOptions();
        options.wait_free_backprop = true;
        options.partition_bytes = kChunk;
        options.fusion_bytes = 64;
        options.max_inflight_bytes = cap;
        options.priority = w == 0;  // worker 1 FIFO: queues in different orders
        options.priority_across_workers = true;
        options.wait_timeout = absl::Seconds(8);
        auto scheduler = CommScheduler::Create(*clusters[w].client, model.Tensors(), options);
        if (!scheduler.ok()) {
          results[w] = scheduler.status();
          return;
        }
        for (int step = 0; step < 4 && results[w].ok(); ++step) {
          results[w] = Step(**scheduler, model);
        }
        if (results[w].ok()) results[w] = (*scheduler)->Drain();
        stats[w] = (*scheduler)->stats();
      });
    }
    for (std::thread& thread : threads) thread.join();
    CHECK(absl::Now() - start < absl::Seconds(8));
    for (int w = 0; w < 2; ++w) {
      INFO("worker " << w << ": " << results[w].ToString());
      CHECK(results[w].ok());
      CHECK(stats[w].push_calls == 4 * 11);
      if (cap == 0) continue;
      // A piece above the cap goes alone; otherwise the cap holds.
      CHECK(stats[w].peak_inflight_push_bytes <=
            static_cast<int64_t>(std::max(cap, kChunk)));
      if (cap < kChunk) CHECK(stats[w].peak_inflight_push_bytes == static_cast<int64_t>(kChunk));
    }
  }
}

TEST_CASE("the default credit cap follows the shards: two pieces per shard in flight") {
  constexpr size_t kChunk = 128 * sizeof(float);
  CommSchedulerOptions follows;
  follows.partition_bytes = kChunk;
  follows.max_inflight_bytes = kChunk;
  follows.inflight_pieces_per_shard = 2;
  CHECK(CreditCap(follows, 1) == 2 * kChunk);
  CHECK(CreditCap(follows, 4) == 8 * kChunk);
  CommSchedulerOptions exact = follows;
  exact.inflight_pieces_per_shard = 0;
  CHECK(CreditCap(exact, 4) == kChunk);
  CommSchedulerOptions uncapped = follows;
  uncapped.max_inflight_bytes = 0;
  CHECK(CreditCap(uncapped, 4) == 0);
  // The parsed default: 8 MiB up to four shards, then two 1 MiB pieces each.
  auto all = ParseTechniques("all");
  REQUIRE(all.ok());
  CHECK(all->inflight_pieces_per_shard == kDefaultInflightPiecesPerShard);
  CHECK(CreditCap(*all, 1) == size_t{8} << 20);
  CHECK(CreditCap(*all, 4) == size_t{8} << 20);
  CHECK(CreditCap(*all, 8) == size_t{16} << 20);
  auto given = ParseTechniques("all", 0, 0, 1 << 20);
  REQUIRE(given.ok());
  CHECK(CreditCap(*given, 4) == (size_t{1} << 20));

  // Through the scheduler: 16 one-chunk pieces over 4 shards that hold
  // every call. Following the shards, 8 pushes are in flight at once (2
  // per shard); with the cap exact, 1. Then every call is let go and the
  // step completes.
  for (size_t pieces_per_shard : {size_t{2}, size_t{0}}) {
    INFO("pieces per shard " << pieces_per_shard);
    FakeCluster cluster = MakeFakeCluster(TestOptions(4, kChunk));
    Model model({16 * 128});
    CommSchedulerOptions options = BaseOptions();
    options.wait_free_backprop = true;
    options.partition_bytes = kChunk;
    options.max_inflight_bytes = kChunk;
    options.inflight_pieces_per_shard = pieces_per_shard;
    auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
    REQUIRE(scheduler.ok());
    CHECK((*scheduler)->options().max_inflight_bytes == (pieces_per_shard > 0 ? 8 : 1) * kChunk);
    REQUIRE((*scheduler)->WaitParameters(0).ok());
    for (FakeShardTransport* shard : cluster.shards) shard->Block();
    REQUIRE((*scheduler)->GradientReady(0, model.grads[0]).ok());
    const int64_t expected = static_cast<int64_t>((pieces_per_shard > 0 ? 8 : 1) * kChunk);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while ((*scheduler)->stats().peak_inflight_push_bytes < expected && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::SleepFor(absl::Milliseconds(50));  // a push past the cap would show by now
    CHECK((*scheduler)->stats().peak_inflight_push_bytes == expected);
    std::set<int> shards_in_flight;
    for (const DispatchRecord& push : Pushes(**scheduler)) shards_in_flight.insert(push.shard);
    CHECK(shards_in_flight.size() == (pieces_per_shard > 0 ? 4u : 1u));
    for (FakeShardTransport* shard : cluster.shards) shard->Release();
    REQUIRE((*scheduler)->EndBackward().ok());
    REQUIRE((*scheduler)->Drain().ok());
    CHECK((*scheduler)->stats().push_calls == 16);
  }
}

TEST_CASE("a failed push surfaces at the next wait, naming the tensor") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(1, 1u << 20));
  Model model({10, 20});
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  REQUIRE((*scheduler)->WaitParameters(0).ok());
  REQUIRE((*scheduler)->WaitParameters(1).ok());
  cluster.shards[0]->FailNext(1, absl::InvalidArgumentError("fake refuses"));
  REQUIRE((*scheduler)->GradientReady(1, model.grads[1]).ok());
  absl::Status status = (*scheduler)->WaitParameters(1);
  // Still step 0: its parameters are in, so this returns OK unless the
  // failure has already come back.
  CHECK((status.ok() || absl::IsInvalidArgument(status)));
  absl::Status drained = (*scheduler)->Drain();
  CHECK(absl::IsInvalidArgument(drained));
  CHECK(std::string(drained.message()).find("'t1'") != std::string::npos);
  CHECK(std::string(drained.message()).find("fake refuses") != std::string::npos);
  CHECK(absl::IsInvalidArgument((*scheduler)->EndBackward()));
  CHECK(absl::IsInvalidArgument((*scheduler)->WaitParameters(0)));
}

TEST_CASE(
    "the timeline holds every call once, on lanes where calls never overlap, each step "
    "and each wait of the training loop") {
  constexpr size_t kChunk = 64 * sizeof(float);
  FakeCluster cluster = MakeFakeCluster(TestOptions(2, kChunk));
  Model model({16, 64 * 6 + 3});  // tensor 1: 7 pieces over both shards
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/scheduler_timeline.json";
  auto timeline = Timeline::Open(path, 1, 1 << 20);
  REQUIRE(timeline.ok());
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.partition_bytes = kChunk;
  options.max_inflight_bytes = 3 * kChunk;
  options.timeline = timeline->get();
  CommSchedulerStats stats;
  int64_t released_us = 0;
  {
    auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
    REQUIRE(scheduler.ok());
    const int n = static_cast<int>(model.params.size());
    for (int i = 0; i < n; ++i) REQUIRE((*scheduler)->WaitParameters(i).ok());
    // Step 0's calls to shard 0 are held from here: step 1's parameters of
    // the pieces there cannot arrive before the release, so the loop waits
    // for them in step 1 (it enters the wait long before the release).
    cluster.shards[0]->Block();
    for (int i = n - 1; i >= 0; --i) {
      REQUIRE((*scheduler)->GradientReady(i, model.grads[i]).ok());
    }
    REQUIRE((*scheduler)->EndBackward().ok());
    absl::Time released;
    std::thread release([&] {
      absl::SleepFor(absl::Milliseconds(300));
      released = absl::Now();
      cluster.shards[0]->Release();
    });
    absl::Status second = Step(**scheduler, model);
    release.join();
    released_us = absl::ToUnixMicros(released);
    REQUIRE(second.ok());
    REQUIRE((*scheduler)->Drain().ok());
    stats = (*scheduler)->stats();
  }
  REQUIRE((*timeline)->Close().ok());

  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const Json events = ParseJson(text.str());
  REQUIRE(events.is_array());
  std::map<int, std::string> tracks;
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> spans_on;
  int64_t pushes = 0, pulls = 0, pushed_bytes = 0, pulled_bytes = 0;
  int steps = 0;
  int64_t last_wait_end_us = 0;
  for (const Json& event : events) {
    if (event["ph"] == "M" && event["name"] == "thread_name") {
      tracks[event["tid"].get<int>()] = event["args"]["name"].get<std::string>();
    }
    if (event["ph"] != "X") continue;
    const int tid = event["tid"].get<int>();
    spans_on[tid].emplace_back(event["ts"].get<int64_t>(), event["dur"].get<int64_t>());
    if (event["cat"] == "push" || event["cat"] == "pull") {
      const bool push = event["cat"] == "push";
      CHECK(tracks[tid].rfind(push ? "push " : "pull ", 0) == 0);
      (push ? pushes : pulls) += 1;
      (push ? pushed_bytes : pulled_bytes) += event["args"]["bytes"].get<int64_t>();
      CHECK(event["args"]["queued_ms"].get<double>() >= 0);
      CHECK(event["args"].contains("shard"));
    } else if (event["cat"] == "step") {
      CHECK(tracks[tid] == "steps");
      CHECK(event["name"] == absl::StrCat("step ", steps));
      ++steps;
    } else if (event["cat"] == "wait") {
      CHECK(tracks[tid] == "training loop waits");
      if (event["args"]["step"] == 1) {
        last_wait_end_us =
            std::max(last_wait_end_us, event["ts"].get<int64_t>() + event["dur"].get<int64_t>());
      }
    }
  }
  CHECK(pushes == stats.push_calls);
  CHECK(pulls == stats.pull_calls);
  CHECK(pushed_bytes == stats.bytes_pushed);
  CHECK(pulled_bytes == stats.bytes_pulled);
  CHECK(pushes == 2 * 8);  // t0 and t1's 7 pieces, each step
  CHECK(steps == 2);
  // The loop's wait in step 1 lasted until the held calls were released.
  CHECK(last_wait_end_us >= released_us);
  // A lane holds one call at a time.
  for (auto& [tid, spans] : spans_on) {
    if (tracks[tid] == "training loop waits" || tracks[tid] == "steps") continue;
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      INFO(tracks[tid] << " span " << i);
      CHECK(spans[i - 1].first + spans[i - 1].second <= spans[i].first);
    }
  }
}

TEST_CASE("the destructor drops queued work and returns within the call deadline") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(1, 64));
  Model model({16 * 8});  // 8 pieces of one chunk
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  options.partition_bytes = 64;
  options.max_inflight_bytes = 1;
  options.wait_timeout = absl::Milliseconds(500);
  auto scheduler = CommScheduler::Create(*cluster.client, model.Tensors(), options);
  REQUIRE(scheduler.ok());
  REQUIRE((*scheduler)->WaitParameters(0).ok());
  const int before = cluster.shards[0]->num_calls();
  cluster.shards[0]->Block();
  REQUIRE((*scheduler)->GradientReady(0, model.grads[0]).ok());
  REQUIRE(cluster.shards[0]->AwaitHeld(1, absl::Seconds(10)));
  const absl::Time start = absl::Now();
  scheduler->reset();
  CHECK(absl::Now() - start < absl::Seconds(3));
  CHECK(cluster.shards[0]->num_calls() == before + 1);  // the 7 queued pieces never went
  cluster.shards[0]->Release();
}

TEST_CASE("bad tensors and gradients are refused with INVALID_ARGUMENT or FAILED_PRECONDITION") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(1, 1u << 20));
  std::vector<float> a(4), b(6);
  CommSchedulerOptions options = BaseOptions();
  options.wait_free_backprop = true;
  CHECK(absl::IsInvalidArgument(
      CommScheduler::Create(*cluster.client, {{"a", {5}, absl::MakeSpan(a)}}, options).status()));
  CHECK(absl::IsInvalidArgument(CommScheduler::Create(*cluster.client,
                                                      {{"a", {4}, absl::MakeSpan(a)},
                                                       {"a", {6}, absl::MakeSpan(b)}},
                                                      options)
                                    .status()));
  auto scheduler = CommScheduler::Create(
      *cluster.client, {{"a", {4}, absl::MakeSpan(a)}, {"b", {6}, absl::MakeSpan(b)}}, options);
  REQUIRE(scheduler.ok());
  CHECK(absl::IsInvalidArgument((*scheduler)->WaitParameters(2)));
  REQUIRE((*scheduler)->WaitParameters(0).ok());
  REQUIRE((*scheduler)->WaitParameters(1).ok());
  CHECK(absl::IsInvalidArgument((*scheduler)->GradientReady(0, b)));
  REQUIRE((*scheduler)->GradientReady(1, b).ok());
  CHECK(absl::IsFailedPrecondition((*scheduler)->GradientReady(1, b)));
  absl::Status missing = (*scheduler)->EndBackward();
  CHECK(absl::IsFailedPrecondition(missing));
  CHECK(std::string(missing.message()).find("'a'") != std::string::npos);
}

}  // namespace
}  // namespace harrier
