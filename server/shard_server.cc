#include "server/shard_server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/request_limits.h"
#include "server/grpc/health_service.h"
#include "server/shard_listener_factory.h"
#include "spdlog/spdlog.h"

namespace harrier {
namespace {

// The --health_port server: threads beside its Watch streams' for Checks,
// and the bytes gRPC may buffer for all its connections (its messages are
// a few bytes each; this bounds what a flood of calls can make it hold).
constexpr int kHealthPortCheckThreads = 4;
constexpr size_t kHealthPortMemoryBytes = size_t{16} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(const ShardServerOptions& options) {
  if (options.store.num_shards < 1) return absl::InvalidArgumentError("--num_shards must be >= 1");
  if (options.store.shard < 0 || options.store.shard >= options.store.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard=", options.store.shard,
                     " out of range [0, --num_shards=", options.store.num_shards, ")"));
  }
  if (options.store.num_workers < 1)
    return absl::InvalidArgumentError("--num_workers must be >= 1");
  if (options.store.max_pending_rounds < 1) {
    return absl::InvalidArgumentError("--max_pending_rounds must be >= 1");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port=", options.port, " out of range"));
  }
  if (options.health_port < -1 || options.health_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--health_port=", options.health_port, " out of range"));
  }
  const GrpcServerLimits& grpc_limits = options.grpc_limits;
  if (grpc_limits.max_health_watches < 1 ||
      (grpc_limits.max_threads > 0 &&
       grpc_limits.max_health_watches > grpc_limits.max_threads / 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_health_watches=", grpc_limits.max_health_watches,
        ": at least 1 and at most half of --grpc_max_threads (", grpc_limits.max_threads,
        "), so Watch streams leave threads for the unary calls"));
  }
  auto optimizer = CreateOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  // Before anything is restored or bound: a bad certificate path fails fast.
  auto credentials = MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();

  std::unique_ptr<ShardServer> server(new ShardServer());
  server->options_ = options;
  server->store_ = std::make_unique<ShardStore>(options.store, std::move(*optimizer));
  // The run this shard starts with: a resumed one (its job id), a new one
  // (shard 0 of a fresh run), or none yet (other shards of a fresh run learn
  // it from the first call that carries it).
  uint64_t job_id = 0;
  uint64_t newest_job = 0;
  int64_t restored_unix_ms = 0;
  // The restored checkpoint's sessions, taken back once the run has begun
  // (BeginRunLocked forgets every session).
  std::vector<RankSessionCheckpoint> restored_sessions;
  uint64_t restored_epoch_floor = 0;
  if (!options.checkpoint_dir.empty()) {
    if (auto status = PrepareCheckpointDir(options.checkpoint_dir); !status.ok()) return status;
    if (auto legacy = ListCheckpointVersions(options.checkpoint_dir, options.store.shard);
        legacy.ok() && !legacy->empty()) {
      spdlog::warn(
          "{} holds checkpoints from before job ids; they are not restored (to resume them, "
          "move {} to {}/shard-{} and start with --resume)",
          CheckpointShardDir(options.checkpoint_dir, options.store.shard),
          CheckpointShardDir(options.checkpoint_dir, options.store.shard),
          CheckpointJobDir(options.checkpoint_dir, 1), options.store.shard);
    }
    const std::vector<uint64_t> jobs = ListCheckpointJobs(options.checkpoint_dir);
    if (!jobs.empty()) newest_job = jobs.back();
    if (options.resume) {
      for (auto it = jobs.rbegin(); it != jobs.rend() && job_id == 0; ++it) {
        const std::string job_dir = CheckpointJobDir(options.checkpoint_dir, *it);
        std::vector<std::string> warnings;
        auto checkpoint = LoadLatestCheckpoint(job_dir, options.store.shard, &warnings);
        for (const auto& warning : warnings) spdlog::warn("{}", warning);
        if (absl::IsNotFound(checkpoint.status())) continue;
        if (!checkpoint.ok()) {
          return absl::DataLossError(absl::StrCat("cannot restore shard ", options.store.shard,
                                                  " from ", job_dir, ": ",
                                                  checkpoint.status().message()));
        }
        if (auto status = server->store_->Import(*checkpoint); !status.ok()) {
          return absl::Status(status.code(),
                              absl::StrCat("cannot restore shard ", options.store.shard, " from ",
                                           job_dir, ": ", status.message()));
        }
        job_id = *it;
        server->restored_version_ = checkpoint->version;
        // The age gauge then shows the restored checkpoint's age: the state
        // served is that old, whatever the restart took.
        restored_unix_ms = checkpoint->created_unix_ms;
        restored_sessions = std::move(checkpoint->sessions);
        restored_epoch_floor = checkpoint->session_epoch_floor;
        absl::MutexLock lock(&server->checkpoint_mutex_);
        server->next_checkpoint_version_ = checkpoint->version + 1;
        spdlog::info(
            "event=restore shard={} version={} chunks={} age_seconds={:.3f} dir={} job_id={} "
            "session_ranks={}",
            options.store.shard, checkpoint->version, checkpoint->slots.size(),
            (absl::ToUnixMillis(absl::Now()) - checkpoint->created_unix_ms) / 1000.0, job_dir, *it,
            std::count_if(restored_sessions.begin(), restored_sessions.end(),
                          [](const RankSessionCheckpoint& session) { return session.epoch != 0; }));
      }
      if (job_id == 0) {
        spdlog::warn("--resume: no checkpoint of shard {} in {}: starting a fresh run",
                     options.store.shard, options.checkpoint_dir);
      }
    } else if (!jobs.empty()) {
      spdlog::info(
          "event=fresh_run shard={} kept_aside={} (earlier runs' checkpoints, not restored; "
          "--resume continues the newest)",
          options.store.shard, jobs.size());
    }
  }
  if (job_id == 0 && options.store.shard == 0) job_id = NewJobId(newest_job);
  ShardServiceOptions service_options = options.service;
  service_options.job = options.job;
  service_options.job_token = options.job_token;
  service_options.rejoin_after = std::min(options.rejoin_after, options.heartbeat_timeout);
  if (options.job_token.empty()) {
    spdlog::warn(
        "no job token (--auth_token_file): session credentials are keyed from the job name "
        "alone; they guard against mistakes (a wrong rank, a stale process of a restarted "
        "worker) but not against a hostile client; admin calls are served {}",
        options.admin_open ? "to any host (--admin_open)" : "only on this host (loopback)");
  }
  server->RegisterMetrics(&service_options);
  server->shard_service_ = std::make_unique<ShardService>(server->store_.get(), service_options);
  if (job_id != 0) {
    absl::MutexLock lock(&server->run_mutex_);
    server->BeginRunLocked(job_id, options.resume && server->restored_version_ > 0
                                       ? "resumed from its checkpoint"
                                       : "a fresh run");
    if (server->restored_version_ > 0) {
      // BeginRunLocked starts a run's versions at 1; a resumed run goes on.
      server->last_checkpoint_version_ = server->restored_version_;
      server->last_checkpoint_unix_ms_ = restored_unix_ms;
      absl::MutexLock checkpoint_lock(&server->checkpoint_mutex_);
      server->next_checkpoint_version_ = server->restored_version_ + 1;
      // The epochs the shard had seen: a stale process of a worker that
      // re-registered before the restart stays refused after it.
      SessionTable& sessions = server->shard_service_->sessions();
      sessions.RaiseEpochFloor(restored_epoch_floor);
      for (size_t rank = 0; rank < restored_sessions.size(); ++rank) {
        const RankSessionCheckpoint& saved = restored_sessions[rank];
        sessions.Restore(static_cast<uint32_t>(rank), saved.epoch, saved.released, saved.heard);
      }
    }
  }
  if (options.store.shard != 0) {
    ShardServer* raw = server.get();
    server->shard_service_->sessions().SetNewerRunHandler(
        [raw](uint64_t newer) { return raw->AdoptRun(newer); });
  }
  ShardListenerOptions listener_options;
  listener_options.shard = options.store.shard;
  listener_options.host = options.host;
  listener_options.port = options.port;
  listener_options.tcp_port = options.tcp_port;
  listener_options.tcp_congestion_control = options.tcp_congestion_control;
  listener_options.tcp_advertise = options.tcp_advertise;
  listener_options.credentials = *credentials;
  listener_options.job_token = options.job_token;
  listener_options.store = server->store_.get();
  listener_options.find_listener = MakeShardListenerLookup(&server->listeners_);
  // With a token or TLS the gRPC channel authenticates its clients; the
  // hello secret extends that to UCX endpoints. Without either, anyone
  // may call GetTransportAddress, so a secret would protect nothing.
  listener_options.grpc_limits = options.grpc_limits;
  listener_options.require_hello_secret = !options.job_token.empty() || options.tls.enabled();
  if (options.store.shard == 0) {
    ControlOptions control;
    control.num_workers = options.store.num_workers;
    control.sync = options.store.sync;
    control.optimizer = options.optimizer;
    if (options.store.sync.mode == SyncMode::kLocal) control.optimizer = OptimizerOptions{"delta"};
    control.shard_addresses = options.shard_addresses;
    control.job_token = options.job_token;
    control.job = options.job;
    control.max_chunk_clocks = options.store.max_chunks;
    control.sessions = &server->shard_service_->sessions();
    control.membership = &server->store_->membership();
    control.heartbeat_timeout = options.heartbeat_timeout;
    control.rejoin_after = std::min(options.rejoin_after, options.heartbeat_timeout);
    ShardServer* raw = server.get();
    control.before_register = [raw] { raw->StartNextRunIfDone(); };
    server->control_service_ = std::make_unique<ControlServiceImpl>(control);
    listener_options.grpc_services.push_back(server->control_service_.get());
  }
  {
    ShardServer* raw = server.get();
    AdminHooks admin;
    admin.status = [raw] { return raw->FillStatus(); };
    admin.tensors = [raw](proto::StatusResponse* response) {
      for (const ShardStore::TensorHeld& held : raw->store_->tensors_held()) {
        proto::TensorHeld* tensor = response->add_tensors();
        tensor->set_name(held.name);
        for (uint64_t d : held.shape) tensor->add_shape(d);
        tensor->set_chunks(held.chunks);
        tensor->set_elements(held.elements);
      }
    };
    admin.checkpoint = [raw]() -> absl::StatusOr<proto::CheckpointResponse> {
      if (raw->options_.checkpoint_dir.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("shard ", raw->options_.store.shard,
                         " has no --checkpoint_dir: there is nowhere to write a checkpoint"));
      }
      CheckpointWritten written;
      if (auto status = raw->WriteCheckpointNow(&written); !status.ok()) return status;
      proto::CheckpointResponse response;
      response.set_version(written.version);
      response.set_path(written.path);
      return response;
    };
    // Only recorded here: harrier-server's main loop stops the shard, after
    // this call has been answered.
    // The client's reason is logged (twice): cut short and escaped.
    admin.shutdown = [raw](const std::string& reason) {
      raw->RequestShutdown(absl::StrCat("AdminService.Shutdown: ", TruncatedForLog(reason)), 0);
    };
    admin.new_run = [raw](const proto::NewRunRequest& request) {
      return raw->NewRunByOperator(request);
    };
    AdminAccess access;
    access.job_token = options.job_token;
    access.open = options.admin_open;
    server->admin_service_ = std::make_unique<AdminServiceImpl>(
        std::move(admin), access, &server->shard_service_->memory().probes());
    listener_options.grpc_services.push_back(server->admin_service_.get());
  }
  // gRPC last: every address GetTransportAddress hands out is live.
  std::vector<std::string> names;
  if (options.ucx) names.push_back("ucx");
  if (options.tcp) names.push_back("tcp");
  names.push_back("grpc");
  for (const std::string& name : names) {
    auto listener = CreateShardListener(name, listener_options);
    if (!listener.ok()) return listener.status();
    server->listeners_.push_back(std::move(*listener));
  }
  for (const auto& listener : server->listeners_) {
    if (auto status = listener->Start(server->shard_service_.get()); !status.ok()) return status;
  }
  server->port_ = server->listeners_.back()->port();
  server->listening_ = true;
  if (options.health_port >= 0) {
    // A server with no service of its own: the health service is all it
    // serves. It answers anyone who reaches the port, so what its callers
    // may make it hold is bounded as on the main port: threads for the
    // Watch streams it admits plus a few for Checks, a small buffer quota
    // (its messages are a few bytes), and the streams of one connection.
    grpc::ServerBuilder health_builder;
    const int max_watches = options.grpc_limits.max_health_watches;
    HealthService::Install(health_builder, max_watches);
    health_builder.AddListeningPort(absl::StrCat(options.host, ":", options.health_port),
                                    grpc::InsecureServerCredentials(), &server->health_port_);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    grpc::ResourceQuota health_quota("harrier-health");
    health_quota.Resize(kHealthPortMemoryBytes);
    health_quota.SetMaxThreads(max_watches + kHealthPortCheckThreads);
    health_builder.SetResourceQuota(health_quota);
    if (options.grpc_limits.max_streams_per_connection > 0) {
      health_builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                                        options.grpc_limits.max_streams_per_connection);
    }
    server->health_server_ = health_builder.BuildAndStart();
    if (server->health_server_ == nullptr || server->health_port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host, ":",
                                                 options.health_port, " (--health_port)"));
    }
  }
  if (options.metrics_port >= 0) {
    auto http =
        MetricsHttpServer::Start(options.host, options.metrics_port, server->metrics_.get());
    if (!http.ok()) return http.status();
    server->metrics_http_ = std::move(*http);
  }
  // The store is restored before the server starts, so the shard reports
  // SERVING only once it holds its parameters.
  for (const auto& listener : server->listeners_) listener->SetServing(true);
  if (server->health_server_)
    server->health_server_->GetHealthCheckService()->SetServingStatus(true);
  ShardServer* self = server.get();
  server->monitor_ = std::thread([self] { self->MonitorLoop(); });
  return server;
}

