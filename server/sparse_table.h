#ifndef HARRIER_SERVER_SPARSE_TABLE_H_
#define HARRIER_SERVER_SPARSE_TABLE_H_

// A sparse table (proto::TABLE_SPARSE): rows keyed by any int64 id, as this
// shard holds them (SparseRows, server/sparse_rows.h), behind the Table
// interface. The table is one part per shard (the chunk the partitioner
// places here), with one clock book: a table's clock advances with each
// push of that rank, whatever ids it carries, so a worker pushes every
// shard each step (an empty push where it has no rows there).
//
// Pushes carry the ids in TensorChunk.row_ids and one row of gradient per
// id in the payload (float32, or fp16/bf16 through their codecs). The rule
// is the dense one: a push is checked whole (ids distinct and all this
// shard's, the count within kMaxRowsPerCall, gradients finite and below
// 2^40) before anything is applied; exactly-once by (rank, clock) as for a
// dense chunk. BSP holds each round's per-row sums and applies their
// average once the round is complete; SSP and ASP apply each push on
// arrival, scaled 1/n. A table may run asynchronously ("asp", or "ssp"
// with a bound) while the job's dense tensors run BSP.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/codec/codec.h"
#include "server/sparse_rows.h"
#include "server/table.h"

namespace harrier {

class SparseTable : public Table {
 public:
  SparseTable(std::string name, const TableEnvironment& env);
  ~SparseTable() override;

  proto::TableKind kind() const override { return proto::TABLE_SPARSE; }
  const std::string& name() const override { return name_; }

  absl::StatusOr<bool> Init(const proto::InitRequest& request) override;
  absl::StatusOr<std::unique_ptr<StagedPush>> Validate(const proto::TensorChunk& header,
                                                       absl::string_view payload) override;
  absl::StatusOr<PullOutcome> TryPull(const PullQuery& query, proto::TensorChunk* out,
                                      const PullTarget& target) override;
  bool Park(const PullQuery& query, std::shared_ptr<PullWaiter> waiter) override;
  void Unpark(const PullQuery& query, const PullWaiter* waiter) override;
  void Depart(uint32_t rank, PullWakeups& wakeups) override;
  void RebaseFromWorker(uint32_t rank, uint32_t part, int64_t next_clock,
                        PullWakeups& wakeups) override;
  void MergeNextClocks(std::vector<int64_t>* next) const override;
  void WakeAll(PullWakeups& wakeups) override;
  void Retire(PullWakeups& wakeups) override;
  void Export(std::vector<SlotCheckpoint>* out, bool changes_only = false) const override;
  absl::Status Import(const SlotCheckpoint& saved) override;
  TensorHeld held() const override;
  uint64_t param_bytes() const override;
  // The rows held, in no particular order, flattened (tests).
  absl::StatusOr<std::vector<float>> Snapshot(uint32_t part) const override;

  SparseRowsStats stats() const;
  // Tests: the stored row of `id`, or false.
  bool FindRowForTesting(int64_t id, std::vector<float>* values) const;

 private:
  class RowsPush;
  // The per-row gradient sums of one BSP round.
  struct RoundRows {
    absl::flat_hash_map<int64_t, uint32_t> index;  // id -> row in `sums`
    std::vector<float> sums;
    HeldBudgetBytes held;  // of the shard's parameter budget
  };
  // What one distinct row of a round's sums costs the budget (its floats
  // and its index entry).
  uint64_t RoundRowBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  absl::Status CheckIds(const std::string& ids, size_t* count, const char* what) const;
  void FinishRoundsLocked(const std::vector<PushDecision::CompletedRound>& rounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void TakeAnswerableWaitersLocked(PullWakeups& wakeups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void TakeAllWaitersLocked(PullWakeups& wakeups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  std::string Where() const;
  const ConsistencyController& controller() const;

  const std::string name_;
  const TableEnvironment env_;

  mutable absl::Mutex mutex_;
  bool created_ ABSL_GUARDED_BY(mutex_) = false;
  uint32_t part_ ABSL_GUARDED_BY(mutex_) = 0;
  proto::SparseTableConfig config_ ABSL_GUARDED_BY(mutex_);
  // The table's own consistency when it differs from the job's.
  std::unique_ptr<ConsistencyController> own_controller_;
  std::unique_ptr<SparseRows> rows_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<ClockBook> book_ ABSL_GUARDED_BY(mutex_);
  std::map<int64_t, RoundRows> rounds_ ABSL_GUARDED_BY(mutex_);
  // The table's clock as far as eviction goes: the highest push or pull
  // clock seen.
  int64_t now_ ABSL_GUARDED_BY(mutex_) = 0;
  bool retired_ ABSL_GUARDED_BY(mutex_) = false;
  struct Parked {
    int64_t clock = 0;
    std::shared_ptr<PullWaiter> waiter;
  };
  std::vector<Parked> waiters_ ABSL_GUARDED_BY(mutex_);
  // Encoders of 16-bit pull replies (stateless; guarded for Encode's sake).
  std::unique_ptr<Codec> fp16_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<Codec> bf16_ ABSL_GUARDED_BY(mutex_);
};

std::unique_ptr<Table> MakeSparseTable(std::string name, const TableEnvironment& env);

}  // namespace harrier

#endif  // HARRIER_SERVER_SPARSE_TABLE_H_
