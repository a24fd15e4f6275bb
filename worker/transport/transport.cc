#include "worker/transport/transport.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"

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

uint32_t ChecksumOf(const OutgoingChunk& chunk) {
  if (!chunk.checksum_pending) return chunk.header.checksum();
  const absl::string_view payload = chunk.payload();
  return Crc32c(payload.data(), payload.size());
}

proto::TensorChunk WireHeader(const OutgoingChunk& chunk) {
  proto::TensorChunk header = chunk.header;
  if (chunk.checksum_pending) header.set_checksum(ChecksumOf(chunk));
  return header;
}

namespace {
thread_local bool caller_waits = false;
}  // namespace

CallerWaitsScope::CallerWaitsScope() : outer_(caller_waits) { caller_waits = true; }
CallerWaitsScope::~CallerWaitsScope() { caller_waits = outer_; }

bool TakeCallerWaits() {
  const bool waits = caller_waits;
  caller_waits = false;
  return waits;
}

absl::Status RunBlocking(const std::function<void(CallDone done)>& start, absl::Time deadline) {
  // Shared with the done, which may (for a transport that overran the
  // grace) run after this returned.
  struct Outcome {
    absl::Notification done;
    absl::Status status;
  };
  auto outcome = std::make_shared<Outcome>();
  CallerWaitsScope caller_waits_here;
  start([outcome](absl::Status status) {
    outcome->status = std::move(status);
    outcome->done.Notify();
  });
  const absl::Time give_up =
      deadline == absl::InfiniteFuture() ? deadline : deadline + kBlockingGrace;
  if (!outcome->done.WaitForNotificationWithDeadline(give_up)) {
    return absl::InternalError(absl::StrCat(
        "the transport did not complete a call ", absl::FormatDuration(kBlockingGrace),
        " after its deadline; its buffers may still be in use"));
  }
  return outcome->status;
}

namespace {

LandedChunkSink HostViews(const ChunkViewSink& sink) {
  return [&sink](const proto::TensorChunk& header, const PayloadView& payload, MemoryKind) {
    return sink(header, payload);
  };
}

}  // namespace

absl::Status PushBlocking(ShardTransport& transport, const std::vector<OutgoingChunk>& chunks,
                          absl::Time deadline, CallCanceller& canceller) {
  return RunBlocking(
      [&](CallDone done) { transport.StartPush(chunks, deadline, canceller, std::move(done)); },
      deadline);
}

absl::Status PullBlocking(ShardTransport& transport, const proto::PullRequest& request,
                          const ChunkViewSink& sink, absl::Time deadline,
                          CallCanceller& canceller) {
  return PullBlocking(transport, request, nullptr, HostViews(sink), deadline, canceller);
}

absl::Status PullBlocking(ShardTransport& transport, const proto::PullRequest& request,
                          const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                          absl::Time deadline, CallCanceller& canceller) {
  return RunBlocking(
      [&](CallDone done) {
        transport.StartPull(request, choose, sink, deadline, canceller, std::move(done));
      },
      deadline);
}

absl::Status PushPullBlocking(ShardTransport& transport, const std::vector<OutgoingChunk>& chunks,
                              const ChunkViewSink& sink, absl::Time deadline,
                              CallCanceller& canceller) {
  return PushPullBlocking(transport, chunks, nullptr, HostViews(sink), deadline, canceller);
}

absl::Status PushPullBlocking(ShardTransport& transport, const std::vector<OutgoingChunk>& chunks,
                              const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                              absl::Time deadline, CallCanceller& canceller) {
  return RunBlocking(
      [&](CallDone done) {
        transport.StartPushPull(chunks, choose, sink, deadline, canceller, std::move(done));
      },
      deadline);
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

}  // namespace harrier
