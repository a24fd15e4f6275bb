#ifndef HARRIER_SERVER_CONSISTENCY_H_
#define HARRIER_SERVER_CONSISTENCY_H_

// The consistency rule (BSP, SSP, ASP, local SGD), in one place: when a
// push may be applied, how (now with a scale, or held for a round that is
// applied as one averaged step), when a round is complete, and when a pull
// may be answered. A round's gradient sum lives with the round in the
// clock book (one per-clock map). Tables keep the values and the locks and
// do what a ClockBook tells them; they apply no rule of their own.

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codec/codec.h"
#include "server/membership.h"
#include "server/optimizer.h"

namespace harrier {

enum class SyncMode { kBsp, kSsp, kAsp, kLocal };

// Worker i's pull at clock t is answered when min over live workers of
// (iterations pushed) >= t - s.
//   BSP:   s = 0; the n pushes of an iteration are averaged into one step.
//   SSP:   finite s >= 1; each push applied on arrival, scaled 1/n.
//   ASP:   no bound; each push applied on arrival, scaled 1/n.
//   Local: a BSP round every H worker steps; pushes are model deltas that
//          the shard averages and subtracts (the delta optimizer).
struct SyncPolicy {
  SyncMode mode = SyncMode::kBsp;
  int64_t staleness = 0;    // -1 = unbounded (ASP)
  int64_t local_steps = 1;  // H, local SGD only

  // Parses --sync/--staleness/--local_steps; InvalidArgument on a bad mix
  // (e.g. ssp with staleness < 1).
  static absl::StatusOr<SyncPolicy> FromFlags(absl::string_view sync, int64_t staleness,
                                              int64_t local_steps);
  std::string ToString() const;
};

// The gradient sum (or vote) of a BSP/local round while its clock book waits
// for the round's other ranks. Shared between a book and its staged copies
// (a push call decides on a copy of the book; the sum is only written when
// the call commits), so copying a book never copies a sum.
// Leaves elements uninitialised where std::allocator would zero them: a
// round sum is always written whole (copied or added into) before it is
// read, and zeroing a chunk's buffer first cost a shard a few per cent of
// its CPU.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) {}  // NOLINT: as std::allocator
  template <class U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A round's sum of gradients, element by element.
using SumBuffer = std::vector<float, UninitializedAllocator<float>>;

struct RoundSum {
  bool started = false;
  std::string codec_params;          // every push of a round uses one codec
  SumBuffer sum;
  std::unique_ptr<Aggregator> vote;  // sign codecs: majority vote, never an average

  // The round's step: the vote's result, or the sum divided by
  // `contributors` (AverageInPlace), into `sum`.
  void Finish(int contributors, size_t num_elements);
};

// What a ClockBook says to do with an accepted push's gradient.
struct PushDecision {
  enum class Kind {
    kApplyNow,      // one optimizer step with the gradient times `scale`
    kHoldForRound,  // add it to the sum of round `round`
  };
  // A round (a clock's pushes) that is complete: apply the average of its
  // `contributors` pushes (or their vote) as one step, in clock order.
  struct CompletedRound {
    int64_t clock = 0;
    int contributors = 0;
    std::shared_ptr<RoundSum> sum;  // never null
  };

