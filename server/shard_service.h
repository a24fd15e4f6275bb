#ifndef HARRIER_SERVER_SHARD_SERVICE_H_
#define HARRIER_SERVER_SHARD_SERVICE_H_

// The one request path of a shard: every transport (the gRPC callback
// service, the UCX listener) decodes its framing into header + payload views
// and calls this class, which owns what must not differ between transports:
// the identity check (job and session of every call that names a rank,
// before anything touches the store), the deadline rule, the chunks-per-call
// limit, push-then-pull, the latency metrics and the bounded executors the
// store work runs on.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"
#include "common/metrics/metrics.h"
#include "common/request_limits.h"
#include "common/thread_pool.h"
#include "proto/harrier.pb.h"
#include "server/buffer_budget.h"
#include "server/memory_account.h"
#include "server/session.h"
#include "server/shard_store.h"

namespace harrier {

struct ShardServiceOptions {
  // The job every message must name (--job), and the job token the session
  // key is derived from (empty: from the job name alone; server/session.h).
  std::string job = kDefaultJob;
  std::string job_token;
  // A Leave (or release) carrying a newer session than a rank's current
  // one is refused while that one has been heard from within this
  // (SessionTable::VerifyHolder); the shard's --rejoin_after_ms.
  std::chrono::milliseconds rejoin_after{3000};
  // Pushes never wait for other workers, so their own small pool keeps them
  // moving (they are what unblocks waiting pulls) while every pull thread is
  // blocked on the consistency model. Used by callers that may not apply a
  // push themselves (Call::work_on_caller_thread false: UCX).
  int push_threads = 2;
  // Threads that answer pulls. A pull blocked on the consistency model
  // holds none while it waits (it is parked on its slot and handed back to
  // this pool when the slot changes, its deadline passes or it is
  // cancelled), so these only copy and send replies.
  int pull_threads = 64;
  // Calls waiting for a thread, per pool; one more is refused with
  // RESOURCE_EXHAUSTED instead of queueing without limit.
  size_t max_queued_calls = 1024;
  // Pulls parked on the consistency model at once (they hold no thread,
  // only their call's memory); one more is refused with RESOURCE_EXHAUSTED.
  size_t max_parked_pulls = 65536;
  // Payload bytes one call may have the transport buffer before the shard
  // validates anything (--max_request_bytes): a call that would hold more is
  // refused with RESOURCE_EXHAUSTED as the excess arrives.
  uint64_t max_request_bytes = uint64_t{512} << 20;
  // The same bound over every unfinished call of one connection
  // (--max_connection_bytes) and of the whole shard (--max_buffered_bytes):
  // see BufferBudget.
  uint64_t max_connection_bytes = uint64_t{1} << 30;
  uint64_t max_buffered_bytes = uint64_t{4} << 30;
  // Bytes parked pulls may hold (their chunk lists and queued reply
  // chunks; --max_parked_pull_bytes) and AdminService.Probe calls in flight
  // (--max_probe_bytes_in_flight): see MemoryAccount.
  uint64_t max_parked_pull_bytes = uint64_t{256} << 20;
  uint64_t max_probe_bytes_in_flight = uint64_t{64} << 20;
  // Call latencies (seconds) are observed into these for every transport;
  // null: not measured. Not owned; must outlive the service.
  Histogram* push_seconds = nullptr;  // Push, and PushPull up to its push applied
  Histogram* pull_seconds = nullptr;  // Pull and PushPull, consistency waits included
};

// Thread-safe. Every call's `done` runs exactly once, either on a pool
// thread or on the calling thread before the method returns: when the call
// is refused before any store work (a full queue, too many chunks,
// shutdown), or when its work ran there (Call::work_on_caller_thread).
// Nothing of the call is touched after `done` starts.
class ShardService {
 public:
  using Clock = ShardStore::Clock;
  using Done = std::function<void(const absl::Status&)>;

  // Most chunks one push, push-pull or pull may carry: bounds the memory a
  // single call holds (chunks are at most 32 MiB, ClientOptions' upper
  // bound). common/request_limits.h states it.
  static constexpr uint32_t kMaxChunksPerCall = static_cast<uint32_t>(harrier::kMaxChunksPerCall);

