#include "server/table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace harrier {

absl::Status PullWaitExpired(const PullQuery& query, const PullVerdict& verdict) {
  return absl::DeadlineExceededError(absl::StrCat(
      "pull of key '", query.ref->key(), "' chunk ", query.ref->chunk(), " at clock ", query.clock,
      " by rank ", query.rank, " waited for min clock >= ", verdict.required_min_clock,
      "; slowest worker is rank ", verdict.slowest_rank, " at clock ", verdict.min_clock));
}

absl::Status ParamBudget::Reserve(absl::string_view where, uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  if (chunks_ >= max_chunks_) {
    return absl::ResourceExhaustedError(absl::StrCat(where, ": shard ", shard_, " holds ", chunks_,
                                                     " chunks already (--max_chunks)"));
  }
  if (bytes_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": shard ", shard_, " holds ", bytes_, " parameter bytes; ", bytes,
                     " more would pass ", max_bytes_, " (--max_param_bytes)"));
  }
  chunks_++;
  bytes_ += bytes;
  return absl::OkStatus();
}

void ParamBudget::Add(uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  chunks_++;
  bytes_ += bytes;
}

absl::Status ParamBudget::ReserveBytes(absl::string_view where, uint64_t bytes) {
  return ReserveBytes([where] { return std::string(where); }, bytes);
}

absl::Status ParamBudget::ReserveBytes(absl::FunctionRef<std::string()> where, uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  if (bytes_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where(), ": shard ", shard_, " holds ", bytes_, " parameter bytes; ", bytes,
                     " more would pass ", max_bytes_, " (--max_param_bytes)"));
  }
  bytes_ += bytes;
  return absl::OkStatus();
}

void ParamBudget::AddBytes(uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  bytes_ += bytes;
}

void ParamBudget::ReleaseBytes(uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  bytes_ -= std::min(bytes, bytes_);
}

void ParamBudget::Release(uint64_t chunks, uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  chunks_ -= std::min(chunks, chunks_);
  bytes_ -= std::min(bytes, bytes_);
}

HeldBudgetBytes::HeldBudgetBytes(HeldBudgetBytes&& other) noexcept
    : budget_(other.budget_), bytes_(other.bytes_) {
  other.bytes_ = 0;
}

HeldBudgetBytes& HeldBudgetBytes::operator=(HeldBudgetBytes&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = other.budget_;
    bytes_ = other.bytes_;
    other.bytes_ = 0;
  }
  return *this;
}

absl::Status HeldBudgetBytes::Resize(ParamBudget* budget, absl::FunctionRef<std::string()> where,
                                     uint64_t bytes) {
  if (budget == nullptr) return absl::OkStatus();
  budget_ = budget;
  if (bytes > bytes_) {
    if (absl::Status reserved = budget_->ReserveBytes(where, bytes - bytes_); !reserved.ok()) {
      return reserved;
    }
  } else if (bytes < bytes_) {
    budget_->ReleaseBytes(bytes_ - bytes);
  }
  bytes_ = bytes;
  return absl::OkStatus();
}

void HeldBudgetBytes::Absorb(HeldBudgetBytes&& other) {
  if (other.bytes_ == 0) return;
  if (bytes_ == 0) budget_ = other.budget_;
  bytes_ += other.bytes_;
  other.bytes_ = 0;
}

void HeldBudgetBytes::Reset() {
  if (budget_ != nullptr && bytes_ > 0) budget_->ReleaseBytes(bytes_);
  bytes_ = 0;
}

uint64_t ParamBudget::chunks() const {
  absl::MutexLock lock(&mutex_);
  return chunks_;
}

uint64_t ParamBudget::bytes() const {
  absl::MutexLock lock(&mutex_);
  return bytes_;
}

}  // namespace harrier
