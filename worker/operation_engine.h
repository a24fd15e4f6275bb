#ifndef HARRIER_WORKER_OPERATION_ENGINE_H_
#define HARRIER_WORKER_OPERATION_ENGINE_H_

// Runs the client's async operations: each is a set of tasks (one per shard
// group) that start their transport calls on a small fixed executor and
// end through completion callbacks, so no thread waits per call in flight.
// Calls that fail UNAVAILABLE are retried after a backoff kept on a timer;
// Wait() blocks its caller with a deadline that cancels, WhenDone() hands
// the outcome to a callback instead.

#include <atomic>
#include <cstdint>
#include <deque>
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
#include "worker/timeline.h"
#include "worker/transport/timer_thread.h"
#include "worker/transport/transport.h"

namespace harrier {

enum class OpKind { kPush, kPull, kPushPull };

// An operation's outcome, handed to a WhenDone callback.
using OperationDone = std::function<void(absl::Status status)>;

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

  // Records one task's status; true for the last task. The last one hands
  // the outcome to the WhenDone callback, if one is set, and puts the
  // operation on the timeline, if it has one.
  bool Finish(const absl::Status& task_status);
  // On the timeline, if it has one: the operation from its start to now,
  // with its outcome; gives its lane back.
  void Record(const absl::Status& outcome);
  bool done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return remaining_ == 0; }
  // The outcome once done: DEADLINE_EXCEEDED if a WhenDone deadline
  // cancelled it.
  absl::Status Outcome() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const uint64_t id_;
  const OpKind kind_;
  const std::string description_;
  const std::shared_ptr<std::atomic<int64_t>> live_;
  CallCanceller canceller_;
  absl::Mutex mutex_;
  int remaining_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
  bool waited_ ABSL_GUARDED_BY(mutex_) = false;
  bool expired_ ABSL_GUARDED_BY(mutex_) = false;  // cancelled at its WhenDone deadline
  OperationDone then_ ABSL_GUARDED_BY(mutex_);
  // Set before the operation starts, when it goes on a timeline: from its
  // start to the end of its last task, on a lane of its kind.
  std::shared_ptr<Timeline> timeline_;
  absl::Time started_;
  int lane_ = 0;
};

struct OperationEngineOptions {
  // Threads that start tasks (build and encode their chunks, start their
  // transport calls): a fixed number, whatever the shards and calls in
  // flight, since no thread waits for a call.
  int threads = 4;
  // Tasks in flight at once per class (pushes; pulls and push-pulls, so
  // pulls parked by the consistency model never hold up pushes): each is
  // one shard group's call, with its retries. Tasks beyond wait in their
  // class's queue, and beyond max_queued of those new ones are refused
  // (RESOURCE_EXHAUSTED).
  int max_in_flight = 256;
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
// waits until their tasks have ended; handles may outlive the engine
// (Wait() on them is then not allowed: the Client documents this).
class OperationEngine {
 public:
  // Ends a task with its status; call exactly once, from any thread.
  using TaskDone = std::function<void(absl::Status status)>;
  // One shard group's part of an operation: starts its work (on an
  // executor thread, or the calling thread for RunHere) and returns without
  // waiting for it; `done` ends it.
  using Task = std::function<void(Operation& op, TaskDone done)>;
  // Starts one try of a call; `done` ends the try (a transport's CallDone).
  using Attempt = std::function<void(CallDone done)>;

  explicit OperationEngine(const OperationEngineOptions& options);
  ~OperationEngine();
  OperationEngine(const OperationEngine&) = delete;
  OperationEngine& operator=(const OperationEngine&) = delete;

  // Starts `tasks` on the executor. A task the executor refuses finishes
  // the operation with RESOURCE_EXHAUSTED naming it. With on_timeline
  // false the operation is left off the timeline (its caller records it).
  OperationHandle Start(OpKind kind, std::string description, std::vector<Task> tasks,
                        bool on_timeline = true);
  // An operation that finished before it started (a bad argument, say).
  OperationHandle Failed(OpKind kind, std::string description, absl::Status status);
  // The blocking form of a one-task operation, started on the calling
  // thread: a thread hand-off fewer, which is much of a small operation's
  // cost.
  absl::Status RunHere(OpKind kind, std::string description, const Task& task);

