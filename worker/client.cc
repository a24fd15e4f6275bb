#include "worker/client.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_security.h"
#include "common/partitioner.h"
#include "worker/chunk_codec.h"
#include "worker/control_client.h"
#include "worker/operation_engine.h"
#include "worker/shard_calls.h"
#include "worker/sparse_tables.h"
#include "worker/tensor_table.h"
#include "worker/timeline.h"
#include "worker/transport/transport.h"
#include "worker/transport/transport_factory.h"

namespace harrier {
namespace {

// `with_transport`: whether options.transport names the backend to build
// (not so when the caller hands in the transports).
absl::Status CheckOptions(const ClientOptions& options, bool with_transport) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.servers is empty: need host:port of every shard");
  }
  for (const auto& server : options.servers) {
    if (server.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("server address '", server, "' is not host:port"));
    }
  }
  if (options.grpc_connections < 1 || options.grpc_connections > 16) {
    return absl::InvalidArgumentError("grpc_connections must be in [1, 16]");
  }
  if (options.chunk_bytes < sizeof(float) || options.chunk_bytes > (32u << 20)) {
    return absl::InvalidArgumentError("chunk_bytes must be in [4, 32 MiB]");
  }
  if (with_transport) {
    if (auto status = CheckTransportName(options.transport); !status.ok()) return status;
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("rpc_timeout must be positive");
  }
  if (options.max_calls_in_flight < 1) {
    return absl::InvalidArgumentError("max_calls_in_flight must be at least 1");
  }
  if (options.partitioner != nullptr &&
      options.partitioner->num_shards() != static_cast<int>(options.servers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.partitioner places chunks on ", options.partitioner->num_shards(),
        " shards, but there are ", options.servers.size(), " servers"));
  }
  return absl::OkStatus();
}

std::string Describe(OpKind kind, const std::string& name) {
  switch (kind) {
    case OpKind::kPush:
      return absl::StrCat("push of '", name, "'");
    case OpKind::kPull:
      return absl::StrCat("pull of '", name, "'");
    case OpKind::kPushPull:
      return absl::StrCat("push-pull of '", name, "'");
  }
  return name;
}

SyncInfo ToSyncInfo(const proto::SyncConfig& sync) {
  SyncInfo info;
  switch (sync.mode()) {
    case proto::SYNC_SSP:
      info.mode = "ssp";
      break;
    case proto::SYNC_ASP:
      info.mode = "asp";
      break;
    case proto::SYNC_LOCAL:
      info.mode = "local";
      break;
    default:
      info.mode = "bsp";
      break;
  }
  info.staleness = sync.staleness();
  info.local_steps = sync.local_steps();
  return info;
}

// The layout of the chunks `scope` selects: `info`'s groups cut down to
// them, shard groups left empty dropped. Its own entry, so the tasks that
// share it keep it alive as they do a whole tensor's.
absl::StatusOr<std::shared_ptr<const TensorInfo>> ScopeLayout(
    const absl::StatusOr<std::shared_ptr<const TensorInfo>>& info, const CallScope& scope) {
  if (!info.ok()) return info.status();
  size_t chunks = 0;
  for (const ShardGroup& group : (*info)->groups) chunks += group.spans.size();
  const uint64_t first = scope.first_chunk;
  const uint64_t end = scope.num_chunks == 0 ? chunks : first + scope.num_chunks;
  if (scope.clock < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", (*info)->name, "': call scope clock ", scope.clock, " < -1"));
  }
  if (scope.clock == -1 && (*info)->own_clock != nullptr) {
    // Which piece would move the tensor's clock on is the caller's to say.
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", (*info)->name,
                     "' keeps a clock of its own: a call on some of its chunks names its clock"));
  }
  if (first >= chunks || end > chunks) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", (*info)->name, "': chunks [",
                                                   first, ", ", end, ") out of its ", chunks,
                                                   " chunks"));
  }
  auto scoped = std::make_shared<TensorInfo>();
  scoped->name = (*info)->name;
  scoped->shape = (*info)->shape;
  scoped->num_elements = (*info)->num_elements;
  for (const ShardGroup& group : (*info)->groups) {
    ShardGroup part;
    part.shard = group.shard;
    for (const ChunkSpan& span : group.spans) {
      if (span.chunk >= first && span.chunk < end) part.spans.push_back(span);
    }
    if (!part.spans.empty()) scoped->groups.push_back(std::move(part));
  }
  return std::shared_ptr<const TensorInfo>(std::move(scoped));
}

}  // namespace

