#ifndef HARRIER_WORKER_TRANSPORT_TIMER_THREAD_H_
#define HARRIER_WORKER_TRANSPORT_TIMER_THREAD_H_

// One thread that runs closures at given times: the deadlines, grace
// periods and retry backoffs of calls in flight, so none of them holds a
// thread while it waits.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace harrier {

// Thread-safe. Closures run on the timer's own thread, one at a time, in
// time order (equal times in the order they were scheduled), unlocked: a
// closure may schedule more. They must be quick (a closure that blocks
// delays every later one). The destructor runs the closures still
// scheduled at once, in order, then joins the thread; closures scheduled
// after that run on the scheduling thread.
class TimerThread {
 public:
  explicit TimerThread(std::string name);
  ~TimerThread();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  // Runs `run` at `when` (at once if it has passed).
  void At(absl::Time when, std::function<void()> run);
  void After(absl::Duration delay, std::function<void()> run) {
    At(absl::Now() + delay, std::move(run));
  }

 private:
  void Loop();

  const std::string name_;
  absl::Mutex mutex_;
  std::multimap<absl::Time, std::function<void()>> due_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_TIMER_THREAD_H_
