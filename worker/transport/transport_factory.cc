#include "worker/transport/transport_factory.h"

#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/fallback_transport.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/tcp/tcp_transport.h"
#include "worker/transport/timer_thread.h"
#include "worker/transport/ucx/ucx_transport.h"

namespace harrier {

absl::Status CheckTransportName(absl::string_view backend) {
  if (backend == "auto" || backend == "grpc" || backend == "ucx" || backend == "tcp") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", backend, "' (auto, grpc, tcp or ucx)"));
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

// `known`: an address and secret already asked for, used by the first
// connect (a secret serves one hello; asking again would waste it).
// `withdrawn` (may be null) is set once the shard answers that it no longer
// serves tcp (FAILED_PRECONDITION: restarted with --tcp=false).
absl::StatusOr<std::unique_ptr<ShardTransport>> ConnectTcp(
    const ShardLink& link, std::shared_ptr<TimerThread> timer, absl::Time deadline,
    std::optional<transport::PeerAddress> known = std::nullopt,
    std::shared_ptr<std::atomic<bool>> withdrawn = nullptr) {
  struct Known {
    absl::Mutex mu;
    std::optional<transport::PeerAddress> address ABSL_GUARDED_BY(mu);
  };
  auto first = std::make_shared<Known>();
  {
    absl::MutexLock lock(&first->mu);
    first->address = std::move(known);
  }
  TcpAddressProvider provider =
      [address_of = link.address, target = link.target, first,
       withdrawn](absl::Time address_deadline) -> absl::StatusOr<transport::PeerAddress> {
    std::optional<transport::PeerAddress> taken;
    {
      absl::MutexLock lock(&first->mu);
      taken.swap(first->address);
    }
    absl::StatusOr<transport::PeerAddress> address;
    if (taken.has_value()) {
      address = std::move(*taken);
    } else {
      address = address_of("tcp", address_deadline);
    }
    if (withdrawn != nullptr && absl::IsFailedPrecondition(address.status())) {
      withdrawn->store(true, std::memory_order_release);
    }
    if (!address.ok()) return address.status();
    address->address = WithHost(address->address, target);
    return address;
  };
  return TcpShardTransport::Connect(link.name, std::move(provider), std::move(timer), deadline,
                                    link.tcp_congestion_control);
}

// The gRPC data path's shared parts, made when the first shard needs them
// (under "auto", possibly later and on any caller's thread).
struct GrpcParts {
  absl::Mutex mutex;
  std::shared_ptr<TimerThread> timer ABSL_GUARDED_BY(mutex);
  std::shared_ptr<ClientCallQueue> calls ABSL_GUARDED_BY(mutex);

  std::unique_ptr<ShardTransport> Make(const ShardLink& link) {
    absl::MutexLock lock(&mutex);
    // One timer thread and one completion queue for every shard's calls.
    if (timer == nullptr) timer = std::make_shared<TimerThread>("grpc-transport");
    if (calls == nullptr) calls = std::make_shared<ClientCallQueue>("grpc-calls");
    std::vector<std::shared_ptr<grpc::Channel>> channels = {link.channel};
    channels.insert(channels.end(), link.extra_channels.begin(), link.extra_channels.end());
    return std::make_unique<GrpcShardTransport>(std::move(channels),
                                                GrpcShardTransport::kDefaultSpreadMinBytes, timer,
                                                link.pull_channel, calls);
  }
};

// "auto": the tcp data path where the shard serves it and the control
// channel is plaintext; gRPC where the channel is TLS (tcp is not
// encrypted, so turning TLS on never sends parameters in the clear) or the
// shard was started with --tcp=false. Decided per shard when the client
// connects, and again should a shard on tcp restart without it: its calls
// then go over gRPC (FallbackShardTransport).
absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> CreateAuto(
    const std::vector<ShardLink>& links, absl::Time deadline) {
  std::shared_ptr<TimerThread> tcp_timer;
  // Shared with the fallbacks, which may make gRPC transports later.
  auto grpc_parts = std::make_shared<GrpcParts>();
  GrpcParts& grpc = *grpc_parts;
  std::vector<std::unique_ptr<ShardTransport>> transports;
  for (const ShardLink& link : links) {
    if (!link.encrypted) {
      auto served = link.address("tcp", deadline);
      if (served.ok()) {
        if (tcp_timer == nullptr) tcp_timer = std::make_shared<TimerThread>("tcp-transport");
        auto withdrawn = std::make_shared<std::atomic<bool>>(false);
        auto transport = ConnectTcp(link, tcp_timer, deadline, std::move(*served), withdrawn);
        if (!transport.ok()) return transport.status();
        transports.push_back(std::make_unique<FallbackShardTransport>(
            link.name, std::move(*transport),
            [withdrawn] { return withdrawn->load(std::memory_order_acquire); },
            [grpc_parts, link] { return grpc_parts->Make(link); }));
        continue;
      }
      // FAILED_PRECONDITION: the shard does not serve tcp. Anything else
      // (unreachable, refused) would fail the gRPC path too: say it now.
      if (!absl::IsFailedPrecondition(served.status())) return served.status();
    }
    transports.push_back(grpc.Make(link));
  }
  return transports;
}

absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> CreateTcp(
    const std::vector<ShardLink>& links, absl::Time deadline) {
  // One timer thread for every shard's deadlines.
  auto timer = std::make_shared<TimerThread>("tcp-transport");
  std::vector<std::unique_ptr<ShardTransport>> transports;
  for (const ShardLink& link : links) {
    auto transport = ConnectTcp(link, timer, deadline);
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
  if (backend == "auto") return CreateAuto(links, deadline);
  GrpcParts grpc;
  std::vector<std::unique_ptr<ShardTransport>> transports;
  for (const ShardLink& link : links) transports.push_back(grpc.Make(link));
  return transports;
}

}  // namespace harrier
