#include "worker/operation_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace harrier {
namespace {

const char* KindName(OpKind kind) {
  switch (kind) {
    case OpKind::kPush:
      return "push";
    case OpKind::kPull:
      return "pull";
    case OpKind::kPushPull:
      return "push-pull";
  }
  return "call";
}

}  // namespace

uint64_t OperationHandle::id() const { return op_ == nullptr ? 0 : op_->id(); }

Operation::Operation(uint64_t id, OpKind kind, std::string description,
                     std::shared_ptr<std::atomic<int64_t>> live)
    : id_(id), kind_(kind), description_(std::move(description)), live_(std::move(live)) {
  ++*live_;
}

Operation::~Operation() { --*live_; }

absl::Status Operation::Outcome() const {
  if (expired_) {
    return absl::DeadlineExceededError(absl::StrCat(
        "operation ", id_, " (", description_, ") did not finish by its deadline and was cancelled"));
  }
  return status_;
}

bool Operation::Finish(const absl::Status& task_status) {
  OperationDone then;
  absl::Status outcome;
  {
    absl::MutexLock lock(&mutex_);
    if (!task_status.ok() && status_.ok()) status_ = task_status;
    if (--remaining_ > 0) return false;
    then = std::move(then_);
    then_ = nullptr;
    if (then || timeline_ != nullptr) outcome = Outcome();
    // On the timeline before a waiter can wake: a caller that stops the
    // timeline once its Wait returned finds the operation in the file, and
    // a wait never ends before the operation it waited for. (The
    // timeline's lock is a leaf: it is never held while taking this.)
    Record(outcome);
  }
  if (then) then(std::move(outcome));
  return true;
}

void Operation::Record(const absl::Status& outcome) {
  if (timeline_ == nullptr) return;
  const absl::Time ended = absl::Now();
  timeline_->ReleaseLane(lane_);
  Json args{{"operation", id_}};
  if (!outcome.ok()) args["error"] = std::string(outcome.message());
  timeline_->Span(lane_, description_, KindName(kind_), started_, ended, args);
}

// One call's tries: the state the backoff timer and the canceller share.
struct OperationEngine::Retry {
  CallCanceller* canceller = nullptr;
  Attempt attempt;
  CallDone done;
  absl::Time give_up;
  absl::Duration backoff;
  absl::Status last;  // the latest try's status
  // Claimed by whichever ends the current backoff first: its timer or a
  // cancel.
  std::atomic<bool> waiting{false};
};

OperationEngine::OperationEngine(const OperationEngineOptions& options)
    : options_(options),
      live_(std::make_shared<std::atomic<int64_t>>(0)),
      executor_(std::max(1, options.threads), ThreadPool::kUnbounded, "the client's executor") {}

OperationEngine::~OperationEngine() {
  // Cancel whatever is still in flight, then wait for its tasks to end:
  // the transports and buffers they use go after the engine.
  std::vector<std::shared_ptr<Operation>> running;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& entry : running_) {
      if (auto op = entry.second.lock()) running.push_back(std::move(op));
    }
  }
  for (auto& op : running) op->canceller().CancelAll();
  running.clear();
  absl::MutexLock lock(&mutex_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return running_.empty(); };
  mutex_.Await(absl::Condition(&ended));
}

std::shared_ptr<Operation> OperationEngine::NewOperation(OpKind kind, std::string description,
                                                         bool on_timeline) {
  auto op = std::make_shared<Operation>(next_id_++, kind, std::move(description), live_);
  if (on_timeline) {
    if (std::shared_ptr<Timeline> timeline = this->timeline(); timeline != nullptr) {
      op->started_ = absl::Now();
      op->lane_ = timeline->TakeLane(KindName(kind));
      op->timeline_ = std::move(timeline);
    }
  }
  return op;
}

