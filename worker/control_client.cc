#include "worker/control_client.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_limits.h"
#include "common/grpc_security.h"
#include "common/grpc_status.h"
#include "proto/harrier.grpc.pb.h"

namespace harrier {
namespace {

// The deadline of each background heartbeat: short, so a dead shard does not
// delay the heartbeats of the live ones by a whole rpc_timeout.
constexpr absl::Duration kHeartbeatDeadline = absl::Seconds(2);
constexpr absl::Duration kProbeDeadline = absl::Seconds(1);

// Adds the job token to the metadata of every call made on a channel. An
// interceptor rather than call credentials: gRPC sends call credentials only
// over TLS, and the token must also work on plaintext channels.
class JobTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit JobTokenInterceptor(const std::string* token) : token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({std::string(kJobTokenMetadataKey), *token_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const token_;  // the factory's, which the channel owns
};

class JobTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit JobTokenInterceptorFactory(std::string token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new JobTokenInterceptor(&token_);
  }

 private:
  const std::string token_;
};

std::shared_ptr<grpc::Channel> OpenChannel(const std::string& target,
                                           const grpc::ChannelArguments& args,
                                           const ChannelSecurity& security) {
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      security.credentials ? security.credentials : grpc::InsecureChannelCredentials();
  if (security.job_token.empty()) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<JobTokenInterceptorFactory>(security.job_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

}  // namespace

struct GrpcControlClient::Shard {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<proto::ParameterService::Stub> parameters;
  std::unique_ptr<proto::ControlService::Stub> control;  // shard 0 only
};

GrpcControlClient::GrpcControlClient(std::vector<std::string> servers, absl::Duration rpc_timeout)
    : servers_(std::move(servers)), rpc_timeout_(rpc_timeout) {}

GrpcControlClient::~GrpcControlClient() = default;

absl::StatusOr<std::unique_ptr<GrpcControlClient>> GrpcControlClient::Connect(
    const std::vector<std::string>& servers, absl::Duration connect_timeout,
    absl::Duration rpc_timeout, const ChannelSecurity& security) {
  std::unique_ptr<GrpcControlClient> client(new GrpcControlClient(servers, rpc_timeout));
  client->security_ = security;
  const auto args = MakeChannelArguments();
  const absl::Time deadline = absl::Now() + connect_timeout;
  for (size_t i = 0; i < servers.size(); ++i) {
    auto shard = std::make_unique<Shard>();
    shard->channel = OpenChannel(servers[i], args, security);
    if (!shard->channel->WaitForConnected(absl::ToChronoTime(deadline))) {
      return absl::UnavailableError(absl::StrCat(
          "cannot connect to ", client->ShardName(static_cast<int>(i)), " within ",
          absl::FormatDuration(connect_timeout),
          security.credentials ? " (TLS: is the shard serving TLS, and does its certificate "
                                 "chain to --tls_ca and name this host?)"
                               : ""));
    }
    shard->parameters = proto::ParameterService::NewStub(shard->channel);
    if (i == 0) shard->control = proto::ControlService::NewStub(shard->channel);
    client->shards_.push_back(std::move(shard));
    if (auto status = client->CheckShardIndex(static_cast<int>(i)); !status.ok()) return status;
  }
  return client;
}

absl::Status GrpcControlClient::CheckShardIndex(int shard) {
  proto::ShardInfoRequest request;
  proto::ShardInfoResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  const grpc::Status status =
      shards_[shard]->parameters->GetShardInfo(&context, request, &response);
  // A shard from before GetShardInfo cannot say: nothing to check.
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) return absl::OkStatus();
  if (!status.ok()) {
    const absl::Status converted = FromGrpcStatus(status);
    return absl::Status(converted.code(),
                        absl::StrCat(ShardName(shard), ": ", converted.message()));
  }
  if (static_cast<int>(response.shard()) != shard) {
    return absl::InvalidArgumentError(absl::StrCat(
        servers_[shard], " is not shard ", shard, " (it says it is shard ", response.shard(),
        " of ", response.num_shards(), "): list --servers in shard order"));
  }
  if (static_cast<size_t>(response.num_shards()) != servers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--servers lists ", servers_.size(),
                                                   " shards but ", servers_[shard],
                                                   " says there are ", response.num_shards()));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> GrpcControlClient::channel(int shard) const {
  return shards_[shard]->channel;
}

std::shared_ptr<grpc::Channel> GrpcControlClient::OpenDataChannel(int shard, int index) const {
  auto args = MakeChannelArguments();
  args.SetInt("harrier.data_connection", index);
  return OpenChannel(servers_[shard], args, security_);
}

std::shared_ptr<grpc::Channel> GrpcControlClient::OpenPullChannel(int shard) const {
  auto args = MakeChannelArguments();
  args.SetInt("harrier.pull_connection", 1);
  return OpenChannel(servers_[shard], args, security_);
}

int GrpcControlClient::num_shards() const { return static_cast<int>(servers_.size()); }

std::string GrpcControlClient::ShardName(int shard) const {
  return absl::StrCat("shard ", shard, " (", servers_[shard], ")");
}

namespace {

// The one way every control RPC is made: a deadline on the context, and the
// shard's name in front of any error.
template <typename Rpc>
absl::Status Call(const ControlClient& client, int shard, absl::Time deadline, Rpc rpc) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  const grpc::Status status = rpc(&context);
  if (status.ok()) return absl::OkStatus();
  const absl::Status converted = FromGrpcStatus(status);
  return absl::Status(converted.code(),
                      absl::StrCat(client.ShardName(shard), ": ", converted.message()));
}

}  // namespace

absl::StatusOr<proto::RegisterResponse> GrpcControlClient::Register(
    const proto::RegisterRequest& request) {
  proto::RegisterResponse response;
  absl::Status status = Call(*this, 0, absl::Now() + rpc_timeout_, [&](grpc::ClientContext* c) {
    return shards_[0]->control->Register(c, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::Status GrpcControlClient::Barrier(const proto::BarrierRequest& request) {
  proto::BarrierResponse response;
  return Call(*this, 0, absl::Now() + rpc_timeout_, [&](grpc::ClientContext* c) {
    return shards_[0]->control->Barrier(c, request, &response);
  });
}

absl::Status GrpcControlClient::Heartbeat(const proto::HeartbeatRequest& request) {
  proto::HeartbeatResponse response;
  return Call(*this, 0, absl::Now() + rpc_timeout_, [&](grpc::ClientContext* c) {
    return shards_[0]->control->Heartbeat(c, request, &response);
  });
}

absl::Status GrpcControlClient::ReleaseSession(const proto::RegisterRequest& request,
                                               absl::Time deadline) {
  proto::RegisterResponse response;
  return Call(*this, 0, deadline, [&](grpc::ClientContext* c) {
    return shards_[0]->control->Register(c, request, &response);
  });
}

absl::Status GrpcControlClient::Init(int shard, const proto::InitRequest& request) {
  proto::InitResponse response;
  return Call(*this, shard, absl::Now() + rpc_timeout_, [&](grpc::ClientContext* c) {
    return shards_[shard]->parameters->Init(c, request, &response);
  });
}

absl::Status GrpcControlClient::Leave(int shard, const proto::LeaveRequest& request) {
  proto::LeaveResponse response;
  return Call(*this, shard, absl::Now() + rpc_timeout_, [&](grpc::ClientContext* c) {
    return shards_[shard]->parameters->Leave(c, request, &response);
  });
}

absl::Status GrpcControlClient::ShardHeartbeat(int shard, const proto::HeartbeatRequest& request,
                                               absl::Time deadline,
                                               proto::HeartbeatResponse* response) {
  proto::HeartbeatResponse ignored;
  if (response == nullptr) response = &ignored;
  return Call(*this, shard, deadline, [&](grpc::ClientContext* c) {
    return shards_[shard]->parameters->Heartbeat(c, request, response);
  });
}

absl::Status GrpcControlClient::ReleaseShard(int shard, const proto::LeaveRequest& request,
                                             absl::Time deadline) {
  proto::LeaveResponse response;
  return Call(*this, shard, deadline, [&](grpc::ClientContext* c) {
    return shards_[shard]->parameters->Leave(c, request, &response);
  });
}

absl::StatusOr<transport::PeerAddress> GrpcControlClient::GetTransportAddress(
    int shard, const std::string& transport, absl::Time deadline) {
  proto::TransportAddressRequest request;
  request.set_transport(transport);
  proto::TransportAddressResponse response;
  absl::Status status = Call(*this, shard, deadline, [&](grpc::ClientContext* c) {
    return shards_[shard]->parameters->GetTransportAddress(c, request, &response);
  });
  if (!status.ok()) return status;
  return transport::PeerAddress{response.address(), response.hello_secret()};
}

bool GrpcControlClient::ShardReachable(int shard) {
  // An empty transport name asks for nothing: the RPC has no side effect.
  return !absl::IsUnavailable(
      GetTransportAddress(shard, "", absl::Now() + kProbeDeadline).status());
}

HeartbeatLoop::HeartbeatLoop(ControlClient& control, absl::Duration interval,
                             std::function<proto::HeartbeatRequest(int shard)> request)
    : control_(control), interval_(interval), request_(std::move(request)) {
  thread_ = std::thread([this] { Run(); });
}

HeartbeatLoop::~HeartbeatLoop() {
  stop_.Notify();
  thread_.join();
}

void HeartbeatLoop::Run() {
  do {
    for (int shard = 0; shard < control_.num_shards() && !stop_.HasBeenNotified(); ++shard) {
      control_.ShardHeartbeat(shard, request_(shard), absl::Now() + kHeartbeatDeadline)
          .IgnoreError();
    }
  } while (!stop_.WaitForNotificationWithTimeout(interval_));
}

}  // namespace harrier
