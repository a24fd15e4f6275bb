#ifndef HARRIER_SERVER_SHARD_SERVER_H_
#define HARRIER_SERVER_SHARD_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_security.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http_server.h"
#include "common/transport/stream.h"
#include "server/admin_service.h"
#include "server/checkpoint.h"
#include "server/consistency.h"
#include "server/control_service.h"
#include "server/optimizer.h"
#include "server/shard_listener.h"
#include "server/shard_service.h"
#include "server/shard_store.h"

namespace harrier {

struct ShardServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the kernel picks one; see ShardServer::port()
  // The shard, the job's shape and rules, and what a job may Init here.
  ShardStoreOptions store;
  // The request path's pools and byte limits, shared by every listener
  // (its histograms are the server's own).
  ShardServiceOptions service;
  // The gRPC library's own memory, threads and streams (shard_listener.h).
  GrpcServerLimits grpc_limits;
  OptimizerOptions optimizer;
  std::vector<std::string> shard_addresses;  // optional, for GetShardMap
  WorkerLossPolicy on_worker_loss = WorkerLossPolicy::kFail;
  // A worker that heartbeated once and then is silent this long is lost.
  std::chrono::milliseconds heartbeat_timeout{10000};
  // Also serve pushes and pulls over UCX active messages (server/ucx/);
  // clients get the address from GetTransportAddress.
  bool ucx = false;
  // Also serve pushes and pulls over plain TCP streams (server/tcp/), on
  // tcp_port (0: the kernel picks one); clients get the address from
  // GetTransportAddress. On by default: it is the data path clients pick
  // by default (ClientOptions::transport "auto") when they have no TLS.
  bool tcp = true;
  int tcp_port = 0;
  // Congestion control of the tcp data path's connections: the first of
  // these names the kernel lets this process set ("" keeps the kernel's
  // default; common/transport/stream.h, SetCongestionControl).
  std::string tcp_congestion_control = std::string(transport::kDefaultCongestionControl);
  // "host:port" clients are told to reach the tcp data path at, when it is
  // not the bound address (a proxy, a forwarded port); "": the bound one.
  std::string tcp_advertise;
  // Checkpoints: restored from on start, written every checkpoint_every
  // (zero: only at shutdown) and at graceful shutdown. Empty dir: none.
  std::string checkpoint_dir;
  std::chrono::milliseconds checkpoint_every{0};
  int checkpoint_keep = 3;
  // Every N-th checkpoint is complete; those between are incremental (sparse
  // tables' changed rows only). 1: every checkpoint complete.
  int checkpoint_full_every = 1;
  // Prometheus /metrics and /healthz over HTTP; -1 disables, 0 = ephemeral.
  int metrics_port = -1;
  // gRPC transport security (common/grpc_security.h): cert + key serve
  // TLS, with ca as well every client must present a certificate of that CA.
  TlsFiles tls;
  // Non-empty: every call of every service except health must carry it.
  // Session credentials are keyed from it (server/session.h).
  std::string job_token;
  // The job every message must name (--job); the workers' --job.
  std::string job = kDefaultJob;
  // grpc.health.v1 alone, plaintext and without a token, on this port too
  // (-1 off, 0 ephemeral): for probes that cannot do TLS or send a token.
  int health_port = -1;
  // Job lifecycle (server/README.md, "Job lifecycle"). resume: continue the
  // newest run checkpointed in checkpoint_dir (its job id, its clocks);
  // false: a fresh run, older runs' checkpoints kept aside, never applied.
  bool resume = false;
  // Once every rank is done (its worker exited, or was lost), the shard
  // writes a final checkpoint and requests shutdown (RequestShutdown, exit
  // code 0, or 1 when a lost worker failed the job). false: the next
  // Register starts a new run.
  bool exit_when_done = false;
  // A Register for a rank whose session has been silent this long replaces
  // that session (a restarted worker rejoins); at most heartbeat_timeout.
  std::chrono::milliseconds rejoin_after{3000};
  // Without a job token, serve admin calls (AdminService) to any peer, not
  // only to callers on this host (loopback); --admin_open.
  bool admin_open = false;
};

// One shard: a ShardStore behind one ShardService, reached through its
// listeners (shard_listener.h): gRPC, which also serves the ControlService
// on shard 0, the AdminService and grpc.health.v1, and with options.ucx UCX.
// Several may run in one process (tests do). Thread-safe.
class ShardServer {
 public:
  // Validates the options, binds the port and starts serving.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(const ShardServerOptions& options);
  ~ShardServer();