void ShardServer::MonitorLoop() {
  auto next_checkpoint = std::chrono::steady_clock::now() + options_.checkpoint_every;
  for (;;) {
    {
      absl::MutexLock lock(&monitor_mutex_);
      // Woken early by Shutdown; otherwise a check every 200 ms.
      monitor_mutex_.AwaitWithTimeout(absl::Condition(&monitor_stop_), absl::Milliseconds(200));
      if (monitor_stop_) return;
    }
    shard_service_->CheckLiveness(options_.heartbeat_timeout, options_.on_worker_loss);
    if (control_service_) control_service_->ExpireBarriers();
    CheckRunDone();
    if (options_.checkpoint_every.count() > 0 &&
        std::chrono::steady_clock::now() >= next_checkpoint) {
      if (auto status = WriteCheckpointNow(); !status.ok()) {
        spdlog::error("checkpoint failed: {}", status.ToString());
      }
      next_checkpoint = std::chrono::steady_clock::now() + options_.checkpoint_every;
    }
  }
}

ShardServer::~ShardServer() {
  // Start() may fail after construction (a bad checkpoint, a port in use,
  // UCX): then nothing is serving and there is nothing to stop.
  if (!listening_) {
    for (const auto& listener : listeners_) listener->Close();
    return;
  }
  Shutdown(std::chrono::milliseconds(0));
}

