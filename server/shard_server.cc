#include "server/shard_server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_limits.h"

namespace harrier {

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    const ShardServerOptions& options) {
  if (options.num_shards < 1) return absl::InvalidArgumentError("--num_shards must be >= 1");
  if (options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("--shard=", options.shard,
                                                   " out of range [0, --num_shards=",
                                                   options.num_shards, ")"));
  }
  if (options.num_workers < 1) return absl::InvalidArgumentError("--num_workers must be >= 1");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port=", options.port, " out of range"));
  }
  auto optimizer = CreateOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();

  std::unique_ptr<ShardServer> server(new ShardServer());
  ShardStoreOptions store_options;
  store_options.shard = options.shard;
  store_options.num_shards = options.num_shards;
  store_options.num_workers = options.num_workers;
  store_options.sync = options.sync;
  store_options.staleness_aware_lr = options.staleness_aware_lr;
  server->store_ = std::make_unique<ShardStore>(store_options, std::move(*optimizer));
  server->parameter_service_ = std::make_unique<ParameterServiceImpl>(server->store_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                           grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  builder.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  ApplyServerTuning(builder);
  builder.RegisterService(server->parameter_service_.get());
  if (options.shard == 0) {
    ControlOptions control;
    control.num_workers = options.num_workers;
    control.sync = options.sync;
    control.shard_addresses = options.shard_addresses;
    server->control_service_ = std::make_unique<ControlServiceImpl>(control);
    builder.RegisterService(server->control_service_.get());
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  ShardServer* self = server.get();
  server->monitor_ = std::thread([self, timeout = options.heartbeat_timeout,
                                  policy = options.on_worker_loss] {
    std::unique_lock<std::mutex> lock(self->monitor_mutex_);
    while (!self->monitor_stop_) {
      self->monitor_wake_.wait_for(lock, std::chrono::milliseconds(200));
      if (self->monitor_stop_) break;
      lock.unlock();
      self->store_->CheckLiveness(timeout, policy);
      lock.lock();
    }
  });
  return server;
}

ShardServer::~ShardServer() {
  Shutdown(std::chrono::milliseconds(0));
  server_->Wait();
}

void ShardServer::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_) return;
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lock(monitor_mutex_);
    monitor_stop_ = true;
  }
  monitor_wake_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  server_->GetHealthCheckService()->SetServingStatus(false);
  store_->Close();
  if (control_service_) control_service_->Close();
  server_->Shutdown(std::chrono::system_clock::now() + grace);
}

void ShardServer::Wait() { server_->Wait(); }

}  // namespace harrier