  // What a transport knows about a call besides its messages.
  struct Call {
    // When the transport saw the call begin: latency is measured from here,
    // so receiving the request counts.
    Clock::time_point received = Clock::now();
    // The client's deadline; max(): the client gave none.
    Clock::time_point client_deadline = Clock::time_point::max();
    // Cancelled by the transport when the client cancels or goes away; may
    // be null. Must stay valid until `done` has run.
    Cancellation* cancellation = nullptr;
    // The calling thread may run the store work that does not wait: the
    // push, and the pull chunks the consistency model lets through at once
    // (from the first that has to wait on, the pull pool answers). Saves a
    // hand-off for callers whose thread may do CPU work and take the
    // store's chunk locks (a gRPC reaction); never for one that must only
    // move bytes (the UCX progress thread).
    bool work_on_caller_thread = false;
    // Push and PushPull: where the store writes what the push did (chunks
    // applied and chunks acknowledged as duplicates, see ShardStore::Push),
    // before `done` runs with OK. May be null. Must stay valid until `done`
    // has run.
    PushResult* push_result = nullptr;
  };

  // Where a pull's reply chunks go. Called on a pool thread, in order:
  // Allocate then Send for each chunk.
  class ReplySink {
   public:
    virtual ~ReplySink() = default;
    // Memory for the next reply chunk's `bytes` payload bytes (the store
    // writes the parameters straight into it, under the chunk's lock: must
    // be quick). Owned by the sink; valid until the Send that follows.
    virtual char* Allocate(size_t bytes) = 0;
    // Instead of Allocate, for a dense reply: the next chunk's payload is
    // the bytes of `version`, borrowed (no copy). The sink holds the
    // reference until its transport is done with the bytes (for gRPC until
    // the slice is released, for UCX until the send completes) and never
    // writes them. Called without the chunk's lock. The default copies
    // into Allocate's memory, for a sink that cannot send borrowed memory.
    virtual void Borrow(std::shared_ptr<const ParamBuffer> version) {
      char* payload = Allocate(version->bytes());
      if (version->bytes() > 0) std::memcpy(payload, version->data(), version->bytes());
    }
    // The chunk whose payload was just written, complete with its job.
    // `index` counts the chunks of this reply from 0; `last`: no chunk
    // follows and, if Send returns OK, the call ends OK (a transport may
    // send the status with this chunk). Must not block; an error (the
    // client went away) ends the call with it.
    virtual absl::Status Send(const proto::TensorChunk& header, uint32_t index, bool last) = 0;
    // Blocks until every chunk sent so far has left (or the client went
    // away: CANCELLED), at most until `deadline` (DEADLINE_EXCEEDED). Called
    // from the pull pool only, before each chunk after the first, so a call
    // holds one reply chunk in memory at a time rather than all of them,
    // and the copy of chunk i+1 does not compete with the send of chunk i.
    // A transport that sends synchronously has nothing to wait for.
    virtual absl::Status AwaitSent(Clock::time_point deadline) {
      (void)deadline;
      return absl::OkStatus();
    }
  };

  // `store` is not owned and must outlive the service.
  ShardService(ShardStore* store, const ShardServiceOptions& options);
  // Shutdown().
  ~ShardService();
  ShardService(const ShardService&) = delete;
  ShardService& operator=(const ShardService&) = delete;

  // The server-side deadline of a call whose client gives up at
  // `client_deadline`: a little earlier, so the client receives the shard's
  // DEADLINE_EXCEEDED (which names the slowest worker) rather than its own
  // bare one; and no later than an hour from `now`, so a call without a
  // deadline does not wait forever.
  static Clock::time_point ServerDeadline(Clock::time_point client_deadline,
                                          Clock::time_point now);

