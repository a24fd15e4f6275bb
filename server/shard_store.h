#ifndef HARRIER_SERVER_SHARD_STORE_H_
#define HARRIER_SERVER_SHARD_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cancellation.h"
#include "common/codec/codec.h"
#include "common/partitioner.h"
#include "proto/harrier.pb.h"
#include "server/checkpoint.h"
#include "server/codec_cache.h"
#include "server/consistency.h"
#include "server/fused_apply.h"
#include "server/membership.h"
#include "server/optimizer.h"

namespace harrier {

class ThreadPool;

// One version of a chunk's parameters: 64-byte aligned floats. A slot
// publishes a version and never writes it again while anyone else holds it
// (copy-on-write), so a pull may send it as it is, holding a reference
// until its transport is done with the bytes. Thread-safe to read once
// published; writes only by the slot, under its lock, while it is the sole
// holder.
class ParamBuffer {
 public:
  explicit ParamBuffer(size_t num_elements);  // contents uninitialised
  ~ParamBuffer();
  ParamBuffer(const ParamBuffer&) = delete;
  ParamBuffer& operator=(const ParamBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(float); }
  // CRC32C of the bytes, computed by the first caller and cached: once per
  // version, not once per pull. Racing callers compute the same value.
  uint32_t Crc() const;
  // The bytes are about to change (the slot's sole holder writes them).
  void Invalidate() { crc_.store(0, std::memory_order_relaxed); }

 private:
  float* const data_;
  const size_t size_;
  // (1 << 32) | crc once known; 0 before.
  mutable std::atomic<uint64_t> crc_{0};
};

struct ShardStoreOptions {
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  SyncPolicy sync;
  // SSP/ASP: divide each push's step by the staleness it arrives with
  // (Zhang et al. 2016), i.e. by max(1, fastest rank's clock - push clock).
  bool staleness_aware_lr = false;
  // BSP/local: rounds a rank may push ahead of the slowest live rank
  // (ConsistencyController); bounds the round sums a slot holds.
  int64_t max_pending_rounds = ConsistencyController::kDefaultMaxPendingRounds;
  // What a job may Init on this shard: chunks (keys x chunks), their bytes
  // in all, and the bytes of one chunk (a client splits tensors into chunks
  // of at most 32 MiB). Past them Init answers RESOURCE_EXHAUSTED.
  size_t max_chunks = 1u << 20;
  uint64_t max_param_bytes = uint64_t{64} << 30;
  uint64_t max_chunk_bytes = uint64_t{32} << 20;
  // Threads that apply one large dense chunk (at least 1 MiB) in parts
  // (server/fused_apply.h); results are bit-identical for every count. 1:
  // the pushing thread alone.
  int apply_threads = 1;
};

// Counters a shard exposes (monotonic; read without locks).
struct ShardCounters {
  // Staleness of answered pulls: pull clock minus min clock.
  std::atomic<int64_t> max_staleness{0};
  std::atomic<uint64_t> pushes{0};
  std::atomic<uint64_t> pulls{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> optimizer_steps{0};
  // Exactly-once: pushed chunks acknowledged as already applied (or held in
  // a pending round) and not applied again.
  std::atomic<uint64_t> duplicate_pushes{0};
  // Compressed pulls answered from the view before the current one (the
  // client lost the latest reply), and dense ones that reset a view the
  // client did not hold (version 0, unknown, or from before a restart).
  std::atomic<uint64_t> pull_view_remakes{0};
  std::atomic<uint64_t> pull_view_resets{0};
};

// What a push call did, chunk by chunk (ShardStore::Push).
struct PushResult {
  uint32_t applied = 0;    // new chunks: applied, or held for their round
  uint32_t duplicate = 0;  // seen before: acknowledged, not applied again
};

// The parameters one shard owns, keyed by (tensor key, chunk). Applies
// pushes and answers pulls as each slot's ClockBook (server/consistency.h)
// says; who is still in the job is its Membership's (server/membership.h). Every public
// method is thread-safe; each chunk has its own lock, so pushes and pulls of
// different chunks run in parallel. Bad input is refused before anything
// changes: a refused call leaves every chunk as it was.
class ShardStore {
 public:
  using Clock = std::chrono::steady_clock;

