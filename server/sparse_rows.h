#ifndef HARRIER_SERVER_SPARSE_ROWS_H_
#define HARRIER_SERVER_SPARSE_ROWS_H_

// The rows of one sparse table on one shard, in process: int64 ids mapped to
// rows of `dim` floats with their per-row optimizer state, created on first
// use by an initializer that is a function of (seed, table name, id), with
// admission of new ids, a row budget with eviction (LRU or LFU, sampled) and
// a time to live in the table's clocks. Not thread-safe: SparseTable
// (server/sparse_table.h) locks it; benches use it alone.
//
// Memory: rows live in blocks of kRowsPerBlock (values, optimizer state and
// a 24-byte record each), reserved from the shard's ParamBudget a block at a
// time, plus one hash-map entry per row. A block is never returned while
// the table lives: evicted rows' slots are reused.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/row_placement.h"
#include "proto/harrier.pb.h"

namespace harrier {

class ParamBudget;

enum class SparseOptimizerKind { kSgd, kAdagrad, kRowwiseAdagrad, kAdam };
enum class SparseEviction { kLru, kLfu };

// A parsed, checked SparseTableConfig.
struct SparseRowsConfig {
  uint32_t dim = 0;
  SparseOptimizerKind optimizer = SparseOptimizerKind::kSgd;
  float lr = 0.01f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float initial_accumulator = 0.0f;
  float init_scale = 0.01f;
  uint64_t seed = 0;
  uint64_t max_rows = 0;  // 0: unbounded but for the ParamBudget
  SparseEviction eviction = SparseEviction::kLru;
  int64_t ttl_steps = 0;
  uint32_t admit_after = 0;
  float admit_probability = 1.0f;

  // INVALID_ARGUMENT naming the field for a dimension of 0 or above
  // kMaxSparseDim, an unknown optimizer or eviction, a negative or
  // non-finite rate, a probability outside (0, 1].
  // max_bytes becomes a row budget (the lower of it and max_rows).
  static absl::StatusOr<SparseRowsConfig> FromProto(const proto::SparseTableConfig& config);
  // Floats of optimizer state per row.
  uint32_t state_floats() const;
};

// Largest row dimension a sparse table takes.
inline constexpr uint32_t kMaxSparseDim = 1u << 16;
// Ids in one push or pull of a sparse table (a call refuses more).
inline constexpr size_t kMaxRowsPerCall = 1u << 20;


// Figures of one table on one shard (status, metrics, benches).
struct SparseRowsStats {
  uint64_t rows = 0;           // held now
  uint64_t admitted = 0;       // rows created, ever
  uint64_t evicted = 0;        // by the row budget or the time to live
  uint64_t expired = 0;        // of those, by the time to live
  uint64_t not_admitted_pushes = 0;  // pushes of ids not (yet) admitted: counted only
  uint64_t reserved_bytes = 0; // blocks reserved plus the hash map's slots
  // reserved_bytes per row held (0 with none).
  double bytes_per_row = 0;
  // The raw bytes of a row: its values and optimizer state.
  uint64_t raw_row_bytes = 0;
};

class SparseRows {
 public:
  // One row's bookkeeping beside its values and state.
  struct RowMeta {
    int64_t id = 0;
    int64_t last_used = 0;
    uint32_t uses = 0;   // LFU count (saturating)
    uint32_t steps = 0;  // optimizer steps (Adam's bias correction); ~0u: free slot
  };

  static constexpr uint32_t kRowsPerBlock = 4096;

  // `budget` (may be null: unbounded) is charged a block at a time; `shard`
  // names the rows' owner in messages.
  SparseRows(std::string name, SparseRowsConfig config, ParamBudget* budget = nullptr);
  ~SparseRows();
  SparseRows(const SparseRows&) = delete;
  SparseRows& operator=(const SparseRows&) = delete;

  const SparseRowsConfig& config() const { return config_; }
  uint32_t dim() const { return config_.dim; }

  // The initializer's row for `id` (what a new row starts as) into `out`.
  void InitialRow(int64_t id, float* out) const;

