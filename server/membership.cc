#include "server/membership.h"

#include "absl/strings/str_cat.h"

namespace harrier {

Membership::Membership(int num_workers)
    : num_workers_(num_workers),
      departed_(new std::atomic<bool>[num_workers]),
      active_(num_workers),
      last_seen_(num_workers),
      seen_(num_workers, false) {
  for (int r = 0; r < num_workers; ++r) departed_[r] = false;
}

absl::Status Membership::CheckRank(uint32_t rank, absl::string_view what) const {
  if (rank < static_cast<uint32_t>(num_workers_)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": rank ", rank, " out of range [0, ", num_workers_, ")"));
}

bool Membership::Depart(uint32_t rank) {
  if (departed_[rank].exchange(true)) return false;
  active_--;
  return true;
}

void Membership::Heard(uint32_t rank) {
  absl::MutexLock lock(&mutex_);
  last_seen_[rank] = Clock::now();
  seen_[rank] = true;
}

std::vector<uint32_t> Membership::FindLost(std::chrono::milliseconds timeout,
                                           WorkerLossPolicy policy) {
  std::vector<uint32_t> lost;
  absl::MutexLock lock(&mutex_);
  const auto now = Clock::now();
  for (int r = 0; r < num_workers_; ++r) {
    if (!seen_[r] || departed_[r] || now - last_seen_[r] <= timeout) continue;
    lost.push_back(static_cast<uint32_t>(r));
    if (policy == WorkerLossPolicy::kFail && !failed_) {
      failure_ = absl::AbortedError(absl::StrCat(
          "worker rank ", r, " lost: no heartbeat for ",
          std::chrono::duration_cast<std::chrono::milliseconds>(now - last_seen_[r]).count(),
          " ms (--on_worker_loss=fail)"));
      failed_ = true;
    }
    seen_[r] = false;  // reported once
  }
  return lost;
}

absl::Status Membership::failure() const {
  if (!failed_) return absl::OkStatus();
  absl::MutexLock lock(&mutex_);
  return failure_;
}

}  // namespace harrier
