// The consistency rule (server/consistency.h) and membership, table-driven:
// each case is a sequence of events on one slot's ClockBook and what the book
// must answer after each. No process, no socket, no store.

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "server/consistency.h"
#include "server/membership.h"

namespace harrier {
namespace {

enum class Event { kPush, kRefusedPush, kDuplicatePush, kLostPush, kLeave, kRestore, kPull };

struct Step {
  Event event;
  uint32_t rank = 0;
  int64_t clock = 0;
  // kPush: what the book decides.
  bool apply_now = false;
  float scale = 1.0f;
  // kPush, kLeave: the rounds completed, as (clock, contributors).
  std::vector<std::pair<int64_t, int>> completed = {};
  // kPull: the verdict.
  bool may_answer = false;
  int64_t min_clock = 0;
  // kRestore: the checkpoint's clocks.
  std::vector<int64_t> clocks = {};
};

Step Push(uint32_t rank, int64_t clock, float scale) {
  return {Event::kPush, rank, clock, true, scale};
}
Step Hold(uint32_t rank, int64_t clock, std::vector<std::pair<int64_t, int>> completed = {}) {
  return {Event::kPush, rank, clock, false, 1.0f, std::move(completed)};
}
// Refused: FAILED_PRECONDITION (a clock from the future, too far ahead).
Step Refused(uint32_t rank, int64_t clock) { return {Event::kRefusedPush, rank, clock}; }
// Exactly-once: a clock below the rank's next one is a duplicate to
// acknowledge, not to record (CheckPush still says "already pushed")...
Step Duplicate(uint32_t rank, int64_t clock) { return {Event::kDuplicatePush, rank, clock}; }
// ...unless a restore re-based the rank past it: lost with the shard.
Step Lost(uint32_t rank, int64_t clock) { return {Event::kLostPush, rank, clock}; }
Step Leave(uint32_t rank, std::vector<std::pair<int64_t, int>> completed = {}) {
  Step step{Event::kLeave, rank};
  step.completed = std::move(completed);
  return step;
}
Step Restore(std::vector<int64_t> clocks) {
  Step step{Event::kRestore};
  step.clocks = std::move(clocks);
  return step;
}
Step Pull(int64_t clock, bool may_answer, int64_t min_clock) {
  Step step{Event::kPull, 0, clock};
  step.may_answer = may_answer;
  step.min_clock = min_clock;
  return step;
}

struct Case {
  std::string name;
  std::string sync;
  int64_t staleness = 1;
  int64_t local_steps = 1;
  int workers = 2;
  bool staleness_aware = false;
  std::vector<Step> steps;
};

std::vector<std::pair<int64_t, int>> Flatten(
    const std::vector<PushDecision::CompletedRound>& rounds) {
  std::vector<std::pair<int64_t, int>> flat;
  for (const auto& round : rounds) flat.emplace_back(round.clock, round.contributors);
  return flat;
}

void Run(const Case& c) {
  INFO("case: " << c.name);
  auto policy = SyncPolicy::FromFlags(c.sync, c.staleness, c.local_steps);
  REQUIRE(policy.ok());
  ConsistencyController controller(*policy, c.workers, c.staleness_aware);
  Membership membership(c.workers);
  ClockBook book = controller.NewClockBook();
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const Step& step = c.steps[i];
    INFO("step " << i << " rank " << step.rank << " clock " << step.clock);
    switch (step.event) {
      case Event::kPush: {
        REQUIRE(book.CheckPush(step.rank, step.clock, membership).ok());
        const PushDecision decision = book.RecordPush(step.rank, step.clock, membership);
        REQUIRE((decision.kind == PushDecision::Kind::kApplyNow) == step.apply_now);
        if (step.apply_now) {
          REQUIRE(decision.scale == Approx(step.scale));
          REQUIRE(decision.completed.empty());
        } else {
          REQUIRE(decision.round == step.clock);
          REQUIRE(Flatten(decision.completed) == step.completed);
        }
        break;
      }
      case Event::kRefusedPush: {
        REQUIRE(absl::IsFailedPrecondition(book.CheckPush(step.rank, step.clock, membership)));
        REQUIRE(absl::IsFailedPrecondition(
            book.ClassifyPush(step.rank, step.clock, membership).status()));
        break;
      }
      case Event::kDuplicatePush: {
        auto push = book.ClassifyPush(step.rank, step.clock, membership);
        REQUIRE(push.ok());
        REQUIRE(*push == PushClass::kDuplicate);
        const absl::Status check = book.CheckPush(step.rank, step.clock, membership);
        REQUIRE(absl::IsFailedPrecondition(check));
        REQUIRE(std::string(check.message()).find("already pushed") != std::string::npos);
        break;
      }
      case Event::kLostPush: {
        auto push = book.ClassifyPush(step.rank, step.clock, membership);
        REQUIRE(absl::IsFailedPrecondition(push.status()));
        REQUIRE(std::string(push.status().message()).find("was lost") != std::string::npos);
        break;
      }
      case Event::kLeave:
        REQUIRE(membership.Depart(step.rank));
        REQUIRE(Flatten(book.Depart(step.rank)) == step.completed);
        break;
      case Event::kRestore:
        book.Restore(step.clocks);
        break;
      case Event::kPull: {
        const PullVerdict verdict = book.CheckPull(step.clock);
        REQUIRE(verdict.may_answer == step.may_answer);
        REQUIRE(verdict.min_clock == step.min_clock);
        break;
      }
    }
  }
}

TEST_CASE("clock book: every mode, table-driven") {
  const std::vector<Case> cases = {
      {"bsp: a round completes when every rank pushed, pulls wait for it",
       "bsp", 1, 1, 2, false,
       {Pull(0, true, 0), Hold(0, 0), Pull(1, false, 0), Duplicate(0, 0), Refused(0, 2),
        Hold(1, 0, {{0, 2}}), Pull(1, true, 1), Hold(1, 1), Hold(0, 1, {{1, 2}}),
        Pull(2, true, 2)}},
      {"bsp: a fast rank may run one round ahead; rounds complete in clock order",
       "bsp", 1, 1, 3, false,
       {Hold(0, 0), Hold(0, 1), Hold(1, 0), Hold(1, 1), Hold(2, 0, {{0, 3}}),
        Hold(2, 1, {{1, 3}}), Pull(2, true, 2)}},
      {"bsp: a rank that leaves completes the rounds waiting only for it",
       "bsp", 1, 1, 3, false,
       {Hold(0, 0), Hold(1, 0), Leave(2, {{0, 2}}), Pull(1, true, 1), Hold(0, 1),
        Hold(1, 1, {{1, 2}})}},
      {"bsp: uneven step counts: the early leaver holds nobody back",
       "bsp", 1, 1, 2, false,
       {Hold(0, 0), Hold(1, 0, {{0, 2}}), Leave(1), Hold(0, 1, {{1, 1}}), Hold(0, 2, {{2, 1}}),
        Pull(3, true, 3)}},
      {"bsp: every rank left: pulls are answered at once",
       "bsp", 1, 1, 2, false,
       {Leave(0), Leave(1), Pull(100, true, kEveryoneLeftClock)}},
      {"bsp: after a restore each rank re-bases once on this slot",
       "bsp", 1, 1, 2, false,
       {Restore({1, 1}), Pull(1, true, 1), Hold(0, 3), Pull(2, false, 1), Hold(1, 3, {{3, 2}}),
        Refused(0, 9), Duplicate(1, 3), Duplicate(0, 0), Lost(0, 1), Lost(1, 2), Duplicate(0, 3),
        Pull(4, true, 4)}},
      {"bsp: after a restore a retry of a clock in the checkpoint is a duplicate, of one "
       "after it new",
       "bsp", 1, 1, 2, false,
       {Restore({3, 3}), Duplicate(0, 2), Duplicate(1, 0), Hold(0, 3), Duplicate(0, 3),
        Hold(1, 3, {{3, 2}}), Duplicate(1, 3), Refused(0, -1)}},
      {"bsp: a re-based rank past a pending round completes it",
       "bsp", 1, 1, 2, false,
       {Restore({2, 2}), Hold(0, 2), Hold(1, 5, {{2, 1}})}},
      {"ssp(s=2): pushes apply on arrival scaled 1/n, pulls wait for min clock >= t - 2",
       "ssp", 2, 1, 2, false,
       {Push(0, 0, 0.5f), Push(0, 1, 0.5f), Pull(2, true, 0), Pull(3, false, 0), Duplicate(0, 1),
        Push(1, 0, 0.5f), Pull(3, true, 1)}},
      {"ssp: after a rank leaves the scale is 1/active",
       "ssp", 1, 1, 4, false,
       {Push(0, 0, 0.25f), Leave(3), Push(1, 0, 1.0f / 3), Leave(2), Push(0, 1, 0.5f)}},
      {"ssp: staleness-aware scale divides by how far behind the push is",
       "ssp", 3, 1, 2, true,
       {Push(0, 0, 0.5f), Push(0, 1, 0.5f), Push(0, 2, 0.5f), Push(1, 0, 0.5f / 3),
        Push(1, 1, 0.5f / 2)}},
      {"asp: never waits",
       "asp", 1, 1, 2, false,
       {Push(0, 0, 0.5f), Push(0, 1, 0.5f), Pull(1000, true, 0), Push(1, 0, 0.5f)}},
      {"local(H=4): a round of deltas per push, averaged like BSP",
       "local", 1, 4, 2, false,
       {Hold(0, 0), Pull(1, false, 0), Hold(1, 0, {{0, 2}}), Pull(1, true, 1)}},
  };
  for (const Case& c : cases) Run(c);
}

TEST_CASE("clock book: BSP refuses a push too many rounds ahead of the slowest rank") {
  ConsistencyController controller(*SyncPolicy::FromFlags("bsp", 0, 1), 2, false,
                                   /*max_pending_rounds=*/3);
  Membership membership(2);
  ClockBook book = controller.NewClockBook();
  for (int64_t clock = 0; clock < 3; ++clock) {
    REQUIRE(book.CheckPush(0, clock, membership).ok());
    book.RecordPush(0, clock, membership);
  }
  const absl::Status refused = book.CheckPush(0, 3, membership);
  REQUIRE(absl::IsFailedPrecondition(refused));
  REQUIRE(std::string(refused.message()).find("rank 1 at clock 0") != std::string::npos);
  book.RecordPush(1, 0, membership);  // the slowest catches up one round
  REQUIRE(book.CheckPush(0, 3, membership).ok());
  // SSP holds no rounds: no such bound.
  ConsistencyController ssp(*SyncPolicy::FromFlags("ssp", 1, 1), 2, false, 3);
  ClockBook ssp_book = ssp.NewClockBook();
  for (int64_t clock = 0; clock < 10; ++clock) {
    REQUIRE(ssp_book.CheckPush(0, clock, membership).ok());
    ssp_book.RecordPush(0, clock, membership);
  }
}

// Seen with the real MLP (tests/integration:shard_kill_training_grpc_test):
// the workers ran about 100 rounds past the shard's last checkpoint before
// it came back, and the bound refused their first pushes for good.
TEST_CASE("clock book: after a restore the pending-rounds bound lets every rank re-base") {
  ConsistencyController controller(*SyncPolicy::FromFlags("bsp", 0, 1), 2, false,
                                   /*max_pending_rounds=*/64);
  Membership membership(2);
  ClockBook book = controller.NewClockBook();
  book.Restore({547, 547});
  REQUIRE(book.CheckPush(0, 653, membership).ok());
  REQUIRE(book.RecordPush(0, 653, membership).completed.empty());
  REQUIRE(book.CheckPush(1, 653, membership).ok());
  const PushDecision last = book.RecordPush(1, 653, membership);
  REQUIRE(last.completed.size() == 1);
  REQUIRE(last.completed[0].clock == 653);
  // Re-based: the bound is back, measured from the new clocks.
  REQUIRE(book.CheckPush(0, 654, membership).ok());
  book.RecordPush(0, 654, membership);
  for (int64_t clock = 655; clock < 654 + 64; ++clock) book.RecordPush(0, clock, membership);
  REQUIRE(absl::IsFailedPrecondition(book.CheckPush(0, 654 + 64, membership)));
}

// Seen in the shard-kill training tests under load: after shard 1 came
// back, rank 1's pull there waited for rank 0 at its checkpoint clock,
// while rank 0, done with its step on shard 1 before the crash (its pushes
// acknowledged, then lost), waited on shard 0 for rank 1. Rank 0's
// heartbeat says where it is on each chunk, and the book re-bases it.
TEST_CASE("clock book: a heartbeat re-bases a rank whose pushes were lost with the shard") {
  ConsistencyController controller(*SyncPolicy::FromFlags("bsp", 0, 1), 2);
  Membership membership(2);
  ClockBook book = controller.NewClockBook();
  book.Restore({350, 350});
  // Rank 1 retries its push of clock 359; rank 0 had its 359 acknowledged.
  REQUIRE(book.CheckPush(1, 359, membership).ok());
  REQUIRE(book.RecordPush(1, 359, membership).completed.empty());
  REQUIRE_FALSE(book.CheckPull(360).may_answer);  // waits for rank 0 at 350
  std::vector<PushDecision::CompletedRound> completed;
  // A heartbeat that is not ahead of the book changes nothing.
  REQUIRE_FALSE(book.RebaseFromWorker(0, 350, &completed));
  REQUIRE(book.RebaseFromWorker(0, 360, &completed));
  REQUIRE(completed.size() == 1);
  REQUIRE(completed[0].clock == 359);
  REQUIRE(completed[0].contributors == 1);
  REQUIRE(book.CheckPull(360).may_answer);
  // Re-based once: later heartbeats are no re-base, rank 0's next push is
  // its clock 360, and its lost clocks are refused as lost, not applied.
  REQUIRE_FALSE(book.RebaseFromWorker(0, 400, &completed));
  REQUIRE(book.CheckPush(0, 360, membership).ok());
  REQUIRE(absl::IsFailedPrecondition(book.ClassifyPush(0, 355, membership).status()));
  // A rank that pushed after the restore is not re-based by a heartbeat.
  REQUIRE_FALSE(book.RebaseFromWorker(1, 365, &completed));
  REQUIRE(book.pushed(1) == 360);
}

TEST_CASE("clock book: a checkpoint rolls ranks back to the first pending round") {
  ConsistencyController controller(*SyncPolicy::FromFlags("bsp", 0, 1), 3);
  Membership membership(3);
  ClockBook book = controller.NewClockBook();
  for (uint32_t r = 0; r < 3; ++r) book.RecordPush(r, 0, membership);
  book.RecordPush(0, 1, membership);
  book.RecordPush(1, 1, membership);
  REQUIRE(book.RoundPending(1));
  REQUIRE(book.CheckpointClocks() == std::vector<int64_t>{1, 1, 1});
  book.RecordPush(2, 1, membership);
  REQUIRE(book.CheckpointClocks() == std::vector<int64_t>{2, 2, 2});
}

// What tests/fuzz/shard_store_fuzz found (corpus regression-export-cut-
// below-rebased-rank): a checkpoint cuts every rank at the first pending
// round, so a round opened below a rank that a restore put past it lowers
// that rank's checkpoint clock, though the book's own clock does not move.
// By design: the checkpoint is the state before that round, and every rank
// of a restored shard may re-base.
TEST_CASE("clock book: a round opened below a restored rank lowers its checkpoint clock") {
  ConsistencyController controller(*SyncPolicy::FromFlags("bsp", 0, 1), 3);
  Membership membership(3);
  ClockBook book = controller.NewClockBook();
  book.Restore({2, 0, 0});
  REQUIRE(book.CheckpointClocks() == std::vector<int64_t>{2, 0, 0});
  book.RecordPush(1, 0, membership);
  REQUIRE(book.RoundPending(0));
  REQUIRE(book.CheckpointClocks() == std::vector<int64_t>{0, 0, 0});
  REQUIRE(book.pushed(0) == 2);
  REQUIRE(book.RecordPush(2, 0, membership).completed.size() == 1);
  REQUIRE(book.CheckpointClocks() == std::vector<int64_t>{2, 1, 1});
}

TEST_CASE("consistency controller: local SGD steps with the delta optimizer") {
  OptimizerOptions adam;
  adam.kind = "adam";
  auto configured = CreateOptimizer(adam);
  REQUIRE(configured.ok());
  ConsistencyController local(*SyncPolicy::FromFlags("local", 0, 4), 2);
  auto optimizer = local.ShardOptimizer(std::move(*configured));
  REQUIRE(optimizer->options().kind == "delta");
  std::vector<float> weights = {1.0f, 2.0f};
  const std::vector<float> delta = {0.5f, -1.0f};
  OptimizerState state;
  optimizer->Step(absl::MakeSpan(weights), delta, 1.0f, state);
  REQUIRE(weights == std::vector<float>{0.5f, 3.0f});

  ConsistencyController bsp(*SyncPolicy::FromFlags("bsp", 0, 1), 2);
  REQUIRE(bsp.ShardOptimizer(std::move(*CreateOptimizer(adam)))->options().kind == "adam");
}

TEST_CASE("membership: departures, liveness and the failure of a job") {
  Membership membership(3);
  REQUIRE(membership.active() == 3);
  REQUIRE(absl::IsInvalidArgument(membership.CheckRank(3, "push")));
  REQUIRE(membership.CheckRank(2, "push").ok());
  REQUIRE(membership.Depart(1));
  REQUIRE_FALSE(membership.Depart(1));  // idempotent
  REQUIRE(membership.active() == 2);
  REQUIRE(membership.departed(1));

  // Only ranks heard from once can be lost; each is reported once.
  REQUIRE(membership.FindLost(std::chrono::milliseconds(0), WorkerLossPolicy::kContinue).empty());
  // Rank 0 silent for a second, rank 2 heard just now: a 500 ms timeout
  // tells them apart even when a busy machine (or TSan) delays this thread
  // between the calls by far more than an idle one would.
  membership.Heard(0);
  membership.Heard(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  membership.Heard(2);
  REQUIRE(membership.FindLost(std::chrono::milliseconds(500), WorkerLossPolicy::kFail) ==
          std::vector<uint32_t>{0});
  REQUIRE(absl::IsAborted(membership.failure()));
  REQUIRE(std::string(membership.failure().message()).find("rank 0") != std::string::npos);
  REQUIRE(membership.FindLost(std::chrono::milliseconds(500), WorkerLossPolicy::kFail).size() <=
          1);
}

TEST_CASE("membership: present counts ranks that joined and neither left nor were lost") {
  Membership membership(3);
  REQUIRE(membership.present() == 0);  // none joined yet, whatever --num_workers says
  membership.Join(0);
  membership.Join(0);   // idempotent
  membership.Heard(2);  // a heartbeat or push joins too
  REQUIRE(membership.present() == 2);
  REQUIRE(membership.active() == 3);
  REQUIRE(membership.Depart(0));
  REQUIRE(membership.present() == 1);
  membership.Join(0);  // a departed rank does not come back
  REQUIRE(membership.present() == 1);
  membership.Depart(1);  // never joined: present unchanged
  REQUIRE(membership.present() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<Membership::Lost> lost;
  REQUIRE(membership.FindLost(std::chrono::milliseconds(2), WorkerLossPolicy::kFail, &lost) ==
          std::vector<uint32_t>{2});
  REQUIRE(lost.size() == 1);
  REQUIRE(lost[0].rank == 2);
  REQUIRE(lost[0].silent >= std::chrono::milliseconds(5));
  REQUIRE(membership.present() == 0);
  membership.Heard(2);  // heard again: present again
  REQUIRE(membership.present() == 1);
}

}  // namespace
}  // namespace harrier