  // OK, or RESOURCE_EXHAUSTED once a call holds more than kMaxChunksPerCall
  // chunks. Transports ask as chunks arrive, so an oversized call is refused
  // before it is all buffered.
  static absl::Status CheckChunkCount(size_t chunks);
  // OK, or RESOURCE_EXHAUSTED once a call's payloads add up to more than
  // max_request_bytes; asked the same way, as payloads arrive.
  absl::Status CheckRequestBytes(uint64_t bytes) const;
  // Whether a push chunk's payload may be handed on split over the pieces
  // it arrived in (ShardStore::ReadsSplitPayload); transports ask before
  // they would copy the pieces together.
  bool ReadsSplitPayload(const proto::TensorChunk& header) const {
    return store_->ReadsSplitPayload(header);
  }
  // Where transports reserve each payload they buffer before the call is
  // validated, per connection and in all, and release it when the call's
  // buffers are freed.
  BufferBudget& buffer_budget() { return memory_.payloads(); }
  // The shard's memory account: every budget, for the transports, the
  // AdminService and the status and metrics.
  MemoryAccount& memory() { return memory_; }
  const MemoryAccount& memory() const { return memory_; }

  // Every request is first checked against the size limits on its strings
  // and lists (common/request_limits.h: INVALID_ARGUMENT, or
  // RESOURCE_EXHAUSTED for more than kMaxChunksPerCall chunks), before
  // anything is allocated or kept for it. Then every call that names a rank
  // is checked against the sessions (SessionTable::Verify: the job, the
  // rank's session): a refused call gets FAILED_PRECONDITION (another job)
  // or PERMISSION_DENIED (no, an old or a bad credential) and changes
  // nothing.

  // Applies one worker's chunks (validated whole first; see
  // ShardStore::Push). The views' memory stays the caller's and valid until
  // `done` has run.
  void Push(const Call& call, std::vector<ShardStore::PushChunkView> chunks, Done done);

  // Answers every chunk of `request` into `sink` as the consistency model
  // allows; `done` gets the first error or OK. `sink` must stay valid until
  // `done` has run.
  void Pull(const Call& call, proto::PullRequest request, ReplySink* sink, Done done);

  // Push, then the pull half of each pushed chunk (ShardStore::PushPullRef)
  // into `sink`. The pull half runs on the pull pool, so the push pool keeps
  // applying the other workers' pushes it may wait for.
  void PushPull(const Call& call, std::vector<ShardStore::PushChunkView> chunks, ReplySink* sink,
                Done done);

  // The worker is alive (ShardStore::Heartbeat), once its session verifies.
  // `response` (may be null) gets the rank's next clock here when the
  // request asks for it.
  absl::Status Heartbeat(const proto::HeartbeatRequest& request,
                         proto::HeartbeatResponse* response = nullptr);
  // Init's limits, job and session (SessionTable::Verify): an Init without
  // a session is refused PERMISSION_DENIED ("register first") and creates
  // nothing; a newer run's session starts that run on this shard before
  // anything is created.
  absl::Status CheckInit(const proto::InitRequest& request);
  // CheckInit, then the store's Init: created (true) or matched (false).
  absl::StatusOr<bool> Init(const proto::InitRequest& request);
  // The rank's worker exited (Membership::Release), logged as
  // `event=worker_done`.
  void Release(uint32_t rank);
  // Applies `policy` to every rank that heartbeated once but not within
  // `timeout`, logging `event=worker_lost` for each. Called periodically by
  // the server's liveness monitor.
  void CheckLiveness(std::chrono::milliseconds timeout, WorkerLossPolicy policy);
  // The worker leaves for good (ShardStore::Leave), once its session
  // verifies: nobody else can make a rank leave.
  absl::Status Leave(const proto::LeaveRequest& request);

  // The sessions this shard verifies against; shard 0's control plane
  // issues new ones through it (server/control_service.h).
  SessionTable& sessions() { return sessions_; }

  // Refuses later calls (UNAVAILABLE), then waits for the queued and running
  // ones to finish: close the store first so blocked pulls end at once.
  // Idempotent.
  void Shutdown();