void ShardServer::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_ || !listening_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&monitor_mutex_);
    monitor_stop_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
  if (auto status = WriteCheckpointNow(); !status.ok()) {
    spdlog::error("final checkpoint failed: {}", status.ToString());
  }
  for (const auto& listener : listeners_) listener->SetServing(false);
  if (health_server_) health_server_->GetHealthCheckService()->SetServingStatus(false);
  // Blocked pulls and barriers wake up now, so what follows drains at once.
  store_->Close();
  if (control_service_) control_service_->Close();
  // gRPC's calls end (each reactor is finished by the ShardService), then
  // the service's pools drain (UCX answers are posted to a worker that still
  // runs), then the UCX listener closes with nothing left to answer.
  const absl::Time deadline = absl::Now() + absl::FromChrono(grace);
  for (const auto& listener : listeners_) listener->Stop(deadline);
  shard_service_->Shutdown();
  for (const auto& listener : listeners_) listener->Close();
  if (metrics_http_) metrics_http_->Stop();
  // Last: probes see NOT_SERVING until the shard is gone.
  if (health_server_) health_server_->Shutdown(std::chrono::system_clock::now());
  stopped_.Notify();
}

void ShardServer::Wait() { stopped_.WaitForNotification(); }

void ShardServer::RequestShutdown(std::string reason, int exit_code) {
  absl::MutexLock lock(&stop_mutex_);
  if (stop_request_.has_value()) return;
  spdlog::info("event=shutdown_requested shard={} exit_code={} reason=\"{}\"", options_.store.shard,
               exit_code, reason);
  stop_request_ = StopRequest{std::move(reason), exit_code};
}

