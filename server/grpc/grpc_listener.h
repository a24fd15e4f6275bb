#ifndef HARRIER_SERVER_GRPC_GRPC_LISTENER_H_
#define HARRIER_SERVER_GRPC_GRPC_LISTENER_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/grpc/async_call.h"
#include "server/grpc/parameter_service.h"
#include "server/shard_listener.h"
#include "server/shard_service.h"
#include "server/shard_store.h"

namespace harrier {

struct GrpcListenerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the kernel picks one; see port()
  // Null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Non-empty: every ParameterService call must carry it.
  std::string job_token;
  ShardStore* store = nullptr;  // not owned; GetShardInfo describes it
  // Served on the same port (not owned; they outlive the listener). One
  // that is also a QueueServedService has its asynchronous calls requested
  // on the listener's queues.
  std::vector<grpc::Service*> services;
  // The other listeners GetTransportAddress hands out (ParameterServiceImpl).
  ShardListenerLookup find_listener;
  // gRPC's own memory, threads and streams (shard_listener.h).
  GrpcServerLimits limits;
};

// The "grpc" ShardListener: one grpc::Server on host:port serving the
// ParameterService (parameter_service.h), the services the options add and
// grpc.health.v1. Data calls run on the listener's queue threads and the
// ShardService's pools, the rest on gRPC's threads. Thread-safe after Start.
class GrpcListener final : public ShardListener {
 public:
  explicit GrpcListener(GrpcListenerOptions options);
  ~GrpcListener() override;

  absl::string_view name() const override { return "grpc"; }
  // UNAVAILABLE when host:port cannot be bound.
  absl::Status Start(ShardService* service) override;
  // "host:port" with the bound port.
  std::string address() const override;
  int port() const override { return port_; }
  // gRPC authenticates each call (TLS, the job token): no hello.
  std::string IssueHelloSecret() override { return ""; }
  void SetServing(bool serving) override;
  // grpc::Server::Shutdown: calls still running at `deadline` are cancelled.
  void Stop(absl::Time deadline) override;
  void Close() override;

 private:
  GrpcListenerOptions options_;
  std::unique_ptr<ParameterServiceImpl> parameter_service_;
  // Declared before the server: destroyed after it.
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  QueuePollers pollers_;
  std::vector<QueueServedService*> queue_served_;  // the services with asynchronous methods
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_GRPC_GRPC_LISTENER_H_