 private:
  // One call in flight: what its tasks share.
  struct Work;
  // One request's chunks to pull, in reply order.
  struct PullPlan;
  // A pull waiting on its slot without a thread.
  struct Parked;
  enum class Pool { kPush, kPull };
  // What ended a parked pull's wait.
  enum class Wake { kSlot, kCancel, kDeadline, kRetry, kShutdown };

  std::shared_ptr<Work> Begin(const Call& call, Histogram* latency, Done done) const;
  // Runs a push's `task` where the call allows (work_on_caller_thread).
  absl::Status RunPush(const Work& work, std::function<void()> task);
  // Runs `task` on `pool`, or says why not (the service is shut down, or
  // the pool's queue is full) and drops it.
  absl::Status Submit(Pool pool, std::function<void()> task);
  // Answers the plan's chunks from `*next` on into `sink`, advancing
  // `*next`. With `only_if_ready` it stops at the first chunk that would
  // wait, sets `*would_wait` and returns OK.
  // Never waits on the store: the first chunk the consistency model holds
  // back (before the call's deadline) sets `*would_wait` and returns OK.
  // `on_pool`: may wait for the sink (AwaitSent) between chunks.
  absl::Status PullInto(const Work& work, const PullPlan& plan, bool on_pool, size_t* next,
                        ReplySink* sink, bool* would_wait);
  // The pull part of Pull and PushPull: where the call allows, what is
  // ready now on this thread; the rest on the pull pool.
  void AnswerPulls(const std::shared_ptr<Work>& work, std::shared_ptr<PullPlan> plan,
                   ReplySink* sink);
  // Answers from chunk `next` on; parks the call at the first that waits.
  void Continue(const std::shared_ptr<Work>& work, std::shared_ptr<const PullPlan> plan,
                ReplySink* sink, size_t next, bool on_pool);
  // Registers the call on its slot, its cancellation and the deadline
  // timer; whichever fires first hands it to the pull pool (Fire).
  // What a pull parked at item `next` of `plan` holds while it waits.
  static uint64_t ParkedBytes(const PullPlan& plan, size_t next);
  void Park(const std::shared_ptr<Work>& work, std::shared_ptr<const PullPlan> plan,
            ReplySink* sink, size_t next);
  // Once per Park: takes the call off what else it is registered with and
  // resumes it on the pull pool (or, if the pool refuses, on the timer
  // thread). Runs on whatever thread woke it; never under a store lock.
  void Fire(const std::shared_ptr<Parked>& parked, Wake why);
  void Resume(const std::shared_ptr<Parked>& parked);
  // The deadline timer: fires parked calls whose deadline passed, and runs
  // those the pull pool refused.
  void RunTimer();
  absl::Status ApplyPush(const Work& work, const std::vector<ShardStore::PushChunkView>& chunks);
  // Checks every chunk's header against its limits (common/request_limits.h),
  // then verifies the job and session of every chunk (runs of chunks with
  // the same identity are verified once).
  absl::Status CheckChunks(const std::vector<ShardStore::PushChunkView>& chunks,
                           absl::string_view what);

  ShardStore* const store_;
  const ShardServiceOptions options_;
  MemoryAccount memory_;
  SessionTable sessions_;

  // Submitters hold it shared; Shutdown exclusively, to retire the pools.
  absl::Mutex mutex_;
  std::unique_ptr<ThreadPool> push_pool_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<ThreadPool> pull_pool_ ABSL_GUARDED_BY(mutex_);

  // Every parked call, by deadline (the registry Shutdown ends them from).
  absl::Mutex parking_mutex_;
  absl::CondVar parking_changed_;
  std::map<std::pair<Clock::time_point, const Parked*>, std::shared_ptr<Parked>> parked_
      ABSL_GUARDED_BY(parking_mutex_);
  std::vector<std::shared_ptr<Parked>> run_now_ ABSL_GUARDED_BY(parking_mutex_);
  bool parking_closed_ ABSL_GUARDED_BY(parking_mutex_) = false;  // Park refuses
  bool timer_stop_ ABSL_GUARDED_BY(parking_mutex_) = false;
  std::thread timer_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_SERVICE_H_
