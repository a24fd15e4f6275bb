#ifndef HARRIER_SERVER_TABLE_H_
#define HARRIER_SERVER_TABLE_H_

// A table is one named set of parameters of one kind on a shard: a dense
// tensor held in chunks (DenseTable, server/dense_table.h), and whatever
// other kinds the shard learns. ShardStore is a registry of tables: it owns
// placement, the whole-call rule of a push (validate every part, then apply
// all or none) and the count of parked pulls; everything about how a kind
// stores, aggregates, compresses and answers is behind this interface.
//
// Adding a kind: a new proto::TableKind value, a class implementing Table in
// a file of its own, and one line in TableKinds() (server/table_kinds.cc).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/harrier.pb.h"
#include "server/checkpoint.h"
#include "server/codec_cache.h"
#include "server/consistency.h"
#include "server/membership.h"
#include "server/optimizer.h"
#include "server/param_buffer.h"

namespace harrier {

class ParallelForPool;

struct ShardStoreOptions {
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  SyncPolicy sync;
  // SSP/ASP: divide each push's step by the staleness it arrives with
  // (Zhang et al. 2016), i.e. by max(1, fastest rank's clock - push clock).
  bool staleness_aware_lr = false;
  // BSP/local: rounds a rank may push ahead of the slowest live rank
  // (ConsistencyController); bounds the round sums a chunk holds.
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
  // Sparse tables keep the set of rows changed since the last checkpoint
  // (incremental checkpoints, --checkpoint_full_every above 1).
  bool track_sparse_changes = false;
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
  // Compressed pull replies sent as encoded for another rank whose view
  // and parameters were the same (server/pull_views.h): encodes saved.
  std::atomic<uint64_t> pull_replies_shared{0};
};

// What a push call did, part by part (ShardStore::Push).
struct PushResult {
  uint32_t applied = 0;    // new parts: applied, or held for their round
  uint32_t duplicate = 0;  // seen before: acknowledged, not applied again
};

// The parameter memory every table of a shard draws from (--max_chunks,
// --max_param_bytes). A table gives back what it took when it is freed, so
// a table of an ended run that a call still holds stays counted until the
// call lets go. Thread-safe.
class ParamBudget {
 public:
  ParamBudget(int shard, size_t max_chunks, uint64_t max_bytes)
      : shard_(shard), max_chunks_(max_chunks), max_bytes_(max_bytes) {}
  // Takes one chunk of `bytes`, or RESOURCE_EXHAUSTED naming `where` and
  // the limit it would pass (nothing taken).
  absl::Status Reserve(absl::string_view where, uint64_t bytes);
  // Takes one chunk whatever the limits (a checkpoint being restored).
  void Add(uint64_t bytes);
  // Bytes that are not a chunk (a sparse table's index, its BSP round
  // sums): ReserveBytes refuses past --max_param_bytes as Reserve does;
  // AddBytes takes them whatever the limit; ReleaseBytes gives them back.
  absl::Status ReserveBytes(absl::string_view where, uint64_t bytes);
  // The same, with `where` made only when the bytes are refused (a caller
  // on a hot path builds no message for the common case).
  absl::Status ReserveBytes(absl::FunctionRef<std::string()> where, uint64_t bytes);
  void AddBytes(uint64_t bytes);
  void ReleaseBytes(uint64_t bytes);
  // Gives back `chunks` chunks (Reserve, Add) and `bytes` bytes together:
  // what a table took, when it is freed.
  void Release(uint64_t chunks, uint64_t bytes);
  uint64_t chunks() const;
  uint64_t bytes() const;

 private:
  const int shard_;
  const size_t max_chunks_;
  const uint64_t max_bytes_;
  mutable absl::Mutex mutex_;
  uint64_t chunks_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

// Bytes of a ParamBudget held by one owner (a pull view's buffer, an
// encoder's state, a BSP round's sums) and given back when the owner goes,
// so no path can forget to give them back. Movable, not copyable.
class HeldBudgetBytes {
 public:
  HeldBudgetBytes() = default;
  HeldBudgetBytes(HeldBudgetBytes&& other) noexcept;
  HeldBudgetBytes& operator=(HeldBudgetBytes&& other) noexcept;
  HeldBudgetBytes(const HeldBudgetBytes&) = delete;
  HeldBudgetBytes& operator=(const HeldBudgetBytes&) = delete;
  ~HeldBudgetBytes() { Reset(); }

  // Makes the bytes held `bytes` of `budget` (null: nothing is counted).
  // Growth is reserved: past --max_param_bytes it fails RESOURCE_EXHAUSTED
  // naming where() (made only then) and what is held stays as it was. A
  // shrink is given back. `budget` must be the one already held from, if any.
  absl::Status Resize(ParamBudget* budget, absl::FunctionRef<std::string()> where, uint64_t bytes);
  // Takes over what `other` holds (of the same budget); `other` then holds
  // nothing.
  void Absorb(HeldBudgetBytes&& other);
  // Gives back everything held.
  void Reset();
  uint64_t bytes() const { return bytes_; }

