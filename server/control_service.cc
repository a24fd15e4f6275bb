#include "server/control_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace harrier {

// One Barrier call waiting for the other workers. Finished exactly once, by
// whoever removes it from its barrier (under mutex_), outside the lock.
class ControlServiceImpl::Wait final : public grpc::ServerUnaryReactor {
 public:
  Wait(ControlServiceImpl* service, std::string name, uint32_t rank,
       proto::BarrierResponse* response, Clock::time_point expires)
      : service_(service),
        name_(std::move(name)),
        rank_(rank),
        response_(response),
        expires_(expires) {}

  const std::string& name() const { return name_; }
  uint32_t rank() const { return rank_; }
  Clock::time_point expires() const { return expires_; }

  void Answer(uint32_t generation) {
    response_->set_generation(generation);
    Finish(grpc::Status::OK);
  }

  // The client cancelled, its deadline passed or it went away.
  void OnCancel() override { service_->Withdraw(this); }
  void OnDone() override { delete this; }

 private:
  ControlServiceImpl* const service_;
  const std::string name_;
  const uint32_t rank_;
  proto::BarrierResponse* const response_;  // gRPC's
  const Clock::time_point expires_;
};


ControlServiceImpl::ControlServiceImpl(ControlOptions options)
    : options_(std::move(options)),
      token_check_(options_.job_token),
      rank_taken_(options_.num_workers, false),
      last_heartbeat_(options_.num_workers) {}

ControlServiceImpl::Clock::time_point ControlServiceImpl::BarrierExpiry(
    const grpc::CallbackServerContext& context) const {
  const auto now = Clock::now();
  const auto cap = now + options_.max_barrier_wait;
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return cap;
  const auto remaining = deadline - std::chrono::system_clock::now();
  if (remaining >= options_.max_barrier_wait) return cap;
  return now + std::chrono::duration_cast<Clock::duration>(remaining);
}

void ControlServiceImpl::FillSync(proto::SyncConfig* sync) const {
  switch (options_.sync.mode) {
    case SyncMode::kBsp: sync->set_mode(proto::SYNC_BSP); break;
    case SyncMode::kSsp: sync->set_mode(proto::SYNC_SSP); break;
    case SyncMode::kAsp: sync->set_mode(proto::SYNC_ASP); break;
    case SyncMode::kLocal: sync->set_mode(proto::SYNC_LOCAL); break;
  }
  sync->set_staleness(options_.sync.staleness);
  sync->set_local_steps(options_.sync.local_steps);
}

grpc::Status ControlServiceImpl::Register(grpc::ServerContext* context,
                                          const proto::RegisterRequest* request,
                                          proto::RegisterResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  int rank = request->requested_rank();
  if (rank >= options_.num_workers || rank < -1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("requested rank ", rank, " out of range [0, ",
                                     options_.num_workers, ")"));
  }
  if (rank == -1) {
    for (int r = 0; r < options_.num_workers; ++r) {
      if (!rank_taken_[r]) {
        rank = r;
        break;
      }
    }
    if (rank == -1) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("all ", options_.num_workers,
                                       " worker ranks are taken (--num_workers on the server)"));
    }
  }
  // A rank may register again (a restarted worker keeps its rank).
  rank_taken_[rank] = true;
  last_heartbeat_[rank] = std::chrono::steady_clock::now();
  response->set_rank(static_cast<uint32_t>(rank));
  response->set_num_workers(static_cast<uint32_t>(options_.num_workers));
  for (const auto& address : options_.shard_addresses) response->add_shard_addresses(address);
  FillSync(response->mutable_sync());
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ControlServiceImpl::Barrier(grpc::CallbackServerContext* context,
                                                      const proto::BarrierRequest* request,
                                                      proto::BarrierResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) {
    grpc::ServerUnaryReactor* refused = context->DefaultReactor();
    refused->Finish(status);
    return refused;
  }
  const uint32_t rank = request->rank();
  if (rank >= static_cast<uint32_t>(options_.num_workers)) {
    grpc::ServerUnaryReactor* refused = context->DefaultReactor();
    refused->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("barrier '", request->name(), "': rank ", rank,
                                              " out of range [0, ", options_.num_workers, ")")));
    return refused;
  }
  auto* wait = new Wait(this, request->name(), rank, response, BarrierExpiry(*context));
  std::vector<Wait*> released;
  uint32_t generation = 0;
  grpc::Status refusal;
  {
    absl::MutexLock lock(&mutex_);
    BarrierState& barrier = barriers_[request->name()];
    if (barrier.arrived.empty()) barrier.arrived.assign(options_.num_workers, false);
    if (barrier.arrived[rank]) {
      refusal = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                             absl::StrCat("barrier '", request->name(), "': rank ", rank,
                                          " is already waiting"));
    } else {
      generation = barrier.generation;
      barrier.arrived[rank] = true;
      if (++barrier.count == options_.num_workers) {
        barrier.generation++;
        barrier.count = 0;
        barrier.arrived.assign(options_.num_workers, false);
        released.swap(barrier.waiting);
        released.push_back(wait);
      } else if (closed_) {
        refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down");
      } else {
        barrier.waiting.push_back(wait);
      }
    }
  }
  // Finished outside the lock: a reaction (OnCancel) may run meanwhile and
  // takes it; a wait no longer listed is left alone there.
  if (!refusal.ok()) {
    wait->Finish(refusal);
  } else {
    for (Wait* done : released) done->Answer(generation);
  }
  return wait;
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
                                      options_.num_workers, " workers arrived"));
  return true;
}

void ControlServiceImpl::Withdraw(Wait* wait) {
  grpc::Status status;
  {
    absl::MutexLock lock(&mutex_);
    if (!RemoveLocked(wait, &status)) return;
  }
  wait->Finish(status);
}

void ControlServiceImpl::ExpireBarriers() {
  const auto now = Clock::now();
  std::vector<std::pair<Wait*, grpc::Status>> expired;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& entry : barriers_) {
      std::vector<Wait*> waiting = entry.second.waiting;
      for (Wait* wait : waiting) {
        grpc::Status status;
        if (wait->expires() <= now && RemoveLocked(wait, &status)) {
          expired.emplace_back(wait, std::move(status));
        }
      }
    }
  }
  for (auto& [wait, status] : expired) wait->Finish(status);
}

grpc::Status ControlServiceImpl::Heartbeat(grpc::ServerContext* context,
                                           const proto::HeartbeatRequest* request,
                                           proto::HeartbeatResponse* response) {
  if (auto status = token_check_.Check(*context); !status.ok()) return status;
  if (request->rank() >= static_cast<uint32_t>(options_.num_workers)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("heartbeat: rank ", request->rank(), " out of range"));
  }
  absl::MutexLock lock(&mutex_);
  last_heartbeat_[request->rank()] = std::chrono::steady_clock::now();
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
  FillSync(response->mutable_sync());
  return grpc::Status::OK;
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
    wait->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
  }
}

}  // namespace harrier
