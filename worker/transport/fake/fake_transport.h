#ifndef HARRIER_WORKER_TRANSPORT_FAKE_FAKE_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_FAKE_FAKE_TRANSPORT_H_

// A ShardTransport for unit tests: no process, no socket. It records every
// call (headers, payload copies, deadline) and answers as the test says:
// a responder decides each call's status and replies, the first N calls can
// fail (UNAVAILABLE by default), and calls can be held until the test
// releases them, honouring (or, to model a stuck backend, ignoring) the
// call's deadline and its CallCanceller.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/transport/transport.h"

namespace harrier {

class FakeShardTransport : public ShardTransport {
 public:
  enum class CallKind { kPush, kPull, kPushPull };
  struct Call {
    CallKind kind = CallKind::kPush;
    std::vector<proto::TensorChunk> chunks;  // pushed headers
    std::vector<std::string> payloads;       // copies of the pushed payloads
    proto::PullRequest pull;                 // kPull only
    absl::Time deadline;
    absl::Time started;
  };
  // Decides a call's outcome; for pulls and push-pulls it hands the replies
  // to `sink` (ReplyDense helps). Runs on the calling thread, unlocked.
  using Responder = std::function<absl::Status(const Call& call, const ChunkViewSink* sink)>;

  // The default responder answers OK and replies to every requested (or
  // pushed) chunk with dense values: element i of chunk c is c * 1000 + i.
  FakeShardTransport();

  std::string name() const override { return "fake"; }
  // Host memory only, like gRPC: a chunk in device memory is refused with
  // FAILED_PRECONDITION and not recorded (RefuseDeviceChunks), unless a
  // subclass overrides SendsFromDeviceMemory() to fake a device.
  absl::Status Push(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                    CallCanceller& canceller) override;
  absl::Status Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                    absl::Time deadline, CallCanceller& canceller) override;
  absl::Status PushPull(const std::vector<OutgoingChunk>& chunks, const ChunkViewSink& sink,
                        absl::Time deadline, CallCanceller& canceller) override;
  // Each reply is copied into the landing the chooser names when it fits
  // (a device landing only if ReceivesIntoDeviceMemory(): a subclass saying
  // so fakes device memory with host memory) and the sink sees it there.
  absl::Status PullInto(const proto::PullRequest& request, const ReplyLandingChooser& choose,
                        const LandedChunkSink& sink, absl::Time deadline,
                        CallCanceller& canceller) override;
  absl::Status PushPullInto(const std::vector<OutgoingChunk>& chunks,
                            const ReplyLandingChooser& choose, const LandedChunkSink& sink,
                            absl::Time deadline, CallCanceller& canceller) override;

  void SetResponder(Responder responder);
  // The next `n` calls fail with `status` (after being recorded).
  void FailNext(int n, absl::Status status = absl::UnavailableError("fake shard unavailable"));
  // Holds every call from now on, after recording it, until Release().
  void Block();
  void Release();
  // With false, a held call ignores its deadline and canceller (a stuck
  // backend); it still ends on Release() or after a minute.
  void set_honour_cancel(bool honour);

  std::vector<Call> calls() const;
  int num_calls() const;
  int cancelled_calls() const;  // held calls ended by their canceller
  int held_calls() const;       // held right now
  // True once `n` calls are held at the same time, false after `timeout`.
  bool AwaitHeld(int n, absl::Duration timeout) const;

  // Hands one dense reply chunk to `sink`: `header`'s key, chunk and element
  // count, with `values` as payload and its checksum.
  static absl::Status ReplyDense(const ChunkViewSink& sink, const proto::TensorChunk& header,
                                 absl::Span<const float> values);
  // What the default responder does.
  static absl::Status DefaultResponse(const Call& call, const ChunkViewSink* sink);

 private:
  absl::Status Handle(Call call, const ChunkViewSink* sink, CallCanceller& canceller);
  // A sink that lands each reply as PullInto says, then calls `sink`.
  ChunkViewSink Landing(const ReplyLandingChooser& choose, const LandedChunkSink& sink) const;
  // Waits while held; the status a held call ends with (OK once released).
  absl::Status Hold(absl::Time deadline, CallCanceller& canceller);

  mutable absl::Mutex mutex_;
  Responder responder_ ABSL_GUARDED_BY(mutex_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mutex_);
  int fail_remaining_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status fail_status_ ABSL_GUARDED_BY(mutex_);
  bool blocking_ ABSL_GUARDED_BY(mutex_) = false;
  uint64_t release_generation_ ABSL_GUARDED_BY(mutex_) = 0;
  bool honour_cancel_ ABSL_GUARDED_BY(mutex_) = true;
  int held_ ABSL_GUARDED_BY(mutex_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_FAKE_FAKE_TRANSPORT_H_
