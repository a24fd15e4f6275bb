#ifndef HARRIER_SERVER_CONSISTENCY_H_
#define HARRIER_SERVER_CONSISTENCY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace harrier {

enum class SyncMode { kBsp, kSsp, kAsp, kLocal };

// The staleness rule of ../shared/DESIGN.md, in one place. Worker i's pull at
// clock t is answered when min over workers of (iterations pushed) >= t - s.
//   BSP:   s = 0; the n pushes of an iteration are averaged into one step.
//   SSP:   finite s >= 1; each push applied on arrival, scaled 1/n.
//   ASP:   no bound; each push applied on arrival, scaled 1/n.
//   Local: a BSP round every H worker steps; pushes are model deltas that
//          the shard averages and subtracts (no server optimizer).
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

// Decides when a pull may be answered and how a push is applied. Pure and
// immutable: every slot of a shard consults the same controller.
class ConsistencyController {
 public:
  ConsistencyController(SyncPolicy policy, int num_workers);

  const SyncPolicy& policy() const { return policy_; }
  int num_workers() const { return num_workers_; }

  // The rule above. min_clock is the minimum over live workers of the
  // iterations pushed for the key.
  bool PullMayProceed(int64_t pull_clock, int64_t min_clock) const;

  // The lowest min_clock that lets a pull at `pull_clock` proceed.
  int64_t RequiredMinClock(int64_t pull_clock) const;

  // True when the pushes of one clock are buffered until every live worker
  // has pushed, then applied as one averaged step (BSP, local SGD).
  bool AggregatesRounds() const;

  // True when pushes are model deltas subtracted as they are, with no
  // server optimizer (local SGD).
  bool PushesAreDeltas() const { return policy_.mode == SyncMode::kLocal; }

 private:
  SyncPolicy policy_;
  int num_workers_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_CONSISTENCY_H_
