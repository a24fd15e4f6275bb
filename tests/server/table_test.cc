// The shard as a registry of tables (server/table.h): table kinds on the
// wire, "would wait" as a value, parked pulls woken by the push that lets
// them through, round sums shared between a clock book and its staged
// copies, and a push call applied whole across several tables.

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "server/consistency.h"
#include "server/shard_store.h"
#include "tests/server/store_fixtures.h"

namespace harrier {
namespace {

using testing::Gradient;
using testing::Init;
using testing::MakeStore;

proto::ChunkRef Ref(const std::string& key, size_t n) {
  proto::ChunkRef ref;
  ref.set_key(key);
  ref.set_num_elements(n);
  return ref;
}

PullTarget IntoString(std::string* payload) {
  PullTarget target;
  target.allocate = [payload](size_t bytes) {
    payload->resize(bytes);
    return payload->data();
  };
  return target;
}

struct CountingWaiter : PullWaiter {
  std::atomic<int> wakes{0};
  void Wake() override { wakes++; }
};

TEST_CASE("tables: Init names a known table kind; one key is one table of one kind") {
  auto store = MakeStore("bsp", 1);
  proto::InitRequest request = Init("w", 4);
  REQUIRE(request.kind() == proto::TABLE_DENSE);  // the default
  REQUIRE(*store->Init(request));
  proto::InitRequest unknown = Init("v", 4);
  unknown.set_kind(static_cast<proto::TableKind>(77));
  const absl::StatusOr<bool> refused = store->Init(unknown);
  REQUIRE(absl::IsInvalidArgument(refused.status()));
  REQUIRE(refused.status().message().find("unknown table kind 77") != std::string::npos);
  // Refused whole: no empty table is left behind.
  REQUIRE(store->holdings().keys == 1);
  REQUIRE(store->tensors_held().size() == 1);
  REQUIRE(store->tensors_held()[0].name == "w");
}

std::vector<float> Values(const std::string& payload) {
  std::vector<float> values(payload.size() / 4);
  std::memcpy(values.data(), payload.data(), payload.size());
  return values;
}

TEST_CASE("tables: an average table holds each round's average whatever --sync, on its own clock") {
  for (const char* sync : {"bsp", "ssp", "asp", "local"}) {
    INFO(sync);
    auto store = MakeStore(sync, 2);
    // The training tensor runs ahead on the training clock.
    REQUIRE(store->Init(Init("w", 2)).ok());
    for (int64_t clock = 0; clock < 5; ++clock) {
      REQUIRE(store->Push({Gradient("w", 0, clock, {1, 1})}).ok());
      REQUIRE(store->Push({Gradient("w", 1, clock, {1, 1})}).ok());
    }
    proto::InitRequest average = Init("loss", 2);
    average.set_kind(proto::TABLE_AVERAGE);
    REQUIRE(*store->Init(average));
    const proto::ChunkRef ref = Ref("loss", 2);
    proto::TensorChunk out;
    std::string payload;
    for (int64_t round = 0; round < 3; ++round) {
      // Its first push is clock 0 of its own, after five training clocks.
      const float x = static_cast<float>(round + 1);
      REQUIRE(store->Push({Gradient("loss", 0, round, {x, 10 * x})}).ok());
      // Every mode waits for the round: the other rank has not pushed.
      absl::StatusOr<PullOutcome> waits =
          store->TryPull(0, round + 1, ref, &out, IntoString(&payload));
      REQUIRE(waits.ok());
      REQUIRE_FALSE(waits->ready);
      REQUIRE(store->Push({Gradient("loss", 1, round, {3 * x, 30 * x})}).ok());
      absl::StatusOr<PullOutcome> answer =
          store->TryPull(1, round + 1, ref, &out, IntoString(&payload));
      REQUIRE((answer.ok() && answer->ready));
      // The average itself: no optimizer step, no 1/n scaling.
      REQUIRE(Values(payload) == std::vector<float>{2 * x, 20 * x});
    }
    // Its clock does not lower the next clock a worker resumes from.
    REQUIRE(store->NextClocks() == std::vector<int64_t>{5, 5});
    // Kept by a checkpoint with its kind: a restored shard averages it still.
    const ShardCheckpoint saved = store->Export();
    auto restored = MakeStore(sync, 2);
    REQUIRE(restored->Import(saved).ok());
    REQUIRE(*restored->Init(average) == false);
    REQUIRE(restored->NextClocks() == std::vector<int64_t>{5, 5});
    REQUIRE(absl::IsInvalidArgument(restored->Init(Init("loss", 2)).status()));  // as dense
  }
}

TEST_CASE("tables: every Init of a tensor says the same clock") {
  auto store = MakeStore("bsp", 2);
  proto::InitRequest own = Init("late", 4);
  own.set_own_clock(true);
  REQUIRE(*store->Init(own));
  const absl::StatusOr<bool> refused = store->Init(Init("late", 4));
  REQUIRE(absl::IsInvalidArgument(refused.status()));
  REQUIRE(refused.status().message().find("keeps a clock of its own") != std::string::npos);
  // A dense tensor on a clock of its own: pushed from clock 0 while the
  // training tensor is at clock 3; BSP rounds as usual.
  REQUIRE(store->Init(Init("w", 4)).ok());
  for (int64_t clock = 0; clock < 3; ++clock) {
    REQUIRE(store->Push({Gradient("w", 0, clock, {0, 0, 0, 0})}).ok());
    REQUIRE(store->Push({Gradient("w", 1, clock, {0, 0, 0, 0})}).ok());
  }
  REQUIRE(store->Push({Gradient("late", 0, 0, {2, 2, 2, 2})}).ok());
  REQUIRE(store->Push({Gradient("late", 1, 0, {4, 4, 4, 4})}).ok());
  proto::TensorChunk out;
  std::string payload;
  absl::StatusOr<PullOutcome> answer =
      store->TryPull(0, 1, Ref("late", 4), &out, IntoString(&payload));
  REQUIRE((answer.ok() && answer->ready));
  REQUIRE(Values(payload) == std::vector<float>{-3, -3, -3, -3});  // SGD lr 1, averaged
  REQUIRE(store->NextClocks() == std::vector<int64_t>{3, 3});
}

TEST_CASE("tables: a pull the consistency model holds back is a value, not an error") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 4)).ok());
  const proto::ChunkRef ref = Ref("w", 4);
  proto::TensorChunk out;
  std::string payload;
  // Clock 0 is ready; clock 1 waits for both ranks' clock 0.
  absl::StatusOr<PullOutcome> ready = store->TryPull(0, 0, ref, &out, IntoString(&payload));
  REQUIRE(ready.ok());
  REQUIRE(ready->ready);
  REQUIRE(payload.size() == 16);
  REQUIRE(store->Push({Gradient("w", 1, 0, {1, 1, 1, 1})}).ok());
  absl::StatusOr<PullOutcome> waits = store->TryPull(0, 1, ref, &out, IntoString(&payload));
  REQUIRE(waits.ok());
  REQUIRE_FALSE(waits->ready);
  REQUIRE(waits->verdict.required_min_clock == 1);
  REQUIRE(waits->verdict.min_clock == 0);
  REQUIRE(waits->verdict.slowest_rank == 0);
  REQUIRE(store->blocked_pulls() == 0);  // asking never parks
  // The error a transport gives when the wait runs out is built from it.
  const absl::Status expired = PullWaitExpired(PullQuery{0, 1, &ref}, waits->verdict);
  REQUIRE(absl::IsDeadlineExceeded(expired));
  REQUIRE(expired.message().find("slowest worker is rank 0 at clock 0") != std::string::npos);
  // Errors stay errors.
  REQUIRE(
      absl::IsNotFound(store->TryPull(0, 0, Ref("nope", 4), &out, IntoString(&payload)).status()));
  REQUIRE(absl::IsInvalidArgument(store->TryPull(0, -1, ref, &out, IntoString(&payload)).status()));
}

