#include "server/consistency.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace harrier {

absl::StatusOr<SyncPolicy> SyncPolicy::FromFlags(absl::string_view sync, int64_t staleness,
                                                 int64_t local_steps) {
  SyncPolicy policy;
  if (sync == "bsp") {
    policy.mode = SyncMode::kBsp;
    policy.staleness = 0;
  } else if (sync == "ssp") {
    if (staleness < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sync=ssp needs --staleness >= 1, got ", staleness));
    }
    policy.mode = SyncMode::kSsp;
    policy.staleness = staleness;
  } else if (sync == "asp") {
    policy.mode = SyncMode::kAsp;
    policy.staleness = -1;
  } else if (sync == "local") {
    if (local_steps < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sync=local needs --local_steps >= 1, got ", local_steps));
    }
    policy.mode = SyncMode::kLocal;
    policy.staleness = 0;
    policy.local_steps = local_steps;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --sync='", sync, "' (expected bsp, ssp, asp or local)"));
  }
  return policy;
}

std::string SyncPolicy::ToString() const {
  switch (mode) {
    case SyncMode::kBsp: return "bsp";
    case SyncMode::kSsp: return absl::StrCat("ssp(s=", staleness, ")");
    case SyncMode::kAsp: return "asp";
    case SyncMode::kLocal: return absl::StrCat("local(H=", local_steps, ")");
  }
  return "?";
}

ConsistencyController::ConsistencyController(SyncPolicy policy, int num_workers,
                                             bool staleness_aware_lr, int64_t max_pending_rounds)
    : policy_(policy),
      num_workers_(num_workers),
      staleness_aware_lr_(staleness_aware_lr),
      max_pending_rounds_(std::max<int64_t>(1, max_pending_rounds)) {}

bool ConsistencyController::PullMayProceed(int64_t pull_clock, int64_t min_clock) const {
  if (policy_.staleness < 0) return true;
  return min_clock >= RequiredMinClock(pull_clock);
}

int64_t ConsistencyController::RequiredMinClock(int64_t pull_clock) const {
  if (policy_.staleness < 0) return 0;
  return pull_clock - policy_.staleness;
}

bool ConsistencyController::AggregatesRounds() const {
  return policy_.mode == SyncMode::kBsp || policy_.mode == SyncMode::kLocal;
}

std::unique_ptr<Optimizer> ConsistencyController::ShardOptimizer(
    std::unique_ptr<Optimizer> configured) const {
  if (policy_.mode == SyncMode::kLocal) return CreateDeltaOptimizer();
  return configured;
}

ClockBook ConsistencyController::NewClockBook() const { return ClockBook(this, num_workers_); }

ClockBook::ClockBook(const ConsistencyController* controller, int num_workers)
    : controller_(controller),
      pushed_(num_workers, 0),
      may_rebase_(num_workers, false),
      lost_from_(num_workers, 0),
      lost_to_(num_workers, 0),
      departed_(num_workers, false) {}

absl::StatusOr<PushClass> ClockBook::ClassifyPush(uint32_t rank, int64_t clock,
                                                  const Membership& membership) const {
  (void)membership;
  const int64_t expected = pushed_[rank];
  if (clock < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("push for negative clock ", clock, " from rank ", rank));
  }
  if (clock < expected) {
    if (clock >= lost_from_[rank] && clock < lost_to_[rank]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "push for clock ", clock, " from rank ", rank,
          " was lost: the shard restarted from a checkpoint at clock ", lost_from_[rank],
          " and the rank re-based to clock ", lost_to_[rank],
          ", so its clocks in between were never applied here and cannot be now"));
    }
    return PushClass::kDuplicate;
  }
  if (clock != expected && !may_rebase_[rank]) {
    return absl::FailedPreconditionError(
        absl::StrCat("push for clock ", clock, " from rank ", rank, " but its next clock is ",
                     expected, " (clock from the future)"));
  }
  if (controller_->AggregatesRounds() && !AwaitingRebase()) {
    const PullVerdict slowest = CheckPull(0);
    if (!slowest.everyone_left &&
        clock - slowest.min_clock >= controller_->max_pending_rounds()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "push for clock ", clock, " from rank ", rank, " is ", clock - slowest.min_clock,
          " rounds ahead of the slowest rank (rank ", slowest.slowest_rank, " at clock ",
          slowest.min_clock, "); at most ", controller_->max_pending_rounds(),
          " rounds may be pending (--max_pending_rounds)"));
    }
  }
  return PushClass::kNew;
}

absl::Status ClockBook::CheckPush(uint32_t rank, int64_t clock,
                                  const Membership& membership) const {
  absl::StatusOr<PushClass> push = ClassifyPush(rank, clock, membership);
  if (!push.ok()) return push.status();
  if (*push == PushClass::kDuplicate) {
    return absl::FailedPreconditionError(
        absl::StrCat("push for clock ", clock, " from rank ", rank, " but its next clock is ",
                     pushed_[rank], " (already pushed)"));
  }
  return absl::OkStatus();
}

bool ClockBook::RebaseFromWorker(uint32_t rank, int64_t next_clock,
                                 std::vector<PushDecision::CompletedRound>* completed) {
  if (rank >= may_rebase_.size() || !may_rebase_[rank] || departed_[rank] ||
      next_clock <= pushed_[rank]) {
    return false;
  }
  may_rebase_[rank] = false;
  lost_from_[rank] = pushed_[rank];
  lost_to_[rank] = next_clock;
  pushed_[rank] = next_clock;
  *completed = TakeCompletedRounds();
  return true;
}

