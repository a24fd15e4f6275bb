#include "server/buffer_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace harrier {

absl::Status BufferBudget::Reserve(absl::string_view connection, uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  auto it = by_connection_.find(connection);
  const uint64_t held = it == by_connection_.end() ? 0 : it->second;
  if (bytes > max_connection_bytes_ || held > max_connection_bytes_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this connection's unfinished calls would hold more than ", max_connection_bytes_,
        " payload bytes (--max_connection_bytes); wait for calls to finish or raise the bound"));
  }
  if (bytes > max_buffered_bytes_ || buffered_ > max_buffered_bytes_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the shard's unfinished calls would hold more than ", max_buffered_bytes_,
        " payload bytes (--max_buffered_bytes); retry later or raise the bound"));
  }
  if (bytes == 0) return absl::OkStatus();
  if (it == by_connection_.end()) {
    by_connection_.emplace(std::string(connection), bytes);
  } else {
    it->second += bytes;
  }
  buffered_ += bytes;
  return absl::OkStatus();
}

void BufferBudget::Release(absl::string_view connection, uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  auto it = by_connection_.find(connection);
  if (it == by_connection_.end()) return;
  const uint64_t released = std::min(bytes, it->second);
  it->second -= released;
  buffered_ -= released;
  if (it->second == 0) by_connection_.erase(it);
}

uint64_t BufferBudget::buffered() const {
  absl::MutexLock lock(&mutex_);
  return buffered_;
}

uint64_t BufferBudget::buffered(absl::string_view connection) const {
  absl::MutexLock lock(&mutex_);
  auto it = by_connection_.find(connection);
  return it == by_connection_.end() ? 0 : it->second;
}

}  // namespace harrier
