#ifndef HARRIER_SERVER_SHARD_STORE_H_
#define HARRIER_SERVER_SHARD_STORE_H_

// The parameters one shard owns, as a registry of tables (server/table.h):
// table name -> Table. The store decides what is placed here (the
// Partitioner), applies a push call whole or not at all across its parts,
// counts the pulls parked on the tables, and walks every table for the
// events of a job (a rank leaving, a restore, a new run, a shutdown).
// Every public method is thread-safe. Bad input is refused before anything
// changes: a refused call leaves every table as it was.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/parallel_for.h"
#include "common/partitioner.h"
#include "proto/harrier.pb.h"
#include "server/checkpoint.h"
#include "server/codec_cache.h"
#include "server/consistency.h"
#include "server/dense_table.h"
#include "server/membership.h"
#include "server/optimizer.h"
#include "server/sparse_rows.h"
#include "server/table.h"

namespace harrier {

class ShardStore {
 public:
  using Clock = std::chrono::steady_clock;

  // `partitioner` decides which (key, chunk) this shard owns; null: the
  // HashPartitioner over options.num_shards, as clients place by default.
  ShardStore(ShardStoreOptions options, std::unique_ptr<Optimizer> optimizer,
             std::unique_ptr<Partitioner> partitioner = nullptr);
  ~ShardStore();

  const ShardStoreOptions& options() const { return options_; }
  const ConsistencyController& controller() const { return controller_; }
  const ShardCounters& counters() const { return counters_; }

  // Creates the part with the given values in the table of the request's
  // kind (returns true), or checks the request against the existing part
  // (returns false, values kept). A key names one table of one kind.
  absl::StatusOr<bool> Init(const proto::InitRequest& request);

  // One pushed part: `header`'s payload field is ignored and `payload` is
  // used instead, or `pieces` (in order; a value may straddle two) when
  // they are not empty, which transports give only where
  // ReadsSplitPayload said yes. All are borrowed for the call only.
  // `payload.data()` must be aligned for float (dense payloads are read in
  // place).
  struct PushChunkView {
    const proto::TensorChunk* header = nullptr;
    absl::string_view payload;
    absl::Span<const absl::string_view> pieces;
  };
  // Whether the table `header` pushes to reads a payload split over the
  // pieces it arrived in (Table::ReadsSplitPayload): a transport that
  // would otherwise copy the pieces together passes them on. False for an
  // unknown key.
  bool ReadsSplitPayload(const proto::TensorChunk& header) const;
  // One worker's gradients for one clock, any number of parts of any
  // tables. Every part is validated by its table first; then, with every
  // part's lock held, each is re-checked and staged (StagedPush). If any is
  // refused none is applied and the call changes nothing; otherwise every
  // new part is applied and every duplicate (rank, clock, key, chunk) is
  // only counted, so a retried call is applied exactly once. INVALID_ARGUMENT
  // for a malformed part (duplicates are validated too), NOT_FOUND for an
  // unknown key, FAILED_PRECONDITION for a clock from the future, a clock
  // lost with a restart or a rank that left. `result` (may be null) gets the
  // counts of an OK call.
  absl::Status Push(const std::vector<PushChunkView>& chunks, PushResult* result = nullptr);
  // As above, with the payloads in the messages.
  absl::Status Push(const std::vector<proto::TensorChunk>& chunks, PushResult* result = nullptr);

  // Answers a pull at `clock` into `out` and `target` if the consistency
  // model lets it through now, or says what it waits for (never waits).
  absl::StatusOr<PullOutcome> TryPull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                                      proto::TensorChunk* out, const PullTarget& target);
  // For a pull TryPull held back: true if it still has to wait and
  // `waiter` is now parked on its part (counted in blocked_pulls()); false
  // if TryPull should be asked again now (the pull may be answered, or fails
  // at once: closed, retired, unknown chunk, a lost worker). Deadline and
  // cancellation stay the caller's to watch.
  bool Park(int64_t clock, const proto::ChunkRef& ref, std::shared_ptr<PullWaiter> waiter);
  // Takes `waiter` off its part's list if it is still there (its pull was
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

  // The rank pushed its last clock (its total is `clock`): pulls and BSP
  // rounds stop waiting for it. Idempotent; the first call logs
  // `event=leave`.
  absl::Status Leave(uint32_t rank, int64_t clock);
  // The rank departs (Leave, or lost under kContinue): false if it already
  // had; else every table stops waiting for it.
  bool Depart(uint32_t rank);
  // A heartbeat's per-chunk next push clocks (ClockBook::RebaseFromWorker):
  // completes the rounds a re-base lets finish and wakes the pulls waiting
  // on them. Chunks this shard does not hold are ignored.
  void RebaseFromWorker(uint32_t rank,
                        const google::protobuf::RepeatedPtrField<proto::ChunkClock>& pushed);
  // Wakes every parked pull, to find what changed (the job failed).
  void WakeAllPulls();

  // Number of ranks that have not left (joined or not: what averages use).
  int active_workers() const { return membership_.active(); }
  // Number of ranks in the job now: registered (shard 0) or heard from
  // here, and neither left nor lost (Membership::present).
  int present_workers() const { return membership_.present(); }
  // Who is still in the job (the service and shard 0's control plane
  // record registrations, heartbeats and releases in it).
  const Membership& membership() const { return membership_; }
  Membership& membership() { return membership_; }

