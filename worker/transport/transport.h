#ifndef HARRIER_WORKER_TRANSPORT_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_TRANSPORT_H_

// The client side of one shard's data path. The client library builds and
// checks the messages (chunking, compression, checksums); a transport only
// moves them. Backends live in sibling folders (grpc/, ucx/) behind this
// header; the control plane (register, barrier) always uses gRPC.
// transport_factory.h builds them, so client code names no backend.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/codec/codec_backend.h"
#include "common/payload_view.h"
#include "proto/harrier.pb.h"

namespace harrier {

// Lets a waiting caller abort calls in flight. A transport registers how to
// abort its call while it runs. Thread-safe. An abort runs under the
// canceller's lock: it only tells its call to end (the call completes
// later, on a transport thread) and never calls into the canceller.
class CallCanceller {
 public:
  // False if already cancelled: the transport must not start the call.
  bool Register(const void* call, std::function<void()> abort);
  void Unregister(const void* call);
  // Runs every registered abort; later Register() calls return false.
  void CancelAll();
  bool cancelled() const;

 private:
  mutable absl::Mutex mutex_;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::pair<const void*, std::function<void()>>> calls_ ABSL_GUARDED_BY(mutex_);
};

// Receives each reply chunk of a pull as its header (ignore its payload
// field: a backend may leave it set) and a view of its payload. Both are
// borrowed and valid only during the call: a sink copies what it keeps.
using ChunkViewSink =
    std::function<absl::Status(const proto::TensorChunk& header, const PayloadView& payload)>;

// Where one reply chunk's payload should land, chosen by the receiver
// before its data arrives. `data == nullptr`: nowhere, the payload arrives
// in a transport buffer.
struct ReplyLanding {
  void* data = nullptr;
  size_t capacity = 0;  // bytes at `data`; a larger payload does not land
  MemoryKind memory = MemoryKind::kHost;
};
// Picks the landing of a reply chunk from its header (ignore its payload
// field) and payload size. Runs on a transport thread while the call is in
// flight (UCX: the progress thread, under the call's lock), possibly
// concurrently with other calls' choosers: quick, thread-safe, and never
// calling into the transport.
using ReplyLandingChooser =
    std::function<ReplyLanding(const proto::TensorChunk& header, size_t bytes)>;
// Receives each reply chunk: `payload` is in the landing buffer that was
// chosen for it (in that landing's memory, kDevice included: then the
// view's bytes are a device address, not readable on the host), or, when it
// did not land (or no chooser was given), a host view of a transport buffer
// (kHost). Runs on a transport thread, one reply at a time per call, before
// the call's done; what it returns other than OK fails the call.
using LandedChunkSink = std::function<absl::Status(
    const proto::TensorChunk& header, const PayloadView& payload, MemoryKind memory)>;

// One chunk to push: header fields plus a payload that is either borrowed
// (dense gradients: a view into the caller's tensor, not copied) or owned
// (compressed payloads, produced by the codec).
//
// Lifetime: a borrowed payload must stay valid and unchanged until the
// transport call that sends it has completed (its done has run). The client
// guarantees this: a push's gradient belongs to the caller until the
// operation's Wait() returns, and every transport call of the operation
// completes first. A transport, in turn, does not complete a call while its
// network stack still reads the bytes: it waits for their release, for a
// bounded time (gRPC: its slices; UCX: its sends, closing the endpoint if
// they stall), and says in its status when the bound passed first (see
// each backend).
struct OutgoingChunk {
  // Payload field empty; checksum covers payload() (see checksum_pending).
  proto::TensorChunk header;
  absl::string_view borrowed;
  std::string owned;
  bool is_borrowed = false;
  // Where `borrowed` lives. kDevice only when the transport said
  // SendsFromDeviceMemory(); owned payloads are always host memory.
  MemoryKind borrowed_memory = MemoryKind::kHost;
  // header.checksum is not set yet: the transport takes the CRC32C of a
  // borrowed host payload as it sends it (ChecksumOf), so that a transport
  // that copies the payload anyway reads the caller's memory once, not
  // twice. Only for borrowed payloads in host memory.
  bool checksum_pending = false;
  // The borrowed host payload is the caller's own staging, written just
  // before the push and left alone until it completes
  // (TensorOptions::staging_buffers): a transport that copies payloads into
  // send buffers of its own sends this one from where it is.
  bool send_in_place = false;

