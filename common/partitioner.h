#ifndef HARRIER_COMMON_PARTITIONER_H_
#define HARRIER_COMMON_PARTITIONER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"


namespace harrier {

// Maps a tensor's chunk to the shard that owns it. Implementations must be
// pure functions of their inputs so every worker and shard agrees.
class Partitioner {
 public:
  virtual ~Partitioner() = default;
  virtual int num_shards() const = 0;
  virtual int ShardFor(absl::string_view key, uint32_t chunk) const = 0;
  // The `index`-th (from 0) of the keys `stem` + "0", `stem` + "1", ... whose
  // chunk 0 this partitioner places on `shard` (in [0, num_shards())): how
  // a worker names a tensor of its own (a fused bucket) that must live on a
  // given shard; empty for a shard out of range. The default searches the keys in order with ShardFor.
  virtual std::string KeyOnShard(absl::string_view stem, int shard, int index) const;
};

// Chunk c of key k lives on shard (fnv1a(k) + c) mod num_shards: a tensor's
// chunks are spread round-robin over the shards, starting at a shard that
// depends on the key so small tensors spread too.
class HashPartitioner : public Partitioner {
 public:
  explicit HashPartitioner(int num_shards);
  int num_shards() const override { return num_shards_; }
  int ShardFor(absl::string_view key, uint32_t chunk) const override;

 private:
  int num_shards_;
};

// One contiguous piece of a tensor: elements [offset, offset + num_elements).
struct ChunkSpan {
  uint32_t chunk = 0;
  size_t offset = 0;
  size_t num_elements = 0;
  int shard = 0;
};

// A tensor of at least this many bytes per shard is cut into equal parts
// over every shard (SplitIntoChunks).
inline constexpr size_t kEvenSplitMinBytesPerShard = size_t{64} << 10;

// Splits a tensor of `num_elements` into chunks of at most `chunk_elements`.
// With several shards, a tensor of at least kEvenSplitMinBytesPerShard
// float32 bytes per shard is cut into a multiple of num_shards() chunks of
// equal size (sizes differ by at most one element), so the partitioner's
// round-robin gives every shard the same share of it: each shard then
// carries nM/k of a step's M bytes from n workers, where tensors hashed
// whole leave one shard's link the bottleneck (Herring's even split). A
// smaller tensor is cut into chunks of `chunk_elements` with a shorter last
// one (one chunk when it fits). A zero-element tensor gets one empty chunk.
// Every worker must split alike: the result is a pure function of the
// arguments.
std::vector<ChunkSpan> SplitIntoChunks(absl::string_view key, size_t num_elements,
                                       size_t chunk_elements, const Partitioner& partitioner);

}  // namespace harrier

#endif  // HARRIER_COMMON_PARTITIONER_H_