// Threads of the operation engine's executor: they start calls (build and
// encode chunks) and never wait for one, so their number does not depend on
// the shards or on the calls in flight.
constexpr int kExecutorThreads = 4;

// The facade's state: the parts, and how an operation becomes one task per
// shard group.
class Client::Impl {
 public:
  Impl(const ClientOptions& options, std::unique_ptr<ControlClient> control,
       std::vector<std::unique_ptr<ShardTransport>> transports, std::unique_ptr<ChunkCodec> codec)
      : options_(options),
        partitioner_(options.partitioner != nullptr
                         ? options.partitioner
                         : std::make_shared<const HashPartitioner>(
                               static_cast<int>(options.servers.size()))),
        control_(std::move(control)),
        transports_(std::move(transports)),
        tensors_(*partitioner_, options.chunk_bytes / sizeof(float)),
        codec_(std::move(codec)),
        engine_(EngineOptions(options)) {}

  static OperationEngineOptions EngineOptions(const ClientOptions& options) {
    OperationEngineOptions engine;
    // No thread waits for a call, so a few start every shard's calls.
    engine.threads = kExecutorThreads;
    engine.max_queued = options.max_queued_calls;
    engine.max_in_flight = options.max_calls_in_flight;
    engine.retry_timeout = options.retry_timeout;
    // Every transport call ends by rpc_timeout, and a cancelled one sooner.
    engine.cancel_grace = options.rpc_timeout;
    return engine;
  }

  absl::Status Register();

  // Starts the work of one operation on one shard group, at a clock;
  // `done` ends it.
  using GroupRun = std::function<void(Operation&, const ShardGroup&, int64_t clock,
                                      OperationEngine::TaskDone done)>;
  GroupRun PushRun(const std::string& name, const float* gradient);
  GroupRun PullRun(const std::string& name, float* out);
  GroupRun PushPullRun(const std::string& name, const float* gradient, float* out);
  // `clock` -1: the current clock.
  Handle StartGroups(OpKind kind, const std::string& name,
                     const absl::StatusOr<std::shared_ptr<const TensorInfo>>& info,
                     const GroupRun& run, int64_t clock = -1, bool on_timeline = true);
  // A tensor on one shard (every tensor up to the chunk size) runs on the
  // calling thread; others through the pools.
  absl::Status RunBlocking(OpKind kind, const std::string& name,
                           const absl::StatusOr<std::shared_ptr<const TensorInfo>>& info,
                           const GroupRun& run);

  void CountStart(OpKind kind);
  // The clock of an operation on `info` that names none (CallScope::clock
  // -1): the tensor's own (advanced by a push) or the worker's.
  int64_t ClockFor(OpKind kind, const TensorInfo& info);

  const ClientOptions options_;
  const std::shared_ptr<const Partitioner> partitioner_;
  std::unique_ptr<ControlClient> control_;
  // Pushes and pulls go over these; control, Init, heartbeats and Leave
  // over control_.
  std::vector<std::unique_ptr<ShardTransport>> transports_;
  TensorTable tensors_;
  std::unique_ptr<ChunkCodec> codec_;
  int rank_ = 0;
  proto::Session session_;  // from Register: every call naming rank_ carries it
  int num_workers_ = 0;
  SyncInfo sync_;
  std::atomic<int64_t> clock_{0};
  std::atomic<uint64_t> pushes_{0}, pulls_{0};
  std::unique_ptr<ShardCalls> calls_;         // made once the rank is known
  std::unique_ptr<SparseTables> sparse_;      // likewise
  // After control_ and calls_, which it reads: stops before they go.
  std::unique_ptr<HeartbeatLoop> heartbeat_;
  // Serialises StartTimeline and StopTimeline.
  absl::Mutex timeline_mutex_;
  OperationEngine engine_;                    // last: cancels and drains before the parts go
};

