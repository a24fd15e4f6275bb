#ifndef HARRIER_WORKER_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/framing.h"
#include "common/transport/ucx_worker.h"
#include "worker/transport/transport.h"

namespace harrier {

class UcxShardTransport;
struct UcxPeer;
struct UcxCall;

// Fetches a shard's current UCX worker address and a fresh hello secret
// (GetTransportAddress over gRPC), giving up by `deadline`. Used to
// reconnect after the shard failed: a restarted shard has a new address.
using UcxAddressProvider =
    std::function<absl::StatusOr<transport::PeerAddress>(absl::Time deadline)>;

// Whether UCX sends device-memory chunks itself. Read from the environment
// variable HARRIER_UCX_DEVICE_MEMORY by UcxClientContext::Create(name):
//   auto (or unset): directly when this UCX supports UCS_MEMORY_TYPE_CUDA,
//                    else the client stages them through host memory;
//   off:             always staged (to compare both paths on a CUDA UCX);
//   on:              directly, and Create fails FAILED_PRECONDITION when
//                    this UCX has no CUDA support.
enum class UcxDeviceMemory { kAuto, kOff, kOn };
// INVALID_ARGUMENT naming the choices for anything but auto/off/on (and "").
absl::StatusOr<UcxDeviceMemory> ParseUcxDeviceMemory(absl::string_view value);
inline constexpr char kUcxDeviceMemoryEnv[] = "HARRIER_UCX_DEVICE_MEMORY";

// One UCP worker and progress thread shared by a Client's shard transports.
// The reply handler and completions run on whichever thread progresses the
// worker: the progress thread, or a calling thread that sends its own
// messages and progresses the worker itself for a short while as it waits
// for its reply (UcxWorker::Post, BeginDriving); then it sleeps on its
// call. Thread-safe. Lives as
// long as the longest-lived transport made from it (they share ownership).
class UcxClientContext {
 public:
  // The device-memory mode comes from HARRIER_UCX_DEVICE_MEMORY (above);
  // a bad value fails with INVALID_ARGUMENT.
  static absl::StatusOr<std::shared_ptr<UcxClientContext>> Create(const std::string& name);
  static absl::StatusOr<std::shared_ptr<UcxClientContext>> Create(const std::string& name,
                                                                  UcxDeviceMemory device_memory);
  ~UcxClientContext();

  // The memory types this UCX supports (UcxWorker::memory_types()).
  uint64_t memory_types() const { return worker_->memory_types(); }
  // True when chunks in device memory go out from device memory: this UCX
  // supports UCS_MEMORY_TYPE_CUDA and the mode is not kOff.
  bool sends_from_device_memory() const { return sends_from_device_memory_; }

  // Connects to a shard's UCX worker address (from GetTransportAddress) with
  // error mode PEER, and waits for its hello reply until `deadline`.
  // `peer_name` names the shard in error messages. `peer_alive` (may be
  // empty) is polled while a call waits when UCX itself cannot detect a
  // dead peer (shared memory only, see UcxWorker::Connect); false fails the
  // shard's calls with UNAVAILABLE. It runs on the calling threads.
  // `address_provider` (may be empty) lets the transport reconnect once the
  // shard has failed: see UcxShardTransport.
  static absl::StatusOr<std::unique_ptr<UcxShardTransport>> Connect(
      std::shared_ptr<UcxClientContext> context, const std::string& peer_name,
      const transport::PeerAddress& address, absl::Time deadline,
      std::function<bool()> peer_alive = nullptr, UcxAddressProvider address_provider = nullptr);

 private:
  friend class UcxShardTransport;
  struct Message {
    std::string header;
    const void* data = nullptr;
    size_t bytes = 0;
    ucs_memory_type_t data_memory = UCS_MEMORY_TYPE_HOST;  // the header is always host
  };

  UcxClientContext() = default;

  // Opens an endpoint to `address` and says hello with its secret; on
  // failure the new peer's endpoint is closed again (on the progress
  // thread).
  absl::StatusOr<std::shared_ptr<UcxPeer>> ConnectPeer(const std::string& peer_name,
                                                       const transport::PeerAddress& address,
                                                       absl::Time deadline,
                                                       std::function<bool()> peer_alive);

  // Sends `messages` as one call to `peer` and waits for its reply until
  // `deadline` or cancellation; hands reply chunks to `sink` (if any) in
  // order. Never returns while UCX still reads the messages' data: sends
  // still in flight a grace after the call ended force-close the peer's
  // endpoint, which completes them (see ucx_transport.cc).
  // With `landing` (PullInto), reply payloads land where its chooser says
  // and go to its sink instead of `sink`.
  struct Landing {
    const ReplyLandingChooser* choose;
    const LandedChunkSink* sink;
  };
  absl::Status Execute(const std::shared_ptr<UcxPeer>& peer, uint64_t request_id,
                       std::vector<Message> messages, const ChunkViewSink* sink,
                       absl::Time deadline, CallCanceller& canceller,
                       const Landing* landing = nullptr);
  uint64_t NextRequestId() { return next_request_id_++; }
  // Waits (bounded) until UCX no longer reads the call's payloads nor
  // writes into its landing buffers; see kSendDrainGrace in ucx_transport.cc.
  absl::Status WaitSendsDone(const std::shared_ptr<UcxCall>& call,
                             const std::shared_ptr<UcxPeer>& peer);