 private:
  ParamBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

// A pull that has to wait without holding a thread (ShardService parks
// it). Wake() runs at most once per Park, on the thread that changed the
// table (a push applied, a round finished, a departure or re-base, a new
// run, Close), after every table lock is released: it must be quick (hand
// the answer to a pool) and may call back into the store.
class PullWaiter {
 public:
  virtual ~PullWaiter() = default;
  virtual void Wake() = 0;
};

// Parked pulls taken off a table under its locks and woken when this goes
// out of scope: declare it before the locks, so that no table lock is held
// while a waiter hands its pull to a pool.
class PullWakeups {
 public:
  explicit PullWakeups(std::atomic<int>& blocked) : blocked_(blocked) {}
  ~PullWakeups() {
    for (auto& waiter : waiters_) waiter->Wake();
  }
  PullWakeups(const PullWakeups&) = delete;
  PullWakeups& operator=(const PullWakeups&) = delete;
  // Takes one waiter off its table's list.
  void Take(std::shared_ptr<PullWaiter> waiter) {
    --blocked_;
    waiters_.push_back(std::move(waiter));
  }

 private:
  std::atomic<int>& blocked_;
  std::vector<std::shared_ptr<PullWaiter>> waiters_;
};

// What every table of one shard shares: the job's rules and the shard's
// accounts. Owned by the ShardStore; outlives its tables.
struct TableEnvironment {
  const ShardStoreOptions* options = nullptr;
  const ConsistencyController* controller = nullptr;
  const Optimizer* optimizer = nullptr;
  // What TABLE_AVERAGE tables use instead: BSP rounds whatever the job's
  // --sync, and a step that makes the round's average the value.
  const ConsistencyController* round_controller = nullptr;
  const Optimizer* average_optimizer = nullptr;
  const Membership* membership = nullptr;
  CodecCache* codecs = nullptr;
  ShardCounters* counters = nullptr;
  ParamBudget* budget = nullptr;
  // Where large dense chunks are applied in parts (null: the pushing
  // thread alone; --apply_threads).
  ParallelForPool* apply_pool = nullptr;
  // Spare parameter versions held (bytes), for the shard's holdings.
  std::atomic<uint64_t>* spare_bytes = nullptr;
  // Pulls parked now, across every table.
  std::atomic<int>* blocked_pulls = nullptr;
  // The last compressed-pull view version handed out (server/pull_views.h).
  std::atomic<uint64_t>* last_view_version = nullptr;
  // Set before the tables are told of a shutdown.
  const std::atomic<bool>* closed = nullptr;
  // Set by a checkpoint import: parts created later start re-basable.
  const std::atomic<bool>* restored = nullptr;
};

// One pull of one part of a table.
struct PullQuery {
  uint32_t rank = 0;
  int64_t clock = 0;
  const proto::ChunkRef* ref = nullptr;
};

// Where a pull's reply payload goes. `allocate` gives memory for a payload
// of that many bytes (valid until the pull returns); `borrow`, when set,
// takes a dense reply's parameter version instead of a copy (its bytes are
// the payload, immutable while the reference is held).
struct PullTarget {
  std::function<char*(size_t bytes)> allocate;
  std::function<void(std::shared_ptr<const ParamBuffer> version)> borrow;
};

// TryPull's answer when it is not an error: answered (the reply is written),
// or the consistency model holds it back, and what it waits for.
struct PullOutcome {
  bool ready = false;
  PullVerdict verdict;
};

// DEADLINE_EXCEEDED for a pull whose wait ran out: names the clock waited
// for and the slowest worker.
absl::Status PullWaitExpired(const PullQuery& query, const PullVerdict& verdict);

// One validated part of a push call, ready to apply. The store takes every
// part's mutex() (in address order, the one order every multi-part lock
// uses), then Recheck()s and Stage()s each; if all pass every part
// Commit()s, otherwise every staged part Unstage()s and the call changes
// nothing. Each method but the destructor runs with mutex() held.
class StagedPush {
 public:
  virtual ~StagedPush() = default;
  virtual absl::Mutex& mutex() = 0;
  // What another call may have changed since validation: OK with true for
  // a new part, false for a duplicate (a retry racing its original).
  virtual absl::StatusOr<bool> Recheck() = 0;
  // The checks left and the step, into shadows: an error changes nothing.
  virtual absl::Status Stage() = 0;
  // The call was refused: the shadows go back to being spares.
  virtual void Unstage() = 0;
  // Applies a new part (not called for duplicates) and hands the pulls it
  // unblocks to `wakeups`.
  virtual void Commit(PullWakeups& wakeups) = 0;
  // Payload bytes of the part, for the shard's counters.
  virtual size_t payload_bytes() const = 0;
};

// A tensor this shard holds part of (what status and the advisor list).
struct TensorHeld {
  std::string name;
  std::vector<uint64_t> shape;
  uint32_t chunks = 0;
  uint64_t elements = 0;
};

// One named set of parameters. Thread-safe: every method may run
// concurrently with every other; a table locks its own parts.
class Table {
 public:
  virtual ~Table() = default;

