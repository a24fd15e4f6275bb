#ifndef HARRIER_COMMON_THREAD_POOL_H_
#define HARRIER_COMMON_THREAD_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace harrier {

// A fixed set of threads running submitted tasks in FIFO order, with a
// bounded queue: a task submitted while `max_queued` tasks wait is refused
// with RESOURCE_EXHAUSTED (naming the pool) rather than queued without limit.
// Tasks must not block waiting for other tasks of the same pool (no nested
// waits). The destructor runs the queued tasks to completion, then joins.
class ThreadPool {
 public:
  // No bound on the queue: only for pools whose submitters bound themselves.
  static constexpr size_t kUnbounded = 0;

  ThreadPool(int num_threads, size_t max_queued = kUnbounded, std::string name = "thread pool");
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // OK, or RESOURCE_EXHAUSTED when the queue is full (the task is dropped,
  // not run). Thread-safe.
  absl::Status Submit(std::function<void()> task);

  int num_threads() const { return static_cast<int>(threads_.size()); }
  size_t queued() const;

 private:
  void Run();

  const size_t max_queued_;
  const std::string name_;
  mutable absl::Mutex mutex_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_THREAD_POOL_H_
