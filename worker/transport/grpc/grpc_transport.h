#ifndef HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "proto/harrier.grpc.pb.h"
#include "worker/transport/transport.h"

namespace harrier {

// The portable data path: ParameterService streams over one channel.
class GrpcShardTransport : public ShardTransport {
 public:
  explicit GrpcShardTransport(std::shared_ptr<grpc::Channel> channel);

  std::string name() const override { return "grpc"; }
  bool SupportsMemory(MemoryKind kind) const override { return kind == MemoryKind::kHost; }
  absl::Status RegisterMemory(void*, size_t, MemoryKind kind) override;

  absl::Status Push(const std::vector<proto::TensorChunk>& chunks, absl::Time deadline,
                    CallCanceller& canceller) override;
  absl::Status Pull(const proto::PullRequest& request, const ChunkSink& sink, absl::Time deadline,
                    CallCanceller& canceller) override;
  absl::Status PushPull(const std::vector<proto::TensorChunk>& chunks, const ChunkSink& sink,
                        absl::Time deadline, CallCanceller& canceller) override;

 private:
  std::unique_ptr<proto::ParameterService::Stub> stub_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
