#ifndef HARRIER_SERVER_GRPC_PARAMETER_SERVICE_H_
#define HARRIER_SERVER_GRPC_PARAMETER_SERVICE_H_

#include <functional>
#include <string>

#include "proto/harrier.grpc.pb.h"
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
using RawDataService = PS::WithRawCallbackMethod_Push<
    PS::WithRawCallbackMethod_Pull<PS::WithRawCallbackMethod_PushPull<
        PS::WithStreamedUnaryMethod_Init<PS::WithStreamedUnaryMethod_Heartbeat<
            PS::WithStreamedUnaryMethod_Leave<PS::WithStreamedUnaryMethod_GetShardInfo<
                PS::WithStreamedUnaryMethod_GetTransportAddress<PS::Service>>>>>>>>;
}  // namespace internal_parameter_service

// gRPC framing of a shard: Push, Pull and PushPull are served through the
// callback API as raw ByteBuffers and handed to the ShardService, which
// answers them exactly as it answers UCX. Reactions (gRPC's callback
// threads) read and frame, and run the store work that does not wait (the
// push, pull chunks that are ready); a pull that has to wait runs on the
// service's pull pool, never in a reaction. TensorChunk payloads are read
// from the received slices and replies written from slices the store fills,
// never parsed into or serialised from protobuf strings (common/chunk_wire.h).
// The bytes on the wire are unchanged, so typed clients are served alike.
// A client's cancel wakes its blocked pull at once (OnCancel cancels the
// call's Cancellation). The small control calls (Init, Heartbeat, Leave,
// GetTransportAddress) stay synchronous, served as streamed unary so that
// the job token is checked before their request body is read. Thread-safe.
class ParameterServiceImpl final : public internal_parameter_service::RawDataService {
 public:
  // Neither is owned; both must outlive the service (and the gRPC server).
  // A non-empty `job_token` must come with every call (JobTokenCheck).
  // GetTransportAddress answers with the listener `find_listener` finds
  // (null: none, FAILED_PRECONDITION for every transport).
  ParameterServiceImpl(ShardStore* store, ShardService* service, std::string job_token = "",
                       ShardListenerLookup find_listener = nullptr);

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

  using internal_parameter_service::RawDataService::Pull;
  using internal_parameter_service::RawDataService::Push;
  using internal_parameter_service::RawDataService::PushPull;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(grpc::CallbackServerContext* context,
                                                  grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PushPull(
      grpc::CallbackServerContext* context) override;

 private:
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
};

}  // namespace harrier

#endif  // HARRIER_SERVER_GRPC_PARAMETER_SERVICE_H_
