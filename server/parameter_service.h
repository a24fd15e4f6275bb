#ifndef HARRIER_SERVER_PARAMETER_SERVICE_H_
#define HARRIER_SERVER_PARAMETER_SERVICE_H_

#include "proto/harrier.grpc.pb.h"
#include "common/metrics/metrics.h"
#include "server/shard_store.h"

namespace harrier {

// gRPC front of a ShardStore (synchronous API: gRPC's thread pool runs each
// call; a blocked pull holds one thread until its deadline). Calls are
// answered with the store's status; the service itself keeps no state.
class ParameterServiceImpl final : public proto::ParameterService::Service {
 public:
  explicit ParameterServiceImpl(ShardStore* store) : store_(store) {}

  // Optional: call latencies are observed into these (not owned; must
  // outlive the service). Set before serving.
  void SetLatencyHistograms(Histogram* push_seconds, Histogram* pull_seconds) {
    push_seconds_ = push_seconds;
    pull_seconds_ = pull_seconds;
  }

  grpc::Status Init(grpc::ServerContext* context, const proto::InitRequest* request,
                    proto::InitResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, grpc::ServerReader<proto::TensorChunk>* reader,
                    proto::PushResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                    grpc::ServerWriter<proto::TensorChunk>* writer) override;
  grpc::Status PushPull(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<proto::TensorChunk, proto::TensorChunk>* stream) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const proto::HeartbeatRequest* request,
                         proto::HeartbeatResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const proto::LeaveRequest* request,
                     proto::LeaveResponse* response) override;

 private:
  ShardStore* store_;  // not owned
  Histogram* push_seconds_ = nullptr;
  Histogram* pull_seconds_ = nullptr;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_PARAMETER_SERVICE_H_
