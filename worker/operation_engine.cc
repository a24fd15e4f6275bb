#include "worker/operation_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace harrier {

uint64_t OperationHandle::id() const { return op_ == nullptr ? 0 : op_->id(); }

Operation::Operation(uint64_t id, OpKind kind, std::string description,
                     std::shared_ptr<std::atomic<int64_t>> live)
    : id_(id), kind_(kind), description_(std::move(description)), live_(std::move(live)) {
  ++*live_;
}

Operation::~Operation() { --*live_; }

bool Operation::Finish(const absl::Status& task_status) {
  absl::MutexLock lock(&mutex_);
  if (!task_status.ok() && status_.ok()) status_ = task_status;
  return --remaining_ == 0;
}

OperationEngine::OperationEngine(const OperationEngineOptions& options)
    : options_(options),
      live_(std::make_shared<std::atomic<int64_t>>(0)),
      push_pool_(options.threads_per_pool, options.max_queued, "the client's push pool"),
      pull_pool_(options.threads_per_pool, options.max_queued, "the client's pull pool") {}

OperationEngine::~OperationEngine() {
  // Cancel whatever is still in flight so the pools drain quickly.
  std::vector<std::shared_ptr<Operation>> running;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& entry : running_) {
      if (auto op = entry.second.lock()) running.push_back(std::move(op));
    }
  }
  for (auto& op : running) op->canceller().CancelAll();
}

std::shared_ptr<Operation> OperationEngine::NewOperation(OpKind kind, std::string description) {
  return std::make_shared<Operation>(next_id_++, kind, std::move(description), live_);
}

OperationHandle OperationEngine::Failed(OpKind kind, std::string description, absl::Status status) {
  auto op = NewOperation(kind, std::move(description));
  absl::MutexLock lock(&op->mutex_);
  op->status_ = std::move(status);
  return OperationHandle(std::move(op));
}

OperationHandle OperationEngine::Start(OpKind kind, std::string description,
                                       std::vector<Task> tasks) {
  auto op = NewOperation(kind, std::move(description));
  if (tasks.empty()) return OperationHandle(std::move(op));
  {
    absl::MutexLock lock(&op->mutex_);
    op->remaining_ = static_cast<int>(tasks.size());
  }
  {
    absl::MutexLock lock(&mutex_);
    running_[op.get()] = op;
  }
  ThreadPool& pool = kind == OpKind::kPush ? push_pool_ : pull_pool_;
  for (Task& task : tasks) {
    // The task holds the operation, not the engine's registry: an operation
    // nobody waits for is freed when its last task ends.
    absl::Status submitted = pool.Submit([this, op, task = std::move(task)] {
      if (op->Finish(task(*op))) Untrack(op.get());
    });
    if (!submitted.ok()) {
      const absl::Status refused = absl::ResourceExhaustedError(absl::StrCat(
          "operation ", op->id(), " (", op->description(), ") not started: ", submitted.message()));
      if (op->Finish(refused)) Untrack(op.get());
    }
  }
  return OperationHandle(std::move(op));
}

void OperationEngine::Untrack(const Operation* op) {
  absl::MutexLock lock(&mutex_);
  running_.erase(op);
}

absl::Status OperationEngine::RunHere(OpKind kind, std::string description, const Task& task) {
  auto op = NewOperation(kind, std::move(description));
  const absl::Time start = absl::Now();
  absl::Status status = task(*op);
  AddWait(kind, absl::Now() - start);
  return status;
}

absl::Status OperationEngine::Wait(const OperationHandle& handle, absl::Time deadline) {
  Operation* op = handle.op_.get();
  auto not_found = [&] {
    return absl::NotFoundError(absl::StrCat("unknown or already waited handle ", handle.id()));
  };
  if (op == nullptr) return not_found();
  const absl::Time start = absl::Now();
  const absl::Condition done(op, &Operation::done);
  absl::Status result;
  bool finished = false;
  {
    absl::MutexLock lock(&op->mutex_);
    if (op->waited_) return not_found();
    op->waited_ = true;
    finished = op->mutex_.AwaitWithDeadline(done, deadline);
    if (finished) result = op->status_;
  }
  if (!finished) {
    op->canceller().CancelAll();
    absl::MutexLock lock(&op->mutex_);
    // The tasks end promptly once cancelled (transports abort their calls,
    // retries stop sleeping); after that no buffer of this operation is
    // touched again. The grace bounds the wait on a transport that does not.
    if (op->mutex_.AwaitWithTimeout(done, options_.cancel_grace)) {
      result = absl::DeadlineExceededError(
          absl::StrCat("operation ", op->id(), " (", op->description(),
                       ") did not finish by its deadline and was cancelled"));
    } else {
      result = absl::InternalError(absl::StrCat(
          "operation ", op->id(), " (", op->description(),
          ") was cancelled at its deadline "
          "but is still running ",
          absl::FormatDuration(options_.cancel_grace),
          " later: a transport call ignores cancellation, and the operation's buffers may "
          "still be in use"));
    }
  }
  AddWait(op->kind(), absl::Now() - start);
  return result;
}

absl::Status OperationEngine::WithRetries(CallCanceller& canceller,
                                          const std::function<absl::Status()>& attempt) const {
  const absl::Time give_up = absl::Now() + options_.retry_timeout;
  absl::Duration backoff = options_.initial_backoff;
  for (;;) {
    absl::Status status = attempt();
    if (!absl::IsUnavailable(status) || canceller.cancelled() || absl::Now() + backoff > give_up) {
      return status;
    }
    if (canceller.SleepUnlessCancelled(backoff)) return status;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void OperationEngine::AddWait(OpKind kind, absl::Duration waited) {
  (kind == OpKind::kPush ? push_wait_ns_ : pull_wait_ns_) += absl::ToInt64Nanoseconds(waited);
}

absl::Duration OperationEngine::push_wait() const {
  return absl::Nanoseconds(push_wait_ns_.load());
}
absl::Duration OperationEngine::pull_wait() const {
  return absl::Nanoseconds(pull_wait_ns_.load());
}

}  // namespace harrier
