#ifndef HARRIER_WORKER_TRANSPORT_FAKE_FAKE_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_FAKE_FAKE_TRANSPORT_H_

// A ShardTransport for unit tests: no process, no socket. It records every
// call (headers, payload copies, deadline) and answers as the test says:
// a responder decides each call's status and replies, the first N calls can
// fail (UNAVAILABLE by default), and calls can be held: their completions
// are stored (no thread waits for them) until the test releases them, all
// at once or one by one in any order, honouring (or, to model a stuck
// backend, ignoring) the call's deadline and its CallCanceller.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/transport/timer_thread.h"
#include "worker/transport/transport.h"

namespace harrier {

class FakeShardTransport : public ShardTransport {
 public:
  enum class CallKind { kPush, kPull, kPushPull };
  struct Call {
    uint64_t id = 0;  // the call's index in calls()
    CallKind kind = CallKind::kPush;
    std::vector<proto::TensorChunk> chunks;  // pushed headers
    std::vector<std::string> payloads;       // copies of the pushed payloads
    proto::PullRequest pull;                 // kPull only
    absl::Time deadline;
    absl::Time started;
  };
  // Decides a call's outcome; for pulls and push-pulls it hands the replies
  // to `sink` (ReplyDense helps). Runs on the thread that completes the
  // call, unlocked.
  using Responder = std::function<absl::Status(const Call& call, const ChunkViewSink* sink)>;

  // The default responder answers OK and replies to every requested (or
  // pushed) chunk with dense values: element i of chunk c is c * 1000 + i.
  // Host memory only, like gRPC: a chunk in device memory is refused with
  // FAILED_PRECONDITION and not recorded (RefuseDeviceChunks).
  FakeShardTransport();
  // Fakes a device with host memory: with traits saying it sends from or
  // receives into device memory, such chunks are sent and kDevice landings
  // used (traits.name is replaced by "fake"). `timer` (null: one of its
  // own) runs held calls' deadlines, cancels and releases: fakes of one
  // client may share one, as real transports do.
  explicit FakeShardTransport(TransportTraits traits, std::shared_ptr<TimerThread> timer = nullptr);
  // Completes the calls still held with DEADLINE_EXCEEDED.
  ~FakeShardTransport() override;

  // A call that is not held completes before Start returns, on the
  // starting thread. A held call (Block) completes on Release (on the fake's
  // timer thread), CompleteHeld (on the calling thread), its canceller's
  // abort or its deadline (the timer thread). Each reply is copied into the
  // landing the chooser names when it fits (a device landing only if
  // ReceivesIntoDeviceMemory()) and the sink sees it there.
  void StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                 CallCanceller& canceller, CallDone done) override;
  void StartPull(const proto::PullRequest& request, const ReplyLandingChooser* choose,
                 const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                 CallDone done) override;
  void StartPushPull(const std::vector<OutgoingChunk>& chunks, const ReplyLandingChooser* choose,
                     const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                     CallDone done) override;

  void SetResponder(Responder responder);
  // The next `n` calls fail with `status` (after being recorded).
  void FailNext(int n, absl::Status status = absl::UnavailableError("fake shard unavailable"));
  // Holds every call from now on, after recording it: its completion is
  // stored until Release() (or CompleteHeld) answers it with the responder.
  void Block();
  void Release();
  // Holds the calls `hold` picks (besides every call while blocked): a shard
  // that answers some calls only later (a BSP pull waiting for a round).
  // It runs under the fake's lock when the call is recorded, so a test may
  // note the call's id there and CompleteHeld it afterwards: it is held by
  // the time anyone else can look. Quick; it must not call into the fake.
  void SetHoldIf(std::function<bool(const Call& call)> hold);
  // With false, a call held from now on ignores its deadline and canceller
  // (a stuck backend); it still ends on Release() or after a minute.
  void set_honour_cancel(bool honour);

  std::vector<Call> calls() const;
  int num_calls() const;
  int cancelled_calls() const;  // held calls ended by their canceller
  int held_calls() const;       // held right now
  // The calls held right now, oldest first.
  std::vector<Call> held() const;
  // True once `n` calls are held at the same time, false after `timeout`.
  bool AwaitHeld(int n, absl::Duration timeout) const;
  // Answers the held call `id` now with the responder and runs its done,
  // on this thread: a test completes held calls in any order. False if no
  // call of that id is held.
  bool CompleteHeld(uint64_t id);

  // Hands one dense reply chunk to `sink`: `header`'s key, chunk and element
  // count, with `values` as payload and its checksum.
  static absl::Status ReplyDense(const ChunkViewSink& sink, const proto::TensorChunk& header,
                                 absl::Span<const float> values);
  // What the default responder does.
  static absl::Status DefaultResponse(const Call& call, const ChunkViewSink* sink);

 private:
  // A call in flight: what completing it needs.
  struct Pending {
    Call call;
    const ReplyLandingChooser* choose = nullptr;
    const LandedChunkSink* sink = nullptr;  // null: a push
    CallCanceller* canceller = nullptr;
    CallDone done;
  };

  void Handle(Call call, const ReplyLandingChooser* choose, const LandedChunkSink* sink,
              CallCanceller& canceller, CallDone done);
  // Runs the responder (replies through the landing) and the done.
  void Answer(const Pending& pending);
  // Removes the held call `id`; null if it is not held.
  std::shared_ptr<Pending> TakeHeld(uint64_t id);
  // Ends the held call `id` with `status` (deadline, cancel), if still held.
  void EndHeld(uint64_t id, absl::Status status, bool cancelled);

  mutable absl::Mutex mutex_;
  Responder responder_ ABSL_GUARDED_BY(mutex_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mutex_);
  int fail_remaining_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status fail_status_ ABSL_GUARDED_BY(mutex_);
  bool blocking_ ABSL_GUARDED_BY(mutex_) = false;
  std::function<bool(const Call& call)> hold_if_ ABSL_GUARDED_BY(mutex_);
  bool honour_cancel_ ABSL_GUARDED_BY(mutex_) = true;
  std::map<uint64_t, std::shared_ptr<Pending>> held_ ABSL_GUARDED_BY(mutex_);
  int cancelled_ ABSL_GUARDED_BY(mutex_) = 0;
  // Runs `run` at `when` on the timer while this fake lives.
  void Later(absl::Time when, std::function<void()> run);

  // Whether the fake still lives: the timer's closures look before they
  // touch it (the timer may be shared and outlive it).
  struct Life {
    absl::Mutex mutex;
    bool alive ABSL_GUARDED_BY(mutex) = true;
  };
  const std::shared_ptr<Life> life_ = std::make_shared<Life>();
  const std::shared_ptr<TimerThread> timer_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_FAKE_FAKE_TRANSPORT_H_