std::optional<ShardServer::StopRequest> ShardServer::shutdown_request() const {
  absl::MutexLock lock(&stop_mutex_);
  return stop_request_;
}

uint64_t ShardServer::job_id() const { return shard_service_->sessions().job_id(); }

uint64_t ShardServer::NewJobId(uint64_t previous) {
  const uint64_t now_ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  return std::max(now_ms, previous + 1);
}

void ShardServer::BeginRunLocked(uint64_t job_id, absl::string_view why) {
  shard_service_->sessions().StartRun(job_id);
  run_done_ = false;
  last_checkpoint_unix_ms_ = 0;
  last_checkpoint_version_ = 0;
  {
    absl::MutexLock lock(&checkpoint_mutex_);
    next_checkpoint_version_ = 1;
  }
  spdlog::info("event=job_start shard={} job={} job_id={} reason=\"{}\"", options_.store.shard,
               options_.job, job_id, std::string(why));
}

absl::Status ShardServer::AdoptRun(uint64_t job_id) {
  absl::MutexLock lock(&run_mutex_);
  const uint64_t current = this->job_id();
  // Adopted meanwhile by another call (or a newer one was): the caller
  // compares the job ids again.
  if (job_id <= current) return absl::OkStatus();
  if (current == 0) {
    BeginRunLocked(job_id, "the run's first call reached the shard");
    return absl::OkStatus();
  }
  // Anyone who can mint a session (without a job token: anyone) could
  // otherwise end a running job on this shard with one call, dropping its
  // parameters: a newer run replaces this one only once its workers are
  // gone.
  if (!run_done_) {
    const std::vector<uint32_t> live = store_->membership().LiveRanks(options_.heartbeat_timeout);
    if (!live.empty()) {
      spdlog::warn("event=run_change_refused shard={} job_id={} newer_job_id={} live_ranks={}",
                   options_.store.shard, current, job_id, absl::StrJoin(live, ","));
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", options_.store.shard, " runs job id ", current, ", whose rank",
          live.size() == 1 ? " " : "s ", absl::StrJoin(live, ", "), live.size() == 1 ? " is" : " are",
          " live (heard from within --heartbeat_timeout_ms=", options_.heartbeat_timeout.count(),
          "): a newer run starts on this shard once they are done or lost, or when the operator "
          "starts it (harrier-ctl new-run)"));
    }
  }
  // Shard 0 started a newer run: whatever this shard held belongs to the
  // old one (its checkpoints stay in their job folder).
  store_->StartRun();
  BeginRunLocked(job_id, absl::StrCat("a newer run than job id ", current, " reached the shard"));
  return absl::OkStatus();
}