absl::Status Client::Impl::Register() {
  proto::RegisterRequest request;
  request.set_job(options_.job);
  request.set_requested_rank(options_.rank);
  request.set_worker_name(options_.worker_name);
  auto response = control_->Register(request);
  // A worker restarted for its rank (a pod restart, a crash) finds its old
  // session still live until it has been silent for the shards'
  // --rejoin_after_ms: it keeps asking, within the connect timeout.
  const absl::Time give_up = absl::Now() + options_.connect_timeout;
  while (options_.rank >= 0 && absl::IsAlreadyExists(response.status()) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(250));
    response = control_->Register(request);
  }
  if (!response.ok()) return response.status();
  rank_ = static_cast<int>(response->rank());
  session_ = response->session();
  num_workers_ = static_cast<int>(response->num_workers());
  sync_ = ToSyncInfo(response->sync());
  sync_.optimizer = response->optimizer().kind();
  sync_.lr = response->optimizer().lr();
  sync_.momentum = response->optimizer().momentum();
  sync_.weight_decay = response->optimizer().weight_decay();
  ShardCallsConfig config;
  config.job = options_.job;
  config.rank = static_cast<uint32_t>(rank_);
  config.session = session_;
  config.rpc_timeout = options_.rpc_timeout;
  config.shard_name = [control = control_.get()](int shard) { return control->ShardName(shard); };
  std::vector<ShardTransport*> transports;
  for (const auto& transport : transports_) transports.push_back(transport.get());
  SparseTablesConfig sparse;
  sparse.job = config.job;
  sparse.rank = config.rank;
  sparse.session = config.session;
  sparse.rpc_timeout = config.rpc_timeout;
  sparse.shard_name = config.shard_name;
  sparse_ = std::make_unique<SparseTables>(std::move(sparse), transports, *control_, engine_,
                                           *partitioner_);
  calls_ = std::make_unique<ShardCalls>(std::move(config), std::move(transports), *codec_, engine_);
  // One heartbeat round now: the shards learn the run (a shard other than 0
  // starts it from this call) and say where this rank is, so that a worker
  // restarted mid-job, or one of a resumed run, goes on from its clock.
  int64_t resume_clock = -1;
  for (int shard = 0; options_.resume_clock && shard < control_->num_shards(); ++shard) {
    proto::HeartbeatRequest heartbeat;
    heartbeat.set_job(options_.job);
    heartbeat.set_rank(static_cast<uint32_t>(rank_));
    *heartbeat.mutable_session() = session_;
    heartbeat.set_report_next_clock(true);
    proto::HeartbeatResponse answer;
    absl::Status status = control_->ShardHeartbeat(shard, heartbeat,
                                                   absl::Now() + options_.rpc_timeout, &answer);
    // A session the shards refuse (another run) is an error now rather than
    // at the first push; anything else is retried by the calls that follow.
    if (absl::IsFailedPrecondition(status) || absl::IsPermissionDenied(status)) return status;
    if (status.ok() && answer.next_clock() >= 0) {
      resume_clock =
          resume_clock < 0 ? answer.next_clock() : std::min(resume_clock, answer.next_clock());
    }
  }
  clock_ = std::max<int64_t>(0, resume_clock);
  if (options_.heartbeat_interval > absl::ZeroDuration()) {
    heartbeat_ = std::make_unique<HeartbeatLoop>(
        *control_, options_.heartbeat_interval, [this](int shard) {
          proto::HeartbeatRequest heartbeat;
          heartbeat.set_job(options_.job);
          heartbeat.set_rank(static_cast<uint32_t>(rank_));
          *heartbeat.mutable_session() = session_;
          heartbeat.set_clock(clock_);
          calls_->AddAcknowledgedClocks(shard, &heartbeat);
          sparse_->AddAcknowledgedClocks(shard, &heartbeat);
          return heartbeat;
        });
  }
  return absl::OkStatus();
}

Client::Impl::GroupRun Client::Impl::PushRun(const std::string& name, const float* gradient) {
  return [this, name, gradient](Operation& op, const ShardGroup& group, int64_t clock,
                                OperationEngine::TaskDone done) {
    calls_->Push(op, name, group, gradient, clock, std::move(done));
  };
}

Client::Impl::GroupRun Client::Impl::PullRun(const std::string& name, float* out) {
  return [this, name, out](Operation& op, const ShardGroup& group, int64_t clock,
                           OperationEngine::TaskDone done) {
    calls_->Pull(op, name, group, out, clock, std::move(done));
  };
}

