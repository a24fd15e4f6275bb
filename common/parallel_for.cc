#include "common/parallel_for.h"

#include <algorithm>
#include <atomic>

namespace harrier {

// One Run call. It lives on the caller's stack; the caller returns only once
// no pool thread refers to it (helpers == 0, and it is off the queue).
struct ParallelForPool::Job {
  Job(size_t n, absl::FunctionRef<void(size_t)> f) : n_parts(n), fn(f) {}

  const size_t n_parts;
  const absl::FunctionRef<void(size_t)> fn;
  // The next part nobody has claimed yet (may run past n_parts).
  std::atomic<size_t> next{0};
  // Under the pool's mutex_: pool threads still wanted (the job leaves the
  // queue at 0) and pool threads inside RunParts now.
  size_t wanted = 0;
  size_t helpers = 0;
};

ParallelForPool::ParallelForPool(int num_threads) {
  const int helpers = std::max(1, num_threads) - 1;
  threads_.reserve(helpers);
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { Work(); });
}

ParallelForPool::~ParallelForPool() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void ParallelForPool::RunParts(Job* job) {
  for (;;) {
    const size_t part = job->next.fetch_add(1, std::memory_order_relaxed);
    if (part >= job->n_parts) return;
    job->fn(part);
  }
}

void ParallelForPool::Run(size_t n_parts, absl::FunctionRef<void(size_t part)> fn) {
  if (n_parts == 0) return;
  if (n_parts == 1 || threads_.empty()) {
    for (size_t part = 0; part < n_parts; ++part) fn(part);
    return;
  }
  Job job(n_parts, fn);
  {
    absl::MutexLock lock(&mutex_);
    job.wanted = std::min(n_parts - 1, threads_.size());
    queue_.push_back(&job);
  }
  RunParts(&job);
  // Every part is claimed: no pool thread may join any more, and those in
  // it finish the parts they hold (their writes are ours once they leave,
  // through mutex_).
  absl::MutexLock lock(&mutex_);
  if (job.wanted > 0) queue_.erase(std::find(queue_.begin(), queue_.end(), &job));
  ParallelForPool* pool = this;
  Job* self = &job;
  auto helpers_left = [pool, self]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mutex_) {
    (void)pool;  // named by the annotation only
    return self->helpers == 0;
  };
  mutex_.Await(absl::Condition(&helpers_left));
}

void ParallelForPool::RunRanges(
    size_t n, size_t part_size,
    absl::FunctionRef<void(size_t part, size_t begin, size_t end)> fn) {
  part_size = std::max<size_t>(1, part_size);
  const size_t parts = n / part_size + (n % part_size != 0 ? 1 : 0);
  Run(parts, [&](size_t part) {
    const size_t begin = part * part_size;
    fn(part, begin, std::min(n, begin + part_size));
  });
}

void ParallelForPool::Work() {
  Job* job = nullptr;
  ParallelForPool* pool = this;
  auto has_work = [pool]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mutex_) {
    return pool->stopping_ || !pool->queue_.empty();
  };
  for (;;) {
    {
      absl::MutexLock lock(&mutex_);
      // The caller may return as soon as this reaches 0: `job` is not
      // touched after it.
      if (job != nullptr) --job->helpers;
      mutex_.Await(absl::Condition(&has_work));
      if (queue_.empty()) return;  // stopping, and no call waits for help
      job = queue_.front();
      ++job->helpers;
      if (--job->wanted == 0) queue_.pop_front();
    }
    RunParts(job);
  }
}

int ParallelForPool::DefaultThreads() {
  const unsigned hardware = std::thread::hardware_concurrency();
  if (hardware == 0) return 1;
  return static_cast<int>(std::min<unsigned>(hardware, kMaxDefaultThreads));
}

ParallelForPool& ParallelForPool::Default() {
  // Never destroyed: parts may run on it until the process exits, from
  // threads that outlive static destruction.
  static ParallelForPool* const pool = new ParallelForPool(DefaultThreads());
  return *pool;
}

void ParallelFor(size_t n_parts, absl::FunctionRef<void(size_t part)> fn) {
  ParallelForPool::Default().Run(n_parts, fn);
}

void ParallelFor(ParallelForPool* pool, size_t n_parts, absl::FunctionRef<void(size_t part)> fn) {
  (pool != nullptr ? *pool : ParallelForPool::Default()).Run(n_parts, fn);
}

}  // namespace harrier
