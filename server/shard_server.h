#ifndef HARRIER_SERVER_SHARD_SERVER_H_
#define HARRIER_SERVER_SHARD_SERVER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "server/consistency.h"
#include "server/control_service.h"
#include "server/optimizer.h"
#include "server/parameter_service.h"
#include "server/shard_store.h"

namespace harrier {

struct ShardServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the kernel picks one; see ShardServer::port()
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  OptimizerOptions optimizer;
  SyncPolicy sync;
  std::vector<std::string> shard_addresses;  // optional, for GetShardMap
  bool staleness_aware_lr = false;
  WorkerLossPolicy on_worker_loss = WorkerLossPolicy::kFail;
  // A worker that heartbeated once and then is silent this long is lost.
  std::chrono::milliseconds heartbeat_timeout{10000};
};

// One shard: a ShardStore behind the gRPC ParameterService, plus the
// ControlService on shard 0 and grpc.health.v1 on every shard. Several may
// run in one process (tests do). Thread-safe.
class ShardServer {
 public:
  // Validates the options, binds the port and starts serving.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(const ShardServerOptions& options);
  ~ShardServer();

  int port() const { return port_; }
  ShardStore& store() { return *store_; }

  // Stops accepting calls, wakes blocked pulls and barriers, lets in-flight
  // calls finish until `grace` has passed, then cancels the rest.
  void Shutdown(std::chrono::milliseconds grace);
  // Blocks until the server has shut down.
  void Wait();

 private:
  ShardServer() = default;

  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<ParameterServiceImpl> parameter_service_;
  std::unique_ptr<ControlServiceImpl> control_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
  // Liveness monitor: applies the worker-loss policy.
  std::mutex monitor_mutex_;
  std::condition_variable monitor_wake_;
  bool monitor_stop_ = false;
  std::thread monitor_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_SERVER_H_