Client::Impl::GroupRun Client::Impl::PushPullRun(const std::string& name, const float* gradient,
                                                 float* out) {
  return [this, name, gradient, out](Operation& op, const ShardGroup& group, int64_t clock,
                                     OperationEngine::TaskDone done) {
    calls_->PushPull(op, name, group, gradient, out, clock, std::move(done));
  };
}

void Client::Impl::CountStart(OpKind kind) {
  if (kind != OpKind::kPull) pushes_++;
  if (kind != OpKind::kPush) pulls_++;
}

Client::Handle Client::Impl::StartGroups(
    OpKind kind, const std::string& name,
    const absl::StatusOr<std::shared_ptr<const TensorInfo>>& info, const GroupRun& run,
    int64_t clock, bool on_timeline) {
  if (!info.ok()) return engine_.Failed(kind, Describe(kind, name), info.status());
  CountStart(kind);
  if (clock < 0) clock = ClockFor(kind, **info);
  std::vector<OperationEngine::Task> tasks;
  for (const ShardGroup& group : (*info)->groups) {
    // The task's done shares the layout, which outlives a re-registration:
    // the group is read until the task ends.
    tasks.push_back([layout = *info, &group, run, clock](Operation& op,
                                                         OperationEngine::TaskDone done) {
      run(op, group, clock, [layout, done = std::move(done)](absl::Status status) {
        done(std::move(status));
      });
    });
  }
  return engine_.Start(kind, Describe(kind, name), std::move(tasks), on_timeline);
}

absl::Status Client::Impl::RunBlocking(
    OpKind kind, const std::string& name,
    const absl::StatusOr<std::shared_ptr<const TensorInfo>>& info, const GroupRun& run) {
  if (!info.ok()) return info.status();
  if ((*info)->groups.size() != 1) {
    return engine_.Wait(StartGroups(kind, name, info, run), absl::InfiniteFuture());
  }
  CountStart(kind);
  const ShardGroup& group = (*info)->groups[0];
  const int64_t clock = ClockFor(kind, **info);
  return engine_.RunHere(kind, Describe(kind, name),
                         [&](Operation& op, OperationEngine::TaskDone done) {
                           run(op, group, clock, std::move(done));
                         });
}

int64_t Client::Impl::ClockFor(OpKind kind, const TensorInfo& info) {
  if (info.own_clock == nullptr) return clock_;
  // A push is for the tensor's next clock and moves it on (when it starts,
  // so pushes of one tensor may be in flight at once); a pull waits for
  // the round of the tensor's last push.
  if (kind == OpKind::kPull) return info.own_clock->load();
  return info.own_clock->fetch_add(1);
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (impl_ == nullptr || impl_->calls_ == nullptr) return;  // never registered
  // Stop heartbeating, then give the session back so the rank is free for
  // another worker at once (rather than after --heartbeat_timeout_ms).
  // Best effort, and short: a worker exits whether or not shard 0 answers.
  impl_->heartbeat_.reset();
  proto::RegisterRequest release;
  release.set_job(impl_->options_.job);
  release.set_requested_rank(impl_->rank_);
  *release.mutable_previous_session() = impl_->session_;
  release.set_release(true);
  impl_->control_->ReleaseSession(release, absl::Now() + absl::Milliseconds(500)).IgnoreError();
  // Every shard learns the worker is done with the job: once every rank is,
  // the run is over there (--exit_when_done).
  for (int shard = 0; shard < impl_->control_->num_shards(); ++shard) {
    proto::LeaveRequest done;
    done.set_job(impl_->options_.job);
    done.set_rank(static_cast<uint32_t>(impl_->rank_));
    *done.mutable_session() = impl_->session_;
    done.set_clock(impl_->clock_);
    done.set_release(true);
    impl_->control_->ReleaseShard(shard, done, absl::Now() + absl::Milliseconds(500)).IgnoreError();
  }
}

