#include "server/control_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/request_limits.h"
#include "server/streamed_unary.h"
#include "spdlog/spdlog.h"

namespace harrier {

// One Barrier call, from its arrival (Enter) to its answer. Finished
// exactly once: refused in Enter, or by whoever removes it from its barrier
// (under mutex_), outside the lock.
class ControlServiceImpl::Wait final
    : public AsyncServerCall<grpc::ServerAsyncResponseWriter<proto::BarrierResponse>,
                             proto::BarrierRequest, proto::BarrierResponse> {
 public:
  explicit Wait(ControlServiceImpl* service) : service_(service) {}

  const std::string& name() const { return name_; }
  uint32_t rank() const { return rank_; }
  Clock::time_point expires() const { return expires_; }
  // Set by Enter before the wait is listed.
  void Listed(Clock::time_point expires) {
    name_ = request()->name();
    rank_ = request()->rank();
    expires_ = expires;
  }

  void Answer(uint32_t generation) {
    response()->set_generation(generation);
    Finish(grpc::Status::OK);
  }
  void Refuse(const grpc::Status& status) { Finish(status); }

 private:
  void Begin() override { service_->Enter(this); }
  // The client cancelled, its deadline passed or it went away.
  void OnCancel() override { service_->Withdraw(this); }
  void OnDone() override { delete this; }

  ControlServiceImpl* const service_;
  std::string name_;
  uint32_t rank_ = 0;
  Clock::time_point expires_;
};

ControlServiceImpl::ControlServiceImpl(ControlOptions options)
    : options_(std::move(options)),
      token_check_(options_.job_token),
      own_sessions_(options_.sessions != nullptr
                        ? nullptr
                        : std::make_unique<SessionTable>(
                              options_.job, DeriveSessionKey(options_.job_token, options_.job),
                              options_.num_workers)),
      sessions_(options_.sessions != nullptr ? options_.sessions : own_sessions_.get()) {}

bool ControlServiceImpl::Departed(uint32_t rank) const {
  return options_.membership != nullptr && options_.membership->departed(rank);
}

int ControlServiceImpl::ActiveRanks() const {
  return options_.membership != nullptr ? options_.membership->active() : options_.num_workers;
}

bool ControlServiceImpl::CompleteLocked(const BarrierState& barrier) const {
  for (int r = 0; r < options_.num_workers; ++r) {
    if (!barrier.arrived[r] && !Departed(static_cast<uint32_t>(r))) return false;
  }
  return true;
}

void ControlServiceImpl::ReleaseLocked(BarrierState* barrier, std::vector<Wait*>* released,
                                       uint32_t* generation) {
  *generation = barrier->generation++;
  barrier->count = 0;
  barrier->arrived.assign(options_.num_workers, false);
  released->insert(released->end(), barrier->waiting.begin(), barrier->waiting.end());
  barrier->waiting.clear();
}

absl::Status ControlServiceImpl::CheckRankFree(uint32_t rank, bool by_number,
                                               const proto::Session* previous) {
  const SessionTable::RankState state = sessions_->state(rank);
  if (state.epoch == 0 || state.released) return absl::OkStatus();
  const auto now = SessionTable::Clock::now();
  const auto timeout = options_.heartbeat_timeout;
  if (!state.heard) {
    // Handed out, and no call ever carried it: reclaimed, so a Register
    // flood cannot hold ranks for the workers still to come.
    if (state.issued && now - state.issued_at > timeout) return absl::OkStatus();
  } else if (by_number &&
             now - state.last_heard > std::min(options_.rejoin_after, options_.heartbeat_timeout)) {
    // A rank asked for by number whose worker has gone silent: taken over
    // (a restarted worker that lost its session rejoins).
    return absl::OkStatus();
  }
  // The worker holding the rank re-registers: it proves it with the
  // session it holds.
  if (by_number && previous != nullptr && !previous->credential().empty() &&
      previous->epoch() == state.epoch &&
      sessions_->Verify(sessions_->job(), rank, *previous, "register").ok()) {
    return absl::OkStatus();
  }
  const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(
                         now - (state.heard ? state.last_heard : state.issued_at))
                         .count();
  return absl::AlreadyExistsError(absl::StrCat(
      "rank ", rank, " is held by a live session (epoch ", state.epoch,
      state.heard ? ", last heard " : ", handed out ", since,
      " ms ago): a worker re-registering for it must present that session, or wait until it "
      "has been silent for --rejoin_after_ms=",
      std::min(options_.rejoin_after, options_.heartbeat_timeout).count()));
}

ControlServiceImpl::Clock::time_point ControlServiceImpl::BarrierExpiry(
    const grpc::ServerContextBase& context) const {
  const auto now = Clock::now();
  const auto cap = now + options_.max_barrier_wait;
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return cap;
  const auto remaining = deadline - std::chrono::system_clock::now();
  if (remaining >= options_.max_barrier_wait) return cap;
  return now + std::chrono::duration_cast<Clock::duration>(remaining);
}

static void FillOptimizerConfig(const OptimizerOptions& optimizer, proto::OptimizerConfig* out) {
  out->set_kind(optimizer.kind);
  out->set_lr(optimizer.lr);
  out->set_momentum(optimizer.momentum);
  out->set_weight_decay(optimizer.weight_decay);
  out->set_beta1(optimizer.beta1);
  out->set_beta2(optimizer.beta2);
  out->set_epsilon(optimizer.epsilon);
}

void FillSyncConfig(const SyncPolicy& policy, proto::SyncConfig* sync) {
  switch (policy.mode) {
    case SyncMode::kBsp:
      sync->set_mode(proto::SYNC_BSP);
      break;
    case SyncMode::kSsp:
      sync->set_mode(proto::SYNC_SSP);
      break;
    case SyncMode::kAsp:
      sync->set_mode(proto::SYNC_ASP);
      break;
    case SyncMode::kLocal:
      sync->set_mode(proto::SYNC_LOCAL);
      break;
  }
  sync->set_staleness(policy.staleness);
  sync->set_local_steps(policy.local_steps);
}

grpc::Status ControlServiceImpl::StreamedRegister(
    grpc::ServerContext* context,
    UnaryStreamer<proto::RegisterRequest, proto::RegisterResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this, context](const proto::RegisterRequest& request, proto::RegisterResponse* response) {
        return Register(context, &request, response);
      });
}

