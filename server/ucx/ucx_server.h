#ifndef HARRIER_SERVER_UCX_UCX_SERVER_H_
#define HARRIER_SERVER_UCX_UCX_SERVER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cancellation.h"
#include "common/thread_pool.h"
#include "common/transport/framing.h"
#include "common/transport/ucx_worker.h"
#include "proto/harrier.pb.h"
#include "server/shard_store.h"

namespace harrier {

struct UcxServerOptions {
  // Pushes never wait on other workers, so a small pool keeps them moving
  // even while every pull thread is blocked on the consistency model.
  int push_threads = 2;
  // Blocked pulls hold a thread each until answered or their deadline.
  int pull_threads = 16;
};

// Serves a ShardStore over UCP active messages (common/transport/framing.h
// has the protocol). Clients fetch address() over gRPC
// (GetTransportAddress) and connect to it. The progress thread only parses
// frames and moves bytes; every store call runs on the push or pull pool.
// Requests give the same statuses as the gRPC ParameterService. A malformed
// request gets an error reply and changes nothing; a peer that fails has its
// endpoint closed by the error handler. Thread-safe.
class UcxServer {
 public:
  static absl::StatusOr<std::unique_ptr<UcxServer>> Start(ShardStore* store,
                                                          const UcxServerOptions& options = {});
  ~UcxServer();

  // The worker address clients connect to (bytes).
  const std::string& address() const { return address_; }

  // Stops taking requests, finishes the ones running (blocked pulls end
  // when the store closes or at their deadline), closes every endpoint.
  // Idempotent.
  void Shutdown();

 private:
  struct Peer;
  struct Pending;
  using RequestKey = std::pair<uint64_t, uint64_t>;  // connection, request

  UcxServer() = default;

  // Progress thread.
  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // `data` holds the AM data, or is empty with `data_status` saying why.
  void OnFrame(const transport::Frame& frame, std::string body, transport::PayloadBuffer data,
               absl::Status data_status, size_t data_length);
  void OnHello(const transport::Frame& frame, const std::string& address);
  void OnChunk(const transport::Frame& frame, const std::string& body,
               transport::PayloadBuffer data,
               absl::Status frame_status);

  // Any thread: queue a reply on the progress thread.
  void SendStatus(uint64_t connection, uint64_t request, uint32_t count,
                  const absl::Status& status);
  void SendChunk(uint64_t connection, uint64_t request, uint32_t index,
                 const proto::TensorChunk& chunk,
                 std::shared_ptr<transport::PayloadBuffer> payload);

  // Pools.
  struct PullItem {
    uint32_t rank = 0;
    int64_t clock = 0;
    proto::ChunkRef ref;
    std::string job;
  };
  // `pushed` null: an empty push.
  void RunPush(uint64_t connection, uint64_t request, bool then_pull,
               ShardStore::Clock::time_point deadline, std::shared_ptr<Pending> pushed);
  void RunPull(uint64_t connection, uint64_t request, ShardStore::Clock::time_point deadline,
               std::vector<PullItem> items);
  std::shared_ptr<Cancellation> TrackCancel(uint64_t connection, uint64_t request);
  void Untrack(uint64_t connection, uint64_t request);

  ShardStore* store_ = nullptr;
  UcxServerOptions options_;
  std::atomic<bool> stopping_{false};

  // Progress thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Peer>> peers_;
  std::map<RequestKey, std::unique_ptr<Pending>> pending_;

  // Cancellation flags of running requests (kCancel, or the peer failed).
  std::mutex cancel_mutex_;
  std::map<RequestKey, std::shared_ptr<Cancellation>> cancels_;

  std::string address_;
  // Shutdown() destroys the pools (their tasks post replies) before the
  // worker, whose destructor runs the posted replies and stops the thread.
  std::unique_ptr<ThreadPool> push_pool_;
  std::unique_ptr<ThreadPool> pull_pool_;
  std::unique_ptr<transport::UcxWorker> worker_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_UCX_UCX_SERVER_H_