namespace {

// A plaintext client reaches a TLS shard's port, but the shard drops the
// connection at its first bytes: the first call fails UNAVAILABLE with
// gRPC's bare "Socket closed". Say what is the likely cause.
absl::Status ExplainPlaintextFailure(const absl::Status& status, const ClientOptions& options) {
  if (!absl::IsUnavailable(status) || !options.tls_ca_file.empty()) return status;
  return absl::UnavailableError(
      absl::StrCat(status.message(),
                   " (this client speaks plaintext: the shard may require TLS, pass --tls_ca)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (auto status = CheckOptions(options, true); !status.ok()) return status;
  auto codec = ChunkCodec::Create(options.codec, options.pull_codec, options.compress_min_bytes,
                                 options.host_backend, options.device_backend);
  if (!codec.ok()) return codec.status();
  ChannelSecurity security;
  TlsFiles tls{options.tls_cert_file, options.tls_key_file, options.tls_ca_file};
  if (tls.enabled()) {
    auto credentials = MakeChannelCredentials(tls);
    if (!credentials.ok()) return credentials.status();
    security.credentials = *credentials;
  }
  security.job_token = options.auth_token;
  const absl::Time connect_deadline = absl::Now() + options.connect_timeout;
  auto control = GrpcControlClient::Connect(options.servers, options.connect_timeout,
                                            options.rpc_timeout, security);
  if (!control.ok()) return ExplainPlaintextFailure(control.status(), options);
  GrpcControlClient* grpc_control = control->get();
  std::vector<ShardLink> links;
  for (int shard = 0; shard < grpc_control->num_shards(); ++shard) {
    ShardLink link;
    link.name = grpc_control->ShardName(shard);
    link.target = grpc_control->ShardTarget(shard);
    link.channel = grpc_control->channel(shard);
    // "auto" may fall back to gRPC; its channels connect only when used.
    const bool may_use_grpc = options.transport == "grpc" || options.transport == "auto";
    for (int index = 1; may_use_grpc && index < options.grpc_connections; ++index) {
      link.extra_channels.push_back(grpc_control->OpenDataChannel(shard, index));
    }
    if (may_use_grpc && options.pull_connection) {
      link.pull_channel = grpc_control->OpenPullChannel(shard);
    }
    link.address = [grpc_control, shard](const std::string& backend, absl::Time deadline) {
      return grpc_control->GetTransportAddress(shard, backend, deadline);
    };
    link.reachable = [grpc_control, shard] { return grpc_control->ShardReachable(shard); };
    link.encrypted = tls.enabled();
    link.tcp_congestion_control = options.tcp_congestion_control;
    links.push_back(std::move(link));
  }
  auto transports =
      CreateShardTransports(options.transport, absl::StrCat("harrier-worker-", options.worker_name),
                            links, connect_deadline);
  // Not explained as a TLS mismatch: the control channel, over the same
  // addresses and credentials, has just connected.
  if (!transports.ok()) return transports.status();
  auto impl = std::make_unique<Impl>(options, std::move(*control), std::move(*transports),
                                     std::move(*codec));
  if (auto status = impl->Register(); !status.ok()) {
    return ExplainPlaintextFailure(status, options);
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options, std::unique_ptr<ControlClient> control,
    std::vector<std::unique_ptr<ShardTransport>> transports) {
  if (auto status = CheckOptions(options, false); !status.ok()) return status;
  if (control == nullptr || control->num_shards() != static_cast<int>(options.servers.size()) ||
      transports.size() != options.servers.size()) {
    return absl::InvalidArgumentError(
        "need a control client and one transport per server, for every server");
  }
  auto codec = ChunkCodec::Create(options.codec, options.pull_codec, options.compress_min_bytes,
                                 options.host_backend, options.device_backend);
  if (!codec.ok()) return codec.status();
  auto impl =
      std::make_unique<Impl>(options, std::move(control), std::move(transports), std::move(*codec));
  if (auto status = impl->Register(); !status.ok()) return status;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

int Client::rank() const { return impl_->rank_; }

uint64_t Client::session_epoch() const { return impl_->session_.epoch(); }
int Client::num_workers() const { return impl_->num_workers_; }
int Client::num_shards() const { return static_cast<int>(impl_->options_.servers.size()); }
std::vector<std::string> Client::data_paths() const {
  std::vector<std::string> names;
  for (const auto& transport : impl_->transports_) names.push_back(transport->data_path());
  return names;
}
size_t Client::chunk_bytes() const { return impl_->options_.chunk_bytes; }
const Partitioner& Client::partitioner() const { return *impl_->partitioner_; }
const SyncInfo& Client::sync() const { return impl_->sync_; }
void Client::Clock() { impl_->clock_++; }
int64_t Client::clock() const { return impl_->clock_; }

absl::Status Client::RegisterTensor(const std::string& name, const std::vector<int64_t>& shape,
                                    absl::Span<const float> initial_values) {
  return RegisterTensor(name, shape, initial_values, MemoryKind::kHost);
}

absl::Status Client::RegisterTensor(const std::string& name, const std::vector<int64_t>& shape,
                                    absl::Span<const float> initial_values, MemoryKind memory) {
  TensorOptions options;
  options.memory = memory;
  return RegisterTensor(name, shape, initial_values, options);
}

absl::StatusOr<int64_t> Client::TensorClock(const std::string& name) const {
  if (impl_->sparse_ != nullptr && impl_->sparse_->Has(name)) return impl_->sparse_->Clock(name);
  auto info = impl_->tensors_.Find(name);
  if (!info.ok()) return info.status();
  return (*info)->own_clock != nullptr ? (*info)->own_clock->load() : impl_->clock_.load();
}

absl::Status Client::RegisterSparseTable(const std::string& name,
                                         const SparseTableOptions& options) {
  if (impl_->tensors_.Find(name).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("'", name, "' is registered as a dense tensor by this worker"));
  }
  return impl_->sparse_->Register(name, options);
}

Client::Handle Client::PullRowsAsync(const std::string& name, absl::Span<const int64_t> ids,
                                     absl::Span<float> out) {
  impl_->CountStart(OpKind::kPull);
  return impl_->sparse_->PullRows(name, ids, out);
}

Client::Handle Client::PushRowsAsync(const std::string& name, absl::Span<const int64_t> ids,
                                     absl::Span<const float> gradients) {
  impl_->CountStart(OpKind::kPush);
  return impl_->sparse_->PushRows(name, ids, gradients);
}

Client::Handle Client::PullRowsAsync(absl::Span<const SparseRowsPull> pulls) {
  impl_->CountStart(OpKind::kPull);
  return impl_->sparse_->PullRows(pulls);
}

Client::Handle Client::PushRowsAsync(absl::Span<const SparseRowsPush> pushes) {
  impl_->CountStart(OpKind::kPush);
  return impl_->sparse_->PushRows(pushes);
}

absl::Status Client::PullRows(const std::string& name, absl::Span<const int64_t> ids,
                              absl::Span<float> out) {
  return Wait(PullRowsAsync(name, ids, out));
}

absl::Status Client::PushRows(const std::string& name, absl::Span<const int64_t> ids,
                              absl::Span<const float> gradients) {
  return Wait(PushRowsAsync(name, ids, gradients));
}

absl::StatusOr<SparseTableStats> Client::SparseStats(const std::string& name) const {
  return impl_->sparse_->Stats(name);
}

absl::Status Client::RegisterTensor(const std::string& name, const std::vector<int64_t>& shape,
                                    absl::Span<const float> initial_values,
                                    const TensorOptions& options) {
  const MemoryKind memory = options.memory;
  if (name.empty()) return absl::InvalidArgumentError("tensor name is empty");
  // Before anything reaches the shards: a tensor the client cannot
  // compress is not registered anywhere.
  if (!impl_->codec_->Supports(memory)) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is registered in ", MemoryKindName(memory),
                     " memory but ClientOptions.device_backend is not set (a --config=cuda "
                     "build's cuda::NewCudaCodecBackend)"));
  }
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': negative dimension"));
    }
  }
  TensorInfo info = impl_->tensors_.Plan(name, shape);
  info.memory = memory;
  info.push_codec = options.codec;
  info.pull_codec = options.pull_codec;
  info.staging_buffers = options.staging_buffers;
  if (auto status = impl_->codec_->CheckCodecs(info); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", status.message()));
  }
  const bool own_clock = options.own_clock || options.kind == TensorKind::kAverage;
  if (own_clock) {
    // A re-registration keeps the clock: the shards' book of it goes on.
    auto existing = impl_->tensors_.Find(name);
    info.own_clock = existing.ok() && (*existing)->own_clock != nullptr
                         ? (*existing)->own_clock
                         : std::make_shared<std::atomic<int64_t>>(0);
  }
  if (!initial_values.empty() && initial_values.size() != info.num_elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", initial_values.size(),
                                                   " initial values for ", info.num_elements,
                                                   " elements"));
  }
  std::vector<float> zeros;
  if (initial_values.empty()) {
    zeros.assign(info.num_elements, 0.0f);
    initial_values = zeros;
  }
  std::vector<ChunkSpan> spans;
  for (const ShardGroup& group : info.groups) {
    spans.insert(spans.end(), group.spans.begin(), group.spans.end());
  }
  std::sort(spans.begin(), spans.end(),
            [](const ChunkSpan& a, const ChunkSpan& b) { return a.chunk < b.chunk; });
  for (const ChunkSpan& span : spans) {
    proto::InitRequest request;
    request.set_job(impl_->options_.job);
    request.set_rank(static_cast<uint32_t>(impl_->rank_));
    *request.mutable_session() = impl_->session_;
    request.set_key(name);
    request.set_chunk(span.chunk);
    for (int64_t dim : shape) request.add_shape(static_cast<uint64_t>(dim));
    request.set_num_elements(span.num_elements);
    request.set_dtype(proto::DTYPE_FLOAT32);
    request.mutable_initial_values()->assign(
        reinterpret_cast<const char*>(initial_values.data() + span.offset),
        span.num_elements * sizeof(float));
    request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
    request.set_kind(options.kind == TensorKind::kAverage ? proto::TABLE_AVERAGE
                                                           : proto::TABLE_DENSE);
    request.set_own_clock(own_clock);
    if (auto status = impl_->control_->Init(span.shard, request); !status.ok()) return status;
  }
  if (auto status = impl_->codec_->AddTensor(info); !status.ok()) return status;
  impl_->tensors_.Add(std::move(info));
  return absl::OkStatus();
}

