#ifndef HARRIER_COMMON_THREAD_POOL_H_
#define HARRIER_COMMON_THREAD_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace harrier {

// A fixed set of threads running submitted tasks in FIFO order. Tasks must
// not block waiting for other tasks of the same pool (no nested waits).
// The destructor runs the queued tasks to completion, then joins.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task);

 private:
  void Run();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_THREAD_POOL_H_
