#include "tests/transport/raw_ucx_client.h"

#include <grpcpp/grpcpp.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "proto/harrier.grpc.pb.h"

namespace harrier::testing {

absl::StatusOr<std::unique_ptr<RawUcxClient>> RawUcxClient::Connect(
    const std::string& grpc_address, const RawUcxHello& options) {
  auto stub = proto::ParameterService::NewStub(
      grpc::CreateChannel(grpc_address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!options.job_token.empty()) context.AddMetadata("harrier-job-token", options.job_token);
  proto::TransportAddressRequest request;
  request.set_transport("ucx");
  proto::TransportAddressResponse response;
  if (auto status = stub->GetTransportAddress(&context, request, &response); !status.ok()) {
    return absl::UnavailableError(absl::StrCat("GetTransportAddress: ", status.error_message()));
  }
  std::unique_ptr<RawUcxClient> client(new RawUcxClient());
  client->connection_id_ = std::random_device()() | (uint64_t{1} << 40);
  auto worker = transport::UcxWorker::Start(
      "raw-test-client", {{transport::kReplyAmId, &RawUcxClient::OnReply, client.get()}});
  if (!worker.ok()) return worker.status();
  client->worker_ = std::move(*worker);
  RawUcxClient* raw = client.get();
  // Shared with the posted task, which may outlive this call on a timeout.
  struct Connecting {
    absl::Notification done;
    absl::Status status;
  };
  auto connecting = std::make_shared<Connecting>();
  raw->worker_->Post([connecting, raw, address = response.address()] {
    bool detects_failure = false;
    auto ep = raw->worker_->Connect(address, &RawUcxClient::OnError, raw, &detects_failure);
    if (ep.ok()) raw->ep_ = *ep;
    connecting->status = ep.status();
    connecting->done.Notify();
  });
  if (!connecting->done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    return absl::DeadlineExceededError("the UCX connect did not finish within 10 s");
  }
  const absl::Status connected = connecting->status;
  if (!connected.ok()) return connected;
  transport::Frame hello;
  hello.op = transport::Op::kHello;
  hello.payload_bytes = client->worker_->address().size();
  const std::string secret = options.replace_secret ? options.secret : response.hello_secret();
  if (auto status = client->Call(hello, secret, client->worker_->address(), options.timeout);
      !status.ok()) {
    return status;
  }
  return client;
}

RawUcxClient::~RawUcxClient() {
  if (!worker_) return;
  worker_->Post([this] {
    if (ep_ != nullptr) worker_->CloseEndpoint(ep_);
    ep_ = nullptr;
  });
  worker_->Stop();
}

void RawUcxClient::Abandon() { worker_.reset(); }

uint64_t RawUcxClient::Send(transport::Frame frame, const std::string& body,
                            const std::string& data) {
  frame.connection_id = connection_id_;
  if (frame.op != transport::Op::kCancel && frame.request_id == 0) {
    frame.request_id = next_request_++;
  }
  std::string header = transport::EncodeHeader(frame, body);
  // `data` outlives the send: the caller waits for the reply, which the
  // shard sends only after it has received the data.
  worker_->Post([this, header = std::move(header), &data]() mutable {
    if (ep_ == nullptr) return;
    worker_->SendAm(ep_, transport::kRequestAmId, std::move(header), data.data(), data.size(),
                    [](ucs_status_t) {});
  });
  return frame.request_id;
}

bool RawUcxClient::AwaitReplyLocked(uint64_t id, absl::Duration timeout) {
  struct Arrived {
    RawUcxClient* client;
    uint64_t id;
    bool operator()() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(client->mutex_) {
      return client->replies_.count(id) > 0 || !client->failure_.ok();
    }
  };
  Arrived arrived{this, id};
  return mutex_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
}

absl::Status RawUcxClient::Await(uint64_t id, absl::Duration timeout) {
  absl::MutexLock lock(&mutex_);
  if (!AwaitReplyLocked(id, timeout)) return absl::DeadlineExceededError("no reply from the shard");
  if (replies_.count(id) == 0) return failure_;
  absl::Status status = replies_[id];
  replies_.erase(id);
  return status;
}

absl::Status RawUcxClient::Call(transport::Frame frame, const std::string& body,
                                const std::string& data, absl::Duration timeout) {
  return Await(Send(frame, body, data), timeout);
}

absl::Status RawUcxClient::CallAndCancel(transport::Frame frame, const std::string& body,
                                         const std::string& data, absl::Duration cancel_after,
                                         absl::Duration timeout) {
  const uint64_t id = Send(frame, body, data);
  bool replied = false;
  {
    absl::MutexLock lock(&mutex_);
    replied = AwaitReplyLocked(id, cancel_after);
  }
  if (replied) return Await(id, absl::ZeroDuration());
  transport::Frame cancel;
  cancel.op = transport::Op::kCancel;
  cancel.request_id = id;
  static const std::string kNoData;
  Send(cancel, "", kNoData);
  return Await(id, timeout);
}

ucs_status_t RawUcxClient::OnReply(void* arg, const void* header, size_t header_length, void*,
                                   size_t, const ucp_am_recv_param_t*) {
  auto* self = static_cast<RawUcxClient*>(arg);
  transport::Frame frame;
  absl::string_view body;
  if (!transport::DecodeHeader(header, header_length, &frame, &body).ok()) return UCS_OK;
  if (frame.op != transport::Op::kStatus) return UCS_OK;  // reply chunks: dropped
  absl::MutexLock lock(&self->mutex_);
  self->replies_[frame.request_id] = transport::DecodeStatus(frame, body);
  return UCS_OK;
}

void RawUcxClient::OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<RawUcxClient*>(arg);
  self->worker_->CloseEndpoint(ep);
  self->ep_ = nullptr;
  absl::MutexLock lock(&self->mutex_);
  self->failure_ = absl::UnavailableError(ucs_status_string(status));
}

}  // namespace harrier::testing