  int port() const { return port_; }
  // The bound health-only port, or -1 when disabled.
  int health_port() const { return health_server_ ? health_port_ : -1; }
  // The bound metrics port, or -1 when disabled.
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }
  // The version the shard was restored from (0: started empty).
  uint64_t restored_version() const { return restored_version_; }
  ShardStore& store() { return *store_; }

  // Stops accepting calls, wakes blocked pulls and barriers, lets in-flight
  // calls finish until `grace` has passed, then cancels the rest.
  void Shutdown(std::chrono::milliseconds grace);

  // Writes a checkpoint now (no-op without a checkpoint dir).
  absl::Status WriteCheckpointNow();
  // The same, saying which it wrote (AdminService.Checkpoint); `written`
  // is left alone without a checkpoint dir. May be null.
  struct CheckpointWritten {
    uint64_t version = 0;
    std::string path;
  };
  absl::Status WriteCheckpointNow(CheckpointWritten* written);
  // Blocks until the server has shut down.
  void Wait();

  // Asks the process that runs the shard to stop: harrier-server polls
  // shutdown_request(), then calls Shutdown and Wait and exits with
  // `exit_code`. The first request wins; later ones are ignored. Made by
  // --exit_when_done and AdminService.Shutdown; a server in a test process
  // only records it.
  struct StopRequest {
    std::string reason;
    int exit_code = 0;
  };
  void RequestShutdown(std::string reason, int exit_code);
  std::optional<StopRequest> shutdown_request() const;

  // The run this shard serves (server/README.md, "Job lifecycle"); 0: none
  // yet (a shard other than 0 before the first call of a run).
  uint64_t job_id() const;

 private:
  ShardServer() = default;

  // Registers every metric and points `service_options` at the latency
  // histograms, so the ShardService has them from construction on (before
  // anything serves: no histogram is set on a running service).
  void RegisterMetrics(ShardServiceOptions* service_options);
  void MonitorLoop();
  // A job id above every one before it: wall-clock milliseconds, and above
  // `previous`.
  static uint64_t NewJobId(uint64_t previous);
  // Starts run `job_id` in the sessions (Issue stamps it, Verify checks it)
  // and the run's bookkeeping; the caller reset the store if need be.
  void BeginRunLocked(uint64_t job_id, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mutex_);
  // Shards other than 0: a verified call carries a newer run than this
  // shard's (SessionTable's newer-run handler). Adopted when this shard has
  // no run yet, or its run is done, or none of its ranks is live
  // (Membership::LiveRanks within heartbeat_timeout); else refused with
  // FAILED_PRECONDITION: a call to one shard alone never ends a run whose
  // workers are still at it (the operator can: NewRun).
  absl::Status AdoptRun(uint64_t job_id);
  // AdminService.NewRun: the operator ends the current run (its state
  // checkpointed first when there is a checkpoint dir) and starts, on
  // shard 0, a new one (`request.job_id` 0: a new id), or adopts, on the
  // others, shard 0's `request.job_id`.
  absl::StatusOr<proto::NewRunResponse> NewRunByOperator(const proto::NewRunRequest& request);
  // The monitor's check: once every rank is done (Membership::RunDone),
  // the final checkpoint, then shutdown (--exit_when_done) or, on shard 0,
  // a new run.
  void CheckRunDone();
  // Shard 0, before each Register: the next run starts once the last is done.
  void StartNextRunIfDone();
  // AdminService.GetStatus: what this shard holds and how it sees the job.
  proto::StatusResponse FillStatus() const;

  ShardServerOptions options_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  absl::Mutex checkpoint_mutex_;  // serialises checkpoint writes
  uint64_t next_checkpoint_version_ ABSL_GUARDED_BY(checkpoint_mutex_) = 1;
  // The version this process last wrote (0: none yet) and the incremental
  // ones written since the last complete one: an incremental checkpoint
  // builds only on one this process wrote, and after a failed write the
  // next is complete (the failed one's changes were taken).
  uint64_t last_written_version_ ABSL_GUARDED_BY(checkpoint_mutex_) = 0;
  int incremental_since_full_ ABSL_GUARDED_BY(checkpoint_mutex_) = 0;
  uint64_t restored_version_ = 0;
  // When the last checkpoint written (or the one restored) was made, Unix
  // milliseconds; 0: none yet.
  std::atomic<int64_t> last_checkpoint_unix_ms_{0};
  // The version of that checkpoint (0: none); read without
  // checkpoint_mutex_ so a status call never waits for a write.
  std::atomic<uint64_t> last_checkpoint_version_{0};
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::unique_ptr<ShardService> shard_service_;
  std::unique_ptr<ControlServiceImpl> control_service_;
  // In start order; the gRPC one, through which clients learn the others'
  // addresses, last. Not changed once the first has started.
  std::vector<std::unique_ptr<ShardListener>> listeners_;
  bool listening_ = false;  // every listener started
  absl::Notification stopped_;  // Shutdown has returned
  int port_ = 0;  // the gRPC listener's
  std::unique_ptr<grpc::Server> health_server_;  // null without options.health_port
  int health_port_ = 0;
  bool shut_down_ = false;
  // Liveness monitor: applies the worker-loss policy.
  // Serialises the run changes (start, adopt, done) with the final
  // checkpoint; taken before checkpoint_mutex_.
  mutable absl::Mutex run_mutex_ ABSL_ACQUIRED_BEFORE(checkpoint_mutex_);
  bool run_done_ ABSL_GUARDED_BY(run_mutex_) = false;
  mutable absl::Mutex stop_mutex_;
  std::optional<StopRequest> stop_request_ ABSL_GUARDED_BY(stop_mutex_);
  absl::Mutex monitor_mutex_;
  bool monitor_stop_ ABSL_GUARDED_BY(monitor_mutex_) = false;
  std::thread monitor_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_SERVER_H_