  // Wakes every waiting pull, which then fails with UNAVAILABLE; later calls
  // fail the same way.
  void Close();

  // A consistent copy of every part for a checkpoint: values, optimizer
  // state and, per rank, the iterations applied. Pushes buffered in an
  // incomplete BSP round are not included; their ranks' clocks are rolled
  // back to that round, so a restored shard simply waits for it again.
  // With `changes_only`: sparse tables give the rows changed since the
  // previous Export (an incremental checkpoint).
  ShardCheckpoint Export(bool changes_only = false) const;
  // Loads a checkpoint into an empty store (before serving). Each rank's
  // first push afterwards may be for a later clock than the checkpoint's
  // (the worker ran on while the shard was down): the shard re-bases that
  // rank's clock once instead of refusing the push.
  absl::Status Import(const ShardCheckpoint& checkpoint);

  // Per rank, its next push clock here: the lowest over the parts of one
  // past the last clock applied or held for it (ClockBook::pushed); -1 for
  // every rank when the shard holds no part. What a restarted worker
  // resumes from (HeartbeatResponse.next_clock) and harrier-ctl shows.
  std::vector<int64_t> NextClocks() const;
  // NextClocks()[rank]: one pass over the chunks, asked by a worker's first
  // heartbeat (report_next_clock) only, not by the periodic ones.
  int64_t NextClock(uint32_t rank) const;

  // A new run (server/README.md, "Job lifecycle"): every table is dropped
  // and membership starts over. Calls holding an old table finish on it
  // harmlessly; pulls waiting on one fail FAILED_PRECONDITION. Counters
  // keep counting.
  void StartRun();

  // What the shard holds: distinct keys, chunks and parameter bytes (all
  // that counts against --max_param_bytes: the chunks, sparse tables' rows
  // and index, the views compressed pulls keep).
  struct Holdings {
    uint64_t keys = 0;
    uint64_t chunks = 0;
    uint64_t param_bytes = 0;
    // Spare versions: each dense chunk keeps at most one (the buffer its
    // next push writes into). Not counted against --max_param_bytes: the
    // shard's parameter memory is at most twice param_bytes, plus one
    // spare round sum per chunk under BSP/local (as big as its chunk, not
    // counted here), plus the versions that replies still being sent hold
    // (one per reply in flight, bounded by the service's limits on calls
    // in flight).
    uint64_t spare_bytes = 0;
  };
  Holdings holdings() const;

  // The sparse tables' figures, summed over the tables (bytes_per_row: of
  // them all together).
  SparseRowsStats sparse_stats() const;

  // Every tensor with a part here, by name: its registered shape and the
  // chunks and elements of it this shard holds.
  using TensorHeld = ::harrier::TensorHeld;
  std::vector<TensorHeld> tensors_held() const;

  // Pulls currently parked on the consistency model (a queue depth).
  int blocked_pulls() const { return blocked_pulls_; }

  // Tests and tools: a copy of a part's parameters.
  absl::StatusOr<std::vector<float>> Snapshot(const std::string& key, uint32_t chunk) const;
  // Tests: a dense chunk's current version and its spare (null if none).
  using BuffersForTesting = DenseTable::BuffersForTesting;
  BuffersForTesting BuffersOfForTesting(const std::string& key, uint32_t chunk) const;
  // Tests: the table `name` of the current run (null if none), held as a
  // call holds it.
  std::shared_ptr<Table> TableForTesting(const std::string& name) const { return FindTable(name); }

 private:
  std::shared_ptr<Table> FindTable(const std::string& name) const;
  absl::Status CheckOwnership(const std::string& key, uint32_t chunk) const;
  // Runs `visit` on every table, then wakes the pulls it handed over.
  void ForEachTable(const std::function<void(Table&, PullWakeups&)>& visit);

  const ShardStoreOptions options_;
  const ConsistencyController controller_;
  const std::unique_ptr<Optimizer> optimizer_;
  // TABLE_AVERAGE tables' rule and step.
  const ConsistencyController round_controller_;
  const std::unique_ptr<Optimizer> average_optimizer_;
  const std::unique_ptr<Partitioner> partitioner_;
  ShardCounters counters_;
  Membership membership_;
  CodecCache codecs_;
  ParamBudget budget_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> restored_{false};
  // The last pull view version handed out. Starts at the wall clock in
  // nanoseconds, so versions never repeat across restarts of a shard (each
  // version takes more than a nanosecond to hand out): a client holding a
  // view from before a restart is always told "unknown", never matched.
  std::atomic<uint64_t> last_view_version_;
  std::atomic<int> blocked_pulls_{0};
  std::atomic<uint64_t> spare_bytes_{0};
  // The pushing thread and apply_threads - 1 helpers for large chunks
  // (null for 1).
  std::unique_ptr<ParallelForPool> apply_pool_;
  TableEnvironment env_;

  mutable absl::Mutex tables_mutex_;
  absl::flat_hash_map<std::string, std::shared_ptr<Table>> tables_ ABSL_GUARDED_BY(tables_mutex_);
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_STORE_H_