  Kind kind = Kind::kApplyNow;
  float scale = 1.0f;
  int64_t round = 0;
  // kHoldForRound: the sum of round `round`, which this push adds to.
  std::shared_ptr<RoundSum> held_sum;
  // Rounds this push completed (the held push's own round among them once
  // every live rank is in), oldest first.
  std::vector<CompletedRound> completed;
};

// What a push is, as far as exactly-once goes (ClockBook::ClassifyPush).
enum class PushClass {
  kNew,        // not seen: record it (RecordPush) and apply it
  kDuplicate,  // (rank, clock) already applied or held in a pending round on
               // this slot: acknowledge it, apply nothing
};

// The min clock a pull reply carries once every rank has left.
inline constexpr int64_t kEveryoneLeftClock = std::numeric_limits<int64_t>::max() / 4;

// Whether a pull may be answered now, and what it waits for.
struct PullVerdict {
  bool may_answer = false;
  int64_t min_clock = 0;           // min over live ranks of iterations pushed
  int slowest_rank = 0;            // a rank at min_clock
  int64_t required_min_clock = 0;  // what the pull waits for
  bool everyone_left = false;      // no live rank: min_clock is meaningless
};

class ClockBook;

// The policy of a job. Immutable; shared by every slot of a shard.
class ConsistencyController {
 public:
  // staleness_aware_lr: SSP/ASP divide each push's step by the staleness it
  // arrives with (Zhang et al. 2016): max(1, fastest rank's clock - clock).
  // max_pending_rounds: BSP/local hold a round's sum until its last rank
  // pushes; a push for a clock this many rounds past the slowest live rank is
  // refused, so a runaway rank cannot make a slot hold rounds without limit
  // (a worker that pulls before its next push is never more than 1 ahead).
  static constexpr int64_t kDefaultMaxPendingRounds = 64;
  ConsistencyController(SyncPolicy policy, int num_workers, bool staleness_aware_lr = false,
                        int64_t max_pending_rounds = kDefaultMaxPendingRounds);

  const SyncPolicy& policy() const { return policy_; }
  int num_workers() const { return num_workers_; }
  bool staleness_aware_lr() const { return staleness_aware_lr_; }
  int64_t max_pending_rounds() const { return max_pending_rounds_; }

  // The staleness rule. min_clock is the minimum over live workers of the
  // iterations pushed for the key.
  bool PullMayProceed(int64_t pull_clock, int64_t min_clock) const;
  // The lowest min_clock that lets a pull at `pull_clock` proceed.
  int64_t RequiredMinClock(int64_t pull_clock) const;
  // True when the pushes of one clock are held until every live worker has
  // pushed, then applied as one averaged step (BSP, local SGD).
  bool AggregatesRounds() const;

  // The optimizer the shard steps with: local SGD's pushes are model deltas,
  // so it gets the delta optimizer whatever was configured; other modes get
  // `configured`.
  std::unique_ptr<Optimizer> ShardOptimizer(std::unique_ptr<Optimizer> configured) const;

  // A clock book for one slot (tensor chunk), every rank at clock 0.
  ClockBook NewClockBook() const;

 private:
  SyncPolicy policy_;
  int num_workers_;
  bool staleness_aware_lr_;
  int64_t max_pending_rounds_;
};

// The clock book of one slot: iterations pushed per rank, the rounds that
// are pending, and after a restore which ranks may re-base their clock. Not
// thread-safe: the slot's lock guards it. Membership is read, never changed.
class ClockBook {
 public:
  // Iterations of `rank` applied (or held in a pending round).
  int64_t pushed(uint32_t rank) const { return pushed_[rank]; }
  const std::vector<int64_t>& pushed() const { return pushed_; }

  // The exactly-once rule. A rank pushes the clocks of a slot in order, so
  // every clock below its next clock (pushed(rank)) has been seen: applied,
  // or held in a pending BSP/local round. Such a push is kDuplicate (a retry
  // after a lost reply, a cut connection or a shard restart; the checkpoint
  // keeps pushed(), so the rule survives a restore) unless its clock is one
  // a restore re-based the rank past (below): those were lost with the
  // shard, and answering "applied" would be false.
  // kNew: the rank's next clock; after Restore() its first push on this slot
  // may also be for a later clock (the worker ran on while the shard was
  // down); the pending-rounds bound waits until every live rank has made
  // that first push.
  // FAILED_PRECONDITION saying why otherwise: a negative clock, a clock from
  // the future, too many rounds ahead of the slowest live rank, or a clock
  // lost with a restart.
  absl::StatusOr<PushClass> ClassifyPush(uint32_t rank, int64_t clock,
                                         const Membership& membership) const;

