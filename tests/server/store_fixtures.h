#ifndef HARRIER_TESTS_SERVER_STORE_FIXTURES_H_
#define HARRIER_TESTS_SERVER_STORE_FIXTURES_H_

// Requests for in-process ShardStore tests: a single-shard store owns every
// key, shapes are 1-D and initial values zero.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/crc32c.h"
#include "server/shard_store.h"

namespace harrier {
namespace testing {

inline proto::InitRequest Init(const std::string& key, size_t n) {
  std::vector<float> zeros(n, 0.0f);
  proto::InitRequest request;
  request.set_key(key);
  request.add_shape(n);
  request.set_num_elements(n);
  request.set_dtype(proto::DTYPE_FLOAT32);
  request.set_initial_values(std::string(reinterpret_cast<const char*>(zeros.data()), n * 4));
  request.set_checksum(Crc32c(request.initial_values().data(), n * 4));
  return request;
}

// A dense push of `values` from `rank` for `clock`.
inline proto::TensorChunk Gradient(const std::string& key, uint32_t rank, int64_t clock,
                                   const std::vector<float>& values) {
  proto::TensorChunk chunk;
  chunk.set_key(key);
  chunk.set_rank(rank);
  chunk.set_clock(clock);
  chunk.set_num_elements(values.size());
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.set_payload(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

// SGD with lr 1, so a step subtracts the (averaged) gradient as it is.
// Staleness 1 for ssp, H = `local_steps` for local.
inline std::unique_ptr<ShardStore> MakeStore(const std::string& sync, int workers,
                                             int64_t local_steps = 1) {
  ShardStoreOptions options;
  options.num_workers = workers;
  options.sync = *SyncPolicy::FromFlags(sync, 1, local_steps);
  OptimizerOptions sgd;
  sgd.lr = 1.0f;
  return std::make_unique<ShardStore>(options, *CreateOptimizer(sgd));
}

// The same with --max_param_bytes set: room for that many parameter bytes
// (chunks, compressed pull views, their encoders' state).
inline std::unique_ptr<ShardStore> MakeStoreWithParamBudget(const std::string& sync, int workers,
                                                            uint64_t max_param_bytes) {
  ShardStoreOptions options;
  options.num_workers = workers;
  options.sync = *SyncPolicy::FromFlags(sync, 1, 1);
  options.max_param_bytes = max_param_bytes;
  OptimizerOptions sgd;
  sgd.lr = 1.0f;
  return std::make_unique<ShardStore>(options, *CreateOptimizer(sgd));
}

// A pull that waits as a transport's would, on the store's own parking:
// TryPull, and while the consistency model holds it back, park on its part
// until woken, `deadline` passes (DEADLINE_EXCEEDED naming the slowest
// worker) or `cancellation` (may be null) is cancelled (CANCELLED). The
// payload goes into `out`.
inline absl::Status PullWaiting(ShardStore& store, uint32_t rank, int64_t clock,
                                const proto::ChunkRef& ref, ShardStore::Clock::time_point deadline,
                                Cancellation* cancellation, proto::TensorChunk* out) {
  struct Waiter : PullWaiter {
    absl::Mutex mutex;
    bool woken ABSL_GUARDED_BY(mutex) = false;
    void Wake() override {
      absl::MutexLock lock(&mutex);
      woken = true;
    }
  };
  std::string* payload = out->mutable_payload();
  PullTarget target;
  target.allocate = [payload](size_t bytes) {
    payload->resize(bytes);
    return payload->data();
  };
  const absl::Time until = absl::Now() + absl::FromChrono(deadline - ShardStore::Clock::now());
  for (;;) {
    absl::StatusOr<PullOutcome> outcome = store.TryPull(rank, clock, ref, out, target);
    if (!outcome.ok()) return outcome.status();
    if (outcome->ready) return absl::OkStatus();
    if (cancellation != nullptr && cancellation->cancelled()) {
      return absl::CancelledError(absl::StrCat("pull of key '", ref.key(), "' chunk ", ref.chunk(),
                                               " cancelled by the client"));
    }
    if (ShardStore::Clock::now() >= deadline) {
      return PullWaitExpired(PullQuery{rank, clock, &ref}, outcome->verdict);
    }
    auto waiter = std::make_shared<Waiter>();
    ScopedWake wake(cancellation, [waiter] { waiter->Wake(); });
    if (!store.Park(clock, ref, waiter)) continue;
    {
      absl::MutexLock lock(&waiter->mutex);
      waiter->mutex.AwaitWithDeadline(absl::Condition(&waiter->woken), until);
    }
    store.Unpark(ref, waiter.get());
  }
}

}  // namespace testing
}  // namespace harrier

#endif  // HARRIER_TESTS_SERVER_STORE_FIXTURES_H_
