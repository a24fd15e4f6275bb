#ifndef HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "proto/harrier.grpc.pb.h"
#include "worker/transport/transport.h"

namespace harrier {

// The portable data path: ParameterService streams over one channel.
//
// Messages are ByteBuffers, not generated types, so payloads are neither
// copied into protos nor serialised: each pushed chunk is a small header
// slice plus a slice over the payload's own bytes (common/chunk_wire.h), and
// reply payloads are handed to the sink as views of the received slices.
// The bytes on the wire are ordinary TensorChunk messages, so any typed
// ParameterService client or server interoperates.
class GrpcShardTransport : public ShardTransport {
 public:
  explicit GrpcShardTransport(std::shared_ptr<grpc::Channel> channel);

  std::string name() const override { return "grpc"; }
  // Host memory only: a chunk in device memory is refused with
  // FAILED_PRECONDITION before anything is sent (RefuseDeviceChunks).

  // Returns once gRPC has released every borrowed payload, so the caller
  // may reuse its buffers as soon as the call returns; the wait for the
  // release is bounded (kSliceReleaseGrace after the stream ended), see
  // grpc_transport.cc.
  absl::Status Push(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                    CallCanceller& canceller) override;
  absl::Status Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                    absl::Time deadline, CallCanceller& canceller) override;
  absl::Status PushPull(const std::vector<OutgoingChunk>& chunks, const ChunkViewSink& sink,
                        absl::Time deadline, CallCanceller& canceller) override;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  const grpc::internal::RpcMethod push_method_;
  const grpc::internal::RpcMethod pull_method_;
  const grpc::internal::RpcMethod push_pull_method_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
