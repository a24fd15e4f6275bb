#include "server/admin_service.h"

#include <arpa/inet.h>

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/grpc_status.h"
#include "common/request_limits.h"
#include "server/streamed_unary.h"

namespace harrier {

bool IsLoopbackPeer(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) return true;
  std::string host;
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    const size_t colon = peer.rfind(':');
    host = std::string(peer.substr(0, colon));
  } else if (absl::ConsumePrefix(&peer, "ipv6:")) {
    // gRPC writes the brackets percent-encoded in newer releases.
    const std::string decoded =
        absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}});
    const size_t open = decoded.find('[');
    const size_t close = decoded.find(']');
    if (open != 0 || close == std::string::npos) return false;
    host = decoded.substr(1, close - 1);
    // A zone ("fe80::1%eth0") is never loopback's.
    if (host.find('%') != std::string::npos) return false;
  } else {
    return false;
  }
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  // A dual-stack listener sees IPv4 callers as ::ffff:a.b.c.d.
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

AdminServiceImpl::AdminServiceImpl(AdminHooks hooks, AdminAccess access, NamedBudget* probe_budget)
    : hooks_(std::move(hooks)),
      access_(std::move(access)),
      token_check_(access_.job_token),
      probe_budget_(probe_budget) {}

grpc::Status AdminServiceImpl::CheckOperator(const grpc::ServerContext& context,
                                             absl::string_view call) const {
  if (auto status = token_check_.Check(context); !status.ok()) return status;
  if (!access_.job_token.empty() || access_.open) return grpc::Status::OK;
  const std::string peer = context.peer();
  if (IsLoopbackPeer(peer)) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat("AdminService.", call, " from ", peer,
                   " refused: this shard has no job token, so it serves admin calls only on its "
                   "own host (a loopback peer: 127.0.0.1 or ::1). Run harrier-ctl on the shard's "
                   "host against 127.0.0.1:<port>, or start the shards with --auth_token_file "
                   "(and give harrier-ctl the same file), or start them with --admin_open=true "
                   "to serve admin calls to any host that reaches the port"));
}

grpc::Status AdminServiceImpl::StreamedGetStatus(
    grpc::ServerContext* context,
    UnaryStreamer<proto::StatusRequest, proto::StatusResponse>* streamer) {
  if (auto status = CheckOperator(*context, "GetStatus"); !status.ok()) return status;
  return ServeAdmittedUnary(
      streamer, [this](const proto::StatusRequest& request, proto::StatusResponse* response) {
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
    UnaryStreamer<proto::CheckpointRequest, proto::CheckpointResponse>* streamer) {
  if (auto status = CheckOperator(*context, "Checkpoint"); !status.ok()) return status;
  return ServeAdmittedUnary(
      streamer, [this](const proto::CheckpointRequest&, proto::CheckpointResponse* response) {
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
    UnaryStreamer<proto::ShutdownRequest, proto::ShutdownResponse>* streamer) {
  if (auto status = CheckOperator(*context, "Shutdown"); !status.ok()) return status;
  return ServeAdmittedUnary(
      streamer, [this](const proto::ShutdownRequest& request, proto::ShutdownResponse*) {
        if (!hooks_.shutdown) {
          return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              "this shard cannot be shut down remotely");
        }
        if (auto status = CheckShutdownLimits(request); !status.ok()) {
          return ToGrpcStatus(status);
        }
        hooks_.shutdown(request.reason());
        return grpc::Status::OK;
      });
}

grpc::Status AdminServiceImpl::StreamedNewRun(
    grpc::ServerContext* context,
    UnaryStreamer<proto::NewRunRequest, proto::NewRunResponse>* streamer) {
  if (auto status = CheckOperator(*context, "NewRun"); !status.ok()) return status;
  return ServeAdmittedUnary(
      streamer, [this](const proto::NewRunRequest& request, proto::NewRunResponse* response) {
        if (!hooks_.new_run) {
          return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this shard cannot change its run");
        }
        auto changed = hooks_.new_run(request);
        if (!changed.ok()) return ToGrpcStatus(changed.status());
        *response = *std::move(changed);
        return grpc::Status::OK;
      });
}

grpc::Status AdminServiceImpl::StreamedProbe(
    grpc::ServerContext* context,
    UnaryStreamer<proto::ProbeRequest, proto::ProbeResponse>* streamer) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  proto::ProbeRequest request;
  if (!streamer->Read(&request)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the request message did not arrive");
  }
  if (request.payload().size() > kMaxProbeBytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("probe payload of ", request.payload().size(), " bytes is over the limit of ",
                     kMaxProbeBytes, " bytes (64 MiB)"));
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