absl::StatusOr<proto::NewRunResponse> ShardServer::NewRunByOperator(
    const proto::NewRunRequest& request) {
  absl::MutexLock lock(&run_mutex_);
  const uint64_t current = job_id();
  const bool control_plane = options_.store.shard == 0;
  uint64_t next = request.job_id();
  if (next == 0) {
    if (!control_plane) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", options_.store.shard,
          ": a new run's job id comes from shard 0 (harrier-ctl new-run asks shard 0 first)"));
    }
    next = NewJobId(current);
  }
  if (next <= current) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", options_.store.shard,
                                                      " already runs job id ", current,
                                                      ", not below the new run's ", next));
  }
  // The ended run's state stays on disk, as a finished run's does.
  if (current != 0 && !run_done_) {
    if (auto status = WriteCheckpointNow(); !status.ok()) {
      spdlog::error("final checkpoint of job id {} failed: {}", current, status.ToString());
    }
  }
  const std::string reason = request.reason().empty() ? std::string("no reason given")
                                                      : request.reason();
  store_->StartRun();
  if (control_service_) control_service_->StartRun();
  BeginRunLocked(next, absl::StrCat("the operator ended job id ", current,
                                    " (AdminService.NewRun: ", reason, ")"));
  proto::NewRunResponse response;
  response.set_job_id(next);
  response.set_previous_job_id(current);
  return response;
}