void OperationEngine::SetTimeline(std::shared_ptr<Timeline> timeline) {
  int track = 0;
  if (timeline != nullptr) track = timeline->Track("waits");
  absl::MutexLock lock(&mutex_);
  timeline_ = std::move(timeline);
  wait_track_ = track;
}

std::shared_ptr<Timeline> OperationEngine::timeline() const {
  absl::MutexLock lock(&mutex_);
  return timeline_;
}

OperationHandle OperationEngine::Failed(OpKind kind, std::string description, absl::Status status) {
  auto op = NewOperation(kind, std::move(description), /*on_timeline=*/false);
  absl::MutexLock lock(&op->mutex_);
  op->status_ = std::move(status);
  return OperationHandle(std::move(op));
}

void OperationEngine::Launch(const std::shared_ptr<Operation>& op, int lane, Task task) {
  // The task's done holds the operation, not the engine's registry: an
  // operation nobody waits for is freed when its last task ends. (The
  // executor's queue is unbounded: admission bounds it.)
  executor_
      .Submit([this, op, lane, task = std::move(task)] {
        task(*op, [this, op, lane](absl::Status status) { TaskEnded(op, lane, status); });
      })
      .IgnoreError();
}

void OperationEngine::TaskEnded(const std::shared_ptr<Operation>& op, int lane,
                                const absl::Status& status) {
  const bool last = op->Finish(status);
  Waiting next;
  {
    absl::MutexLock lock(&mutex_);
    if (last) running_.erase(op.get());
    if (lane < 0) return;  // never admitted
    if (waiting_[lane].empty()) {
      --in_flight_[lane];
      return;
    }
    next = std::move(waiting_[lane].front());
    waiting_[lane].pop_front();
  }
  Launch(next.op, lane, std::move(next.task));
}

OperationHandle OperationEngine::Start(OpKind kind, std::string description,
                                       std::vector<Task> tasks, bool on_timeline) {
  auto op = NewOperation(kind, std::move(description), on_timeline && !tasks.empty());
  if (tasks.empty()) return OperationHandle(std::move(op));
  {
    absl::MutexLock lock(&op->mutex_);
    op->remaining_ = static_cast<int>(tasks.size());
  }
  {
    absl::MutexLock lock(&mutex_);
    running_[op.get()] = op;
  }
  const int lane = kind == OpKind::kPush ? 0 : 1;
  for (Task& task : tasks) {
    enum { kLaunch, kQueued, kRefused } admitted = kLaunch;
    {
      absl::MutexLock lock(&mutex_);
      if (in_flight_[lane] < std::max(1, options_.max_in_flight)) {
        ++in_flight_[lane];
      } else if (waiting_[lane].size() < options_.max_queued) {
        waiting_[lane].push_back({op, std::move(task)});
        admitted = kQueued;
      } else {
        admitted = kRefused;
      }
    }
    if (admitted == kLaunch) Launch(op, lane, std::move(task));
    if (admitted == kRefused) {
      TaskEnded(op, -1, absl::ResourceExhaustedError(absl::StrCat(
                            "operation ", op->id(), " (", op->description(),
                            ") not started: ", options_.max_queued, " calls already wait for ",
                            kind == OpKind::kPush ? "the pushes" : "the pulls", " in flight")));
    }
  }
  return OperationHandle(std::move(op));
}

