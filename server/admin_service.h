#ifndef HARRIER_SERVER_ADMIN_SERVICE_H_
#define HARRIER_SERVER_ADMIN_SERVICE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "server/job_token.h"
#include "server/memory_account.h"

namespace harrier {

// What the AdminService asks of the shard it runs on. The service knows
// nothing of ShardServer: tests (and other hosts) plug in what they have.
// A hook left empty answers UNIMPLEMENTED (checkpoint: FAILED_PRECONDITION).
struct AdminHooks {
  // A snapshot of the shard (StatusResponse's comments say what each field
  // means). Called on gRPC's thread; must not block for long.
  std::function<proto::StatusResponse()> status;
  // The tensors the shard holds, appended to a status response when the
  // request asks (StatusRequest.include_tensors). Empty: none listed.
  std::function<void(proto::StatusResponse*)> tensors;
  // Writes a checkpoint now and says which; FAILED_PRECONDITION without a
  // checkpoint dir.
  std::function<absl::StatusOr<proto::CheckpointResponse>()> checkpoint;
  // Asks the process to stop (final checkpoint, exit 0). Must return at
  // once: the call is answered before the process stops.
  std::function<void(const std::string& reason)> shutdown;
};

namespace internal_admin_service {
using AS = proto::AdminService;
// Streamed unary (server/streamed_unary.h): the token is checked at the
// headers, before a request body is read.
using StreamedAdminService = AS::WithStreamedUnaryMethod_GetStatus<
    AS::WithStreamedUnaryMethod_Checkpoint<AS::WithStreamedUnaryMethod_Shutdown<
        AS::WithStreamedUnaryMethod_Probe<AS::Service>>>>;
}  // namespace internal_admin_service

// The operator's service (harrier-ctl), on every shard. With a job token
// every call must carry it (the check runs at the call's headers, before
// its request is read, so a refused call changes and holds nothing).
// Thread-safe as far as the hooks are.
class AdminServiceImpl final : public internal_admin_service::StreamedAdminService {
 public:
  // `probe_budget` (not owned; null: not charged) holds each Probe's
  // payload and reply while the call is in flight.
  AdminServiceImpl(AdminHooks hooks, std::string job_token, NamedBudget* probe_budget = nullptr);

  template <class Request, class Response>
  using Streamer = grpc::ServerUnaryStreamer<Request, Response>;
  grpc::Status StreamedGetStatus(
      grpc::ServerContext* context,
      Streamer<proto::StatusRequest, proto::StatusResponse>* streamer) override;
  grpc::Status StreamedCheckpoint(
      grpc::ServerContext* context,
      Streamer<proto::CheckpointRequest, proto::CheckpointResponse>* streamer) override;
  grpc::Status StreamedShutdown(
      grpc::ServerContext* context,
      Streamer<proto::ShutdownRequest, proto::ShutdownResponse>* streamer) override;
  // Token-checked; the payload is dropped unread and reply_bytes zero
  // bytes come back (at most kMaxProbeReplyBytes). Payload and reply are
  // charged to the probe budget until the reply is sent (a client that
  // does not read holds them): RESOURCE_EXHAUSTED naming
  // --max_probe_bytes_in_flight when full. No hook: it never touches the
  // shard's state.
  grpc::Status StreamedProbe(grpc::ServerContext* context,
                             Streamer<proto::ProbeRequest, proto::ProbeResponse>* streamer) override;

 private:
  const AdminHooks hooks_;
  const JobTokenCheck token_check_;
  NamedBudget* const probe_budget_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_ADMIN_SERVICE_H_
