#include "common/thread_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace harrier {

ThreadPool::ThreadPool(int num_threads, size_t max_queued, std::string name)
    : max_queued_(max_queued), name_(std::move(name)) {
  num_threads = std::max(1, num_threads);
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Run(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  for (auto& thread : threads_) thread.join();
}

absl::Status ThreadPool::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mutex_);
  if (max_queued_ != kUnbounded && tasks_.size() >= max_queued_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, " is full: ", tasks_.size(), " tasks queued behind ", threads_.size(),
        " busy threads; retry later"));
  }
  tasks_.push_back(std::move(task));
  return absl::OkStatus();
}

size_t ThreadPool::queued() const {
  absl::MutexLock lock(&mutex_);
  return tasks_.size();
}

void ThreadPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(
          +[](ThreadPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mutex_) {
            return pool->stopping_ || !pool->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace harrier
