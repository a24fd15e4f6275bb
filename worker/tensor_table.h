#ifndef HARRIER_WORKER_TENSOR_TABLE_H_
#define HARRIER_WORKER_TENSOR_TABLE_H_

// The client's registry of tensors: each registered name's shape, its
// chunks (ChunkSpan: element range and shard) and those chunks grouped by
// shard, the unit of one transport call.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/codec/codec_backend.h"
#include "common/partitioner.h"

namespace harrier {

// One chunk of one tensor: the key of every per-chunk state on the worker
// (compression, pull mirror).
struct ChunkKey {
  std::string name;
  uint32_t chunk = 0;

  bool operator==(const ChunkKey& other) const {
    return chunk == other.chunk && name == other.name;
  }
  template <typename H>
  friend H AbslHashValue(H state, const ChunkKey& key) {
    return H::combine(std::move(state), key.name, key.chunk);
  }
};

// The chunks of one tensor that live on one shard, in chunk order.
struct ShardGroup {
  int shard = 0;
  std::vector<ChunkSpan> spans;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  size_t num_elements = 0;
  std::vector<ShardGroup> groups;  // by shard index
  // Where the caller's push and pull buffers of this tensor live
  // (Client::RegisterTensor): picks the codec backend of its chunks.
  MemoryKind memory = MemoryKind::kHost;
  // Codec specs of this tensor's pushes and pulls; empty: the client's.
  std::string push_codec;
  std::string pull_codec;
  // The caller's push and pull buffers are its own staging
  // (TensorOptions::staging_buffers).
  bool staging_buffers = false;
  // The tensor's own clock (TensorOptions::own_clock): its next push clock,
  // shared by every copy of the entry; null: the worker's clock.
  std::shared_ptr<std::atomic<int64_t>> own_clock;
};

// Thread-safe. Entries are immutable once added: lookups share them, so an
// operation keeps the layout it started with even if the name is
// registered again meanwhile.
class TensorTable {
 public:
  // Chunks hold at most `chunk_elements` elements (at least 1).
  TensorTable(const Partitioner& partitioner, size_t chunk_elements);

  // The layout of a tensor of this name and shape (does not add it).
  TensorInfo Plan(const std::string& name, const std::vector<int64_t>& shape) const;
  // Adds or replaces the entry for info.name.
  void Add(TensorInfo info);

  // NOT_FOUND if unregistered.
  absl::StatusOr<std::shared_ptr<const TensorInfo>> Find(const std::string& name) const;
  // NOT_FOUND if unregistered; INVALID_ARGUMENT if `elements` (a caller's
  // buffer size) differs from the tensor's.
  absl::StatusOr<std::shared_ptr<const TensorInfo>> Lookup(const std::string& name,
                                                           size_t elements) const;
  // Lookup for a call with an input and an output buffer of equal size.
  absl::StatusOr<std::shared_ptr<const TensorInfo>> LookupPair(const std::string& name,
                                                               size_t in_elements,
                                                               size_t out_elements) const;

 private:
  const Partitioner& partitioner_;
  const size_t chunk_elements_;
  mutable absl::Mutex mutex_;
  absl::flat_hash_map<std::string, std::shared_ptr<const TensorInfo>> tensors_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TENSOR_TABLE_H_
