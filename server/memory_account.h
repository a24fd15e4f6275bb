#ifndef HARRIER_SERVER_MEMORY_ACCOUNT_H_
#define HARRIER_SERVER_MEMORY_ACCOUNT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/buffer_budget.h"

namespace harrier {

// One bound on one kind of memory the shard holds for its clients: a name
// (what is held), the flag that sets the bound, the bound and what is held
// now. Thread-safe.
class NamedBudget {
 public:
  NamedBudget(std::string name, std::string flag, uint64_t limit_bytes)
      : name_(std::move(name)), flag_(std::move(flag)), limit_bytes_(limit_bytes) {}

  // Reserves `bytes`, or RESOURCE_EXHAUSTED naming the budget and its flag,
  // reserving nothing.
  absl::Status Reserve(uint64_t bytes);
  // Gives back `bytes` (at most what is held).
  void Release(uint64_t bytes);

  const std::string& name() const { return name_; }
  const std::string& flag() const { return flag_; }
  uint64_t limit_bytes() const { return limit_bytes_; }
  uint64_t held_bytes() const;

 private:
  const std::string name_;
  const std::string flag_;
  const uint64_t limit_bytes_;
  mutable absl::Mutex mutex_;
  uint64_t held_ ABSL_GUARDED_BY(mutex_) = 0;
};

struct MemoryAccountOptions {
  // Payload bytes of unfinished push calls (received slices and aligned
  // copies): per connection and in all (BufferBudget).
  uint64_t max_connection_bytes = uint64_t{1} << 30;
  uint64_t max_buffered_bytes = uint64_t{4} << 30;
  // Pulls parked on the consistency model: their requests' chunk lists and
  // the reply chunks they queued before parking (--max_parked_pull_bytes).
  uint64_t max_parked_pull_bytes = uint64_t{256} << 20;
  // AdminService.Probe calls in flight: their payloads and replies
  // (--max_probe_bytes_in_flight).
  uint64_t max_probe_bytes_in_flight = uint64_t{64} << 20;
};

// The shard's one account of the memory its clients make it hold, with a
// named sub-budget per kind; each refuses with RESOURCE_EXHAUSTED naming
// itself and its flag, so a client (and the operator) knows which bound was
// hit. What the gRPC library buffers before a handler runs (unary request
// bodies, messages not yet read) is bounded by the gRPC listener's
// resource quota (--grpc_memory_bytes), not here: gRPC does not say which
// call holds it. Thread-safe.
class MemoryAccount {
 public:
  explicit MemoryAccount(const MemoryAccountOptions& options);

  // Push payloads, per connection and in all.
  BufferBudget& payloads() { return payloads_; }
  const BufferBudget& payloads() const { return payloads_; }
  NamedBudget& parked_pulls() { return parked_pulls_; }
  NamedBudget& probes() { return probes_; }

  // What each budget holds now and its bound, for status and metrics.
  struct Figure {
    std::string name;
    std::string flag;
    uint64_t held_bytes = 0;
    uint64_t limit_bytes = 0;
  };
  std::vector<Figure> Figures() const;

 private:
  const MemoryAccountOptions options_;
  BufferBudget payloads_;
  NamedBudget parked_pulls_;
  NamedBudget probes_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_MEMORY_ACCOUNT_H_
