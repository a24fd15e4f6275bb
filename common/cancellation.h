#ifndef HARRIER_COMMON_CANCELLATION_H_
#define HARRIER_COMMON_CANCELLATION_H_

// A cancellation signal that wakes waiters at once instead of being polled.
// The party that learns of the cancel (a gRPC reactor's OnCancel, a UCX
// kCancel frame, a dead peer, shutdown) calls Cancel(); a blocked wait has
// registered a wake-up (typically: lock its mutex, notify its condition
// variable) that Cancel() runs.

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace harrier {

// Thread-safe. Wake-ups run on the thread that calls Cancel(), without the
// cancellation's lock held (they may call cancelled() and Unregister()).
class Cancellation {
 public:
  using WakeId = uint64_t;

  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Idempotent: the first call runs every registered wake-up once.
  void Cancel();
  bool cancelled() const;

  // Runs `wake` when Cancel() is called, or right away (on this thread) if it
  // already was. The returned id must be unregistered before whatever `wake`
  // touches goes away; Unregister waits for a wake-up that is running.
  WakeId Register(std::function<void()> wake);
  void Unregister(WakeId id);

 private:
  mutable absl::Mutex mutex_;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  WakeId next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  std::map<WakeId, std::function<void()>> wakes_ ABSL_GUARDED_BY(mutex_);
  // Cancel() runs wake-ups outside the lock; Unregister waits for them.
  int running_ ABSL_GUARDED_BY(mutex_) = 0;
};

// Registers a wake-up for the scope's lifetime. `cancellation` may be null
// (nothing can cancel the wait).
class ScopedWake {
 public:
  ScopedWake(Cancellation* cancellation, std::function<void()> wake)
      : cancellation_(cancellation),
        id_(cancellation == nullptr ? 0 : cancellation->Register(std::move(wake))) {}
  ~ScopedWake() {
    if (cancellation_ != nullptr) cancellation_->Unregister(id_);
  }
  ScopedWake(const ScopedWake&) = delete;
  ScopedWake& operator=(const ScopedWake&) = delete;

 private:
  Cancellation* cancellation_;
  Cancellation::WakeId id_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_CANCELLATION_H_
