#include "common/cancellation.h"

#include <utility>
#include <vector>

namespace harrier {

void Cancellation::Cancel() {
  std::vector<std::function<void()>> wakes;
  {
    absl::MutexLock lock(&mutex_);
    if (cancelled_) return;
    cancelled_ = true;
    for (auto& entry : wakes_) wakes.push_back(entry.second);
    ++running_;
  }
  for (auto& wake : wakes) wake();
  absl::MutexLock lock(&mutex_);
  --running_;
}

bool Cancellation::cancelled() const {
  absl::MutexLock lock(&mutex_);
  return cancelled_;
}

Cancellation::WakeId Cancellation::Register(std::function<void()> wake) {
  {
    absl::MutexLock lock(&mutex_);
    if (!cancelled_) {
      const WakeId id = next_id_++;
      wakes_.emplace(id, std::move(wake));
      return id;
    }
  }
  wake();
  return 0;
}

void Cancellation::Unregister(WakeId id) {
  absl::MutexLock lock(&mutex_);
  wakes_.erase(id);
  // A Cancel() in progress may still be running a copy of this wake-up.
  mutex_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
}

}  // namespace harrier