grpc::Status ControlServiceImpl::StreamedHeartbeat(
    grpc::ServerContext* context,
    UnaryStreamer<proto::HeartbeatRequest, proto::HeartbeatResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this, context](const proto::HeartbeatRequest& request, proto::HeartbeatResponse* response) {
        return Heartbeat(context, &request, response);
      });
}

grpc::Status ControlServiceImpl::StreamedGetShardMap(
    grpc::ServerContext* context,
    UnaryStreamer<proto::ShardMapRequest, proto::ShardMapResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this, context](const proto::ShardMapRequest& request, proto::ShardMapResponse* response) {
        return GetShardMap(context, &request, response);
      });
}

grpc::Status ControlServiceImpl::Register(grpc::ServerContext* context,
                                          const proto::RegisterRequest* request,
                                          proto::RegisterResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  if (auto status = CheckRegisterLimits(*request); !status.ok()) return ToGrpcStatus(status);
  if (auto status = sessions_->CheckJob(request->job(), "register"); !status.ok()) {
    return ToGrpcStatus(status);
  }
  int rank = request->requested_rank();
  if (rank >= options_.num_workers || rank < -1) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("requested rank ", rank, " out of range [0, ", options_.num_workers, ")"));
  }
  absl::MutexLock lock(&register_mutex_);
  if (request->release()) {
    // Only the session's holder may give it back.
    if (rank < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "release: requested_rank names the rank to give back");
    }
    if (auto status = sessions_->VerifyHolder(
            request->job(), static_cast<uint32_t>(rank), request->previous_session(), "release",
            std::min(options_.rejoin_after, options_.heartbeat_timeout));
        !status.ok()) {
      return ToGrpcStatus(status);
    }
    if (!sessions_->Release(static_cast<uint32_t>(rank), request->previous_session().epoch())) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("release: rank ", rank, ": session epoch ",
                       request->previous_session().epoch(), " is not the rank's current one"));
    }
    spdlog::info("event=release shard=0 rank={} epoch={}", rank,
                 request->previous_session().epoch());
    if (options_.membership != nullptr) options_.membership->Release(static_cast<uint32_t>(rank));
    response->set_rank(static_cast<uint32_t>(rank));
    response->set_num_workers(static_cast<uint32_t>(options_.num_workers));
    return grpc::Status::OK;
  }
  if (options_.before_register) options_.before_register();
  if (rank == -1) {
    for (int r = 0; r < options_.num_workers; ++r) {
      if (CheckRankFree(static_cast<uint32_t>(r), /*by_number=*/false, nullptr).ok()) {
        rank = r;
        break;
      }
    }
    if (rank == -1) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("all ", options_.num_workers,
                       " worker ranks are taken (--num_workers on the server); a rank handed out "
                       "but not used within --heartbeat_timeout_ms=",
                       options_.heartbeat_timeout.count(), " is handed out again"));
    }
  } else {
    const proto::Session* previous =
        request->has_previous_session() ? &request->previous_session() : nullptr;
    if (auto status = CheckRankFree(static_cast<uint32_t>(rank), /*by_number=*/true, previous);
        !status.ok()) {
      return ToGrpcStatus(status);
    }
  }
  // Epochs grow across a restart of shard 0 too: wall-clock milliseconds,
  // and above every epoch the shard has seen since it started.
  const uint64_t now_ms =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  const uint64_t epoch = std::max({last_epoch_ + 1, now_ms, sessions_->max_epoch() + 1});
  last_epoch_ = epoch;
  // A rank that held a session before (a worker restarted, or one taking
  // over a silent rank) rejoins under the new epoch.
  const uint64_t previous_epoch = sessions_->state(static_cast<uint32_t>(rank)).epoch;
  *response->mutable_session() = sessions_->Issue(static_cast<uint32_t>(rank), epoch);
  if (options_.membership != nullptr) options_.membership->Join(static_cast<uint32_t>(rank));
  if (previous_epoch == 0) {
    spdlog::info("event=register shard=0 rank={} epoch={} worker={} job_id={}", rank, epoch,
                 TruncatedForLog(request->worker_name()), sessions_->job_id());
  } else {
    spdlog::info("event=rejoin shard=0 rank={} epoch={} previous_epoch={} worker={} job_id={}",
                 rank, epoch, previous_epoch, TruncatedForLog(request->worker_name()),
                 sessions_->job_id());
  }
  response->set_rank(static_cast<uint32_t>(rank));
  response->set_num_workers(static_cast<uint32_t>(options_.num_workers));
  response->set_job_id(response->session().job_id());
  for (const auto& address : options_.shard_addresses) response->add_shard_addresses(address);
  FillSyncConfig(options_.sync, response->mutable_sync());
  FillOptimizerConfig(options_.optimizer, response->mutable_optimizer());
  return grpc::Status::OK;
}

