#ifndef HARRIER_SERVER_ADMIN_SERVICE_H_
#define HARRIER_SERVER_ADMIN_SERVICE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "server/job_token.h"
#include "server/memory_account.h"
#include "server/streamed_unary.h"

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
  // The operator's run change (NewRunRequest): ends the run this shard
  // serves and starts (shard 0, job_id 0: a new id) or adopts (`job_id`)
  // the next one. Returns the job id now served and the one before.
  std::function<absl::StatusOr<proto::NewRunResponse>(const proto::NewRunRequest&)> new_run;
};

// Who may make admin calls. With a job token, whoever presents it (from any
// host). Without one, only callers on the shard's own host (a loopback
// peer: 127.0.0.0/8, ::1, or a unix socket), unless `open` says any peer
// may: on a shard without a token, anything that reaches the port could
// otherwise stop it, checkpoint it or read its job's layout.
struct AdminAccess {
  std::string job_token;
  bool open = false;  // --admin_open
};

// Whether a gRPC peer string (grpc::ServerContext::peer(): "ipv4:127.0.0.1:5",
// "ipv6:[::1]:5" or its percent-encoded form "ipv6:%5B::1%5D:5",
// "unix:/path") names a caller on this host: an IPv4 loopback address
// (127.0.0.0/8), ::1, an IPv4-mapped IPv6 loopback address, or a unix
// socket. Anything unparsable is not.
bool IsLoopbackPeer(absl::string_view peer);

namespace internal_admin_service {
using AS = proto::AdminService;
// Streamed unary (server/streamed_unary.h): the token is checked at the
// headers, before a request body is read.
using StreamedAdminService = AS::WithStreamedUnaryMethod_GetStatus<
    AS::WithStreamedUnaryMethod_Checkpoint<AS::WithStreamedUnaryMethod_Shutdown<
        AS::WithStreamedUnaryMethod_NewRun<AS::WithStreamedUnaryMethod_Probe<AS::Service>>>>>;
}  // namespace internal_admin_service

// The operator's service (harrier-ctl), on every shard. Every call but
// Probe is checked against `access` first, at the call's headers, before
// its request is read (with a job token every call must carry it:
// UNAUTHENTICATED; without one a peer that is not on this host is refused
// PERMISSION_DENIED naming --admin_open), so a refused call changes and
// holds nothing. Probe (harrier-advise measures the link from the worker
// hosts with it) needs the token when there is one and is served to any
// peer otherwise: it reads and changes nothing, and its replies are
// bounded and charged. Thread-safe as far as the hooks are.
class AdminServiceImpl final : public internal_admin_service::StreamedAdminService {
 public:
  // `probe_budget` (not owned; null: not charged) holds each Probe's
  // payload and reply while the call is in flight.
  AdminServiceImpl(AdminHooks hooks, AdminAccess access, NamedBudget* probe_budget = nullptr);

  grpc::Status StreamedGetStatus(
      grpc::ServerContext* context,
      UnaryStreamer<proto::StatusRequest, proto::StatusResponse>* streamer) override;
  grpc::Status StreamedCheckpoint(
      grpc::ServerContext* context,
      UnaryStreamer<proto::CheckpointRequest, proto::CheckpointResponse>* streamer) override;
  grpc::Status StreamedShutdown(
      grpc::ServerContext* context,
      UnaryStreamer<proto::ShutdownRequest, proto::ShutdownResponse>* streamer) override;
  grpc::Status StreamedNewRun(
      grpc::ServerContext* context,
      UnaryStreamer<proto::NewRunRequest, proto::NewRunResponse>* streamer) override;
  // Token-checked; the payload is dropped unread and reply_bytes zero
  // bytes come back (at most kMaxProbeReplyBytes). Payload and reply are
  // charged to the probe budget until the reply is sent (a client that
  // does not read holds them): RESOURCE_EXHAUSTED naming
  // --max_probe_bytes_in_flight when full. No hook: it never touches the
  // shard's state.
  grpc::Status StreamedProbe(
      grpc::ServerContext* context,
      UnaryStreamer<proto::ProbeRequest, proto::ProbeResponse>* streamer) override;

 private:
  // The token, then (without one) the caller's host; `call` names the
  // method in the refusal.
  grpc::Status CheckOperator(const grpc::ServerContext& context, absl::string_view call) const;

  const AdminHooks hooks_;
  const AdminAccess access_;
  const JobTokenCheck token_check_;
  NamedBudget* const probe_budget_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_ADMIN_SERVICE_H_
