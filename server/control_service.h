#ifndef HARRIER_SERVER_CONTROL_SERVICE_H_
#define HARRIER_SERVER_CONTROL_SERVICE_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "proto/harrier.grpc.pb.h"
#include "server/consistency.h"

namespace harrier {

struct ControlOptions {
  int num_workers = 1;
  SyncPolicy sync;
  std::vector<std::string> shard_addresses;  // may be empty: workers know them
};

// The control plane, served by shard 0: ranks, barriers, heartbeats and the
// shard map. Thread-safe; barriers block a gRPC thread until every worker
// arrives or the caller's deadline passes.
class ControlServiceImpl final : public proto::ControlService::Service {
 public:
  explicit ControlServiceImpl(ControlOptions options);

  grpc::Status Register(grpc::ServerContext* context, const proto::RegisterRequest* request,
                        proto::RegisterResponse* response) override;
  grpc::Status Barrier(grpc::ServerContext* context, const proto::BarrierRequest* request,
                       proto::BarrierResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const proto::HeartbeatRequest* request,
                         proto::HeartbeatResponse* response) override;
  grpc::Status GetShardMap(grpc::ServerContext* context, const proto::ShardMapRequest* request,
                           proto::ShardMapResponse* response) override;

  // Wakes blocked barriers, which then fail with UNAVAILABLE.
  void Close();

 private:
  struct BarrierState {
    uint32_t generation = 0;
    std::vector<bool> arrived;
    int count = 0;
  };
  void FillSync(proto::SyncConfig* sync) const;

  const ControlOptions options_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool closed_ = false;
  std::vector<bool> rank_taken_;
  std::vector<std::chrono::steady_clock::time_point> last_heartbeat_;
  std::map<std::string, BarrierState> barriers_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_CONTROL_SERVICE_H_
