#ifndef HARRIER_WORKER_TRANSPORT_TRANSPORT_FACTORY_H_
#define HARRIER_WORKER_TRANSPORT_TRANSPORT_FACTORY_H_

// Builds the data path to every shard for a backend named by string, so
// client code includes only transport.h and this header, never a backend.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transport/framing.h"
#include "worker/transport/transport.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace harrier {

// What a backend may need about one shard, from the control plane.
struct ShardLink {
  std::string name;  // "shard i (host:port)", for error messages
  // The shard's gRPC address, "host:port": a backend whose listener is
  // bound to every interface ("tcp") reaches it at this host.
  std::string target;
  // The shard's gRPC channel (the grpc backend sends over it).
  std::shared_ptr<grpc::Channel> channel;
  // More channels to the shard, each its own connection: the grpc backend
  // spreads large calls over `channel` and these (ClientOptions::
  // grpc_connections).
  std::vector<std::shared_ptr<grpc::Channel>> extra_channels;
  // A connection of its own for the grpc backend's pulls (null: pulls
  // share the channels above; ClientOptions::pull_connection).
  std::shared_ptr<grpc::Channel> pull_channel;
  // The shard's current address for a backend ("ucx", "tcp") and its hello
  // secret, by a deadline; asked again to reconnect after the shard
  // restarted (a secret serves one hello).
  std::function<absl::StatusOr<transport::PeerAddress>(const std::string& backend,
                                                       absl::Time deadline)>
      address;
  // Whether the control channel is TLS: "auto" then keeps the data on
  // gRPC, the one encrypted backend.
  bool encrypted = false;
  // tcp: congestion control of its connections (ClientOptions::
  // tcp_congestion_control).
  std::string tcp_congestion_control;
  // False when the shard is down; polled by backends that cannot detect a
  // dead peer themselves (UCX over shared memory).
  std::function<bool()> reachable;
};

// OK for "auto", "grpc", "tcp" and "ucx"; INVALID_ARGUMENT naming the
// choices otherwise. "auto" picks per shard: tcp where the shard serves it
// and the link is not encrypted, gRPC otherwise.
absl::Status CheckTransportName(absl::string_view backend);

// One connected transport per link, in link order, each ready by
// `deadline`. `client_name` names this client to the backend (UCX worker
// name). The links' functions must stay valid while the transports live.
absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> CreateShardTransports(
    absl::string_view backend, const std::string& client_name, const std::vector<ShardLink>& links,
    absl::Time deadline);

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_TRANSPORT_FACTORY_H_