  ShardStore(ShardStoreOptions options, std::unique_ptr<Optimizer> optimizer);
  ~ShardStore();

  const ShardStoreOptions& options() const { return options_; }
  const ConsistencyController& controller() const { return controller_; }
  const ShardCounters& counters() const { return counters_; }

  // Creates the chunk with the given values (returns true), or checks the
  // request against the existing chunk (returns false, values kept).
  absl::StatusOr<bool> Init(const proto::InitRequest& request);

  // One worker's gradients for one clock, any number of chunks. All chunks
  // are validated first; then, with every slot of the call locked, all are
  // re-checked and classified (ClockBook::ClassifyPush), and each dense
  // payload's CRC and limit are checked in the one pass that also writes its
  // step (SGD) or round sum into a shadow buffer (server/fused_apply.h;
  // other optimizers: the pass checks, Optimizer::Step follows). If any is
  // refused, none is applied and the call changes nothing (the shadows go
  // back to being spares); otherwise the shadows are swapped in, every new
  // chunk is applied and every duplicate (rank, clock, key, chunk) is only
  // counted, so a retried call is applied exactly once. A call may mix the
  // two after a restore (the checkpoint may hold one slot's push and not
  // another's, e.g. a BSP round complete on one slot and pending on the
  // other): only the missing chunks are applied. INVALID_ARGUMENT for a
  // malformed chunk (duplicates are validated too), NOT_FOUND for an
  // unknown key, FAILED_PRECONDITION for a clock from the future, a clock
  // lost with a restart or a rank that left. `result` (may be null) gets the
  // counts of an OK call.
  absl::Status Push(const std::vector<proto::TensorChunk>& chunks, PushResult* result = nullptr);

  // A pushed chunk whose payload is not in the message: `header`'s payload
  // field is ignored and `payload` is used instead. Both are borrowed for the
  // call only. `payload.data()` must be aligned for float (dense payloads
  // are read in place as the gradient).
  struct PushChunkView {
    const proto::TensorChunk* header = nullptr;
    absl::string_view payload;
  };
  // As Push above (same validation, same errors), without copying payloads.
  absl::Status Push(const std::vector<PushChunkView>& chunks, PushResult* result = nullptr);

  // Writes the chunk's parameters into `out` once a pull at `clock` may be
  // answered. Waits until `deadline` or until `cancellation` (may be null) is
  // cancelled, whichever comes first; either wakes the wait at once (no
  // polling). DEADLINE_EXCEEDED names the clock waited for and the slowest
  // worker; CANCELLED says the client cancelled.
  absl::Status Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                    Clock::time_point deadline, Cancellation* cancellation,
                    proto::TensorChunk* out);

  // A pull that has to wait without holding a thread (ShardService parks
  // it). Wake() runs at most once per Park, on the thread that changed the
  // slot (a push applied, a round finished, a departure or re-base,
  // StartRun, Close), after the store has released its locks: it must be
  // quick (hand the answer to a pool) and may call back into the store.
  class PullWaiter {
   public:
    virtual ~PullWaiter() = default;
    virtual void Wake() = 0;
  };
  // For a pull Pull told to wait: under the slot's lock, true if it still
  // has to wait and `waiter` is now on the slot's list (counted in
  // blocked_pulls()); false if Pull should be asked again now (the pull may
  // be answered, or fails at once: closed, retired, unknown chunk, a lost
  // worker). Deadline and cancellation stay the caller's to watch.
  bool Park(int64_t clock, const proto::ChunkRef& ref, std::shared_ptr<PullWaiter> waiter);
  // Takes `waiter` off the chunk's list if it is still there (its pull was
  // cancelled or expired): Wake then does not run for that Park.
  void Unpark(const proto::ChunkRef& ref, const PullWaiter* waiter);

