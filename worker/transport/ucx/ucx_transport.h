#ifndef HARRIER_WORKER_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/transport/ucx_worker.h"
#include "worker/transport/transport.h"

namespace harrier {

class UcxShardTransport;
struct UcxPeer;
struct UcxCall;

// One UCP worker and progress thread shared by a Client's shard transports.
// The progress thread runs the reply handler and completions; calling
// threads post sends to it and wait on their call. Thread-safe. Lives as
// long as the longest-lived transport made from it (they share ownership).
class UcxClientContext {
 public:
  static absl::StatusOr<std::shared_ptr<UcxClientContext>> Create(const std::string& name);
  ~UcxClientContext();

  // Connects to a shard's UCX worker address (from GetTransportAddress) with
  // error mode PEER, and waits for its hello reply until `deadline`.
  // `peer_name` names the shard in error messages. `peer_alive` (may be
  // empty) is polled while a call waits when UCX itself cannot detect a
  // dead peer (shared memory only, see UcxWorker::Connect); false fails the
  // shard's calls with UNAVAILABLE. It runs on the calling threads.
  static absl::StatusOr<std::unique_ptr<UcxShardTransport>> Connect(
      std::shared_ptr<UcxClientContext> context, const std::string& peer_name,
      const std::string& address, absl::Time deadline,
      std::function<bool()> peer_alive = nullptr);

 private:
  friend class UcxShardTransport;
  struct Message {
    std::string header;
    const void* data = nullptr;
    size_t bytes = 0;
  };

  UcxClientContext() = default;

  // Sends `messages` as one call to `peer` and waits for its reply until
  // `deadline` or cancellation; hands reply chunks to `sink` (if any) in
  // order. Never returns while UCX still reads the messages' data.
  absl::Status Execute(const std::shared_ptr<UcxPeer>& peer, uint64_t request_id,
                       std::vector<Message> messages, const ChunkViewSink* sink,
                       absl::Time deadline, CallCanceller& canceller);
  uint64_t NextRequestId() { return next_request_id_++; }

  // Progress thread.
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Marks the peer failed, force-closes its endpoint (outstanding sends
  // complete with an error) and fails its calls. Progress thread.
  void FailPeer(UcxPeer* peer, const absl::Status& failure);
  std::shared_ptr<UcxCall> FindCall(uint64_t request_id);

  std::atomic<uint64_t> next_request_id_{1};
  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<UcxCall>> calls_;  // guarded by mutex_
  std::vector<std::shared_ptr<UcxPeer>> peers_;         // guarded by mutex_
  std::unique_ptr<transport::UcxWorker> worker_;
};

// A shard's data path over UCX active messages. Host memory only:
// SupportsMemory(kCuda) is false (no UCS_MEMORY_TYPE_CUDA sends yet), so
// the client stages device buffers through host memory. Payloads are sent
// from the chunks' own bytes (no copy); replies are received into the reply
// chunks and handed to the sink on the calling thread. A shard that dies
// fails calls with UNAVAILABLE (error mode PEER), never a hang.
class UcxShardTransport : public ShardTransport {
 public:
  UcxShardTransport(std::shared_ptr<UcxClientContext> context, std::shared_ptr<UcxPeer> peer);
  ~UcxShardTransport() override;

  std::string name() const override { return "ucx"; }
  bool SupportsMemory(MemoryKind kind) const override { return kind == MemoryKind::kHost; }
  absl::Status RegisterMemory(void* data, size_t bytes, MemoryKind kind) override;

  // The view forms: payloads go out from the caller's bytes and replies
  // reach the sink as views of the received buffers. The proto forms are
  // the base class's adapters onto these.
  using ShardTransport::Pull;
  using ShardTransport::Push;
  using ShardTransport::PushPull;
  absl::Status Push(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                    CallCanceller& canceller) override;
  absl::Status Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                    absl::Time deadline, CallCanceller& canceller) override;
  absl::Status PushPull(const std::vector<OutgoingChunk>& chunks, const ChunkViewSink& sink,
                        absl::Time deadline, CallCanceller& canceller) override;

 private:
  absl::Status SendChunks(const std::vector<OutgoingChunk>& chunks, bool then_pull,
                          const ChunkViewSink* sink, absl::Time deadline,
                          CallCanceller& canceller);

  std::shared_ptr<UcxClientContext> context_;
  std::shared_ptr<UcxPeer> peer_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_UCX_UCX_TRANSPORT_H_