void ShardServer::CheckRunDone() {
  absl::MutexLock lock(&run_mutex_);
  const uint64_t id = job_id();
  if (run_done_ || id == 0) return;
  if (!store_->membership().RunDone(options_.heartbeat_timeout)) return;
  run_done_ = true;
  const absl::Status failure = store_->membership().failure();
  spdlog::info("event=job_done shard={} job_id={} status={}{}", options_.store.shard, id,
               failure.ok() ? "ok" : "failed",
               failure.ok() ? "" : absl::StrCat(" failure=\"", failure.message(), "\""));
  // Under run_mutex_: a newer run reaching this shard meanwhile waits until
  // this run's final state is on disk.
  if (auto status = WriteCheckpointNow(); !status.ok()) {
    spdlog::error("final checkpoint of job id {} failed: {}", id, status.ToString());
  }
  if (options_.exit_when_done) {
    RequestShutdown(failure.ok() ? absl::StrCat("job id ", id, " is done: every worker finished")
                                 : absl::StrCat("job id ", id, " failed: ", failure.message()),
                    failure.ok() ? 0 : 1);
    return;
  }
  // Otherwise the shards keep the finished run (status, checkpoints) until
  // the next run: shard 0 starts it at the next Register, the others at its
  // first call.
}

void ShardServer::StartNextRunIfDone() {
  absl::MutexLock lock(&run_mutex_);
  if (!run_done_) return;
  const uint64_t id = job_id();
  store_->StartRun();
  if (control_service_) control_service_->StartRun();
  BeginRunLocked(NewJobId(id), absl::StrCat("job id ", id, " is done; a worker registered"));
}

absl::Status ShardServer::WriteCheckpointNow() { return WriteCheckpointNow(nullptr); }

absl::Status ShardServer::WriteCheckpointNow(CheckpointWritten* written) {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  const uint64_t id = job_id();
  if (id == 0) {
    // A shard other than 0 that no run has reached holds nothing of one.
    if (written == nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.store.shard,
                     " has no run yet (no worker has reached it): nothing to write"));
  }
  const std::string dir = CheckpointJobDir(options_.checkpoint_dir, id);
  absl::MutexLock lock(&checkpoint_mutex_);
  const auto started = std::chrono::steady_clock::now();
  const bool incremental = options_.checkpoint_full_every > 1 && last_written_version_ != 0 &&
                           last_written_version_ + 1 == next_checkpoint_version_ &&
                           incremental_since_full_ + 1 < options_.checkpoint_full_every;
  ShardCheckpoint checkpoint = store_->Export(incremental);
  checkpoint.base_version = incremental ? last_written_version_ : 0;
  const SessionTable& sessions = shard_service_->sessions();
  checkpoint.session_epoch_floor = sessions.epoch_floor();
  checkpoint.sessions.resize(static_cast<size_t>(checkpoint.num_workers));
  for (size_t rank = 0; rank < checkpoint.sessions.size(); ++rank) {
    const SessionTable::RankState state = sessions.state(static_cast<uint32_t>(rank));
    checkpoint.sessions[rank] = {state.epoch, state.released, state.heard};
  }
  checkpoint.version = next_checkpoint_version_;
  checkpoint.created_unix_ms = absl::ToUnixMillis(absl::Now());
  auto status = WriteCheckpoint(dir, checkpoint, options_.checkpoint_keep);
  if (!status.ok()) {
    last_written_version_ = 0;  // the changes taken are lost: the next is complete
    return status;
  }
  last_written_version_ = checkpoint.version;
  incremental_since_full_ = incremental ? incremental_since_full_ + 1 : 0;
  ++next_checkpoint_version_;
  last_checkpoint_unix_ms_ = checkpoint.created_unix_ms;
  last_checkpoint_version_ = checkpoint.version;
  const std::string path = CheckpointPath(dir, options_.store.shard, checkpoint.version);
  if (written != nullptr) {
    written->version = checkpoint.version;
    written->path = path;
  }
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  spdlog::info("event=checkpoint shard={} version={} base={} chunks={} bytes={} seconds={:.3f} "
               "job_id={}",
               options_.store.shard, checkpoint.version, checkpoint.base_version,
               checkpoint.slots.size(),
               ec ? -1 : static_cast<int64_t>(bytes),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
               id);
  return absl::OkStatus();
}

