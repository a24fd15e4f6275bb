#ifndef HARRIER_SERVER_MEMBERSHIP_H_
#define HARRIER_SERVER_MEMBERSHIP_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace harrier {

// What a shard does when a worker stops heartbeating.
enum class WorkerLossPolicy {
  kFail,      // every later call fails with ABORTED naming the lost rank
  kContinue,  // the rank leaves: dropped from min_clock and from averages
};

// Which ranks of a job are still in it, as one shard sees them: ranks that
// left (Leave, or lost under kContinue), when each was last heard from, which
// are present (joined and neither left nor lost), and the job's failure once
// a lost worker failed it. The consistency rule (server/consistency.h) reads
// it; it knows nothing of clocks. Thread-safe; departed(), active() and
// present() are lock-free, for the hot path and the metrics.
class Membership {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Membership(int num_workers);

  int num_workers() const { return num_workers_; }

  // OK for a rank in [0, num_workers), INVALID_ARGUMENT naming `what`
  // otherwise.
  absl::Status CheckRank(uint32_t rank, absl::string_view what) const;

  bool departed(uint32_t rank) const { return departed_[rank].load(); }
  // Ranks that have not left, joined or not: what averages divide by.
  int active() const { return active_.load(); }
  // Ranks that joined (Join, or heard from) and have neither left nor been
  // lost since: the workers actually in the job now.
  int present() const { return present_.load(); }

  // The rank leaves for good; false if it already had (idempotent).
  bool Depart(uint32_t rank);

  // The rank joined the job (shard 0: it registered). Counts in present()
  // unless it departed. Idempotent.
  void Join(uint32_t rank);

  // The rank is alive now (a heartbeat or a push); it joins if it had not.
  void Heard(uint32_t rank);

  // A rank FindLost reported, and how long it had been silent.
  struct Lost {
    uint32_t rank = 0;
    std::chrono::milliseconds silent{0};
  };

  // Ranks heard from once, not departed, and silent for more than `timeout`,
  // each reported once (and no longer present() until heard again). Under
  // kFail the first one fails the job (failure() turns ABORTED, naming it);
  // under kContinue the caller makes them leave.
  std::vector<uint32_t> FindLost(std::chrono::milliseconds timeout, WorkerLossPolicy policy,
                                 std::vector<Lost>* details = nullptr);

  // OK, or the status every call gets once a lost worker failed the job.
  absl::Status failure() const;

  // The rank's worker exited (it gave its session back: LeaveRequest.release
  // or, on shard 0, Register with release). It is not departed by this: a
  // worker that exits without Leave may be restarted and rejoin, and until
  // then rounds wait for it as for any silent rank. Heard() undoes it.
  void Release(uint32_t rank);

  // Whether the run is over on this shard: every rank is done, that is
  // reported lost (either policy), or departed and either released or
  // silent for more than `timeout` (a worker that left and then died).
  bool RunDone(std::chrono::milliseconds timeout) const;

  // Ranks in the job now (joined, neither departed, released nor lost) and
  // heard from within `timeout`: the workers a run change would cut off.
  std::vector<uint32_t> LiveRanks(std::chrono::milliseconds timeout) const;

  // A new run: every rank as at construction (nobody joined, departed,
  // released or lost; no failure).
  void Reset();

  // One rank as this shard sees it (harrier-ctl status).
  struct RankView {
    bool joined = false;    // counted in present()
    bool departed = false;
    bool released = false;
    bool lost = false;      // reported by FindLost and not heard since
    bool heard = false;     // ever heard from (this run)
    Clock::time_point last_heard;
  };
  RankView view(uint32_t rank) const;

 private:
  const int num_workers_;
  const std::unique_ptr<std::atomic<bool>[]> departed_;
  std::atomic<int> active_;
  std::atomic<int> present_{0};
  std::atomic<bool> failed_{false};
  mutable absl::Mutex mutex_;
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
  std::vector<Clock::time_point> last_seen_ ABSL_GUARDED_BY(mutex_);
  std::vector<bool> seen_ ABSL_GUARDED_BY(mutex_);    // heard from since last reported lost
  std::vector<bool> joined_ ABSL_GUARDED_BY(mutex_);  // counted in present_
  std::vector<bool> ever_seen_ ABSL_GUARDED_BY(mutex_);
  std::vector<bool> released_ ABSL_GUARDED_BY(mutex_);
  std::vector<bool> lost_ ABSL_GUARDED_BY(mutex_);

  void JoinLocked(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void UnjoinLocked(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_SERVER_MEMBERSHIP_H_