void ControlServiceImpl::StartCalls(const std::vector<grpc::ServerCompletionQueue*>& queues) {
  for (grpc::ServerCompletionQueue* queue : queues) {
    auto request = [this](Wait* call, grpc::ServerCompletionQueue* q, void* tag) {
      RequestBarrier(call->context(), call->request(), call->stream(), q, q, tag);
    };
    acceptors_.push_back(AcceptCalls<Wait>(queue, &live_calls_, std::move(request),
                                           [this] { return new Wait(this); }));
  }
}

bool ControlServiceImpl::AwaitCallsDone(absl::Time deadline) {
  return live_calls_.AwaitNone(deadline);
}

void ControlServiceImpl::Enter(Wait* wait) {
  const proto::BarrierRequest* request = wait->request();
  if (auto status = token_check_.Check(*wait->context()); !status.ok()) {
    wait->Refuse(status);
    return;
  }
  if (auto status = CheckBarrierLimits(*request); !status.ok()) {
    wait->Refuse(ToGrpcStatus(status));
    return;
  }
  const uint32_t rank = request->rank();
  if (auto status = sessions_->Verify(request->job(), rank, request->session(),
                                      absl::StrCat("barrier '", request->name(), "'"));
      !status.ok()) {
    wait->Refuse(ToGrpcStatus(status));
    return;
  }
  wait->Listed(BarrierExpiry(*wait->context()));
  std::vector<Wait*> released;
  uint32_t generation = 0;
  grpc::Status refusal;
  {
    absl::MutexLock lock(&mutex_);
    BarrierState* barrier = FindOrAddLocked(request->name());
    if (barrier == nullptr) {
      refusal = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("barrier '", TruncatedForLog(request->name()), "': ranks wait at ",
                       barriers_.size(), " other barriers already, the limit of ",
                       kMaxPendingBarriers, " pending barriers on this shard"));
    } else if (barrier->arrived[rank]) {
      refusal = grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("barrier '", request->name(), "': rank ", rank, " is already waiting"));
    } else {
      barrier->arrived[rank] = true;
      ++barrier->count;
      if (CompleteLocked(*barrier)) {
        barrier->waiting.push_back(wait);
        ReleaseLocked(barrier, &released, &generation);
      } else if (closed_) {
        barrier->arrived[rank] = false;
        --barrier->count;
        DropAbandonedLocked();
        refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down");
      } else {
        barrier->waiting.push_back(wait);
      }
    }
  }
  // Finished outside the lock: a reaction (OnCancel) may run meanwhile and
  // takes it; a wait no longer listed is left alone there.
  if (!refusal.ok()) {
    wait->Refuse(refusal);
  } else {
    for (Wait* done : released) done->Answer(generation);
  }
}

