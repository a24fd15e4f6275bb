#include "server/control_service.h"

#include "absl/strings/str_cat.h"

namespace harrier {

ControlServiceImpl::ControlServiceImpl(ControlOptions options)
    : options_(std::move(options)),
      rank_taken_(options_.num_workers, false),
      last_heartbeat_(options_.num_workers) {}

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

grpc::Status ControlServiceImpl::Register(grpc::ServerContext*,
                                          const proto::RegisterRequest* request,
                                          proto::RegisterResponse* response) {
  std::lock_guard<std::mutex> lock(mutex_);
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

grpc::Status ControlServiceImpl::Barrier(grpc::ServerContext* context,
                                         const proto::BarrierRequest* request,
                                         proto::BarrierResponse* response) {
  const uint32_t rank = request->rank();
  if (rank >= static_cast<uint32_t>(options_.num_workers)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("barrier '", request->name(), "': rank ", rank,
                                     " out of range [0, ", options_.num_workers, ")"));
  }
  std::unique_lock<std::mutex> lock(mutex_);
  BarrierState& barrier = barriers_[request->name()];
  if (barrier.arrived.empty()) barrier.arrived.assign(options_.num_workers, false);
  if (barrier.arrived[rank]) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("barrier '", request->name(), "': rank ", rank,
                                     " is already waiting"));
  }
  const uint32_t generation = barrier.generation;
  barrier.arrived[rank] = true;
  if (++barrier.count == options_.num_workers) {
    barrier.generation++;
    barrier.count = 0;
    barrier.arrived.assign(options_.num_workers, false);
    changed_.notify_all();
  }
  while (barrier.generation == generation) {
    if (closed_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down");
    if (context->IsCancelled() ||
        std::chrono::system_clock::now() >= context->deadline()) {
      barrier.arrived[rank] = false;
      barrier.count--;
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("barrier '", request->name(), "': ", barrier.count,
                                       " of ", options_.num_workers, " workers arrived"));
    }
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
  response->set_generation(generation);
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::Heartbeat(grpc::ServerContext*,
                                           const proto::HeartbeatRequest* request,
                                           proto::HeartbeatResponse* response) {
  if (request->rank() >= static_cast<uint32_t>(options_.num_workers)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("heartbeat: rank ", request->rank(), " out of range"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  last_heartbeat_[request->rank()] = std::chrono::steady_clock::now();
  response->set_server_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::GetShardMap(grpc::ServerContext*, const proto::ShardMapRequest*,
                                             proto::ShardMapResponse* response) {
  for (const auto& address : options_.shard_addresses) response->add_shard_addresses(address);
  response->set_num_workers(static_cast<uint32_t>(options_.num_workers));
  FillSync(response->mutable_sync());
  return grpc::Status::OK;
}

void ControlServiceImpl::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

}  // namespace harrier
