#ifndef HARRIER_TESTS_TRANSPORT_RAW_UCX_CLIENT_H_
#define HARRIER_TESTS_TRANSPORT_RAW_UCX_CLIENT_H_

// A framing-level UCX client for tests: sends arbitrary (also malformed)
// frames to a shard and waits for the status reply, so bad input can be
// sent that UcxShardTransport would never produce.

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/framing.h"
#include "common/transport/ucx_worker.h"

namespace harrier::testing {

// How RawUcxClient::Connect says hello to a shard with a job token.
struct RawUcxHello {
  std::string job_token;  // sent with GetTransportAddress; empty: none
  // Replace the secret GetTransportAddress issued by `secret` (empty: a
  // hello without one).
  bool replace_secret = false;
  std::string secret;
  absl::Duration timeout = absl::Seconds(10);  // for the hello's reply
};

// Thread-compatible: one call at a time.
class RawUcxClient {
 public:
  // Fetches the shard's UCX address over gRPC and says hello.
  static absl::StatusOr<std::unique_ptr<RawUcxClient>> Connect(const std::string& grpc_address,
                                                               const RawUcxHello& hello = {});
  ~RawUcxClient();

  // Sends one request AM: header = `frame` (connection and request ids
  // filled in) + `body`, data = `data`; returns the status the shard
  // replied with (reply chunks are dropped).
  absl::Status Call(transport::Frame frame, const std::string& body, const std::string& data,
                    absl::Duration timeout = absl::Seconds(10));

  // As Call, but gives up after `cancel_after` as a client does: sends
  // kCancel for the request, then waits for the shard's reply to it.
  absl::Status CallAndCancel(transport::Frame frame, const std::string& body,
                             const std::string& data, absl::Duration cancel_after,
                             absl::Duration timeout = absl::Seconds(10));

  // Stops the worker without closing the endpoint, as a crashed process
  // would leave it.
  void Abandon();

  // Posts one frame without waiting, for requests of several frames: the
  // connection id is filled in, and the request id too unless `frame` has
  // one (the frames of one request share it). Returns the request id.
  // `data` must outlive the reply.
  uint64_t Send(transport::Frame frame, const std::string& body, const std::string& data);
  // The reply status to request `id`, or DEADLINE_EXCEEDED after `timeout`.
  absl::Status Await(uint64_t id, absl::Duration timeout);

 private:
  RawUcxClient() = default;
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);

  uint64_t connection_id_ = 0;
  uint64_t next_request_ = 1;
  ucp_ep_h ep_ = nullptr;  // progress thread only
  // Until a reply to `id` or a failure arrived, at most `timeout`; false
  // if neither did.
  bool AwaitReplyLocked(uint64_t id, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  absl::Mutex mutex_;
  std::map<uint64_t, absl::Status> replies_ ABSL_GUARDED_BY(mutex_);
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<transport::UcxWorker> worker_;
};

}  // namespace harrier::testing

#endif  // HARRIER_TESTS_TRANSPORT_RAW_UCX_CLIENT_H_
