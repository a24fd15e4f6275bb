#include "worker/transport/transport.h"

#include <algorithm>
#include <string>

namespace harrier {

bool CallCanceller::Register(const void* call, std::function<void()> abort) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancelled_) return false;
  calls_.emplace_back(call, std::move(abort));
  return true;
}

void CallCanceller::Unregister(const void* call) {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                              [call](const auto& entry) { return entry.first == call; }),
               calls_.end());
}

void CallCanceller::CancelAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = true;
  for (auto& entry : calls_) entry.second();
}

bool CallCanceller::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

}  // namespace harrier
