#include "server/shard_listener_factory.h"

#include "absl/strings/str_cat.h"
#include "server/grpc/grpc_listener.h"
#include "server/tcp/tcp_listener.h"
#include "server/ucx/ucx_listener.h"

namespace harrier {

absl::Status CheckShardListenerName(absl::string_view name) {
  if (name == "grpc" || name == "ucx" || name == "tcp") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "' (grpc, tcp or ucx)"));
}

absl::StatusOr<std::unique_ptr<ShardListener>> CreateShardListener(
    absl::string_view name, const ShardListenerOptions& options) {
  if (auto status = CheckShardListenerName(name); !status.ok()) return status;
  if (name == "ucx") {
    UcxListenerOptions ucx;
    ucx.shard = options.shard;
    ucx.require_hello_secret = options.require_hello_secret;
    return std::unique_ptr<ShardListener>(std::make_unique<UcxListener>(ucx));
  }
  if (name == "tcp") {
    TcpListenerOptions tcp;
    tcp.host = options.host;
    tcp.port = options.tcp_port;
    tcp.congestion_control = options.tcp_congestion_control;
    tcp.advertise = options.tcp_advertise;
    tcp.require_hello_secret = options.require_hello_secret;
    return std::unique_ptr<ShardListener>(std::make_unique<TcpListener>(tcp));
  }
  GrpcListenerOptions grpc;
  grpc.host = options.host;
  grpc.port = options.port;
  grpc.credentials = options.credentials;
  grpc.job_token = options.job_token;
  grpc.store = options.store;
  grpc.services = options.grpc_services;
  grpc.find_listener = options.find_listener;
  grpc.limits = options.grpc_limits;
  return std::unique_ptr<ShardListener>(std::make_unique<GrpcListener>(std::move(grpc)));
}

ShardListenerLookup MakeShardListenerLookup(
    const std::vector<std::unique_ptr<ShardListener>>* listeners) {
  return [listeners](absl::string_view name) -> absl::StatusOr<ShardListener*> {
    if (!CheckShardListenerName(name).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown transport '", name, "'"));
    }
    for (const auto& listener : *listeners) {
      if (listener->name() == name) return listener.get();
    }
    return absl::FailedPreconditionError(absl::StrCat("shard was started without --", name));
  };
}

}  // namespace harrier
