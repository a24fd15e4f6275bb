#ifndef HARRIER_SERVER_GRPC_PARAMETER_SERVICE_H_
#define HARRIER_SERVER_GRPC_PARAMETER_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/harrier.grpc.pb.h"
#include "server/grpc/async_call.h"
#include "server/job_token.h"
#include "server/shard_listener.h"
#include "server/shard_service.h"
#include "server/shard_store.h"
#include "server/streamed_unary.h"

namespace harrier {

namespace internal_parameter_service {
using PS = proto::ParameterService;
// The unary methods are streamed unary (server/streamed_unary.h): the token
// is checked at the headers, before the request body is read.
using RawDataService = PS::WithRawMethod_Push<
    PS::WithRawMethod_Pull<PS::WithRawMethod_PushPull<
        PS::WithStreamedUnaryMethod_Init<PS::WithStreamedUnaryMethod_Heartbeat<
            PS::WithStreamedUnaryMethod_Leave<PS::WithStreamedUnaryMethod_GetShardInfo<
                PS::WithStreamedUnaryMethod_GetTransportAddress<PS::Service>>>>>>>>;
}  // namespace internal_parameter_service

// gRPC framing of a shard: Push, Pull and PushPull are served through the
// asynchronous API as raw ByteBuffers (async_call.h: the listener's own
// threads poll the completion queues) and handed to the ShardService, which
// answers them exactly as it answers UCX. Reactions (those queue threads)
// read and frame, and run the store work that does not wait (the push,
// pull chunks that are ready); a pull that has to wait runs on the
// service's pull pool, never in a reaction. TensorChunk payloads are read
// from the received slices and replies written from slices the store fills,
// never parsed into or serialised from protobuf strings (common/chunk_wire.h).
// The bytes on the wire are unchanged, so typed clients are served alike.
// A client's cancel wakes its blocked pull at once (OnCancel cancels the
// call's Cancellation). The small control calls (Init, Heartbeat, Leave,
// GetTransportAddress) stay synchronous, served as streamed unary so that
// the job token is checked before their request body is read. Thread-safe.
class ParameterServiceImpl final : public internal_parameter_service::RawDataService,
                                   public QueueServedService {
 public:
  // Neither is owned; both must outlive the service (and the gRPC server).
  // A non-empty `job_token` must come with every call (JobTokenCheck).
  // GetTransportAddress answers with the listener `find_listener` finds
  // (null: none, FAILED_PRECONDITION for every transport).
  ParameterServiceImpl(ShardStore* store, ShardService* service, std::string job_token = "",
                       ShardListenerLookup find_listener = nullptr);
  ~ParameterServiceImpl() override;

  grpc::Status StreamedInit(
      grpc::ServerContext* context,
      UnaryStreamer<proto::InitRequest, proto::InitResponse>* streamer) override;
  grpc::Status StreamedHeartbeat(
      grpc::ServerContext* context,
      UnaryStreamer<proto::HeartbeatRequest, proto::HeartbeatResponse>* streamer) override;
  grpc::Status StreamedLeave(
      grpc::ServerContext* context,
      UnaryStreamer<proto::LeaveRequest, proto::LeaveResponse>* streamer) override;
  grpc::Status StreamedGetShardInfo(
      grpc::ServerContext* context,
      UnaryStreamer<proto::ShardInfoRequest, proto::ShardInfoResponse>* streamer) override;
  grpc::Status StreamedGetTransportAddress(
      grpc::ServerContext* context,
      UnaryStreamer<proto::TransportAddressRequest, proto::TransportAddressResponse>* streamer)
      override;

  // Push, Pull and PushPull (a pull answered late from the pool still
  // starts operations on its queue).
  void StartCalls(const std::vector<grpc::ServerCompletionQueue*>& queues) override;
  bool AwaitCallsDone(absl::Time deadline) override;

 private:
  // Keeps one call of `Call`'s method requested on `queue`.
  template <class Call, class Request>
  std::unique_ptr<QueueEvent> Accept(grpc::ServerCompletionQueue* queue, Request request);

  // The methods' work once the token passed and the request was read.
  grpc::Status AnswerInit(const proto::InitRequest& request, proto::InitResponse* response);
  grpc::Status AnswerHeartbeat(const proto::HeartbeatRequest& request,
                               proto::HeartbeatResponse* response);
  grpc::Status AnswerLeave(const proto::LeaveRequest& request);
  grpc::Status AnswerShardInfo(proto::ShardInfoResponse* response);
  grpc::Status AnswerTransportAddress(const proto::TransportAddressRequest& request,
                                      proto::TransportAddressResponse* response);

  ShardStore* store_;      // not owned
  ShardService* service_;  // not owned
  const JobTokenCheck token_check_;
  const ShardListenerLookup find_listener_;
  LiveCalls live_calls_;
  std::vector<std::unique_ptr<QueueEvent>> acceptors_;  // after live_calls_: they refer to it
};

}  // namespace harrier

#endif  // HARRIER_SERVER_GRPC_PARAMETER_SERVICE_H_
