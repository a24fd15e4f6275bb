#ifndef HARRIER_SERVER_PARAMETER_SERVICE_H_
#define HARRIER_SERVER_PARAMETER_SERVICE_H_

#include <mutex>
#include <string>

#include "proto/harrier.grpc.pb.h"
#include "common/metrics/metrics.h"
#include "server/shard_store.h"

namespace harrier {

// gRPC front of a ShardStore (synchronous API: gRPC's thread pool runs each
// call; a blocked pull holds one thread until its deadline). Calls are
// answered with the store's status; the service itself keeps no state.
//
// Push, Pull and PushPull are served raw (ByteBuffers, still synchronous):
// TensorChunk payloads are read from the received slices and written from
// a slice the store fills, never parsed into or serialised from protobuf
// strings (common/chunk_wire.h). The bytes on the wire are unchanged, so
// typed clients and Harrier's zero-copy client are served alike.
class ParameterServiceImpl final : public proto::ParameterService::Service {
 public:
  explicit ParameterServiceImpl(ShardStore* store);

  // Optional: call latencies are observed into these (not owned; must
  // outlive the service). Set before serving.
  void SetLatencyHistograms(Histogram* push_seconds, Histogram* pull_seconds) {
    push_seconds_ = push_seconds;
    pull_seconds_ = pull_seconds;
  }

  grpc::Status Init(grpc::ServerContext* context, const proto::InitRequest* request,
                    proto::InitResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const proto::HeartbeatRequest* request,
                         proto::HeartbeatResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const proto::LeaveRequest* request,
                     proto::LeaveResponse* response) override;
  grpc::Status GetTransportAddress(grpc::ServerContext* context,
                                   const proto::TransportAddressRequest* request,
                                   proto::TransportAddressResponse* response) override;

  // The UCX worker address GetTransportAddress serves; until set, it
  // answers FAILED_PRECONDITION. Thread-safe.
  void SetUcxAddress(std::string address);

 private:
  using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  // Raw handlers of Push, Pull and PushPull (installed by the constructor).
  grpc::Status RawPush(grpc::ServerContext* context, RawStream* stream);
  grpc::Status RawPull(grpc::ServerContext* context, RawStream* stream);
  grpc::Status RawPushPull(grpc::ServerContext* context, RawStream* stream);

  ShardStore* store_;  // not owned
  std::mutex address_mutex_;
  std::string ucx_address_;  // guarded by address_mutex_; empty: no UCX
  Histogram* push_seconds_ = nullptr;
  Histogram* pull_seconds_ = nullptr;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_PARAMETER_SERVICE_H_