  // Copies the row of `id` into `out` (dim floats) as of table clock
  // `clock`: the stored row, else the initializer's, which is stored too when
  // admission lets the id in at once and room can be made.
  void Lookup(int64_t id, int64_t clock, float* out);

  // One optimizer step on the row of `id` with `gradient` x `scale` at
  // table clock `clock`. A new id is counted for admission and stored once
  // admitted (from the initializer's row); before that the push changes
  // nothing but its count.
  void Apply(int64_t id, const float* gradient, float scale, int64_t clock);

  // Evicts the rows unused for more than ttl_steps clocks before `clock`,
  // looking at no more than `budget` slots (a sweep resumes where the last
  // one stopped).
  void Expire(int64_t clock, size_t budget);

  // True and the row's values if `id` is stored (tests, checkpoints).
  bool Find(int64_t id, std::vector<float>* values) const;

  // Checkpoints: every stored row (ids, values, optimizer state) or, with
  // `changed_only`, those written since the last MarkClean().
  struct Dump {
    std::vector<int64_t> ids;
    std::vector<float> values;  // ids.size() x dim
    std::vector<float> state;   // ids.size() x state_floats()
    std::vector<uint32_t> steps;
    std::vector<int64_t> removed;  // changed_only: ids evicted since
  };
  Dump Export(bool changed_only) const;
  // Starts (or stops) keeping the set of rows changed since MarkClean():
  // only a shard that writes checkpoints pays for it.
  void TrackChanges(bool on);
  void MarkClean();
  // Stores the rows of `dump` (over the budget if need be: a restore).
  absl::Status Import(const Dump& dump);

  SparseRowsStats stats() const;

 private:
  static constexpr uint32_t kFreeSlot = ~0u;

  float* ValuesOf(uint32_t slot);
  const float* ValuesOf(uint32_t slot) const;
  float* StateOf(uint32_t slot);
  const float* StateOf(uint32_t slot) const;
  RowMeta& MetaOf(uint32_t slot);
  const RowMeta& MetaOf(uint32_t slot) const;
  // A slot for a new row, or false if none can be had (budget refused and
  // nothing to evict).
  bool TakeSlot(uint32_t* slot);
  bool AddBlock();
  void EvictOne();
  void Remove(uint32_t slot, bool expired);
  // Whether a push of a new `id` admits it (counts it otherwise).
  bool Admit(int64_t id);
  uint32_t Store(int64_t id, int64_t clock);
  void StepRow(uint32_t slot, const float* gradient, float scale, float* values,
               float* state, uint32_t steps) const;

  const std::string name_;
  const SparseRowsConfig config_;
  const uint64_t name_hash_;
  ParamBudget* const budget_;

  struct Block {
    std::unique_ptr<float[]> values;
    std::unique_ptr<float[]> state;
    std::unique_ptr<RowMeta[]> meta;
  };
  std::vector<Block> blocks_;
  uint32_t slots_used_ = 0;  // slots ever handed out (free ones below reused)
  std::vector<uint32_t> free_;
  absl::flat_hash_map<int64_t, uint32_t> index_;
  // Admission counts of ids not stored: a count-min sketch (4 x 64 Ki
  // saturating 16-bit counters, 512 KiB), a fixed bound whatever the ids.
  std::vector<uint16_t> sketch_;
  // Rows written since MarkClean, and ids removed since (incremental
  // checkpoints).
  bool track_changes_ = false;
  absl::flat_hash_map<int64_t, bool> dirty_;  // true: written; false: removed
  uint64_t index_bytes_charged_ = 0;
  uint64_t block_bytes_charged_ = 0;  // what blocks_ took from budget_
  uint64_t sample_state_ = 0x9e3779b97f4a7c15ull;
  uint32_t sweep_next_ = 0;
  uint64_t admitted_ = 0;
  uint64_t evicted_ = 0;
  uint64_t expired_ = 0;
  uint64_t not_admitted_ = 0;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SPARSE_ROWS_H_
