#ifndef HARRIER_SERVER_CONTROL_SERVICE_H_
#define HARRIER_SERVER_CONTROL_SERVICE_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/harrier.grpc.pb.h"
#include "server/consistency.h"
#include "server/grpc/async_call.h"
#include "server/optimizer.h"
#include "server/job_token.h"
#include "server/membership.h"
#include "server/session.h"
#include "server/streamed_unary.h"

namespace harrier {

// The sync policy as workers and operators are told it (RegisterResponse,
// GetShardMap, AdminService.GetStatus).
void FillSyncConfig(const SyncPolicy& policy, proto::SyncConfig* sync);

struct ControlOptions {
  int num_workers = 1;
  SyncPolicy sync;
  // The shards' optimizer, told to every worker that registers.
  OptimizerOptions optimizer;
  std::vector<std::string> shard_addresses;  // may be empty: workers know them
  // A barrier whose client set no deadline (or a later one) ends this long
  // after it began, with DEADLINE_EXCEEDED.
  std::chrono::milliseconds max_barrier_wait = std::chrono::hours(1);
  // Every call must carry this job token (empty: none needed).
  std::string job_token;
  // The job every request must name (--job).
  std::string job = kDefaultJob;
  // Most ChunkClocks a Heartbeat may list: the chunks a shard may hold
  // (--max_chunks).
  size_t max_chunk_clocks = size_t{1} << 20;
  // Shard 0's sessions (its ShardService's), through which Register issues
  // new ones, so shard 0's data path refuses a replaced epoch at once, and
  // whose record of when each rank was last heard (control heartbeats and
  // shard 0's data calls alike) decides which ranks Register may hand out
  // again. Not owned; must outlive the service. Null: the service keeps a
  // table of its own, keyed from `job` and `job_token` (tests).
  SessionTable* sessions = nullptr;
  // Shard 0's membership: a rank that left (Leave, or lost under
  // --on_worker_loss=continue) no longer holds up a barrier; a rank that
  // registers joins it (Membership::Join). Not owned; must outlive the
  // service. Null: nobody ever leaves.
  Membership* membership = nullptr;
  // A session handed out by Register but not heard from within this is
  // reclaimed (its rank may be handed out again); a heard session silent
  // this long may be replaced by a Register for its rank.
  std::chrono::milliseconds heartbeat_timeout{10000};
  // A Register for a rank by number replaces a session silent this long (a
  // restarted worker rejoins before --on_worker_loss acts on its silence).
  std::chrono::milliseconds rejoin_after{3000};
  // Called at the start of every Register (not a release), under the
  // Register lock: the shard starts its next run there once the last one is
  // done (--exit_when_done=false). Null: nothing.
  std::function<void()> before_register;
};

// The control plane, served by shard 0: ranks and their sessions, barriers,
// heartbeats and the shard map. Register's rules (server/README.md,
// "Sessions"): a rank is free when no session of it is known, or when its
// session was handed out but nothing carried it within heartbeat_timeout
// (a Register flood cannot keep ranks); a Register asking for a held rank
// gets a new epoch only if it presents the rank's current session, or the
// session has been silent for heartbeat_timeout, and ALREADY_EXISTS
// otherwise. Every other call that names a rank must carry its session.
// A barrier completes once every rank still in the job (not departed in
// `membership`) has arrived. Thread-safe. Barriers go through gRPC's callback API and hold
// no thread while they wait: the last worker's arrival answers every waiter
// at once; a waiter whose client cancels or whose deadline passes is
// answered DEADLINE_EXCEEDED at once (gRPC cancels the call) and no longer
// counts as arrived; one without a deadline ends so after max_barrier_wait
// (at the next ExpireBarriers). Barrier state is bounded
// (common/request_limits.h): names are at most kMaxBarrierNameBytes; at most
// kMaxPendingBarriers names are kept at once (a completed barrier's idle
// state is dropped to make room; a new name while every kept one has a rank
// waiting is refused RESOURCE_EXHAUSTED); a barrier whose last waiter
// leaves (its deadline, a cancel) before it ever completed is dropped.
// Register, Heartbeat and GetShardMap are served as streamed unary
// (server/streamed_unary.h): the token is checked at a call's headers,
// before its request body is read.
class ControlServiceImpl final
    : public proto::ControlService::WithAsyncMethod_Barrier<
          proto::ControlService::WithStreamedUnaryMethod_Register<
              proto::ControlService::WithStreamedUnaryMethod_Heartbeat<
                  proto::ControlService::WithStreamedUnaryMethod_GetShardMap<
                      proto::ControlService::Service>>>>,
      public QueueServedService {
 public:
  explicit ControlServiceImpl(ControlOptions options);

  grpc::Status StreamedRegister(
      grpc::ServerContext* context,
      UnaryStreamer<proto::RegisterRequest, proto::RegisterResponse>* streamer) override;
  grpc::Status StreamedHeartbeat(
      grpc::ServerContext* context,
      UnaryStreamer<proto::HeartbeatRequest, proto::HeartbeatResponse>* streamer) override;
  grpc::Status StreamedGetShardMap(
      grpc::ServerContext* context,
      UnaryStreamer<proto::ShardMapRequest, proto::ShardMapResponse>* streamer) override;
  // What the streamed methods run once the request is read (each checks the
  // token again: they may also be called directly).
  grpc::Status Register(grpc::ServerContext* context, const proto::RegisterRequest* request,
                        proto::RegisterResponse* response) override;
  // Barrier is asynchronous: its calls wait on the queues the server's
  // listener polls (server/grpc/async_call.h), holding no thread.
  void StartCalls(const std::vector<grpc::ServerCompletionQueue*>& queues) override;
  bool AwaitCallsDone(absl::Time deadline) override;
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

  // How many ranks wait at barrier `name` now (0 for a barrier never
  // entered). A cancelled call stops counting only once gRPC tells the
  // shard, which trails the client's own view of the cancel.
  int WaitingAt(const std::string& name);

  // A new run: barriers start over (waiters of the old run are answered
  // FAILED_PRECONDITION). The sessions and membership are reset by their
  // owner.
  void StartRun();

 private:
  class Wait;
  using Clock = std::chrono::steady_clock;
  struct BarrierState {
    uint32_t generation = 0;
    std::vector<bool> arrived;
    int count = 0;
    std::vector<Wait*> waiting;  // not owned: each finishes itself
  };

  // Why `rank` may not be handed to a new session now (OK: it may). A
  // Register asking for the rank `by_number` may also take it over from a
  // silent session, or renew it with `previous` (may be null), the rank's
  // current session.
  absl::Status CheckRankFree(uint32_t rank, bool by_number, const proto::Session* previous);
  // Ranks that have not left.
  int ActiveRanks() const;
  bool Departed(uint32_t rank) const;
  // Every rank still in the job has arrived.
  bool CompleteLocked(const BarrierState& barrier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Answers the waiters of `barrier` with its generation and starts the
  // next one; the waiters are added to `released`.
  void ReleaseLocked(BarrierState* barrier, std::vector<Wait*>* released, uint32_t* generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // When a barrier entered now gives up: the client's deadline, capped.
  Clock::time_point BarrierExpiry(const grpc::ServerContextBase& context) const;
  // A Barrier call arrived: answered, refused, or left waiting.
  void Enter(Wait* wait);
  // `wait` stops waiting (its client cancelled, or it expired): it no
  // longer counts as arrived and is answered DEADLINE_EXCEEDED. No-op when
  // it was answered already.
  void Withdraw(Wait* wait);
  // Removes `wait` from its barrier, undoing its arrival; false if it is not
  // waiting (any more). Returns the status to answer it with. The barrier's
  // state stays (see DropIfAbandonedLocked).
  bool RemoveLocked(Wait* wait, grpc::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops every barrier nobody waits at that never completed (its
  // generation would start again at 0 anyway): an abandoned barrier keeps
  // nothing.
  void DropAbandonedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The state of barrier `name`, made if new: when kMaxPendingBarriers
  // names are kept already, idle ones (nobody waiting) are dropped to make
  // room first; null when every kept one has a rank waiting.
  BarrierState* FindOrAddLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const ControlOptions options_;
  const JobTokenCheck token_check_;
  std::unique_ptr<SessionTable> own_sessions_;  // when options_.sessions is null
  SessionTable* const sessions_;
  absl::Mutex mutex_;
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
  // Serialises Register: the rank choice and the issue are one step.
  absl::Mutex register_mutex_;
  uint64_t last_epoch_ ABSL_GUARDED_BY(register_mutex_) = 0;
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mutex_);
  LiveCalls live_calls_;
  std::vector<std::unique_ptr<QueueEvent>> acceptors_;  // after live_calls_: they refer to it
};

}  // namespace harrier

#endif  // HARRIER_SERVER_CONTROL_SERVICE_H_
