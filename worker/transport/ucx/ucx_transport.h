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
#include "worker/transport/timer_thread.h"
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

// One UCP worker and progress thread shared by a Client's shard transports,
// and one timer thread for their calls' deadlines, cancels and send-drain
// graces. The reply handler runs on the progress thread (or a thread that
// Post()s while the worker is free); a call completes there, or on the
// timer thread when it expires or is cancelled. Thread-safe. Lives as long
// as the longest-lived transport made from it (they share ownership).
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
    std::string data_prefix;  // sent ahead of `data` (a body too large for the header)
  };

  UcxClientContext() = default;

  // Opens an endpoint to `address` and says hello with its secret; on
  // failure the new peer's endpoint is closed again (on the progress
  // thread).
  absl::StatusOr<std::shared_ptr<UcxPeer>> ConnectPeer(const std::string& peer_name,
                                                       const transport::PeerAddress& address,
                                                       absl::Time deadline,
                                                       std::function<bool()> peer_alive);

  // Sends `messages` as one call to `peer` and completes it with `done`
  // when its reply is in, at `deadline`, on cancellation or when the peer
  // fails; hands reply chunks to `sink` (if any) in order first. With
  // `choose`, reply payloads land where it says. Never completes while UCX
  // still reads the messages' data or writes into a landing: sends still
  // in flight a grace after the call ended force-close the peer's
  // endpoint, which completes them (see ucx_transport.cc).
  void Execute(const std::shared_ptr<UcxPeer>& peer, uint64_t request_id,
               std::vector<Message> messages, const ReplyLandingChooser* choose,
               const LandedChunkSink* sink, absl::Time deadline, CallCanceller& canceller,
               CallDone done);
  uint64_t NextRequestId() { return next_request_id_++; }
  // Looks at a call after anything about it changed: ends it once it is
  // answered, failed, cancelled or expired, and completes it once UCX no
  // longer reads its payloads nor writes into its landings. Any thread but
  // one holding the call's canceller's lock.
  void Check(const std::shared_ptr<UcxCall>& call);
  // Check on the progress thread, in its next round: from UCP callbacks,
  // which may neither complete a call nor make UCP calls.
  void CheckLater(const std::shared_ptr<UcxCall>& call);
  // The send-drain grace of an ended call passed (`second`: twice).
  void DrainOverdue(const std::shared_ptr<UcxCall>& call, bool second);
  // Hands the replies to the sink and runs the call's done.
  void Complete(const std::shared_ptr<UcxCall>& call);
  // While a call to a peer that cannot detect failures runs: asks the
  // peer's probe every 500 ms.
  void WatchPeer(const std::weak_ptr<UcxCall>& call);

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
  std::unique_ptr<TimerThread> timer_;
};

// A shard's data path over UCX active messages. Payloads are sent from the
// chunks' own bytes (no copy): from device memory too, with
// UCP_OP_ATTR_FIELD_MEMORY_TYPE = UCS_MEMORY_TYPE_CUDA, when
// SendsFromDeviceMemory(); otherwise a chunk in device memory is refused
// with FAILED_PRECONDITION before anything is sent. Replies are received
// into host buffers (or the caller's landings) and handed to the sink
// when the call completes. A shard that dies
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

  // Replies reach the sink as views of the received buffers, or in their
  // landings: rendezvous replies are received (ucp_am_recv_data_nbx)
  // straight into their landing, with UCS_MEMORY_TYPE_CUDA for a device one
  // (ReceivesIntoDeviceMemory(), the same UCX support and mode as
  // SendsFromDeviceMemory()); eager ones are copied into a host landing (a
  // device landing gets a host view). The sink and done run on the
  // progress thread (or the timer thread, for a call that expired or was
  // cancelled). A call that finds its peer failed reconnects first (see
  // above), on the starting thread.
  void StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                 CallCanceller& canceller, CallDone done) override;
  void StartPull(const proto::PullRequest& request, const ReplyLandingChooser* choose,
                 const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                 CallDone done) override;
  void StartPushPull(const std::vector<OutgoingChunk>& chunks, const ReplyLandingChooser* choose,
                     const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                     CallDone done) override;

 private:
  void SendChunks(const std::vector<OutgoingChunk>& chunks, bool then_pull,
                  const ReplyLandingChooser* choose, const LandedChunkSink* sink,
                  absl::Time deadline, CallCanceller& canceller, CallDone done);
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
