#ifndef HARRIER_WORKER_OPERATION_ENGINE_H_
#define HARRIER_WORKER_OPERATION_ENGINE_H_

// Runs the client's async operations: each is a set of tasks (one per shard
// group) on a bounded pool (pushes on one, pulls and push-pulls on the
// other, so pulls blocked by the consistency model never delay pushes),
// with retries on UNAVAILABLE and Wait() with a deadline that cancels.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "worker/operation_handle.h"
#include "worker/transport/transport.h"

namespace harrier {

enum class OpKind { kPush, kPull, kPushPull };

// One async operation: it owns its outcome (the first task error wins) and
// the canceller its transport calls register with. Thread-safe.
class Operation {
 public:
  Operation(uint64_t id, OpKind kind, std::string description,
            std::shared_ptr<std::atomic<int64_t>> live);
  ~Operation();
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

  uint64_t id() const { return id_; }
  OpKind kind() const { return kind_; }
  // "push of 'w'": names the operation in errors.
  const std::string& description() const { return description_; }
  CallCanceller& canceller() { return canceller_; }

 private:
  friend class OperationEngine;

  // Records one task's status; true for the last task.
  bool Finish(const absl::Status& task_status);
  bool done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return remaining_ == 0; }

  const uint64_t id_;
  const OpKind kind_;
  const std::string description_;
  const std::shared_ptr<std::atomic<int64_t>> live_;
  CallCanceller canceller_;
  absl::Mutex mutex_;
  int remaining_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
  bool waited_ ABSL_GUARDED_BY(mutex_) = false;
};

struct OperationEngineOptions {
  int threads_per_pool = 4;
  // Tasks queued per pool before new ones are refused (RESOURCE_EXHAUSTED).
  size_t max_queued = 4096;
  // A call that fails UNAVAILABLE is retried with exponential backoff
  // (initial_backoff doubling to max_backoff) until this has passed.
  absl::Duration retry_timeout = absl::Seconds(30);
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  // How long Wait() waits for a cancelled operation's tasks to end: at least
  // the longest a single transport call may run (every call has a deadline).
  absl::Duration cancel_grace = absl::Seconds(60);
};

// Thread-safe. The destructor cancels the operations still running and
// waits for the pools to drain; handles may outlive the engine (Wait() on
// them is then not allowed: the Client documents this).
class OperationEngine {
 public:
  // One shard group's part of an operation; runs on a pool thread.
  using Task = std::function<absl::Status(Operation& op)>;

  explicit OperationEngine(const OperationEngineOptions& options);
  ~OperationEngine();
  OperationEngine(const OperationEngine&) = delete;
  OperationEngine& operator=(const OperationEngine&) = delete;

  // Runs `tasks` on the kind's pool. A task the pool refuses finishes the
  // operation with RESOURCE_EXHAUSTED naming it.
  OperationHandle Start(OpKind kind, std::string description, std::vector<Task> tasks);
  // An operation that finished before it started (a bad argument, say).
  OperationHandle Failed(OpKind kind, std::string description, absl::Status status);
  // The blocking form of a one-task operation, on the calling thread: two
  // thread hand-offs fewer, which is most of a small operation's cost.
  absl::Status RunHere(OpKind kind, std::string description, const Task& task);

  // Waits for the operation and consumes it. At `deadline` it is cancelled:
  // DEADLINE_EXCEEDED once its tasks have ended (its buffers are no longer
  // touched), or INTERNAL naming it if they are still running
  // cancel_grace later (a transport ignoring cancellation: the buffers may
  // still be in use). NOT_FOUND for a default or already-waited handle.
  absl::Status Wait(const OperationHandle& handle, absl::Time deadline);

  // Runs `attempt` until it succeeds, fails with anything but UNAVAILABLE,
  // the operation is cancelled, or retry_timeout has passed.
  absl::Status WithRetries(CallCanceller& canceller,
                           const std::function<absl::Status()>& attempt) const;

  // Time callers spent waiting: on pushes, and on pulls and push-pulls.
  absl::Duration push_wait() const;
  absl::Duration pull_wait() const;
  // Operations alive now (held by a handle or a running task), for tests.
  int64_t live_operations() const { return live_->load(); }

 private:
  std::shared_ptr<Operation> NewOperation(OpKind kind, std::string description);
  void AddWait(OpKind kind, absl::Duration waited);
  void Untrack(const Operation* op);

  const OperationEngineOptions options_;
  const std::shared_ptr<std::atomic<int64_t>> live_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> push_wait_ns_{0};
  std::atomic<int64_t> pull_wait_ns_{0};

  absl::Mutex mutex_;
  // Operations with tasks still running, so the destructor can cancel them.
  absl::flat_hash_map<const Operation*, std::weak_ptr<Operation>> running_ ABSL_GUARDED_BY(mutex_);

  // Last: destroyed first, running queued tasks to completion while
  // everything they use is still alive.
  ThreadPool push_pool_;
  ThreadPool pull_pool_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_OPERATION_ENGINE_H_
