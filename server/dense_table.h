#ifndef HARRIER_SERVER_DENSE_TABLE_H_
#define HARRIER_SERVER_DENSE_TABLE_H_

// A dense float32 tensor of a fixed shape, held as the chunks of it this
// shard owns. Each chunk has its own lock, its clock book (server/
// consistency.h), copy-on-write parameter versions, its optimizer state and
// its compressed-pull views. Pushes are checked and stepped in one pass over
// the payload (server/fused_apply.h) into shadow buffers that are swapped in
// only when the whole call passed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/fused_apply.h"
#include "server/pull_views.h"
#include "server/table.h"

namespace harrier {

class DenseTable : public Table {
 public:
  // kind TABLE_AVERAGE: env's controller and optimizer are the averaging
  // ones (MakeAverageTable).
  DenseTable(std::string name, const TableEnvironment& env,
             proto::TableKind kind = proto::TABLE_DENSE);
  ~DenseTable() override;

  proto::TableKind kind() const override { return kind_; }
  // Whether the tensor keeps a clock of its own (InitRequest.own_clock).
  bool own_clock() const;
  const std::string& name() const override { return name_; }

  absl::StatusOr<bool> Init(const proto::InitRequest& request) override;
  absl::StatusOr<std::unique_ptr<StagedPush>> Validate(const proto::TensorChunk& header,
                                                       absl::string_view payload) override;
  // Dense payloads for a plain SGD step or a round sum: the fused pass
  // reads them split (server/fused_apply.h).
  bool ReadsSplitPayload(const proto::TensorChunk& header) const override;
  absl::StatusOr<std::unique_ptr<StagedPush>> ValidateSplit(
      const proto::TensorChunk& header, absl::Span<const absl::string_view> pieces) override;
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
  absl::StatusOr<std::vector<float>> Snapshot(uint32_t part) const override;

  // Tests: the chunk's current version and its spare (null if none), to
  // check that a refused push swapped and allocated nothing.
  struct BuffersForTesting {
    const ParamBuffer* values = nullptr;
    const ParamBuffer* spare = nullptr;
  };
  BuffersForTesting BuffersOfForTesting(uint32_t chunk) const;

 private:
  class ChunkPush;

  struct Slot {
    Slot(uint32_t chunk, std::vector<uint64_t> shape, size_t num_elements, ClockBook book)
        : chunk(chunk),
          shape(std::move(shape)),
          num_elements(num_elements),
          book(std::move(book)) {}
    // Immutable after creation: read without the lock.
    const uint32_t chunk;
    const std::vector<uint64_t> shape;
    const size_t num_elements;

    absl::Mutex mutex;
    // The current version (never null once created). Pulls take a
    // reference under the lock; a push writes the next version into
    // `spare` (or a new buffer) and swaps it in only once every chunk of
    // its call passed.
    std::shared_ptr<ParamBuffer> values ABSL_GUARDED_BY(mutex);
    // Counts the versions of `values` (a new buffer or a write in place):
    // compressed pulls share a reply only between equal versions.
    uint64_t values_version ABSL_GUARDED_BY(mutex) = 1;
    // Exclusively the slot's (never handed out) when set.
    std::shared_ptr<ParamBuffer> spare ABSL_GUARDED_BY(mutex);
    // What a BSP round's next sum is written into before the swap.
    SumBuffer spare_sum ABSL_GUARDED_BY(mutex);
    OptimizerState optimizer_state ABSL_GUARDED_BY(mutex);
    // The rounds pending here hold their sums (RoundSum).
    ClockBook book ABSL_GUARDED_BY(mutex);
    PullViews views ABSL_GUARDED_BY(mutex);
    // A finished round's vote aggregator, reset, for the next round.
    std::unique_ptr<Aggregator> spare_vote ABSL_GUARDED_BY(mutex);
    std::string spare_vote_params ABSL_GUARDED_BY(mutex);
    // Dropped by a new run: a pull still waiting here is refused.
    bool retired ABSL_GUARDED_BY(mutex) = false;
    // Parked pulls with the clock each pulls at: a push wakes those it
    // lets through, a departure, re-base, new run or Close every one.
    struct Parked {
      int64_t clock = 0;
      std::shared_ptr<PullWaiter> waiter;
    };
    std::vector<Parked> waiters ABSL_GUARDED_BY(mutex);
  };

  std::shared_ptr<Slot> FindSlot(uint32_t chunk) const;
  // Takes every parked pull of `slot`, or only those the slot's clocks now
  // let through (after a push: a parked pull far ahead is not woken by every
  // round only to park again).
  static void TakeAllWaitersLocked(Slot& slot, PullWakeups& wakeups)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  static void TakeAnswerableWaitersLocked(Slot& slot, PullWakeups& wakeups)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // Validate and ValidateSplit: the payload is `payload`, or `pieces` when
  // those are not empty.
  absl::StatusOr<std::unique_ptr<StagedPush>> ValidatePush(
      const proto::TensorChunk& chunk, absl::string_view payload,
      absl::Span<const absl::string_view> pieces);
  absl::Status CheckRoundCodecLocked(Slot& slot, const proto::TensorChunk& chunk)
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
  FusedResult RunFused(const FusedArgs& args) const;
  void StepLocked(Slot& slot, const float* gradient, float scale)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  void FinishRoundsLocked(Slot& slot, const std::vector<PushDecision::CompletedRound>& rounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mutex);
  // Runs `visit` on every slot with its lock held, then hands its parked
  // pulls to `wakeups` (under the lock, so a pull between its check and its
  // park cannot miss the wake-up).
  void ForEachSlot(PullWakeups& wakeups, const std::function<void(Slot&)>& visit) const;
  // A new slot's clock book: restored, and without the ranks that left.
  ClockBook NewBook() const;
  std::string Where(uint32_t chunk) const;

  const std::string name_;
  const TableEnvironment env_;
  const proto::TableKind kind_;

  mutable absl::Mutex mutex_;
  absl::flat_hash_map<uint32_t, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mutex_);
  uint64_t bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  // Set by the first Init (or a checkpoint); later ones must agree.
  bool own_clock_ ABSL_GUARDED_BY(mutex_) = false;
};

// Tables of the dense kind.
std::unique_ptr<Table> MakeDenseTable(std::string name, const TableEnvironment& env);
// A TABLE_AVERAGE table: a dense table whose rounds are BSP's
// (env.round_controller) and whose step sets the values to the round's
// average (env.average_optimizer).
std::unique_ptr<Table> MakeAverageTable(std::string name, const TableEnvironment& env);

}  // namespace harrier

#endif  // HARRIER_SERVER_DENSE_TABLE_H_
