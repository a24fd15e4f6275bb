#ifndef HARRIER_SERVER_SHARD_LISTENER_FACTORY_H_
#define HARRIER_SERVER_SHARD_LISTENER_FACTORY_H_

// Makes a shard's listeners by name, so ShardServer includes only
// shard_listener.h and this header, never a backend.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/transport/stream.h"
#include "server/shard_listener.h"

namespace grpc {
class ServerCredentials;
class Service;
}  // namespace grpc

namespace harrier {

class ShardStore;

// What a backend may need to serve a shard.
struct ShardListenerOptions {
  int shard = 0;
  // gRPC: where it listens (port 0: the kernel picks one) and with what
  // credentials (common/grpc_security.h; null: plaintext).
  std::string host = "0.0.0.0";
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // gRPC: non-empty, every call must carry it (server/job_token.h).
  std::string job_token;
  // gRPC: the store GetShardInfo describes (not owned; outlives the
  // listener).
  ShardStore* store = nullptr;
  // gRPC: more services on the same port (the shard's control and admin
  // services; not owned, outlive the listener).
  std::vector<grpc::Service*> grpc_services;
  // gRPC: the shard's other listeners, whose addresses GetTransportAddress
  // hands out (called on gRPC's threads). Null: none.
  ShardListenerLookup find_listener;
  // gRPC: the library's memory, threads and streams.
  GrpcServerLimits grpc_limits;
  // tcp: its port on `host` (0: the kernel picks one).
  int tcp_port = 0;
  // tcp: congestion control of its connections (TcpListenerOptions).
  std::string tcp_congestion_control = std::string(transport::kDefaultCongestionControl);
  // tcp: the address clients are told instead of the bound one ("": the
  // bound one; TcpListenerOptions::advertise).
  std::string tcp_advertise;
  // UCX and tcp: a hello must carry a secret from IssueHelloSecret, so that only
  // clients that fetched the address over the authenticated gRPC channel
  // get an endpoint. Off: any hello is accepted.
  bool require_hello_secret = false;
};

// OK for "grpc", "tcp" and "ucx"; INVALID_ARGUMENT naming the choices otherwise.
absl::Status CheckShardListenerName(absl::string_view name);

// An unstarted listener of backend `name`.
absl::StatusOr<std::unique_ptr<ShardListener>> CreateShardListener(
    absl::string_view name, const ShardListenerOptions& options);

// A lookup over `listeners` (not owned; neither the vector nor its
// listeners may change while the lookup is called): INVALID_ARGUMENT
// "unknown transport" for a name CheckShardListenerName refuses,
// FAILED_PRECONDITION "shard was started without --<name>" for one not among
// them.
ShardListenerLookup MakeShardListenerLookup(
    const std::vector<std::unique_ptr<ShardListener>>* listeners);

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_LISTENER_FACTORY_H_