  absl::string_view payload() const { return is_borrowed ? borrowed : absl::string_view(owned); }
};

// CRC32C of the chunk's payload: header.checksum, or computed now when it
// is pending.
uint32_t ChecksumOf(const OutgoingChunk& chunk);

// The chunk's header as it goes on the wire: with the checksum set when it
// was pending.
proto::TensorChunk WireHeader(const OutgoingChunk& chunk);

// For transports that send host memory only: FAILED_PRECONDITION naming
// `transport` and the first chunk whose borrowed payload is in device
// memory, before anything is sent (the bytes are never read: on the host a
// device pointer is not readable). OK if every chunk is in host memory.
absl::Status RefuseDeviceChunks(absl::string_view transport,
                                const std::vector<OutgoingChunk>& chunks);

// What a transport is and can do; fixed when it is built.
struct TransportTraits {
  std::string name;  // "grpc", "ucx" or "fake"
  // Pushes accept borrowed payloads in device memory
  // (OutgoingChunk::borrowed_memory == kDevice): UCX built with CUDA
  // support. Otherwise the client stages device chunks through host memory.
  bool sends_from_device_memory = false;
  // Replies land in device memory when a chooser names a kDevice landing
  // (UCX built with CUDA, rendezvous-sized replies); otherwise a kDevice
  // landing is not used and the sink gets a host view.
  bool receives_into_device_memory = false;
};

// Completes one transport call with its status: OK, the shard's status
// (code and message), or the transport's (UNAVAILABLE for a lost peer,
// DEADLINE_EXCEEDED, CANCELLED). Runs exactly once per started call, on a
// transport thread (gRPC: its completion queue's thread; UCX: its progress or timer
// thread; the fake: the thread that completes the call), possibly before
// Start returns, on the starting thread (a call refused before it is sent,
// or one the fake answers at once): a caller holds no lock `done` takes.
// It must be quick and must not block: hand longer work to an executor.
using CallDone = std::function<void(absl::Status status)>;

// One shard's data path. Calls are asynchronous: a Start method sends the
// call and returns at once; the call completes through its `done`. Nothing
// blocks a thread per call in flight. Thread-safe: calls of many
// operations run at once.
//
// Every call ends by its `deadline` (DEADLINE_EXCEEDED) and as soon as
// `canceller` aborts it (CANCELLED); a call started on a cancelled
// canceller completes with CANCELLED at once. Everything a call borrows
// (the chunks and their payloads, the request, the chooser, the sink, the
// landing buffers, the canceller) must stay valid and unchanged until its
// done has run; the transport touches none of it afterwards.
class ShardTransport {
 public:
  virtual ~ShardTransport() = default;

  const TransportTraits& traits() const { return traits_; }
  const std::string& name() const { return traits_.name; }
  bool SendsFromDeviceMemory() const { return traits_.sends_from_device_memory; }
  bool ReceivesIntoDeviceMemory() const { return traits_.receives_into_device_memory; }
  // The backend the shard's calls take now: its name, unless the path
  // changes backends while it lives (FallbackShardTransport).
  virtual std::string data_path() const { return traits_.name; }

  // Sends `chunks` (payloads from their own bytes, not copied) to be
  // applied at their clock.
  virtual void StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                         CallCanceller& canceller, CallDone done) = 0;
  // Fetches the requested chunks, handing each reply to `sink`. With a
  // chooser (may be null), each reply's payload is received straight into
  // the buffer it names where the backend can (UCX: rendezvous replies into
  // host or, with ReceivesIntoDeviceMemory(), device memory; small eager
  // replies are copied into a host landing, and stay host views for a
  // device one); without one, every payload is a host view of a transport
  // buffer. Checksums are the sink's to check.
  virtual void StartPull(const proto::PullRequest& request, const ReplyLandingChooser* choose,
                         const LandedChunkSink& sink, absl::Time deadline,
                         CallCanceller& canceller, CallDone done) = 0;
  // Push, then receive each pushed chunk's parameters at clock + 1, landed
  // as StartPull lands them.
  virtual void StartPushPull(const std::vector<OutgoingChunk>& chunks,
                             const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                             absl::Time deadline, CallCanceller& canceller, CallDone done) = 0;

 protected:
  explicit ShardTransport(TransportTraits traits) : traits_(std::move(traits)) {}

 private:
  const TransportTraits traits_;
};

// Said by a caller that starts one call and then blocks until it completes
// (RunBlocking, the client's blocking Push, Pull and PushPull): while the
// scope lives, the first call started on this thread may run on it and
// complete before its Start returns. That saves the hand-offs to the
// transport's threads and back, much of a call's cost when it is small;
// gRPC then drives the stream from the calling thread (its synchronous
// API). A transport that does not look keeps completing on its own
// threads; later calls of the scope and calls of other threads are
// ordinary asynchronous calls.
class CallerWaitsScope {
 public:
  CallerWaitsScope();
  ~CallerWaitsScope();
  CallerWaitsScope(const CallerWaitsScope&) = delete;
  CallerWaitsScope& operator=(const CallerWaitsScope&) = delete;

 private:
  const bool outer_;
};
// For a transport's Start: true once per CallerWaitsScope, for the first
// call of its thread that asks.
bool TakeCallerWaits();

// The blocking form of a call, written once: runs `start` with a done that
// wakes this thread, and returns the call's status. A transport completes
// every call by its deadline (plus the bounded waits for its buffers), so
// the wait ends; should a transport not complete the call by `deadline` +
// kBlockingGrace, this returns INTERNAL (the call's buffers may then still
// be in use).
inline constexpr absl::Duration kBlockingGrace = absl::Seconds(30);
absl::Status RunBlocking(const std::function<void(CallDone done)>& start, absl::Time deadline);

// Blocking calls for callers that need them (tools, tests, benches).
absl::Status PushBlocking(ShardTransport& transport, const std::vector<OutgoingChunk>& chunks,
                          absl::Time deadline, CallCanceller& canceller);
// Replies as host views, as StartPull without a chooser.
absl::Status PullBlocking(ShardTransport& transport, const proto::PullRequest& request,
                          const ChunkViewSink& sink, absl::Time deadline,
                          CallCanceller& canceller);
absl::Status PullBlocking(ShardTransport& transport, const proto::PullRequest& request,
                          const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                          absl::Time deadline, CallCanceller& canceller);
absl::Status PushPullBlocking(ShardTransport& transport, const std::vector<OutgoingChunk>& chunks,
                              const ChunkViewSink& sink, absl::Time deadline,
                              CallCanceller& canceller);
absl::Status PushPullBlocking(ShardTransport& transport, const std::vector<OutgoingChunk>& chunks,
                              const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                              absl::Time deadline, CallCanceller& canceller);

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_TRANSPORT_H_