bool ControlServiceImpl::RemoveLocked(Wait* wait, grpc::Status* status) {
  auto it = barriers_.find(wait->name());
  if (it == barriers_.end()) return false;
  BarrierState& barrier = it->second;
  auto listed = std::find(barrier.waiting.begin(), barrier.waiting.end(), wait);
  if (listed == barrier.waiting.end()) return false;
  barrier.waiting.erase(listed);
  barrier.arrived[wait->rank()] = false;
  barrier.count--;
  *status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                         absl::StrCat("barrier '", wait->name(), "': ", barrier.count, " of ",
                                      ActiveRanks(), " workers arrived"));
  return true;
}

void ControlServiceImpl::DropAbandonedLocked() {
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    if (it->second.waiting.empty() && it->second.generation == 0) {
      it = barriers_.erase(it);
    } else {
      ++it;
    }
  }
}

ControlServiceImpl::BarrierState* ControlServiceImpl::FindOrAddLocked(const std::string& name) {
  if (auto it = barriers_.find(name); it != barriers_.end()) return &it->second;
  if (barriers_.size() >= kMaxPendingBarriers) {
    // Idle barriers (completed, nobody waiting) give way: only their
    // generation count is lost.
    for (auto it = barriers_.begin(); it != barriers_.end();) {
      it = it->second.waiting.empty() ? barriers_.erase(it) : std::next(it);
    }
    if (barriers_.size() >= kMaxPendingBarriers) return nullptr;
  }
  BarrierState& barrier = barriers_[name];
  barrier.arrived.assign(options_.num_workers, false);
  return &barrier;
}

int ControlServiceImpl::WaitingAt(const std::string& name) {
  absl::MutexLock lock(&mutex_);
  const auto it = barriers_.find(name);
  return it == barriers_.end() ? 0 : static_cast<int>(it->second.waiting.size());
}

void ControlServiceImpl::Withdraw(Wait* wait) {
  grpc::Status status;
  {
    absl::MutexLock lock(&mutex_);
    if (!RemoveLocked(wait, &status)) return;
    DropAbandonedLocked();
  }
  wait->Refuse(status);
}

void ControlServiceImpl::ExpireBarriers() {
  const auto now = Clock::now();
  std::vector<std::pair<Wait*, grpc::Status>> expired;
  std::vector<std::pair<std::vector<Wait*>, uint32_t>> completed;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& entry : barriers_) {
      // A rank left (or was lost) while the others waited for it: they
      // need not wait any longer.
      if (!entry.second.waiting.empty() && CompleteLocked(entry.second)) {
        auto& done = completed.emplace_back();
        ReleaseLocked(&entry.second, &done.first, &done.second);
        continue;
      }
      std::vector<Wait*> waiting = entry.second.waiting;
      for (Wait* wait : waiting) {
        grpc::Status status;
        if (wait->expires() <= now && RemoveLocked(wait, &status)) {
          expired.emplace_back(wait, std::move(status));
        }
      }
    }
    if (!expired.empty()) DropAbandonedLocked();
  }
  for (auto& [wait, status] : expired) wait->Refuse(status);
  for (auto& [waits, generation] : completed) {
    for (Wait* wait : waits) wait->Answer(generation);
  }
}

grpc::Status ControlServiceImpl::Heartbeat(grpc::ServerContext* context,
                                           const proto::HeartbeatRequest* request,
                                           proto::HeartbeatResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  if (auto status = CheckHeartbeatLimits(*request, options_.max_chunk_clocks); !status.ok()) {
    return ToGrpcStatus(status);
  }
  // A verified session counts as heard: what Register reads to tell a live
  // session from a silent or unused one.
  if (auto status =
          sessions_->Verify(request->job(), request->rank(), request->session(), "heartbeat");
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  response->set_server_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::GetShardMap(grpc::ServerContext* context,
                                             const proto::ShardMapRequest*,
                                             proto::ShardMapResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  for (const auto& address : options_.shard_addresses) response->add_shard_addresses(address);
  response->set_num_workers(static_cast<uint32_t>(options_.num_workers));
  FillSyncConfig(options_.sync, response->mutable_sync());
  return grpc::Status::OK;
}

void ControlServiceImpl::StartRun() {
  std::vector<Wait*> waiting;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& entry : barriers_) {
      waiting.insert(waiting.end(), entry.second.waiting.begin(), entry.second.waiting.end());
    }
    barriers_.clear();
  }
  for (Wait* wait : waiting) {
    wait->Refuse(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "barrier: the run ended and a new one started"));
  }
}

void ControlServiceImpl::Close() {
  std::vector<Wait*> waiting;
  {
    absl::MutexLock lock(&mutex_);
    closed_ = true;
    for (auto& entry : barriers_) {
      waiting.insert(waiting.end(), entry.second.waiting.begin(), entry.second.waiting.end());
      entry.second.waiting.clear();
    }
  }
  for (Wait* wait : waiting) {
    wait->Refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
  }
}

}  // namespace harrier