  // Waits for the operation and consumes it. At `deadline` it is cancelled:
  // DEADLINE_EXCEEDED once its tasks have ended (its buffers are no longer
  // touched), or INTERNAL naming it if they are still running
  // cancel_grace later (a transport ignoring cancellation: the buffers may
  // still be in use). NOT_FOUND for a default or already-waited handle.
  absl::Status Wait(const OperationHandle& handle, absl::Time deadline);
  // Consumes the operation as Wait does, handing its outcome to `done`
  // instead: at once (on this thread) if it has finished, else on the
  // thread that ends its last task (a transport or timer thread: `done`
  // must be quick and must not block). At `deadline` the operation is
  // cancelled, and `done` gets DEADLINE_EXCEEDED once its tasks have ended.
  void WhenDone(const OperationHandle& handle, absl::Time deadline, OperationDone done);

  // Runs `attempt` until a try succeeds, fails with anything but
  // UNAVAILABLE, the operation is cancelled, or retry_timeout has passed;
  // then `done` gets the last try's status. The backoff between tries is
  // kept on the engine's timer (cut short by a cancel), and each retry
  // starts on the executor.
  void WithRetries(CallCanceller& canceller, Attempt attempt, CallDone done);

  // Operations started from now on go on `timeline` (null: none): each
  // from its start to its end on a lane of its kind, and each Wait that
  // blocks on a row of the waits. Operations hold the timeline until they
  // end.
  void SetTimeline(std::shared_ptr<Timeline> timeline);
  // The timeline operations go on now; null: none.
  std::shared_ptr<Timeline> timeline() const;

  // Time callers spent waiting: on pushes, and on pulls and push-pulls.
  absl::Duration push_wait() const;
  absl::Duration pull_wait() const;
  // Operations alive now (held by a handle or a running task), for tests.
  int64_t live_operations() const { return live_->load(); }

 private:
  struct Retry;
  // With on_timeline and a timeline, the operation takes a lane on it and
  // must end through Finish (or RunHere's own record) to give it back.
  std::shared_ptr<Operation> NewOperation(OpKind kind, std::string description, bool on_timeline);
  void AddWait(OpKind kind, absl::Duration waited);
  // Runs a task admitted to its class (started on the executor).
  void Launch(const std::shared_ptr<Operation>& op, int lane, Task task);
  // Ends one task of `op` (tracked by running_) and admits the next one
  // waiting in its class.
  void TaskEnded(const std::shared_ptr<Operation>& op, int lane, const absl::Status& status);
  void TryAgain(const std::shared_ptr<Retry>& retry);

  const OperationEngineOptions options_;
  const std::shared_ptr<std::atomic<int64_t>> live_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> push_wait_ns_{0};
  std::atomic<int64_t> pull_wait_ns_{0};

  mutable absl::Mutex mutex_;
  std::shared_ptr<Timeline> timeline_ ABSL_GUARDED_BY(mutex_);
  int wait_track_ ABSL_GUARDED_BY(mutex_) = 0;
  // Operations with tasks still running, so the destructor can cancel them
  // and wait for them.
  absl::flat_hash_map<const Operation*, std::weak_ptr<Operation>> running_ ABSL_GUARDED_BY(mutex_);
  // Per class (0: pushes, 1: pulls and push-pulls): tasks in flight, and
  // those waiting for a place.
  struct Waiting {
    std::shared_ptr<Operation> op;
    Task task;
  };
  int in_flight_[2] ABSL_GUARDED_BY(mutex_) = {0, 0};
  std::deque<Waiting> waiting_[2] ABSL_GUARDED_BY(mutex_);

  // Last: destroyed first (the destructor has ended every task by then).
  TimerThread timer_{"harrier-retries"};
  ThreadPool executor_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_OPERATION_ENGINE_H_