proto::StatusResponse ShardServer::FillStatus() const {
  proto::StatusResponse status;
  status.set_job(options_.job);
  status.set_job_id(job_id());
  status.set_shard(static_cast<uint32_t>(options_.store.shard));
  status.set_num_shards(static_cast<uint32_t>(options_.store.num_shards));
  status.set_num_workers(static_cast<uint32_t>(options_.store.num_workers));
  FillSyncConfig(options_.store.sync, status.mutable_sync());

  const Membership& membership = store_->membership();
  const SessionTable& sessions = shard_service_->sessions();
  const std::vector<int64_t> next_clocks = store_->NextClocks();
  const auto now = std::chrono::steady_clock::now();
  int known = 0;  // ranks with a session (registered or heard from)
  for (int r = 0; r < options_.store.num_workers; ++r) {
    const uint32_t rank = static_cast<uint32_t>(r);
    const SessionTable::RankState session = sessions.state(rank);
    proto::RankStatus* out = status.add_ranks();
    out->set_rank(rank);
    out->set_epoch(session.epoch);
    out->set_next_clock(r < static_cast<int>(next_clocks.size()) ? next_clocks[r] : -1);
    const int64_t silent_ms =
        session.heard
            ? std::chrono::duration_cast<std::chrono::milliseconds>(now - session.last_heard)
                  .count()
            : -1;
    out->set_last_heard_ms_ago(silent_ms);
    const Membership::RankView member = membership.view(rank);
    if (session.epoch != 0 || member.heard) ++known;
    if (member.lost) {
      out->set_state("lost");
    } else if (member.released) {
      out->set_state("done");
    } else if (member.departed) {
      out->set_state("left");
    } else if (member.joined ||
               (session.issued && now - session.issued_at <= options_.heartbeat_timeout)) {
      // A session handed out and never used within the timeout may be
      // handed out again (control_service.h): not in the job.
      out->set_state("present");
    } else {
      out->set_state("absent");
    }
  }
  bool done = false;
  {
    absl::MutexLock lock(&run_mutex_);
    done = run_done_;
  }
  if (const absl::Status failure = membership.failure(); !failure.ok()) {
    status.set_job_state("failed");
    status.set_failure(std::string(failure.message()));
  } else if (done) {
    status.set_job_state("done");
  } else if (known == 0) {
    status.set_job_state("waiting");
  } else {
    status.set_job_state("running");
  }

  const ShardStore::Holdings holdings = store_->holdings();
  status.set_keys(holdings.keys);
  status.set_chunks(holdings.chunks);
  status.set_param_bytes(holdings.param_bytes);
  status.set_bytes_in(store_->counters().bytes_in.load());
  status.set_bytes_out(store_->counters().bytes_out.load());
  const int64_t last = last_checkpoint_unix_ms_;
  status.set_checkpoint_age_seconds(
      last == 0 ? -1.0 : std::max<int64_t>(0, absl::ToUnixMillis(absl::Now()) - last) / 1000.0);
  status.set_checkpoint_version(last_checkpoint_version_.load());
  status.set_uptime_seconds(std::chrono::duration<double>(now - started_).count());
  for (const MemoryAccount::Figure& figure : shard_service_->memory().Figures()) {
    proto::MemoryBudget* budget = status.add_memory();
    budget->set_name(figure.name);
    budget->set_flag(figure.flag);
    budget->set_held_bytes(figure.held_bytes);
    budget->set_limit_bytes(figure.limit_bytes);
  }
  return status;
}