  // OK if pulls may ask for `codec_params` (empty or "none": dense), else
  // INVALID_ARGUMENT: lets a push-pull refuse a bad pull codec before its
  // push is applied.
  absl::Status CheckPullCodec(const std::string& codec_params);

  // The pull half of a push-pull: the pushed chunk at clock + 1 (returned
  // in `clock`), with the pull codec the push asked for. Every transport's
  // PushPull uses it, so they answer alike.
  static proto::ChunkRef PushPullRef(const proto::TensorChunk& pushed, int64_t* clock);

  // Returns where the store writes `bytes` payload bytes; the memory is the
  // caller's and must stay valid until Pull returns.
  using PayloadAllocator = std::function<char*(size_t bytes)>;
  // As Pull above, but the payload goes to memory from `allocate` (called
  // once, with the chunk's lock held) rather than into `out`, whose payload
  // field is left untouched; `out->checksum()` covers the written bytes.
  absl::Status Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                    Clock::time_point deadline, Cancellation* cancellation,
                    proto::TensorChunk* out, const PayloadAllocator& allocate);

  // Takes a reference to the parameter version a dense reply sends; its
  // bytes are the payload, immutable while the reference is held.
  using PayloadBorrower = std::function<void(std::shared_ptr<const ParamBuffer> version)>;
  // As above, but a dense reply is not copied: `borrow` (called once,
  // without the chunk's lock) gets the version instead of `allocate` being
  // called; `out->checksum()` is the version's, computed once per version.
  // Compressed replies still go through `allocate`.
  absl::Status Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                    Clock::time_point deadline, Cancellation* cancellation,
                    proto::TensorChunk* out, const PayloadAllocator& allocate,
                    const PayloadBorrower& borrow);

  // The rank pushed its last clock (its total is `clock`): pulls and BSP
  // rounds stop waiting for it. Idempotent; the first call logs
  // `event=leave`.
  absl::Status Leave(uint32_t rank, int64_t clock);

  // Records that the rank is alive. Pushes count as heartbeats too.
  absl::Status Heartbeat(uint32_t rank);
  // A heartbeat's per-chunk next push clocks (ClockBook::RebaseFromWorker):
  // completes the rounds a re-base lets finish and wakes the pulls waiting
  // on them. Chunks this shard does not hold are ignored.
  void RebaseFromWorker(uint32_t rank,
                        const google::protobuf::RepeatedPtrField<proto::ChunkClock>& pushed);

  // Applies `policy` to every rank that heartbeated once but not within
  // `timeout`, logging `event=worker_lost` for each. Called periodically by
  // the server's liveness monitor.
  void CheckLiveness(std::chrono::milliseconds timeout, WorkerLossPolicy policy);

  // Number of ranks that have not left (joined or not: what averages use).
  int active_workers() const { return membership_.active(); }
  // Number of ranks in the job now: registered (shard 0) or heard from
  // here, and neither left nor lost (Membership::present).
  int present_workers() const { return membership_.present(); }
  // Who is still in the job (shard 0's control plane reads it for barriers
  // and records registrations in it).
  const Membership& membership() const { return membership_; }
  Membership& membership() { return membership_; }

  // Wakes every waiting pull, which then fails with UNAVAILABLE; later calls
  // fail the same way.
  void Close();

  // A consistent copy of every chunk for a checkpoint: values, optimizer
  // state and, per rank, the iterations applied. Pushes buffered in an
  // incomplete BSP round are not included; their ranks' clocks are rolled
  // back to that round, so a restored shard simply waits for it again.
  ShardCheckpoint Export() const;

  // Loads a checkpoint into an empty store (before serving). Each rank's
  // first push afterwards may be for a later clock than the checkpoint's
  // (the worker ran on while the shard was down): the shard re-bases that
  // rank's clock once instead of refusing the push.
  absl::Status Import(const ShardCheckpoint& checkpoint);

  // Per rank, its next push clock here: the lowest over the slots of one
  // past the last clock applied or held for it (ClockBook::pushed); -1 for
  // every rank when the shard holds no slot. What a restarted worker
  // resumes from (HeartbeatResponse.next_clock) and harrier-ctl shows.
  std::vector<int64_t> NextClocks() const;
  // NextClocks()[rank], without the others (every heartbeat asks).
  int64_t NextClock(uint32_t rank) const;

  // A new run (server/README.md, "Job lifecycle"): every slot is dropped
  // and membership starts over. Calls holding an old slot finish on it
  // harmlessly; pulls waiting on one fail FAILED_PRECONDITION. Counters
  // keep counting.
  void StartRun();

  // The rank's worker exited (Membership::Release), logged as
  // `event=worker_done`.
  void Release(uint32_t rank);

  // What the shard holds: distinct keys, chunks and parameter bytes.
  struct Holdings {
    uint64_t keys = 0;
    uint64_t chunks = 0;
    uint64_t param_bytes = 0;
    // Spare versions: each slot keeps at most one (the buffer its next
    // push writes into). Not counted against --max_param_bytes: the
    // shard's parameter memory is at most twice param_bytes, plus one
    // spare round sum per slot under BSP/local (as big as its chunk, not
    // counted here), plus the versions that replies still being sent hold
    // (one per reply in flight, bounded by the service's limits on calls
    // in flight, as their copies were before).
    uint64_t spare_bytes = 0;
  };
  Holdings holdings() const;

  // Every tensor with a chunk here, by name: its registered shape and the
  // chunks and elements of it this shard holds.
  struct TensorHeld {
    std::string name;
    std::vector<uint64_t> shape;
    uint32_t chunks = 0;
    uint64_t elements = 0;
  };
  std::vector<TensorHeld> tensors_held() const;

  // Pulls currently waiting for the consistency model (a queue depth).
  int blocked_pulls() const { return blocked_pulls_; }

  // Test and checkpoint access: a copy of a chunk's parameters.
  absl::StatusOr<std::vector<float>> Snapshot(const std::string& key, uint32_t chunk) const;

  // Tests: the chunk's current version and its spare (null if none), to
  // check that a refused push swapped and allocated nothing.
  struct BuffersForTesting {
    const ParamBuffer* values = nullptr;
    const ParamBuffer* spare = nullptr;
  };
  BuffersForTesting BuffersOfForTesting(const std::string& key, uint32_t chunk) const;

 private:
  // The gradient sum (or vote) of a BSP/local round while its clock book
  // waits for the round's other ranks.
  struct RoundSum {
    bool started = false;
    std::string codec_params;          // every push of a round uses one codec
    std::vector<float> sum;
    std::unique_ptr<Aggregator> vote;  // sign codecs: majority vote, never an average
  };
  // Compressed pulls: the parameters as one rank has rebuilt them from its
  // replies so far, and the encoder of that stream (PowerSGD warm-starts).
  // Two versions: the latest reply's (`values`) and the one before it
  // (`previous`), which is what the rank holds if that reply was lost; a
  // reply re-made from `previous` is decoded by the rank exactly as the
  // shard decodes it, so the two stay bit-identical. At most two copies.
  struct PulledView {
    std::vector<float> values;  // empty until the rank's first compressed pull
    uint64_t version = 0;       // 0: none
    std::vector<float> previous;
    uint64_t previous_version = 0;  // 0: none
    std::string encoder_params;
    std::unique_ptr<Codec> encoder;
  };
  struct Slot {
    Slot(std::string key, uint32_t chunk, std::vector<uint64_t> shape, size_t num_elements,
         ClockBook book)
        : key(std::move(key)),
          chunk(chunk),
          shape(std::move(shape)),
          num_elements(num_elements),
          book(std::move(book)) {}
    // Immutable after creation: read without the lock.
    const std::string key;
    const uint32_t chunk;
    const std::vector<uint64_t> shape;
    const size_t num_elements;

    absl::Mutex mutex;
    absl::CondVar changed;  // the book moved on, a rank left, or the shard closed
    // The current version (never null once created). Pulls take a
    // reference under the lock; a push writes the next version into
    // `spare` (or a new buffer) and swaps it in only once every chunk of
    // its call passed.
    std::shared_ptr<ParamBuffer> values ABSL_GUARDED_BY(mutex);
    // Exclusively the slot's (never handed out) when set.
    std::shared_ptr<ParamBuffer> spare ABSL_GUARDED_BY(mutex);
    // What a BSP round's next sum is written into before the swap.
    std::vector<float> spare_sum ABSL_GUARDED_BY(mutex);
    OptimizerState optimizer_state ABSL_GUARDED_BY(mutex);
    ClockBook book ABSL_GUARDED_BY(mutex);
    std::map<int64_t, RoundSum> sums ABSL_GUARDED_BY(mutex);
    std::vector<PulledView> pulled_views ABSL_GUARDED_BY(mutex);
    // A finished round's vote aggregator, reset, for the next round.
    std::unique_ptr<Aggregator> spare_vote ABSL_GUARDED_BY(mutex);
    std::string spare_vote_params ABSL_GUARDED_BY(mutex);
    // Dropped by StartRun: a pull still waiting here is refused.
    bool retired ABSL_GUARDED_BY(mutex) = false;
    // Parked pulls, woken wherever `changed` is signalled.
    std::vector<std::shared_ptr<PullWaiter>> waiters ABSL_GUARDED_BY(mutex);
  };
  // Parked pulls taken off slots under their locks and woken when this
  // goes out of scope: declare it before the locks, so that no store lock
  // is held while a waiter hands its pull to a pool.
  class Wakeups {
   public:
    explicit Wakeups(std::atomic<int>& blocked) : blocked_(blocked) {}
    ~Wakeups() {
      for (auto& waiter : waiters_) waiter->Wake();
    }
    Wakeups(const Wakeups&) = delete;
    Wakeups& operator=(const Wakeups&) = delete;
    void Take(Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex) {
      if (slot.waiters.empty()) return;
      blocked_ -= static_cast<int>(slot.waiters.size());
      for (auto& waiter : slot.waiters) waiters_.push_back(std::move(waiter));
      slot.waiters.clear();
    }

   private:
    std::atomic<int>& blocked_;
    std::vector<std::shared_ptr<PullWaiter>> waiters_;
  };
  using SlotKey = std::pair<std::string, uint32_t>;

  // A push chunk that passed validation, ready to apply.
  struct ValidatedChunk {
    Slot* slot = nullptr;
    std::shared_ptr<Slot> held;  // keeps `slot` alive across a StartRun
    const float* gradient = nullptr;  // dense: into the payload or `decoded`
    std::vector<float> decoded;       // compressed pushes, decoded
    std::shared_ptr<const CodecCache::Entry> codec;  // compressed pushes
    bool duplicate = false;  // classified under the call's locks
    // Dense: CRC and limit not checked yet; done under the call's locks in
    // the pass that also computes the step (StageLocked).
    bool deferred_check = false;
  };
  // What a new chunk of a call will do, computed under the call's locks
  // before anything changes: the clock book as it will be, and the next
  // values or round sum (shadows; swapped in by CommitLocked).
  struct StagedChunk {
    std::unique_ptr<ClockBook> book;
    PushDecision decision;
    std::shared_ptr<ParamBuffer> next_values;  // a fused SGD step
    bool staged_sum = false;                   // next sum in slot.spare_sum
  };

  std::shared_ptr<Slot> FindSlot(const std::string& key, uint32_t chunk) const;
  absl::Status CheckOwnership(const std::string& key, uint32_t chunk) const;
  absl::Status ValidateChunk(const proto::TensorChunk& chunk, absl::string_view payload,
                             ValidatedChunk* out);
  // Holds the locks of a call's slots, taken in the order given (sorted by
  // address, so two calls never wait on each other's locks in a cycle).
  class SlotLocks {
   public:
    explicit SlotLocks(const std::vector<Slot*>& sorted) ABSL_NO_THREAD_SAFETY_ANALYSIS
        : slots_(sorted) {
      for (Slot* slot : slots_) slot->mutex.Lock();
    }
    ~SlotLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (auto it = slots_.rbegin(); it != slots_.rend(); ++it) (*it)->mutex.Unlock();
    }
    SlotLocks(const SlotLocks&) = delete;
    SlotLocks& operator=(const SlotLocks&) = delete;

   private:
    const std::vector<Slot*> slots_;
  };

  // Under the slot's lock, right before applying: the checks another call
  // could have changed since validation, and whether the chunk is new or a
  // duplicate (a retry racing its original: the one applied second sees a
  // duplicate).
  absl::StatusOr<PushClass> RecheckLocked(Slot& slot, const proto::TensorChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  absl::Status CheckRoundCodecLocked(Slot& slot, const proto::TensorChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // The checks left to do (deferred dense ones) and the step, into
  // shadows: INVALID_ARGUMENT and nothing changed if the payload is bad.
  absl::Status StageLocked(Slot& slot, const proto::TensorChunk& chunk,
                           const ValidatedChunk& valid, StagedChunk* staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // A refused call: the shadows go back to being spares.
  void UnstageLocked(Slot& slot, StagedChunk& staged) ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  void CommitLocked(Slot& slot, const proto::TensorChunk& chunk, absl::string_view payload,
                    const ValidatedChunk& valid, StagedChunk& staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // The buffer the next version is written into: the spare, or a new one.
  std::shared_ptr<ParamBuffer> TakeSpareLocked(Slot& slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  void KeepSpareLocked(Slot& slot, std::shared_ptr<ParamBuffer> buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // Makes `next` the current version; the old one becomes the spare if
  // nobody else holds it.
  void PublishLocked(Slot& slot, std::shared_ptr<ParamBuffer> next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // The current version, writable: itself if the slot is its sole holder,
  // else a copy published in its place.
  ParamBuffer& WritableLocked(Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // FusedApply, in parts on the apply pool for large chunks.
  FusedResult RunFused(const FusedArgs& args);
  void StepLocked(Slot& slot, const float* gradient, float scale)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  void FinishRoundsLocked(Slot& slot, const std::vector<PushDecision::CompletedRound>& rounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // Encodes the difference between the slot's values and the view the
  // rank holds (`held_version`: the current or the previous one; any other
  // gets a dense reply) into `payload` and makes the result the current
  // view; sets the reply's codec fields and view_version.
  absl::Status CompressPullLocked(Slot& slot, uint32_t rank, const std::string& codec_params,
                                  uint64_t held_version, proto::TensorChunk* out,
                                  std::string* payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // Runs `visit` on every slot, with the slot's lock held, then wakes its
  // waiters (under the lock, so a pull between its check and its wait
  // cannot miss the wake-up).
  void ForEachSlotLocked(const std::function<void(Slot&)>& visit);
  // The rank departs (Leave, or lost under kContinue): false if it already
  // had; else every slot stops waiting for it.
  bool Depart(uint32_t rank);

  const ShardStoreOptions options_;
  const ConsistencyController controller_;
  const std::unique_ptr<Optimizer> optimizer_;
  const HashPartitioner partitioner_;
  ShardCounters counters_;
  Membership membership_;
  CodecCache codecs_;
  std::atomic<bool> closed_{false};
  // The last pull view version handed out. Starts at the wall clock in
  // nanoseconds, so versions never repeat across restarts of a shard (each
  // version takes more than a nanosecond to hand out): a client holding a
  // view from before a restart is always told "unknown", never matched.
  std::atomic<uint64_t> last_view_version_;
  std::atomic<int> blocked_pulls_{0};
  std::atomic<uint64_t> spare_bytes_{0};
  // Helpers of the pushing threads for large chunks (apply_threads - 1 of
  // them; null for 1).
  std::unique_ptr<ThreadPool> apply_pool_;

  mutable absl::Mutex slots_mutex_;
  absl::flat_hash_map<SlotKey, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(slots_mutex_);
  // Set by Import(): slots created later start re-basable too.
  bool restored_ ABSL_GUARDED_BY(slots_mutex_) = false;
  uint64_t bytes_ ABSL_GUARDED_BY(slots_mutex_) = 0;  // parameter bytes of every slot
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_STORE_H_