absl::Status OperationEngine::RunHere(OpKind kind, std::string description, const Task& task) {
  auto op = NewOperation(kind, std::move(description), /*on_timeline=*/true);
  const absl::Time start = absl::Now();
  absl::Status status;
  absl::Notification done;
  CallerWaitsScope caller_waits_here;
  task(*op, [&status, &done](absl::Status task_status) {
    status = std::move(task_status);
    done.Notify();
  });
  done.WaitForNotification();
  AddWait(kind, absl::Now() - start);
  op->Record(status);
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
  bool blocked = false;
  {
    absl::MutexLock lock(&op->mutex_);
    if (op->waited_) return not_found();
    op->waited_ = true;
    blocked = !op->done();
    finished = op->mutex_.AwaitWithDeadline(done, deadline);
    if (finished) result = op->status_;
  }
  if (!finished) {
    op->canceller().CancelAll();
    absl::MutexLock lock(&op->mutex_);
    // The tasks end promptly once cancelled (transports abort their calls,
    // retries stop waiting); after that no buffer of this operation is
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
  const absl::Time end = absl::Now();
  AddWait(op->kind(), end - start);
  if (blocked) {
    // The caller's wait, beside the calls it waited for.
    std::shared_ptr<Timeline> timeline;
    int track = 0;
    {
      absl::MutexLock lock(&mutex_);
      timeline = timeline_;
      track = wait_track_;
    }
    if (timeline != nullptr) {
      timeline->Span(track, absl::StrCat("wait for ", op->description()), "wait", start, end,
                     Json{{"operation", op->id()}});
    }
  }
  return result;
}

void OperationEngine::WhenDone(const OperationHandle& handle, absl::Time deadline,
                               OperationDone done) {
  const std::shared_ptr<Operation>& op = handle.op_;
  if (op == nullptr) {
    return done(absl::NotFoundError(absl::StrCat("unknown or already waited handle ", handle.id())));
  }
  absl::Status outcome;
  {
    absl::MutexLock lock(&op->mutex_);
    if (op->waited_) {
      outcome = absl::NotFoundError(absl::StrCat("unknown or already waited handle ", op->id()));
    } else {
      op->waited_ = true;
      if (op->done()) {
        outcome = op->Outcome();
      } else {
        op->then_ = std::move(done);
      }
    }
  }
  if (done) return done(std::move(outcome));  // not handed to the operation
  if (deadline == absl::InfiniteFuture()) return;
  std::weak_ptr<Operation> weak = op;
  timer_.At(deadline, [weak] {
    auto expired = weak.lock();
    if (expired == nullptr) return;
    {
      absl::MutexLock lock(&expired->mutex_);
      if (expired->done()) return;
      expired->expired_ = true;
    }
    expired->canceller().CancelAll();
  });
}

void OperationEngine::WithRetries(CallCanceller& canceller, Attempt attempt, CallDone done) {
  auto retry = std::make_shared<Retry>();
  retry->canceller = &canceller;
  retry->attempt = std::move(attempt);
  retry->done = std::move(done);
  retry->give_up = absl::Now() + options_.retry_timeout;
  retry->backoff = options_.initial_backoff;
  TryAgain(retry);
}

void OperationEngine::TryAgain(const std::shared_ptr<Retry>& retry) {
  // The try's done holds the retry; nothing else does while it runs.
  retry->attempt([this, retry](absl::Status status) {
    if (!absl::IsUnavailable(status) || retry->canceller->cancelled() ||
        absl::Now() + retry->backoff > retry->give_up) {
      CallDone done = std::move(retry->done);
      return done(std::move(status));
    }
    retry->last = std::move(status);
    retry->waiting = true;
    // Whichever comes first ends the backoff: its timer, or a cancel (whose
    // abort runs under the canceller's lock, so it only schedules).
    auto resume = [this, retry] {
      if (!retry->waiting.exchange(false)) return;
      retry->canceller->Unregister(retry.get());
      if (retry->canceller->cancelled()) {
        CallDone done = std::move(retry->done);
        return done(std::move(retry->last));
      }
      retry->backoff = std::min(retry->backoff * 2, options_.max_backoff);
      absl::Status submitted = executor_.Submit([this, retry] { TryAgain(retry); });
      if (!submitted.ok()) {
        CallDone done = std::move(retry->done);
        done(std::move(retry->last));
      }
    };
    if (!retry->canceller->Register(
            retry.get(), [this, resume] { timer_.At(absl::InfinitePast(), resume); })) {
      return resume();  // cancelled meanwhile
    }
    timer_.After(retry->backoff, resume);
  });
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
