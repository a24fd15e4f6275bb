#ifndef HARRIER_SERVER_BUFFER_BUDGET_H_
#define HARRIER_SERVER_BUFFER_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace harrier {

// Bounds the payload bytes a shard holds for calls it has not validated
// yet: per connection (--max_connection_bytes), so one client cannot fill
// the shard through many unfinished calls on one connection, and in all
// (--max_buffered_bytes), so many connections cannot either. A transport
// reserves each payload as it arrives, before keeping it, and releases what
// it reserved when the call's buffers are freed. --max_request_bytes
// bounds one call the same way (ShardService::CheckRequestBytes).
// Thread-safe.
class BufferBudget {
 public:
  BufferBudget(uint64_t max_connection_bytes, uint64_t max_buffered_bytes)
      : max_connection_bytes_(max_connection_bytes), max_buffered_bytes_(max_buffered_bytes) {}

  // Reserves `bytes` for `connection` (a transport's name for it, e.g. the
  // gRPC peer "ipv4:10.0.0.7:41234"), or RESOURCE_EXHAUSTED naming the
  // bound, reserving nothing.
  absl::Status Reserve(absl::string_view connection, uint64_t bytes);
  // Gives back `bytes` reserved for `connection` (at most what it holds).
  void Release(absl::string_view connection, uint64_t bytes);

  uint64_t buffered() const;
  uint64_t buffered(absl::string_view connection) const;

 private:
  const uint64_t max_connection_bytes_;
  const uint64_t max_buffered_bytes_;
  mutable absl::Mutex mutex_;
  uint64_t buffered_ ABSL_GUARDED_BY(mutex_) = 0;
  // Connections holding bytes now; a connection's entry goes when it
  // holds none, so the map stays as large as the calls in flight.
  absl::flat_hash_map<std::string, uint64_t> by_connection_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_SERVER_BUFFER_BUDGET_H_
