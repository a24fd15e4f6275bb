#include "worker/transport/timer_thread.h"

#include <pthread.h>

#include <vector>

#include "absl/time/clock.h"

namespace harrier {

TimerThread::TimerThread(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
    Loop();
  });
}

TimerThread::~TimerThread() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  thread_.join();
}

void TimerThread::At(absl::Time when, std::function<void()> run) {
  {
    absl::MutexLock lock(&mutex_);
    if (!stopping_) {
      due_.emplace(when, std::move(run));
      return;
    }
  }
  run();  // stopped: nothing will run it later
}

void TimerThread::Loop() {
  absl::MutexLock lock(&mutex_);
  for (;;) {
    const absl::Time wake = due_.empty() ? absl::InfiniteFuture() : due_.begin()->first;
    auto next_due = [this, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return stopping_ ||
             (!due_.empty() && (due_.begin()->first <= absl::Now() || due_.begin()->first < wake));
    };
    // Woken at the earliest entry's time, or by a new earlier entry or a
    // stop: then it looks again.
    mutex_.AwaitWithDeadline(absl::Condition(&next_due), wake);
    if (stopping_ && due_.empty()) return;
    std::vector<std::function<void()>> run;
    const absl::Time now = absl::Now();
    while (!due_.empty() && (stopping_ || due_.begin()->first <= now)) {
      run.push_back(std::move(due_.begin()->second));
      due_.erase(due_.begin());
    }
    if (run.empty()) continue;
    mutex_.Unlock();
    for (auto& closure : run) closure();
    mutex_.Lock();
  }
}

}  // namespace harrier
