#include "worker/transport/transport_factory.h"

#include "absl/strings/str_cat.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/tcp/tcp_transport.h"
#include "worker/transport/timer_thread.h"
#include "worker/transport/ucx/ucx_transport.h"

namespace harrier {

absl::Status CheckTransportName(absl::string_view backend) {
  if (backend == "grpc" || backend == "ucx" || backend == "tcp") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", backend, "' (grpc, tcp or ucx)"));
}

namespace {

absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> CreateUcx(
    const std::string& client_name, const std::vector<ShardLink>& links, absl::Time deadline) {
  // One UCX worker for all shards; each shard's address comes over gRPC.
  auto context = UcxClientContext::Create(client_name);
  if (!context.ok()) return context.status();
  std::vector<std::unique_ptr<ShardTransport>> transports;
  for (const ShardLink& link : links) {
    auto address = link.address("ucx", deadline);
    if (!address.ok()) return address.status();
    auto transport =
        UcxClientContext::Connect(*context, link.name, *address, deadline, link.reachable,
                                  [address_of = link.address](absl::Time address_deadline) {
                                    return address_of("ucx", address_deadline);
                                  });
    if (!transport.ok()) return transport.status();
    transports.push_back(std::move(*transport));
  }
  return transports;
}

// "host:port" of a listener address that may leave the host out (":port":
// bound to every interface), completed with the host of the shard's gRPC
// address.
std::string WithHost(const std::string& address, const std::string& target) {
  if (address.empty() || address.front() != ':') return address;
  const size_t colon = target.rfind(':');
  return (colon == std::string::npos ? target : target.substr(0, colon)) + address;
}

absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> CreateTcp(
    const std::vector<ShardLink>& links, absl::Time deadline) {
  // One timer thread for every shard's deadlines.
  auto timer = std::make_shared<TimerThread>("tcp-transport");
  std::vector<std::unique_ptr<ShardTransport>> transports;
  for (const ShardLink& link : links) {
    TcpAddressProvider provider =
        [address_of = link.address, target = link.target](
            absl::Time address_deadline) -> absl::StatusOr<transport::PeerAddress> {
      auto address = address_of("tcp", address_deadline);
      if (!address.ok()) return address.status();
      address->address = WithHost(address->address, target);
      return address;
    };
    auto transport = TcpShardTransport::Connect(link.name, std::move(provider), timer, deadline);
    if (!transport.ok()) return transport.status();
    transports.push_back(std::move(*transport));
  }
  return transports;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> CreateShardTransports(
    absl::string_view backend, const std::string& client_name, const std::vector<ShardLink>& links,
    absl::Time deadline) {
  if (auto status = CheckTransportName(backend); !status.ok()) return status;
  if (backend == "ucx") return CreateUcx(client_name, links, deadline);
  if (backend == "tcp") return CreateTcp(links, deadline);
  std::vector<std::unique_ptr<ShardTransport>> transports;
  // One timer thread and one completion queue for every shard's calls.
  auto timer = std::make_shared<TimerThread>("grpc-transport");
  auto calls = std::make_shared<ClientCallQueue>("grpc-calls");
  for (const ShardLink& link : links) {
    std::vector<std::shared_ptr<grpc::Channel>> channels = {link.channel};
    channels.insert(channels.end(), link.extra_channels.begin(), link.extra_channels.end());
    transports.push_back(std::make_unique<GrpcShardTransport>(
        std::move(channels), GrpcShardTransport::kDefaultSpreadMinBytes, timer,
        link.pull_channel, calls));
  }
  return transports;
}

}  // namespace harrier