Client::Handle Client::PushAsync(const std::string& name, absl::Span<const float> gradient) {
  return impl_->StartGroups(OpKind::kPush, name, impl_->tensors_.Lookup(name, gradient.size()),
                            impl_->PushRun(name, gradient.data()));
}

Client::Handle Client::PullAsync(const std::string& name, absl::Span<float> out) {
  return impl_->StartGroups(OpKind::kPull, name, impl_->tensors_.Lookup(name, out.size()),
                            impl_->PullRun(name, out.data()));
}

Client::Handle Client::PushAsync(const std::string& name, absl::Span<const float> gradient,
                                  const CallScope& scope) {
  return impl_->StartGroups(OpKind::kPush, name,
                            ScopeLayout(impl_->tensors_.Lookup(name, gradient.size()), scope),
                            impl_->PushRun(name, gradient.data()), scope.clock, scope.on_timeline);
}

Client::Handle Client::PullAsync(const std::string& name, absl::Span<float> out,
                                  const CallScope& scope) {
  return impl_->StartGroups(OpKind::kPull, name,
                            ScopeLayout(impl_->tensors_.Lookup(name, out.size()), scope),
                            impl_->PullRun(name, out.data()), scope.clock, scope.on_timeline);
}

Client::Handle Client::PushPullAsync(const std::string& name, absl::Span<const float> gradient,
                                     absl::Span<float> out) {
  return impl_->StartGroups(OpKind::kPushPull, name,
                            impl_->tensors_.LookupPair(name, gradient.size(), out.size()),
                            impl_->PushPullRun(name, gradient.data(), out.data()));
}