  // May `rank` push for `clock` now, i.e. is it kNew? OK, or
  // FAILED_PRECONDITION (a duplicate says "already pushed").
  absl::Status CheckPush(uint32_t rank, int64_t clock, const Membership& membership) const;

  // Records a kNew push (CheckPush accepted it) and says what to do with it.
  PushDecision RecordPush(uint32_t rank, int64_t clock, const Membership& membership);

  // `rank` left the job: from now on this slot's rounds and pulls stop
  // waiting for it. Returns the rounds that completed, oldest first, removed
  // from the book. The store calls it under the slot's lock for every slot,
  // after Membership::Depart: a rank counts as gone on a slot only once its
  // rounds there are settled, so no pull sees it gone before the rounds
  // that waited for it are applied. Idempotent.
  std::vector<PushDecision::CompletedRound> Depart(uint32_t rank);

  // True while round `clock` has pushes held.
  bool RoundPending(int64_t clock) const { return rounds_.count(clock) != 0; }
  // The sum of pending round `clock`; null if none is pending.
  const RoundSum* PendingSum(int64_t clock) const;

  PullVerdict CheckPull(int64_t pull_clock) const;

  // The per-rank clocks a checkpoint keeps: pushes held in an incomplete
  // round are not in the checkpoint, so their ranks are rolled back to it
  // (a restored shard waits for that round again).
  std::vector<int64_t> CheckpointClocks() const;

  // Loads a checkpoint's clocks; every rank may re-base once on this slot.
  void Restore(std::vector<int64_t> pushed);

  // The worker says its next push clock on this slot is `next_clock` (a
  // heartbeat: one past the last clock the shard acknowledged). A rank
  // still to re-base after a restore whose book clock is lower is re-based
  // to it now, as its first push would: the pushes in between were
  // acknowledged before the crash and will not come again, and rounds and
  // pulls that wait for them would wait for ever (a worker done with its
  // step here blocks on another shard for a rank that waits here for it).
  // True if it re-based (pulls may proceed now); `completed` gets the
  // rounds that completed, oldest first.
  bool RebaseFromWorker(uint32_t rank, int64_t next_clock,
                        std::vector<PushDecision::CompletedRound>* completed);

  // The largest clock any rank has reached.
  int64_t fastest() const;

 private:
  friend class ConsistencyController;
  struct Round {
    std::vector<bool> from_rank;
    int count = 0;
    std::shared_ptr<RoundSum> sum = std::make_shared<RoundSum>();
  };

  ClockBook(const ConsistencyController* controller, int num_workers);
  bool RoundComplete(int64_t clock, const Round& round) const;
  std::vector<PushDecision::CompletedRound> TakeCompletedRounds();
  // After a restore, until every live rank has pushed once on this slot, the
  // slowest clock in the book is the checkpoint's, not where that worker is:
  // the workers ran on while the shard was down (about 100 rounds per
  // checkpoint interval for the MLP here), so the pending-rounds bound would
  // refuse each worker's first, re-basing push. BSP still holds at most one
  // round per rank meanwhile (its next pull waits for that round).
  bool AwaitingRebase() const;

  const ConsistencyController* controller_;
  std::vector<int64_t> pushed_;
  std::vector<bool> may_rebase_;
  // Per rank, the clocks [from, to) a re-base after Restore() skipped: below
  // the rank's next clock, never applied by this shard (to == from: none).
  std::vector<int64_t> lost_from_;
  std::vector<int64_t> lost_to_;
  std::vector<bool> departed_;  // ranks gone as far as this slot is concerned
  std::map<int64_t, Round> rounds_;  // BSP/local rounds not yet complete
};

}  // namespace harrier

#endif  // HARRIER_SERVER_CONSISTENCY_H_
