#include "server/grpc/health_service.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/method_handler.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace harrier {
namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr char kWatchMethod[] = "/grpc.health.v1.Health/Watch";
// How often a Watch stream with nothing to send looks whether its client
// is still there.
constexpr absl::Duration kWatchPoll = absl::Seconds(1);

// HealthCheckRequest { string service = 1; } from its wire bytes.
grpc::Status ParseRequest(const grpc::ByteBuffer& request, std::string* service) {
  std::vector<grpc::Slice> slices;
  if (!request.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unreadable HealthCheckRequest");
  }
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  service->clear();
  while (uint32_t tag = in.ReadTag()) {
    const uint32_t field = tag >> 3, wire_type = tag & 7;
    bool read = false;
    if (field == 1 && wire_type == 2) {
      uint32_t length = 0;
      read = in.ReadVarint32(&length);
      if (read && length > HealthService::kMaxServiceNameBytes) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("service name of ", length, " bytes; at most ",
                                         HealthService::kMaxServiceNameBytes));
      }
      read = read && in.ReadString(service, static_cast<int>(length));
    } else if (wire_type == 0) {
      uint64_t ignored;
      read = in.ReadVarint64(&ignored);
    } else if (wire_type == 1) {
      uint64_t ignored;
      read = in.ReadLittleEndian64(&ignored);
    } else if (wire_type == 5) {
      uint32_t ignored;
      read = in.ReadLittleEndian32(&ignored);
    } else if (wire_type == 2) {
      uint32_t length = 0;
      read = in.ReadVarint32(&length) && in.Skip(static_cast<int>(length));
    }
    if (!read) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed HealthCheckRequest");
    }
  }
  return grpc::Status::OK;
}

// HealthCheckResponse { ServingStatus status = 1; } as wire bytes.
grpc::ByteBuffer Response(uint32_t status) {
  const char bytes[2] = {0x08, static_cast<char>(status)};
  grpc::Slice slice(bytes, sizeof(bytes));
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

HealthService::HealthService(int max_watches) : max_watches_(std::max(1, max_watches)) {
  serving_[""] = true;  // as gRPC's own: the server is SERVING until told otherwise
  AddMethod(new grpc::internal::RpcServiceMethod(
      kCheckMethod, grpc::internal::RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<HealthService, grpc::ByteBuffer, grpc::ByteBuffer,
                                           grpc::ByteBuffer, grpc::ByteBuffer>(
          std::mem_fn(&HealthService::Check), this)));
  AddMethod(new grpc::internal::RpcServiceMethod(
      kWatchMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
      new grpc::internal::ServerStreamingHandler<HealthService, grpc::ByteBuffer,
                                                 grpc::ByteBuffer>(
          std::mem_fn(&HealthService::Watch), this)));
}

void HealthService::Install(grpc::ServerBuilder& builder, int max_watches) {
  auto service = std::make_unique<HealthService>(max_watches);
  builder.RegisterService(service.get());
  builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(
      std::unique_ptr<grpc::HealthCheckServiceInterface>(std::move(service))));
}

void HealthService::SetServingStatus(const std::string& service_name, bool serving) {
  absl::MutexLock lock(&mutex_);
  if (shut_down_) return;
  serving_[service_name] = serving;
  ++version_;
}

void HealthService::SetServingStatus(bool serving) {
  absl::MutexLock lock(&mutex_);
  if (shut_down_) return;
  for (auto& [name, state] : serving_) state = serving;
  ++version_;
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mutex_);
  if (shut_down_) return;
  for (auto& [name, state] : serving_) state = false;
  shut_down_ = true;
  ++version_;
}

uint32_t HealthService::StatusLocked(const std::string& service) const {
  auto it = serving_.find(service);
  if (it == serving_.end()) return kServiceUnknown;
  return it->second ? kServing : kNotServing;
}

grpc::Status HealthService::Check(grpc::ServerContext*, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) {
  std::string service;
  if (grpc::Status parsed = ParseRequest(*request, &service); !parsed.ok()) return parsed;
  uint32_t status;
  {
    absl::MutexLock lock(&mutex_);
    status = StatusLocked(service);
  }
  if (status == kServiceUnknown) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown service '", service, "'"));
  }
  *response = Response(status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                                  grpc::ServerWriter<grpc::ByteBuffer>* writer) {
  std::string service;
  if (grpc::Status parsed = ParseRequest(*request, &service); !parsed.ok()) return parsed;
  {
    absl::MutexLock lock(&mutex_);
    if (watches_ >= max_watches_) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("this server serves at most ", max_watches_,
                       " health Watch streams at once (--max_health_watches); use Check, or "
                       "watch again once one has ended"));
    }
    ++watches_;
  }
  absl::Cleanup watch_ended = [this] {
    absl::MutexLock lock(&mutex_);
    --watches_;
  };
  uint64_t seen = 0;
  bool first = true;
  uint32_t sent = kUnknown;
  while (!context->IsCancelled()) {
    uint32_t status;
    {
      absl::MutexLock lock(&mutex_);
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return version_ != seen;
      };
      if (!first) mutex_.AwaitWithTimeout(absl::Condition(&changed), kWatchPoll);
      seen = version_;
      status = StatusLocked(service);
    }
    if (first || status != sent) {
      if (!writer->Write(Response(status))) break;  // the client went away
      sent = status;
      first = false;
    }
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "the watch ended");
}

}  // namespace harrier
