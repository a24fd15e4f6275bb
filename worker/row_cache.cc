#include "worker/row_cache.h"

#include <algorithm>
#include <cstring>

namespace harrier {
namespace {

// Row memory comes in blocks of about this many bytes (at least one row, at
// most the capacity): large enough that allocations are rare, small enough
// that a nearly empty cache of a large capacity costs little.
constexpr size_t kBlockBytes = size_t{256} << 10;

size_t BlockRows(size_t capacity, uint32_t dim) {
  const size_t row_bytes = sizeof(float) * std::max<size_t>(dim, 1);
  return std::max<size_t>(1, std::min(capacity, kBlockBytes / row_bytes));
}

}  // namespace

RowCache::RowCache(size_t capacity, uint32_t dim, int64_t staleness)
    : capacity_(capacity),
      dim_(dim),
      staleness_(staleness),
      block_rows_(BlockRows(capacity, dim)) {}

float* RowCache::RowData(size_t slot) {
  return blocks_[slot / block_rows_].get() + (slot % block_rows_) * dim_;
}

bool RowCache::Get(int64_t id, int64_t clock, float* out) {
  if (capacity_ == 0) return false;
  auto it = index_.find(id);
  if (it == index_.end()) {
    ++misses_;
    return false;
  }
  const size_t slot = it->second;
  if (clock - slots_[slot].clock > staleness_) {
    Remove(slot);
    ++misses_;
    return false;
  }
  std::copy_n(RowData(slot), dim_, out);
  if (slot != head_) {
    Unlink(slot);
    PushFront(slot);
  }
  ++hits_;
  return true;
}

void RowCache::Put(int64_t id, int64_t clock, const void* row) {
  if (capacity_ == 0) return;
  auto it = index_.find(id);
  size_t slot;
  if (it != index_.end()) {
    slot = it->second;
    Unlink(slot);
  } else {
    slot = AcquireSlot();
    index_.emplace(id, slot);
    slots_[slot].id = id;
  }
  slots_[slot].clock = clock;
  std::memcpy(RowData(slot), row, dim_ * sizeof(float));
  PushFront(slot);
}

void RowCache::Invalidate(absl::Span<const int64_t> ids) {
  for (int64_t id : ids) {
    auto it = index_.find(id);
    if (it != index_.end()) Remove(it->second);
  }
}

void RowCache::Clear() {
  while (head_ != kNone) Remove(head_);
}

size_t RowCache::Lookup(absl::Span<const int64_t> ids, int64_t clock,
                        float* out, std::vector<size_t>* missing) {
  size_t found = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (Get(ids[i], clock, out + i * dim_)) {
      ++found;
    } else {
      missing->push_back(i);
    }
  }
  return found;
}

void RowCache::Insert(absl::Span<const int64_t> ids, int64_t clock,
                      const float* rows) {
  for (size_t i = 0; i < ids.size(); ++i) Put(ids[i], clock, rows + i * dim_);
}

size_t RowCache::AcquireSlot() {
  if (free_head_ != kNone) {
    const size_t slot = free_head_;
    free_head_ = slots_[slot].next;
    return slot;
  }
  if (slots_.size() < capacity_) {
    const size_t slot = slots_.size();
    slots_.emplace_back();
    if (slot / block_rows_ == blocks_.size()) {
      const size_t rows = std::min(block_rows_, capacity_ - slot);
      blocks_.emplace_back(new float[rows * dim_]);
    }
    return slot;
  }
  // Full: the least recently used row gives up its slot.
  const size_t slot = tail_;
  Unlink(slot);
  index_.erase(slots_[slot].id);
  return slot;
}

void RowCache::Remove(size_t slot) {
  Unlink(slot);
  index_.erase(slots_[slot].id);
  slots_[slot].next = free_head_;
  free_head_ = slot;
}

void RowCache::Unlink(size_t slot) {
  Slot& s = slots_[slot];
  if (s.prev != kNone) {
    slots_[s.prev].next = s.next;
  } else {
    head_ = s.next;
  }
  if (s.next != kNone) {
    slots_[s.next].prev = s.prev;
  } else {
    tail_ = s.prev;
  }
  s.prev = kNone;
  s.next = kNone;
}

void RowCache::PushFront(size_t slot) {
  Slot& s = slots_[slot];
  s.prev = kNone;
  s.next = head_;
  if (head_ != kNone) {
    slots_[head_].prev = slot;
  } else {
    tail_ = slot;
  }
  head_ = slot;
}

}  // namespace harrier
