#include "server/admin_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/request_limits.h"

namespace harrier {

AdminServiceImpl::AdminServiceImpl(AdminHooks hooks, std::string job_token)
    : hooks_(std::move(hooks)), token_check_(std::move(job_token)) {}

grpc::Status AdminServiceImpl::GetStatus(grpc::ServerContext* context,
                                         const proto::StatusRequest* request,
                                         proto::StatusResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  if (!hooks_.status) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this shard reports no status");
  }
  *response = hooks_.status();
  if (request->include_tensors() && hooks_.tensors) hooks_.tensors(response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Checkpoint(grpc::ServerContext* context,
                                          const proto::CheckpointRequest*,
                                          proto::CheckpointResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  if (!hooks_.checkpoint) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this shard writes no checkpoints (no --checkpoint_dir)");
  }
  auto written = hooks_.checkpoint();
  if (!written.ok()) return ToGrpcStatus(written.status());
  *response = *std::move(written);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Shutdown(grpc::ServerContext* context,
                                        const proto::ShutdownRequest* request,
                                        proto::ShutdownResponse*) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  if (!hooks_.shutdown) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this shard cannot be shut down remotely");
  }
  if (auto status = CheckShutdownLimits(*request); !status.ok()) return ToGrpcStatus(status);
  hooks_.shutdown(request->reason());
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Probe(grpc::ServerContext* context,
                                     const proto::ProbeRequest* request,
                                     proto::ProbeResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  if (request->payload().size() > kMaxProbeBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("probe payload of ", request->payload().size(),
                                     " bytes is over the limit of ", kMaxProbeBytes,
                                     " bytes (64 MiB)"));
  }
  if (request->reply_bytes() > kMaxProbeBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("probe reply_bytes ", request->reply_bytes(),
                                     " is over the limit of ", kMaxProbeBytes, " bytes (64 MiB)"));
  }
  response->mutable_payload()->assign(request->reply_bytes(), '\0');
  return grpc::Status::OK;
}

}  // namespace harrier