bool ClockBook::AwaitingRebase() const {
  for (size_t r = 0; r < may_rebase_.size(); ++r) {
    if (may_rebase_[r] && !departed_[r]) return true;
  }
  return false;
}

int64_t ClockBook::fastest() const {
  int64_t fastest = 0;
  for (int64_t pushed : pushed_) fastest = std::max(fastest, pushed);
  return fastest;
}

PushDecision ClockBook::RecordPush(uint32_t rank, int64_t clock, const Membership& membership) {
  PushDecision decision;
  if (may_rebase_[rank]) {
    // The first push of a rank on this slot after a restore: the worker may
    // have run on while the shard was down, so its clock is taken as it is.
    may_rebase_[rank] = false;
    if (clock > pushed_[rank]) {
      lost_from_[rank] = pushed_[rank];
      lost_to_[rank] = clock;
    }
    pushed_[rank] = std::max(pushed_[rank], clock);
  }
  if (!controller_->AggregatesRounds()) {
    decision.kind = PushDecision::Kind::kApplyNow;
    decision.scale = 1.0f / static_cast<float>(std::max(1, membership.active()));
    if (controller_->staleness_aware_lr()) {
      decision.scale /= static_cast<float>(std::max<int64_t>(1, fastest() - clock));
    }
    pushed_[rank] = clock + 1;
    return decision;
  }
  pushed_[rank] = clock + 1;
  Round& round = rounds_[clock];
  if (round.from_rank.empty()) round.from_rank.assign(pushed_.size(), false);
  round.from_rank[rank] = true;
  round.count++;
  decision.kind = PushDecision::Kind::kHoldForRound;
  decision.round = clock;
  decision.held_sum = round.sum;
  decision.completed = TakeCompletedRounds();
  return decision;
}

bool ClockBook::RoundComplete(int64_t clock, const Round& round) const {
  for (size_t r = 0; r < pushed_.size(); ++r) {
    // A rank is done with this round when it pushed for it, left the job, or
    // was re-based past it after a restore (its push for the round was lost
    // with the shard).
    if (!round.from_rank[r] && !departed_[r] &&
        pushed_[r] <= clock) {
      return false;
    }
  }
  return true;
}

const RoundSum* ClockBook::PendingSum(int64_t clock) const {
  auto it = rounds_.find(clock);
  return it == rounds_.end() ? nullptr : it->second.sum.get();
}

void RoundSum::Finish(int contributors, size_t num_elements) {
  if (vote) {
    sum.resize(num_elements);
    vote->Finish(absl::MakeSpan(sum)).IgnoreError();  // >= 1 vote, sizes match
    return;
  }
  AverageInPlace(absl::MakeSpan(sum), contributors);
}

std::vector<PushDecision::CompletedRound> ClockBook::Depart(uint32_t rank) {
  departed_[rank] = true;
  return TakeCompletedRounds();
}

std::vector<PushDecision::CompletedRound> ClockBook::TakeCompletedRounds() {
  // Rounds complete in clock order: every rank pushes its clocks in order,
  // so round t+1 cannot hold a rank that round t still waits for.
  std::vector<PushDecision::CompletedRound> completed;
  while (!rounds_.empty() &&
         RoundComplete(rounds_.begin()->first, rounds_.begin()->second)) {
    completed.push_back(
        {rounds_.begin()->first, rounds_.begin()->second.count, rounds_.begin()->second.sum});
    rounds_.erase(rounds_.begin());
  }
  return completed;
}

PullVerdict ClockBook::CheckPull(int64_t pull_clock) const {
  PullVerdict verdict;
  int64_t min_clock = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < pushed_.size(); ++r) {
    if (departed_[r]) continue;  // holds nobody back
    if (pushed_[r] < min_clock) {
      min_clock = pushed_[r];
      verdict.slowest_rank = static_cast<int>(r);
    }
  }
  verdict.required_min_clock = controller_->RequiredMinClock(pull_clock);
  if (min_clock == std::numeric_limits<int64_t>::max()) {
    // Every rank left: nothing can hold a pull back any more.
    verdict.everyone_left = true;
    verdict.may_answer = true;
    verdict.min_clock = kEveryoneLeftClock;
    return verdict;
  }
  verdict.min_clock = min_clock;
  verdict.may_answer = controller_->PullMayProceed(pull_clock, min_clock);
  return verdict;
}

std::vector<int64_t> ClockBook::CheckpointClocks() const {
  std::vector<int64_t> clocks = pushed_;
  if (!rounds_.empty()) {
    const int64_t first_pending = rounds_.begin()->first;
    for (int64_t& pushed : clocks) pushed = std::min(pushed, first_pending);
  }
  return clocks;
}

void ClockBook::Restore(std::vector<int64_t> pushed) {
  pushed_ = std::move(pushed);
  pushed_.resize(may_rebase_.size(), 0);
  may_rebase_.assign(may_rebase_.size(), true);
  lost_from_.assign(may_rebase_.size(), 0);
  lost_to_.assign(may_rebase_.size(), 0);
  rounds_.clear();
}

}  // namespace harrier