void Client::SetTimeline(std::shared_ptr<Timeline> timeline) {
  impl_->engine_.SetTimeline(std::move(timeline));
}

absl::Status Client::StartTimeline(const std::string& path, uint64_t max_bytes) {
  if (max_bytes < 1) return absl::InvalidArgumentError("timeline: max_bytes must be >= 1");
  absl::MutexLock lock(&impl_->timeline_mutex_);
  if (impl_->engine_.timeline() != nullptr) {
    return absl::FailedPreconditionError("timeline: one is already being recorded; stop it first");
  }
  absl::StatusOr<std::unique_ptr<Timeline>> opened = Timeline::Open(path, rank(), max_bytes);
  if (!opened.ok()) return opened.status();
  impl_->engine_.SetTimeline(std::move(*opened));
  return absl::OkStatus();
}

absl::Status Client::StopTimeline(absl::Duration timeout) {
  std::shared_ptr<Timeline> timeline;
  {
    absl::MutexLock lock(&impl_->timeline_mutex_);
    timeline = impl_->engine_.timeline();
    if (timeline == nullptr) return absl::OkStatus();
    impl_->engine_.SetTimeline(nullptr);
  }
  // Operations still in flight hold it; their spans after this are dropped.
  return timeline->Close(timeout);
}

std::shared_ptr<Timeline> Client::timeline() const { return impl_->engine_.timeline(); }

