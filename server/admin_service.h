#ifndef HARRIER_SERVER_ADMIN_SERVICE_H_
#define HARRIER_SERVER_ADMIN_SERVICE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "server/job_token.h"

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

// The operator's service (harrier-ctl), on every shard. With a job token
// every call must carry it (the check runs first, so a refused call
// changes nothing). Thread-safe as far as the hooks are.
class AdminServiceImpl final : public proto::AdminService::Service {
 public:
  AdminServiceImpl(AdminHooks hooks, std::string job_token);

  grpc::Status GetStatus(grpc::ServerContext* context, const proto::StatusRequest* request,
                         proto::StatusResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const proto::CheckpointRequest* request,
                          proto::CheckpointResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const proto::ShutdownRequest* request,
                        proto::ShutdownResponse* response) override;
  // Token-checked; the payload is dropped unread and reply_bytes zero
  // bytes come back. No hook: it never touches the shard's state.
  grpc::Status Probe(grpc::ServerContext* context, const proto::ProbeRequest* request,
                     proto::ProbeResponse* response) override;

 private:
  const AdminHooks hooks_;
  const JobTokenCheck token_check_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_ADMIN_SERVICE_H_