void ShardServer::RegisterMetrics(ShardServiceOptions* service_options) {
  metrics_ = std::make_unique<MetricsRegistry>();
  const ShardCounters& counters = store_->counters();
  const MetricLabels shard = {{"shard", std::to_string(options_.store.shard)}};
  auto counter = [&](const std::string& name, const std::string& help,
                     const std::atomic<uint64_t>& value) {
    metrics_->AddCallbackCounter(
        name, help, [&value] { return static_cast<double>(value.load()); }, shard);
  };
  counter("harrier_server_pushes_total", "Chunks pushed and applied.", counters.pushes);
  counter("harrier_server_pulls_total", "Chunks pulled.", counters.pulls);
  counter("harrier_server_bytes_in_total", "Push payload bytes received.", counters.bytes_in);
  counter("harrier_server_bytes_out_total", "Pull payload bytes sent.", counters.bytes_out);
  counter("harrier_server_rejected_total", "Pushes refused as bad input.", counters.rejected);
  counter("harrier_server_duplicate_pushes_total",
          "Pushed chunks acknowledged as already applied (retries), not applied again.",
          counters.duplicate_pushes);
  counter("harrier_server_pull_view_remakes_total",
          "Compressed pull replies re-made from the previous view (the client lost a reply).",
          counters.pull_view_remakes);
  counter("harrier_server_pull_view_resets_total",
          "Compressed pulls answered dense because the client held no view the shard knows.",
          counters.pull_view_resets);
  counter("harrier_server_pull_replies_shared_total",
          "Compressed pull replies encoded once for ranks holding the same view.",
          counters.pull_replies_shared);
  counter("harrier_server_optimizer_steps_total", "Optimizer steps applied.",
          counters.optimizer_steps);
  ShardStore* store = store_.get();
  metrics_->AddCallbackGauge(
      "harrier_server_blocked_pulls", "Pulls waiting for the consistency model (queue depth).",
      [store] { return store->blocked_pulls(); }, shard);
  metrics_->AddCallbackGauge(
      "harrier_server_active_workers",
      "Workers in the job now: registered (shard 0) or heard from, and neither left nor lost.",
      [store] { return store->present_workers(); }, shard);
  metrics_->AddCallbackGauge(
      "harrier_server_max_staleness", "Largest pull clock minus min clock answered.",
      [store] { return static_cast<double>(store->counters().max_staleness.load()); }, shard);
  // Sparse tables, over every table of the shard.
  metrics_->AddCallbackGauge(
      "harrier_server_sparse_rows", "Rows the shard's sparse tables hold now.",
      [store] { return static_cast<double>(store->sparse_stats().rows); }, shard);
  metrics_->AddCallbackCounter(
      "harrier_server_sparse_rows_admitted_total", "Sparse rows created (ids admitted).",
      [store] { return static_cast<double>(store->sparse_stats().admitted); }, shard);
  metrics_->AddCallbackCounter(
      "harrier_server_sparse_rows_evicted_total",
      "Sparse rows evicted by a row budget or a time to live.",
      [store] { return static_cast<double>(store->sparse_stats().evicted); }, shard);
  metrics_->AddCallbackCounter(
      "harrier_server_sparse_rows_expired_total",
      "Of the evicted sparse rows, those evicted by their time to live.",
      [store] { return static_cast<double>(store->sparse_stats().expired); }, shard);
  metrics_->AddCallbackCounter(
      "harrier_server_sparse_pushes_not_admitted_total",
      "Pushed rows of ids not (yet) admitted: counted, not stored.",
      [store] { return static_cast<double>(store->sparse_stats().not_admitted_pushes); }, shard);
  metrics_->AddCallbackGauge(
      "harrier_server_sparse_bytes_per_row",
      "Bytes the shard reserves per sparse row held (values, optimizer state, index).",
      [store] { return store->sparse_stats().bytes_per_row; }, shard);
  metrics_->AddCallbackGauge(
      "harrier_server_checkpoint_age_seconds",
      "Seconds since the last checkpoint was written, or since the restored one was "
      "(-1: none yet).",
      [this] {
        const int64_t last = last_checkpoint_unix_ms_;
        if (last == 0) return -1.0;
        return std::max<int64_t>(0, absl::ToUnixMillis(absl::Now()) - last) / 1000.0;
      },
      shard);
  // The memory account, one series per budget. The service is made after
  // the metrics: read through the server, which outlives the registry.
  for (const char* budget : {"push payloads", "parked pulls", "probes in flight"}) {
    MetricLabels labels = shard;
    labels.emplace_back("budget", budget);
    const std::string name = budget;
    auto figure = [this, name](bool held) {
      if (shard_service_ == nullptr) return 0.0;
      for (const MemoryAccount::Figure& f : shard_service_->memory().Figures()) {
        if (f.name == name) return static_cast<double>(held ? f.held_bytes : f.limit_bytes);
      }
      return 0.0;
    };
    metrics_->AddCallbackGauge(
        "harrier_server_memory_held_bytes",
        "Bytes a budget of the shard's memory account holds now (docs/deploy.md).",
        [figure] { return figure(true); }, labels);
    metrics_->AddCallbackGauge("harrier_server_memory_limit_bytes",
                               "The bound of a budget of the shard's memory account.",
                               [figure] { return figure(false); }, labels);
  }
  // One series per shard whichever transport carried the call: both
  // transports answer through the ShardService, which observes these.
  service_options->push_seconds = &metrics_->AddHistogram(
      "harrier_server_push_seconds", "Push call latency, and the push half of each PushPull.",
      ExponentialBuckets(1e-5, 4, 10), shard);
  service_options->pull_seconds = &metrics_->AddHistogram(
      "harrier_server_pull_seconds", "Pull call latency, including consistency waits.",
      ExponentialBuckets(1e-5, 4, 10), shard);
}

}  // namespace harrier
