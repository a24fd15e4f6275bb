#include "server/membership.h"

#include "absl/strings/str_cat.h"

namespace harrier {

Membership::Membership(int num_workers)
    : num_workers_(num_workers),
      departed_(new std::atomic<bool>[num_workers]),
      active_(num_workers),
      last_seen_(num_workers),
      seen_(num_workers, false),
      joined_(num_workers, false),
      ever_seen_(num_workers, false),
      released_(num_workers, false),
      lost_(num_workers, false) {
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
  // After the exchange: a Join racing with this sees departed_ under the
  // lock, or joined before it and is undone here.
  absl::MutexLock lock(&mutex_);
  UnjoinLocked(rank);
  return true;
}

void Membership::JoinLocked(uint32_t rank) {
  if (joined_[rank] || departed_[rank]) return;
  joined_[rank] = true;
  present_++;
}

void Membership::UnjoinLocked(uint32_t rank) {
  if (!joined_[rank]) return;
  joined_[rank] = false;
  present_--;
}

void Membership::Join(uint32_t rank) {
  absl::MutexLock lock(&mutex_);
  JoinLocked(rank);
}

void Membership::Heard(uint32_t rank) {
  absl::MutexLock lock(&mutex_);
  last_seen_[rank] = Clock::now();
  seen_[rank] = true;
  ever_seen_[rank] = true;
  released_[rank] = false;
  lost_[rank] = false;
  JoinLocked(rank);
}

void Membership::Release(uint32_t rank) {
  absl::MutexLock lock(&mutex_);
  released_[rank] = true;
  UnjoinLocked(rank);
}

bool Membership::RunDone(std::chrono::milliseconds timeout) const {
  absl::MutexLock lock(&mutex_);
  const auto now = Clock::now();
  for (int r = 0; r < num_workers_; ++r) {
    if (lost_[r]) continue;
    if (departed_[r] && (released_[r] || now - last_seen_[r] > timeout)) continue;
    return false;
  }
  return true;
}

std::vector<uint32_t> Membership::LiveRanks(std::chrono::milliseconds timeout) const {
  std::vector<uint32_t> live;
  absl::MutexLock lock(&mutex_);
  const auto now = Clock::now();
  for (int r = 0; r < num_workers_; ++r) {
    if (joined_[r] && ever_seen_[r] && now - last_seen_[r] <= timeout) {
      live.push_back(static_cast<uint32_t>(r));
    }
  }
  return live;
}

void Membership::Reset() {
  absl::MutexLock lock(&mutex_);
  for (int r = 0; r < num_workers_; ++r) {
    departed_[r] = false;
    last_seen_[r] = Clock::time_point();
    seen_[r] = ever_seen_[r] = joined_[r] = released_[r] = lost_[r] = false;
  }
  active_ = num_workers_;
  present_ = 0;
  failure_ = absl::OkStatus();
  failed_ = false;
}

Membership::RankView Membership::view(uint32_t rank) const {
  absl::MutexLock lock(&mutex_);
  RankView view;
  view.joined = joined_[rank];
  view.departed = departed_[rank];
  view.released = released_[rank];
  view.lost = lost_[rank];
  view.heard = ever_seen_[rank];
  view.last_heard = last_seen_[rank];
  return view;
}

std::vector<uint32_t> Membership::FindLost(std::chrono::milliseconds timeout,
                                           WorkerLossPolicy policy, std::vector<Lost>* details) {
  std::vector<uint32_t> lost;
  absl::MutexLock lock(&mutex_);
  const auto now = Clock::now();
  for (int r = 0; r < num_workers_; ++r) {
    if (!seen_[r] || departed_[r] || now - last_seen_[r] <= timeout) continue;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_seen_[r]);
    lost.push_back(static_cast<uint32_t>(r));
    if (details != nullptr) details->push_back({static_cast<uint32_t>(r), silent});
    if (policy == WorkerLossPolicy::kFail && !failed_) {
      failure_ = absl::AbortedError(absl::StrCat("worker rank ", r, " lost: no heartbeat for ",
                                                 silent.count(), " ms (--on_worker_loss=fail)"));
      failed_ = true;
    }
    seen_[r] = false;  // reported once
    lost_[r] = true;
    UnjoinLocked(static_cast<uint32_t>(r));
  }
  return lost;
}

absl::Status Membership::failure() const {
  if (!failed_) return absl::OkStatus();
  absl::MutexLock lock(&mutex_);
  return failure_;
}

}  // namespace harrier
