#ifndef HARRIER_SERVER_CONTROL_SERVICE_H_
#define HARRIER_SERVER_CONTROL_SERVICE_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/harrier.grpc.pb.h"
#include "server/consistency.h"
#include "server/job_token.h"

namespace harrier {

struct ControlOptions {
  int num_workers = 1;
  SyncPolicy sync;
  std::vector<std::string> shard_addresses;  // may be empty: workers know them
  // A barrier whose client set no deadline (or a later one) ends this long
  // after it began, with DEADLINE_EXCEEDED.
  std::chrono::milliseconds max_barrier_wait = std::chrono::hours(1);
  // Every call must carry this job token (empty: none needed).
  std::string job_token;
};

// The control plane, served by shard 0: ranks, barriers, heartbeats and the
// shard map. Thread-safe. Barriers go through gRPC's callback API and hold
// no thread while they wait: the last worker's arrival answers every waiter
// at once; a waiter whose client cancels or whose deadline passes is
// answered DEADLINE_EXCEEDED at once (gRPC cancels the call) and no longer
// counts as arrived; one without a deadline ends so after max_barrier_wait
// (at the next ExpireBarriers).
class ControlServiceImpl final
    : public proto::ControlService::WithCallbackMethod_Barrier<proto::ControlService::Service> {
 public:
  explicit ControlServiceImpl(ControlOptions options);

  grpc::Status Register(grpc::ServerContext* context, const proto::RegisterRequest* request,
                        proto::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const proto::BarrierRequest* request,
                                    proto::BarrierResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const proto::HeartbeatRequest* request,
                         proto::HeartbeatResponse* response) override;
  grpc::Status GetShardMap(grpc::ServerContext* context, const proto::ShardMapRequest* request,
                           proto::ShardMapResponse* response) override;

  // Answers the barrier waits whose server-side deadline has passed. The
  // client's own deadline cancels its call as it passes; this catches the
  // cap (options.max_barrier_wait) of calls without one, so a coarse period
  // (the shard's monitor runs it every 200 ms) is enough.
  void ExpireBarriers();

  // Answers every waiting barrier UNAVAILABLE; later barriers fail alike.
  void Close();

 private:
  class Wait;
  using Clock = std::chrono::steady_clock;
  struct BarrierState {
    uint32_t generation = 0;
    std::vector<bool> arrived;
    int count = 0;
    std::vector<Wait*> waiting;  // not owned: each finishes itself
  };

  void FillSync(proto::SyncConfig* sync) const;
  // When a barrier entered now gives up: the client's deadline, capped.
  Clock::time_point BarrierExpiry(const grpc::CallbackServerContext& context) const;
  // `wait` stops waiting (its client cancelled, or it expired): it no
  // longer counts as arrived and is answered DEADLINE_EXCEEDED. No-op when
  // it was answered already.
  void Withdraw(Wait* wait);
  // Removes `wait` from its barrier, undoing its arrival; false if it is not
  // waiting (any more). Returns the status to answer it with.
  bool RemoveLocked(Wait* wait, grpc::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const ControlOptions options_;
  const JobTokenCheck token_check_;
  absl::Mutex mutex_;
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<bool> rank_taken_ ABSL_GUARDED_BY(mutex_);
  std::vector<Clock::time_point> last_heartbeat_ ABSL_GUARDED_BY(mutex_);
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_SERVER_CONTROL_SERVICE_H_
