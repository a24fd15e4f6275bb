#include "worker/transport/transport.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace harrier {

absl::Status RefuseDeviceChunks(absl::string_view transport,
                                const std::vector<OutgoingChunk>& chunks) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].borrowed_memory != MemoryKind::kDevice) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", transport, " transport cannot send from device memory (chunk ", i, " of '",
        chunks[i].header.key(), "'): stage it through host memory (SendsFromDeviceMemory() is "
        "false)"));
  }
  return absl::OkStatus();
}

absl::Status ShardTransport::PullInto(const proto::PullRequest& request,
                                      const ReplyLandingChooser& /*choose*/,
                                      const LandedChunkSink& sink, absl::Time deadline,
                                      CallCanceller& canceller) {
  return Pull(
      request,
      [&sink](const proto::TensorChunk& header, const PayloadView& payload) {
        return sink(header, payload, MemoryKind::kHost);
      },
      deadline, canceller);
}

absl::Status ShardTransport::PushPullInto(const std::vector<OutgoingChunk>& chunks,
                                          const ReplyLandingChooser& /*choose*/,
                                          const LandedChunkSink& sink, absl::Time deadline,
                                          CallCanceller& canceller) {
  return PushPull(
      chunks,
      [&sink](const proto::TensorChunk& header, const PayloadView& payload) {
        return sink(header, payload, MemoryKind::kHost);
      },
      deadline, canceller);
}

bool CallCanceller::Register(const void* call, std::function<void()> abort) {
  absl::MutexLock lock(&mutex_);
  if (cancelled_) return false;
  calls_.emplace_back(call, std::move(abort));
  return true;
}

void CallCanceller::Unregister(const void* call) {
  absl::MutexLock lock(&mutex_);
  calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                              [call](const auto& entry) { return entry.first == call; }),
               calls_.end());
}

void CallCanceller::CancelAll() {
  // The aborts run under the lock so that none runs after its call has
  // unregistered (the call's objects may be gone by then).
  absl::MutexLock lock(&mutex_);
  cancelled_ = true;
  for (auto& entry : calls_) entry.second();
}

bool CallCanceller::cancelled() const {
  absl::MutexLock lock(&mutex_);
  return cancelled_;
}

bool CallCanceller::SleepUnlessCancelled(absl::Duration duration) const {
  absl::MutexLock lock(&mutex_);
  return mutex_.AwaitWithTimeout(absl::Condition(&cancelled_), duration);
}

}  // namespace harrier
