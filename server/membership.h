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
// left (Leave, or lost under kContinue), when each was last heard from, and
// the job's failure once a lost worker failed it. The consistency rule
// (server/consistency.h) reads it; it knows nothing of clocks. Thread-safe;
// departed() and active() are lock-free, for the hot path.
class Membership {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Membership(int num_workers);

  int num_workers() const { return num_workers_; }

  // OK for a rank in [0, num_workers), INVALID_ARGUMENT naming `what`
  // otherwise.
  absl::Status CheckRank(uint32_t rank, absl::string_view what) const;

  bool departed(uint32_t rank) const { return departed_[rank].load(); }
  // Ranks that have not left.
  int active() const { return active_.load(); }

  // The rank leaves for good; false if it already had (idempotent).
  bool Depart(uint32_t rank);

  // The rank is alive now (a heartbeat or a push).
  void Heard(uint32_t rank);

  // Ranks heard from once, not departed, and silent for more than `timeout`,
  // each reported once. Under kFail the first one fails the job (failure()
  // turns ABORTED, naming it); under kContinue the caller makes them leave.
  std::vector<uint32_t> FindLost(std::chrono::milliseconds timeout, WorkerLossPolicy policy);

  // OK, or the status every call gets once a lost worker failed the job.
  absl::Status failure() const;

 private:
  const int num_workers_;
  const std::unique_ptr<std::atomic<bool>[]> departed_;
  std::atomic<int> active_;
  std::atomic<bool> failed_{false};
  mutable absl::Mutex mutex_;
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
  std::vector<Clock::time_point> last_seen_ ABSL_GUARDED_BY(mutex_);
  std::vector<bool> seen_ ABSL_GUARDED_BY(mutex_);  // heard from since last reported lost
};

}  // namespace harrier

#endif  // HARRIER_SERVER_MEMBERSHIP_H_
