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
  absl::MutexLock lock(&mutex_);
  if (bytes_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": shard ", shard_, " holds ", bytes_, " parameter bytes; ", bytes,
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

uint64_t ParamBudget::chunks() const {
  absl::MutexLock lock(&mutex_);
  return chunks_;
}

uint64_t ParamBudget::bytes() const {
  absl::MutexLock lock(&mutex_);
  return bytes_;
}

}  // namespace harrier