  // Progress thread.
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Marks the peer failed, force-closes its endpoint (outstanding sends
  // complete with an error) and fails its calls. Progress thread.
  void FailPeer(UcxPeer* peer, const absl::Status& failure);
  std::shared_ptr<UcxCall> FindCall(uint64_t request_id);

  std::atomic<uint64_t> next_request_id_{1};
  absl::Mutex mutex_;
  std::map<uint64_t, std::shared_ptr<UcxCall>> calls_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::shared_ptr<UcxPeer>> peers_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<transport::UcxWorker> worker_;
  bool sends_from_device_memory_ = false;
};

// A shard's data path over UCX active messages. Payloads are sent from the
// chunks' own bytes (no copy): from device memory too, with
// UCP_OP_ATTR_FIELD_MEMORY_TYPE = UCS_MEMORY_TYPE_CUDA, when
// SendsFromDeviceMemory(); otherwise a chunk in device memory is refused
// with FAILED_PRECONDITION before anything is sent. Replies are received
// into host buffers (PullInto: into the caller's landings) and handed to
// the sink on the calling thread. A shard that dies
// fails calls with UNAVAILABLE (error mode PEER), never a hang.
//
// Reconnecting: with an address provider, the first call after the peer
// failed fetches the shard's current address and connects a fresh endpoint
// (the failed one is already closed), then proceeds; if the shard is still
// down it returns UNAVAILABLE quickly, so the client's retry loop backs off
// and tries again. One call reconnects at a time; calls that arrive
// meanwhile wait for it and use its endpoint, or fail UNAVAILABLE if it
// failed.
class UcxShardTransport : public ShardTransport {
 public:
  UcxShardTransport(std::shared_ptr<UcxClientContext> context, std::shared_ptr<UcxPeer> peer,
                    std::string peer_name = "", std::function<bool()> peer_alive = nullptr,
                    UcxAddressProvider address_provider = nullptr);
  ~UcxShardTransport() override;

  std::string name() const override { return "ucx"; }
  // The context's sends_from_device_memory(): false with Debian's UCX
  // (no CUDA transports) and with HARRIER_UCX_DEVICE_MEMORY=off.
  bool SendsFromDeviceMemory() const override;

  // Payloads go out from the caller's bytes; replies reach the sink as
  // views of the received buffers.
  absl::Status Push(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                    CallCanceller& canceller) override;
  absl::Status Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                    absl::Time deadline, CallCanceller& canceller) override;
  absl::Status PushPull(const std::vector<OutgoingChunk>& chunks, const ChunkViewSink& sink,
                        absl::Time deadline, CallCanceller& canceller) override;
  // Same as SendsFromDeviceMemory(): the same UCX support and mode.
  bool ReceivesIntoDeviceMemory() const override { return SendsFromDeviceMemory(); }
  // Rendezvous replies are received (ucp_am_recv_data_nbx) straight into
  // their landing, with UCS_MEMORY_TYPE_CUDA for a device one; eager ones
  // are copied into a host landing (a device landing gets a host view).
  absl::Status PullInto(const proto::PullRequest& request, const ReplyLandingChooser& choose,
                        const LandedChunkSink& sink, absl::Time deadline,
                        CallCanceller& canceller) override;
  // The same landing for the pull half of a push-pull.
  absl::Status PushPullInto(const std::vector<OutgoingChunk>& chunks,
                            const ReplyLandingChooser& choose, const LandedChunkSink& sink,
                            absl::Time deadline, CallCanceller& canceller) override;

 private:
  absl::Status StartPull(const proto::PullRequest& request, const ChunkViewSink* sink,
                         const UcxClientContext::Landing* landing, absl::Time deadline,
                         CallCanceller& canceller);
  absl::Status SendChunks(const std::vector<OutgoingChunk>& chunks, bool then_pull,
                          const ChunkViewSink* sink, absl::Time deadline,
                          CallCanceller& canceller,
                          const UcxClientContext::Landing* landing = nullptr);
  // The peer to use now: the current one if it has not failed (or cannot be
  // replaced), else a freshly connected one; UNAVAILABLE if reconnecting
  // failed.
  absl::StatusOr<std::shared_ptr<UcxPeer>> CurrentPeer(absl::Time deadline);

  std::shared_ptr<UcxClientContext> context_;
  const std::string peer_name_;
  const std::function<bool()> peer_alive_;
  const UcxAddressProvider address_provider_;
  absl::Mutex peer_mutex_;
  std::shared_ptr<UcxPeer> peer_ ABSL_GUARDED_BY(peer_mutex_);
  bool reconnecting_ ABSL_GUARDED_BY(peer_mutex_) = false;
  absl::Status last_reconnect_failure_ ABSL_GUARDED_BY(peer_mutex_);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_UCX_UCX_TRANSPORT_H_