TEST_CASE("tables: a parked pull is woken once, by the push that completes its round") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 2)).ok());
  const proto::ChunkRef ref = Ref("w", 2);
  auto waiter = std::make_shared<CountingWaiter>();
  REQUIRE(store->Park(1, ref, waiter));
  REQUIRE(store->blocked_pulls() == 1);
  // Rank 0's push leaves the round waiting for rank 1: the pull stays
  // parked, not woken only to park again.
  REQUIRE(store->Push({Gradient("w", 0, 0, {2, 4})}).ok());
  REQUIRE(waiter->wakes == 0);
  REQUIRE(store->blocked_pulls() == 1);
  // Rank 1's push completes the round: woken once, and now ready.
  REQUIRE(store->Push({Gradient("w", 1, 0, {4, 8})}).ok());
  REQUIRE(waiter->wakes == 1);
  REQUIRE(store->blocked_pulls() == 0);
  proto::TensorChunk out;
  std::string payload;
  absl::StatusOr<PullOutcome> answer = store->TryPull(0, 1, ref, &out, IntoString(&payload));
  REQUIRE((answer.ok() && answer->ready));
  std::vector<float> values(2);
  std::memcpy(values.data(), payload.data(), 8);
  REQUIRE(values == std::vector<float>{-3, -6});  // the round's average, one step
  // A pull that may be answered now is not parked.
  REQUIRE_FALSE(store->Park(1, ref, waiter));
  // Unparked before anything changes: never woken.
  REQUIRE(store->Park(2, ref, waiter));
  store->Unpark(ref, waiter.get());
  REQUIRE(store->blocked_pulls() == 0);
  REQUIRE(store->Push({Gradient("w", 0, 1, {1, 1})}).ok());
  REQUIRE(store->Push({Gradient("w", 1, 1, {1, 1})}).ok());
  REQUIRE(waiter->wakes == 1);
}

