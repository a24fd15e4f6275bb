#ifndef HARRIER_SERVER_UCX_UCX_LISTENER_H_
#define HARRIER_SERVER_UCX_UCX_LISTENER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/transport/framing.h"
#include "common/transport/ucx_worker.h"
#include "proto/harrier.pb.h"
#include "server/hello_secrets.h"
#include "server/shard_listener.h"
#include "server/shard_service.h"

namespace harrier {

struct UcxListenerOptions {
  int shard = 0;  // names the UCX worker
  // A hello must carry a secret from IssueHelloSecret, so that only clients
  // that fetched the address over the gRPC channel (which checks TLS and the
  // job token) get an endpoint. Off: any hello is accepted, as before.
  bool require_hello_secret = false;
};

// UCP active-message framing of a shard (common/transport/framing.h has the
// protocol): the "ucx" ShardListener. Clients fetch address() over gRPC
// (GetTransportAddress) and connect to it. The progress thread parses frames and moves bytes; every
// request goes to the ShardService, which answers exactly as it answers
// gRPC. Small calls (kInlineWorkBytes in ucx_listener.cc) let the service run
// the store work that does not wait on the progress thread itself
// (work_on_caller_thread); the rest runs on the service's pools. A kCancel frame or a failed
// peer cancels the request's Cancellation, which wakes a blocked pull at
// once. A malformed request gets an error reply and changes nothing.
// Thread-safe.
class UcxListener final : public ShardListener {
 public:
  explicit UcxListener(const UcxListenerOptions& options = {});
  ~UcxListener() override;

  absl::string_view name() const override { return "ucx"; }
  // Starts the UCP worker and its progress thread.
  absl::Status Start(ShardService* service) override;

  // The worker address clients connect to (bytes).
  std::string address() const override { return address_; }
  int port() const override { return -1; }

  // With require_hello_secret: a fresh one-time secret (HelloSecrets::Issue).
  // Without: empty. Any thread.
  std::string IssueHelloSecret() override { return hello_secrets_.Issue(); }

  // No health probes over UCX.
  void SetServing(bool) override {}
  // Requests are answered on the ShardService's pools: they keep coming
  // until Close, which drains them.
  void Stop(absl::Time) override {}
  // Stops taking requests, cancels the running ones and waits (at most
  // kDrainTimeout) for the service to answer them, then closes every
  // endpoint. Shut the ShardService down first and nothing is left to wait
  // for. Idempotent.
  void Close() override;

 private:
  struct Peer;
  struct Pending;
  struct Request;
  using RequestKey = std::pair<uint64_t, uint64_t>;  // connection, request

  static constexpr absl::Duration kDrainTimeout = absl::Seconds(10);

  // Progress thread.
  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  // A request whose body came in its data, ahead of the payload.
  ucs_status_t OnBodyInData(const transport::Frame& frame, void* data, size_t length,
                            const ucp_am_recv_param_t* param);
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // `data` holds the AM data, or is empty with `data_status` saying why.
  void OnFrame(const transport::Frame& frame, std::string body, transport::PayloadBuffer data,
               absl::Status data_status, size_t data_length);
  void OnHello(const transport::Frame& frame, const std::string& secret,
               const std::string& address);
  void OnChunk(const transport::Frame& frame, const std::string& body,
               transport::PayloadBuffer data, absl::Status frame_status);
  // Hands a complete request to the service; `pushed` is null for a pull
  // or an empty push.
  void Dispatch(const transport::Frame& frame, int64_t timeout_ms,
                std::shared_ptr<Pending> pushed, proto::PullRequest* pull);
  void CancelConnection(uint64_t connection);

  // Any thread: queue a reply on the progress thread.
  void SendStatus(uint64_t connection, uint64_t request, uint32_t count,
                  const absl::Status& status);
  // `bytes` at `data` are sent as the payload; `keep` owns them and is
  // held until the send completes (a reply buffer, or a parameter version).
  void SendChunk(uint64_t connection, uint64_t request, uint32_t index,
                 const proto::TensorChunk& chunk, const char* data, size_t bytes,
                 std::shared_ptr<const void> keep);
  // Any thread: the service's answer to a request.
  void Answer(const std::shared_ptr<Request>& request, const absl::Status& status);

  const int shard_;                  // names the UCX worker
  ShardService* service_ = nullptr;  // set by Start
  std::atomic<bool> stopping_{false};

  // Progress thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Peer>> peers_;
  std::map<RequestKey, std::unique_ptr<Pending>> pending_;
  // Payload bytes each push / push-pull has sent so far (ShardService's
  // --max_request_bytes), counted as frames arrive, and how many of them
  // are reserved in the service's BufferBudget until the request is
  // complete or its connection closes.
  struct RequestBytes {
    uint64_t sent = 0;
    uint64_t reserved = 0;
    // The first frame's arrival, and rendezvous receives still running:
    // SweepIncompleteCalls ends a call whose frames stopped coming (a
    // client that died over shared memory, which reports no failure, or
    // one that sends part of a call and stalls), once none is receiving.
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    int receiving = 0;
  };
  // Progress thread (the worker's periodic task): refuses, forgets and
  // un-reserves calls older than their timeout (kIncompleteCallLimit when
  // the client gave none).
  void SweepIncompleteCalls();
  std::map<RequestKey, RequestBytes> request_bytes_;
  // Forgets the requests in [first, last) of request_bytes_, giving their
  // reservations back.
  void ForgetRequestBytes(std::map<RequestKey, RequestBytes>::iterator first,
                          std::map<RequestKey, RequestBytes>::iterator last);
  void ForgetRequestBytes(const RequestKey& key);

  // Requests the service is answering: kCancel and failed peers cancel them.
  absl::Mutex requests_mutex_;
  std::map<RequestKey, std::shared_ptr<Request>> requests_ ABSL_GUARDED_BY(requests_mutex_);

  std::string address_;
  std::unique_ptr<transport::UcxWorker> worker_;
  HelloSecrets hello_secrets_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_UCX_UCX_LISTENER_H_