  virtual proto::TableKind kind() const = 0;
  virtual const std::string& name() const = 0;

  // Creates the part `request` describes with its values (true), or checks
  // the request against the existing part (false, values kept).
  virtual absl::StatusOr<bool> Init(const proto::InitRequest& request) = 0;
  // Checks one pushed part against the table without changing anything.
  // `header` and `payload` stay valid until the returned part is gone.
  virtual absl::StatusOr<std::unique_ptr<StagedPush>> Validate(const proto::TensorChunk& header,
                                                               absl::string_view payload) = 0;
  // Whether Validate's payload may be given as the pieces a transport
  // received it in (ValidateSplit), so that it is never copied whole.
  // Transports ask before they would copy a split payload.
  virtual bool ReadsSplitPayload(const proto::TensorChunk& header) const { return false; }
  // Validate for a payload in `pieces` (in order; a value may straddle two).
  // Called only where ReadsSplitPayload said yes; the pieces stay valid as
  // `payload` does for Validate.
  virtual absl::StatusOr<std::unique_ptr<StagedPush>> ValidateSplit(
      const proto::TensorChunk& header, absl::Span<const absl::string_view> pieces) {
    return absl::UnimplementedError("this table reads contiguous payloads only");
  }
  // Answers the pull into `out` and `target` if the consistency model lets
  // it through now; otherwise says what it waits for. Errors stay errors
  // (closed, a new run, a failed job, a bad request).
  virtual absl::StatusOr<PullOutcome> TryPull(const PullQuery& query, proto::TensorChunk* out,
                                              const PullTarget& target) = 0;
  // For a pull TryPull held back: true if it still has to wait and
  // `waiter` is now on the part's list (counted in blocked_pulls); false if
  // TryPull should be asked again now.
  virtual bool Park(const PullQuery& query, std::shared_ptr<PullWaiter> waiter) = 0;
  // Takes `waiter` off the list if it is still there (its pull was
  // cancelled or expired): Wake then does not run for that Park.
  virtual void Unpark(const PullQuery& query, const PullWaiter* waiter) = 0;

  // The rank left (or was lost under kContinue): every part stops waiting
  // for it, finishing the rounds that waited only for it.
  virtual void Depart(uint32_t rank, PullWakeups& wakeups) = 0;
  // A heartbeat's next push clock of `rank` on `part` (ClockBook::
  // RebaseFromWorker).
  virtual void RebaseFromWorker(uint32_t rank, uint32_t part, int64_t next_clock,
                                PullWakeups& wakeups) = 0;
  // Per rank, lowers next[rank] (-1: none yet) to the rank's next push
  // clock on each part.
  virtual void MergeNextClocks(std::vector<int64_t>* next) const = 0;
  // Wakes every parked pull (to find the shard closed or the job failed).
  virtual void WakeAll(PullWakeups& wakeups) = 0;
  // A new run dropped the table: parked pulls fail, spares are freed.
  virtual void Retire(PullWakeups& wakeups) = 0;

  // Appends a consistent copy of every part for a checkpoint. With
  // `changes_only` a kind that can (sparse tables) gives only what changed
  // since its previous Export (an incremental checkpoint); every Export
  // starts the next change set.
  virtual void Export(std::vector<SlotCheckpoint>* out, bool changes_only = false) const = 0;
  // Loads one saved part into the table (before serving).
  virtual absl::Status Import(const SlotCheckpoint& saved) = 0;

  // What the table holds: parts, parameter bytes, the tensor's shape.
  virtual TensorHeld held() const = 0;
  virtual uint64_t param_bytes() const = 0;

  // Tests: a copy of a part's parameters.
  virtual absl::StatusOr<std::vector<float>> Snapshot(uint32_t part) const = 0;
};

// Makes an empty table of one kind named `name`.
using TableFactory =
    std::function<std::unique_ptr<Table>(std::string name, const TableEnvironment& env)>;
// The factory of `kind`, or null for a kind this shard does not know.
const TableFactory* FindTableKind(proto::TableKind kind);

}  // namespace harrier

#endif  // HARRIER_SERVER_TABLE_H_