TEST_CASE("tables: a pull parked far ahead is not woken by the rounds before its own") {
  auto store = MakeStore("ssp", 2);  // staleness 1
  REQUIRE(store->Init(Init("w", 2)).ok());
  const proto::ChunkRef ref = Ref("w", 2);
  auto near = std::make_shared<CountingWaiter>();
  auto far = std::make_shared<CountingWaiter>();
  // SSP with staleness 1: a pull at clock c waits for every rank's c - 2.
  REQUIRE(store->Park(2, ref, near));
  REQUIRE(store->Park(5, ref, far));
  REQUIRE(store->blocked_pulls() == 2);
  for (int64_t clock = 0; clock < 3; ++clock) {
    REQUIRE(store->Push({Gradient("w", 0, clock, {1, 1})}).ok());
    REQUIRE(store->Push({Gradient("w", 1, clock, {1, 1})}).ok());
    // Clock 0 of both lets the near pull through; the far one waits for 3.
    REQUIRE(near->wakes == 1);
    REQUIRE(far->wakes == 0);
  }
  REQUIRE(store->blocked_pulls() == 1);
  REQUIRE(store->Push({Gradient("w", 0, 3, {1, 1})}).ok());
  REQUIRE(far->wakes == 0);  // rank 1 is still at 3
  REQUIRE(store->Push({Gradient("w", 1, 3, {1, 1})}).ok());
  REQUIRE(far->wakes == 1);
  REQUIRE(store->blocked_pulls() == 0);
}

TEST_CASE("tables: a push call spanning tables is applied whole or not at all") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("a", 2)).ok());
  REQUIRE(store->Init(Init("b", 3)).ok());
  proto::TensorChunk bad = Gradient("b", 0, 0, {1, 1, 1});
  bad.set_checksum(bad.checksum() ^ 1);
  REQUIRE(absl::IsInvalidArgument(store->Push({Gradient("a", 0, 0, {1, 1}), bad})));
  REQUIRE(*store->Snapshot("a", 0) == std::vector<float>{0, 0});
  REQUIRE(*store->Snapshot("b", 0) == std::vector<float>{0, 0, 0});
  PushResult result;
  REQUIRE(store->Push({Gradient("a", 0, 0, {1, 1}), Gradient("b", 0, 0, {2, 2, 2})}, &result).ok());
  REQUIRE(result.applied == 2);
  REQUIRE(*store->Snapshot("a", 0) == std::vector<float>{-1, -1});
  REQUIRE(*store->Snapshot("b", 0) == std::vector<float>{-2, -2, -2});
}

TEST_CASE("tables: a round's sum lives with its round, shared by copies of the book") {
  ConsistencyController controller(*SyncPolicy::FromFlags("bsp", 0, 1), 2);
  Membership membership(2);
  ClockBook book = controller.NewClockBook();
  PushDecision first = book.RecordPush(0, 0, membership);
  REQUIRE(first.kind == PushDecision::Kind::kHoldForRound);
  REQUIRE(first.held_sum != nullptr);
  REQUIRE(book.PendingSum(0) == first.held_sum.get());
  first.held_sum->started = true;
  first.held_sum->sum = {2, 6};
  // A staged copy decides on the same sum; completing the round hands it out.
  ClockBook staged = book;
  PushDecision second = staged.RecordPush(1, 0, membership);
  REQUIRE(second.held_sum == first.held_sum);
  REQUIRE(second.completed.size() == 1);
  REQUIRE(second.completed[0].sum == first.held_sum);
  REQUIRE(second.completed[0].contributors == 2);
  REQUIRE(staged.PendingSum(0) == nullptr);
  REQUIRE(book.PendingSum(0) != nullptr);  // the real book moves on only when committed
  second.completed[0].sum->Finish(2, 2);
  REQUIRE(first.held_sum->sum == SumBuffer{1, 3});
}

TEST_CASE("tables: an ended run's table stays counted until the last call holding it lets go") {
  // Room for two chunks of 100 floats.
  auto owned = testing::MakeStoreWithParamBudget("asp", 1, 2 * 400);
  ShardStore& store = *owned;
  REQUIRE(store.Init(Init("w", 100)).ok());
  REQUIRE(store.holdings().param_bytes == 400);
  REQUIRE(store.holdings().chunks == 1);
  // A call of the old run still holds its table as the next run starts.
  std::shared_ptr<Table> held = store.TableForTesting("w");
  REQUIRE(held != nullptr);
  store.StartRun();
  REQUIRE(store.TableForTesting("w") == nullptr);
  REQUIRE(store.holdings().param_bytes == 400);
  REQUIRE(store.holdings().chunks == 1);
  // The new run has what is left, not more.
  REQUIRE(store.Init(Init("v", 100)).ok());
  const absl::StatusOr<bool> refused = store.Init(Init("u", 100));
  REQUIRE(absl::IsResourceExhausted(refused.status()));
  REQUIRE(store.holdings().param_bytes == 800);
  // Freed with the call: its bytes and its chunk go back, exactly.
  held.reset();
  REQUIRE(store.holdings().param_bytes == 400);
  REQUIRE(store.holdings().chunks == 1);
  REQUIRE(store.Init(Init("u", 100)).ok());
  REQUIRE(store.holdings().param_bytes == 800);
  // A run that ends with nothing holding its tables gives everything back.
  store.StartRun();
  REQUIRE(store.holdings().param_bytes == 0);
  REQUIRE(store.holdings().chunks == 0);
}

}  // namespace
}  // namespace harrier
