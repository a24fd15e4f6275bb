#ifndef HARRIER_WORKER_ROW_CACHE_H_
#define HARRIER_WORKER_ROW_CACHE_H_

// The worker's hot-row cache of one sparse table (SparseTableOptions's
// cache_rows and cache_staleness): rows pulled from the shards, each tagged
// with the table's clock at the pull, served again without a call while
// they are at most `staleness` clocks old. Embedding lookups are skewed (a
// few ids take most of the traffic), so a small cache saves most pulls, and
// the staleness bound keeps what a worker reads within the consistency the
// table promises.
//
// Eviction is least-recently-used, where "used" means stored by Put or
// served by Get. Every operation is O(1) per row (expected, through the
// hash map): the recency order is an intrusive doubly-linked list over slot
// indices, and rows live in float blocks the cache grows as it fills, so a
// row costs no heap allocation of its own and an empty cache of a large
// capacity costs no row memory.
//
// Not thread-safe: the caller (the client's sparse table) serialises every
// call, hits() and misses() included.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace harrier {

class RowCache {
 public:
  // Holds up to `capacity` rows of `dim` floats. A row pulled at clock c is
  // served at clock t while t - c <= staleness (staleness 0: only within the
  // clock it was pulled in). Capacity 0 turns the cache off: nothing is
  // stored, every Get returns false and neither counter moves, because a
  // table without a cache has no hits or misses to report.
  RowCache(size_t capacity, uint32_t dim, int64_t staleness);

  RowCache(const RowCache&) = delete;
  RowCache& operator=(const RowCache&) = delete;

  // If row `id` is held and fresh at `clock` (clock - its clock <=
  // staleness), copies its dim floats to `out`, makes it the most recently
  // used row, counts a hit and returns true. Otherwise counts a miss and
  // returns false, `out` untouched; a row held but too old is dropped, since
  // it can never be fresh again at a later clock. A row stored at a clock
  // later than `clock` is fresh (newer than asked for).
  bool Get(int64_t id, int64_t clock, float* out);

  // Stores the dim floats at `row` (any alignment) as row `id` pulled at
  // `clock`, replacing a row already held for `id` (the latest Put wins,
  // whatever its clock), and makes it the most recently used row. When the
  // cache is full and `id` is new, the least recently used row makes room.
  void Put(int64_t id, int64_t clock, const void* row);

  // Drops the rows of `ids` (ids not held are ignored): the worker pushed
  // gradients for them, so the shards' values have moved on from the copies
  // here. Counts neither hits nor misses.
  void Invalidate(absl::Span<const int64_t> ids);

  // Drops every row. The counters keep counting (they are the table's
  // lifetime statistics) and the row memory stays for reuse.
  void Clear();

  // Get over a batch: row i of `out` (ids.size() x dim floats) for ids[i].
  // Returns the number of hits and appends to `missing` the positions i
  // that missed, in increasing order, whose rows of `out` are untouched.
  // A repeated id is looked up (and counted) once per position.
  size_t Lookup(absl::Span<const int64_t> ids, int64_t clock, float* out,
                std::vector<size_t>* missing);

  // Put over a batch: `rows` holds ids.size() x dim floats, row i for
  // ids[i]. A repeated id keeps its last row.
  void Insert(absl::Span<const int64_t> ids, int64_t clock, const float* rows);

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  // Rows held now.
  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }
  uint32_t dim() const { return dim_; }
  int64_t staleness() const { return staleness_; }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // One held row's bookkeeping; its floats are RowData(slot).
  struct Slot {
    int64_t id = 0;
    int64_t clock = 0;
    size_t prev = kNone;  // towards the most recently used row
    size_t next = kNone;  // towards the least recently used row; in a free
                          // slot, the next free slot
  };

  float* RowData(size_t slot);
  // A slot for a new row: a freed one, a never used one, or (when the cache
  // is full) the least recently used row's, which is dropped.
  size_t AcquireSlot();
  void Remove(size_t slot);  // unlinks, unindexes and frees the slot
  void Unlink(size_t slot);
  void PushFront(size_t slot);

  const size_t capacity_;
  const uint32_t dim_;
  const int64_t staleness_;
  // Rows per block of row memory: blocks are allocated as slots are first
  // used, so memory follows the rows held, not the capacity.
  const size_t block_rows_;

  std::vector<Slot> slots_;  // grows up to capacity_, never shrinks
  std::vector<std::unique_ptr<float[]>> blocks_;
  absl::flat_hash_map<int64_t, size_t> index_;  // id -> slot
  size_t head_ = kNone;       // most recently used
  size_t tail_ = kNone;       // least recently used
  size_t free_head_ = kNone;  // dropped slots, chained through Slot::next
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_ROW_CACHE_H_
