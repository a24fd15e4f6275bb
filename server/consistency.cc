#include "server/consistency.h"

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

ConsistencyController::ConsistencyController(SyncPolicy policy, int num_workers)
    : policy_(policy), num_workers_(num_workers) {}

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

}  // namespace harrier
