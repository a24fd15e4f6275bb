#ifndef HARRIER_COMMON_PARALLEL_FOR_H_
#define HARRIER_COMMON_PARALLEL_FOR_H_

// The one parallel-for: a loop split into parts that a bounded set of
// threads runs with the calling thread. No thread is started per call.

#include <cstddef>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace harrier {

// A fixed set of threads that help run the parts of parallel loops. The
// thread that calls Run takes parts itself until none is left, and idle
// pool threads join in; it never waits for a free thread, so a call made
// from inside a part (nested) or while every pool thread is busy completes
// (the caller then runs the remaining parts alone). How the parts are split
// is the caller's choice, so results never depend on the thread count when
// each part's result depends only on the part (RunRanges).
//
// Several pools may live in one process: the codecs and the gRPC client
// share Default(); a component that wants its own thread count (the shard
// store's apply, --apply_threads) holds a pool of that size and passes it.
// Thread-safe.
class ParallelForPool {
 public:
  // Default()'s size: the hardware concurrency, capped here.
  static constexpr int kMaxDefaultThreads = 8;

  // `num_threads` threads in all work on one call: the caller and
  // num_threads - 1 pool threads, all started here. 1 (or less) starts
  // none: every call runs its parts on the caller, in part order.
  explicit ParallelForPool(int num_threads);
  // Joins the pool threads. No Run may be in progress.
  ~ParallelForPool();
  ParallelForPool(const ParallelForPool&) = delete;
  ParallelForPool& operator=(const ParallelForPool&) = delete;

  // Calls fn(part) exactly once for every part in [0, n_parts) and returns
  // when every call has returned. The parts run on the caller and on idle
  // pool threads, in no set order: fn must write only what its part owns
  // and must not throw. Memory written by the parts is visible to the
  // caller when Run returns. Any thread, pool threads included.
  void Run(size_t n_parts, absl::FunctionRef<void(size_t part)> fn);

  // Splits [0, n) into ranges of `part_size` elements (the last may be
  // shorter; part_size 0 counts as 1) and calls fn(part, begin, end) once
  // for each, through Run. The split depends only on n and part_size, never
  // on the thread count: per-part results combined in part order give the
  // same bits for every pool size.
  void RunRanges(size_t n, size_t part_size,
                 absl::FunctionRef<void(size_t part, size_t begin, size_t end)> fn);

  // Threads that work on one call, the caller included (>= 1).
  int num_threads() const { return static_cast<int>(threads_.size()) + 1; }

  // The process's shared pool of DefaultThreads() threads, created on first
  // use and never destroyed (it may serve calls until the process exits).
  static ParallelForPool& Default();
  // min(hardware concurrency, kMaxDefaultThreads), at least 1.
  static int DefaultThreads();

 private:
  struct Job;

  // Pool threads: take a queued job, run its parts, repeat until stopped.
  void Work();
  // Runs parts of `job` until none is left unclaimed.
  static void RunParts(Job* job);

  absl::Mutex mutex_;
  // Calls still wanting pool threads, oldest first.
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> threads_;
};

// ParallelForPool::Default().Run(n_parts, fn).
void ParallelFor(size_t n_parts, absl::FunctionRef<void(size_t part)> fn);

// pool->Run(n_parts, fn); Default() when `pool` is null.
void ParallelFor(ParallelForPool* pool, size_t n_parts, absl::FunctionRef<void(size_t part)> fn);

}  // namespace harrier

#endif  // HARRIER_COMMON_PARALLEL_FOR_H_