absl::Status Client::Wait(const Handle& handle, absl::Time deadline) {
  return impl_->engine_.Wait(handle, deadline);
}

void Client::WhenDone(const Handle& handle, absl::Time deadline,
                      std::function<void(absl::Status)> done) {
  impl_->engine_.WhenDone(handle, deadline, std::move(done));
}

absl::Status Client::Push(const std::string& name, absl::Span<const float> gradient) {
  return impl_->RunBlocking(OpKind::kPush, name, impl_->tensors_.Lookup(name, gradient.size()),
                            impl_->PushRun(name, gradient.data()));
}

absl::Status Client::Pull(const std::string& name, absl::Span<float> out) {
  return impl_->RunBlocking(OpKind::kPull, name, impl_->tensors_.Lookup(name, out.size()),
                            impl_->PullRun(name, out.data()));
}

absl::Status Client::PushPull(const std::string& name, absl::Span<const float> gradient,
                              absl::Span<float> out) {
  return impl_->RunBlocking(OpKind::kPushPull, name,
                            impl_->tensors_.LookupPair(name, gradient.size(), out.size()),
                            impl_->PushPullRun(name, gradient.data(), out.data()));
}

absl::Status Client::Barrier(const std::string& name) {
  proto::BarrierRequest request;
  request.set_job(impl_->options_.job);
  request.set_rank(static_cast<uint32_t>(impl_->rank_));
  *request.mutable_session() = impl_->session_;
  request.set_name(name);
  return impl_->control_->Barrier(request);
}

absl::Status Client::Heartbeat() {
  proto::HeartbeatRequest request;
  request.set_job(impl_->options_.job);
  request.set_rank(static_cast<uint32_t>(impl_->rank_));
  *request.mutable_session() = impl_->session_;
  request.set_clock(impl_->clock_);
  // The control plane, and every shard: shards' liveness (the worker-loss
  // policy) is each shard's own. Every shard is tried; the first error is
  // returned.
  absl::Status first = impl_->control_->Heartbeat(request);
  for (int shard = 0; shard < impl_->control_->num_shards(); ++shard) {
    proto::HeartbeatRequest to_shard = request;
    if (impl_->calls_ != nullptr) impl_->calls_->AddAcknowledgedClocks(shard, &to_shard);
    absl::Status status = impl_->control_->ShardHeartbeat(
        shard, to_shard, absl::Now() + impl_->options_.rpc_timeout);
    if (first.ok()) first = status;
  }
  return first;
}

absl::Status Client::Leave() {
  for (int shard = 0; shard < impl_->control_->num_shards(); ++shard) {
    proto::LeaveRequest request;
    request.set_job(impl_->options_.job);
    request.set_rank(static_cast<uint32_t>(impl_->rank_));
    *request.mutable_session() = impl_->session_;
    request.set_clock(impl_->clock_);
    if (auto status = impl_->control_->Leave(shard, request); !status.ok()) return status;
  }
  return absl::OkStatus();
}

ClientStats Client::stats() const {
  ClientStats stats;
  stats.bytes_pushed = impl_->calls_->bytes_pushed();
  stats.bytes_pulled = impl_->calls_->bytes_pulled();
  stats.bytes_pushed_per_shard = impl_->calls_->bytes_pushed_per_shard();
  stats.bytes_pulled_per_shard = impl_->calls_->bytes_pulled_per_shard();
  stats.bytes_staged = impl_->calls_->bytes_staged();
  stats.bytes_landed = impl_->calls_->bytes_landed();
  stats.bytes_landed_in_staging = impl_->calls_->bytes_landed_in_staging();
  stats.pushes = impl_->pushes_;
  stats.pulls = impl_->pulls_;
  stats.push_wait = impl_->engine_.push_wait();
  stats.pull_wait = impl_->engine_.pull_wait();
  stats.last_min_clock = impl_->calls_->last_min_clock();
  return stats;
}

int64_t Client::live_operations_for_testing() const { return impl_->engine_.live_operations(); }

}  // namespace harrier
