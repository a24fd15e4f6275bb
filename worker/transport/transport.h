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
#include "absl/time/time.h"
#include "common/codec/codec_backend.h"
#include "common/payload_view.h"
#include "proto/harrier.pb.h"

namespace harrier {

// Lets a waiting caller abort calls in flight. A transport registers how to
// abort its call while it runs. Thread-safe.
class CallCanceller {
 public:
  // False if already cancelled: the transport must not start the call.
  bool Register(const void* call, std::function<void()> abort);
  void Unregister(const void* call);
  // Runs every registered abort; later Register() calls return false.
  void CancelAll();
  bool cancelled() const;
  // Sleeps for `duration` unless cancelled first (so a retry's backoff ends
  // at once on cancel). True if cancelled.
  bool SleepUnlessCancelled(absl::Duration duration) const;

 private:
  mutable absl::Mutex mutex_;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::pair<const void*, std::function<void()>>> calls_ ABSL_GUARDED_BY(mutex_);
};

// Receives each reply chunk of a pull as its header (ignore its payload
// field: a backend may leave it set) and a view of its payload, on the
// transport's calling thread. Both are borrowed and valid only during the
// call: a sink copies what it keeps.
using ChunkViewSink =
    std::function<absl::Status(const proto::TensorChunk& header, const PayloadView& payload)>;

// Where one reply chunk's payload should land, chosen by the receiver
// before its data arrives (PullInto). `data == nullptr`: nowhere, the
// payload arrives in a transport buffer as with Pull.
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
// As ChunkViewSink, plus where `payload` is: in the landing buffer that was
// chosen for it (in that landing's memory, kDevice included: then the view's
// bytes are a device address, not readable on the host), or, when it did
// not land, a host view of a transport buffer (kHost).
using LandedChunkSink = std::function<absl::Status(
    const proto::TensorChunk& header, const PayloadView& payload, MemoryKind memory)>;

// One chunk to push: header fields plus a payload that is either borrowed
// (dense gradients: a view into the caller's tensor, not copied) or owned
// (compressed payloads, produced by the codec).
//
// Lifetime: a borrowed payload must stay valid and unchanged until the
// transport call that sends it has returned. The client guarantees this: a
// push's gradient belongs to the caller until the operation's Wait()
// returns, and every transport call of the operation returns first. A
// transport, in turn, does not return while its network stack still reads
// the bytes: it waits for their release, for a bounded time (gRPC: its
// slices; UCX: its sends, closing the endpoint if they stall), and says in
// its status when the bound passed first (see each backend).
struct OutgoingChunk {
  proto::TensorChunk header;  // payload field empty; checksum covers payload()
  absl::string_view borrowed;
  std::string owned;
  bool is_borrowed = false;
  // Where `borrowed` lives. kDevice only when the transport said
  // SendsFromDeviceMemory(); owned payloads are always host memory.
  MemoryKind borrowed_memory = MemoryKind::kHost;

  absl::string_view payload() const { return is_borrowed ? borrowed : absl::string_view(owned); }
};

// For transports that send host memory only: FAILED_PRECONDITION naming
// `transport` and the first chunk whose borrowed payload is in device
// memory, before anything is sent (the bytes are never read: on the host a
// device pointer is not readable). OK if every chunk is in host memory.
absl::Status RefuseDeviceChunks(absl::string_view transport,
                                const std::vector<OutgoingChunk>& chunks);

// One shard's data path. Calls are synchronous and thread-safe: several
// run at once on the client's pools. Every call ends by `deadline`.
// Errors carry the shard's status code and message.
class ShardTransport {
 public:
  virtual ~ShardTransport() = default;

  virtual std::string name() const = 0;  // "grpc", "ucx" or "fake"

  // True if Push and PushPull accept borrowed payloads in device memory
  // (OutgoingChunk::borrowed_memory == kDevice): UCX built with CUDA
  // support. Otherwise the client stages device chunks through host memory.
  virtual bool SendsFromDeviceMemory() const { return false; }

  // Payloads go out from the chunks' bytes and replies reach the sink as
  // views of the received buffers, so a backend can avoid copying both.
  virtual absl::Status Push(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                            CallCanceller& canceller) = 0;
  virtual absl::Status Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                            absl::Time deadline, CallCanceller& canceller) = 0;
  // True if PullInto lands payloads in device memory (UCX built with CUDA,
  // rendezvous-sized replies); otherwise a kDevice landing is not used and
  // the sink gets a host view.
  virtual bool ReceivesIntoDeviceMemory() const { return false; }
  // Pull, with each reply's payload received straight into the buffer
  // `choose` names for it where the backend can (UCX: rendezvous replies
  // into host or, with ReceivesIntoDeviceMemory(), device memory; small
  // eager replies are copied into a host landing, and stay host views for a
  // device one). The landing buffers must stay valid and untouched by the
  // caller until the call returns; the call does not return while the
  // transport may still write into them. Checksums are the sink's to check,
  // as with Pull. The default is Pull with nothing landed.
  virtual absl::Status PullInto(const proto::PullRequest& request,
                                const ReplyLandingChooser& choose, const LandedChunkSink& sink,
                                absl::Time deadline, CallCanceller& canceller);
  // Push, then receive each pushed chunk's parameters at clock + 1.
  virtual absl::Status PushPull(const std::vector<OutgoingChunk>& chunks,
                                const ChunkViewSink& sink, absl::Time deadline,
                                CallCanceller& canceller) = 0;
  // PushPull with the replies landed as PullInto lands them. The default is
  // PushPull with nothing landed.
  virtual absl::Status PushPullInto(const std::vector<OutgoingChunk>& chunks,
                                    const ReplyLandingChooser& choose,
                                    const LandedChunkSink& sink, absl::Time deadline,
                                    CallCanceller& canceller);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_TRANSPORT_H_
