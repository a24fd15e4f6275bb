#include "server/admin_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/streamed_unary.h"

namespace harrier {

AdminServiceImpl::AdminServiceImpl(AdminHooks hooks, std::string job_token,
                                   NamedBudget* probe_budget)
    : hooks_(std::move(hooks)), token_check_(std::move(job_token)), probe_budget_(probe_budget) {}

grpc::Status AdminServiceImpl::StreamedGetStatus(
    grpc::ServerContext* context, Streamer<proto::StatusRequest, proto::StatusResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this](const proto::StatusRequest& request, proto::StatusResponse* response) {
        if (!hooks_.status) {
          return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this shard reports no status");
        }
        *response = hooks_.status();
        if (request.include_tensors() && hooks_.tensors) hooks_.tensors(response);
        return grpc::Status::OK;
      });
}

grpc::Status AdminServiceImpl::StreamedCheckpoint(
    grpc::ServerContext* context,
    Streamer<proto::CheckpointRequest, proto::CheckpointResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this](const proto::CheckpointRequest&, proto::CheckpointResponse* response) {
        if (!hooks_.checkpoint) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this shard writes no checkpoints (no --checkpoint_dir)");
        }
        auto written = hooks_.checkpoint();
        if (!written.ok()) return ToGrpcStatus(written.status());
        *response = *std::move(written);
        return grpc::Status::OK;
      });
}

grpc::Status AdminServiceImpl::StreamedShutdown(
    grpc::ServerContext* context,
    Streamer<proto::ShutdownRequest, proto::ShutdownResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this](const proto::ShutdownRequest& request, proto::ShutdownResponse*) {
        if (!hooks_.shutdown) {
          return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              "this shard cannot be shut down remotely");
        }
        hooks_.shutdown(request.reason());
        return grpc::Status::OK;
      });
}

grpc::Status AdminServiceImpl::StreamedProbe(
    grpc::ServerContext* context, Streamer<proto::ProbeRequest, proto::ProbeResponse>* streamer) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  proto::ProbeRequest request;
  if (!streamer->Read(&request)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the request message did not arrive");
  }
  if (request.payload().size() > kMaxProbeBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("probe payload of ", request.payload().size(),
                                     " bytes is over the limit of ", kMaxProbeBytes,
                                     " bytes (64 MiB)"));
  }
  if (request.reply_bytes() > kMaxProbeReplyBytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("probe reply_bytes ", request.reply_bytes(), " is over the limit of ",
                     kMaxProbeReplyBytes, " bytes (8 MiB)"));
  }
  // Held until the reply is written: the request's payload, the reply
  // message and its serialised copy that gRPC sends from.
  const uint64_t held = request.payload().size() + 2 * request.reply_bytes();
  if (probe_budget_ != nullptr) {
    if (auto status = probe_budget_->Reserve(held); !status.ok()) return ToGrpcStatus(status);
  }
  request.clear_payload();
  proto::ProbeResponse response;
  response.mutable_payload()->assign(request.reply_bytes(), '\0');
  const bool written = streamer->Write(response);
  if (probe_budget_ != nullptr) probe_budget_->Release(held);
  if (!written) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  return grpc::Status::OK;
}

}  // namespace harrier
