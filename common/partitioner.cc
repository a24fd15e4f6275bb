#include "common/partitioner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace harrier {
namespace {

uint64_t Fnv1a(absl::string_view text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

std::string Partitioner::KeyOnShard(absl::string_view stem, int shard, int index) const {
  if (shard < 0 || shard >= num_shards()) return {};  // no key lives there
  for (uint64_t k = 0;; ++k) {
    std::string key = absl::StrCat(stem, k);
    if (ShardFor(key, 0) == shard && index-- == 0) return key;
  }
}

HashPartitioner::HashPartitioner(int num_shards) : num_shards_(std::max(1, num_shards)) {}

int HashPartitioner::ShardFor(absl::string_view key, uint32_t chunk) const {
  return static_cast<int>((Fnv1a(key) + chunk) % static_cast<uint64_t>(num_shards_));
}

std::vector<ChunkSpan> SplitIntoChunks(absl::string_view key, size_t num_elements,
                                       size_t chunk_elements, const Partitioner& partitioner) {
  chunk_elements = std::max<size_t>(1, chunk_elements);
  const size_t shards = static_cast<size_t>(std::max(1, partitioner.num_shards()));
  const size_t min_even_elements = shards * (kEvenSplitMinBytesPerShard / sizeof(float));
  std::vector<ChunkSpan> spans;
  if (shards > 1 && num_elements >= min_even_elements) {
    // A multiple of the shard count, each chunk within chunk_elements.
    const size_t rounds = (num_elements + shards * chunk_elements - 1) / (shards * chunk_elements);
    const size_t count = rounds * shards;
    const size_t base = num_elements / count;
    const size_t longer = num_elements % count;  // the first `longer` get one more
    size_t offset = 0;
    for (size_t c = 0; c < count; ++c) {
      ChunkSpan span;
      span.chunk = static_cast<uint32_t>(c);
      span.offset = offset;
      span.num_elements = base + (c < longer ? 1 : 0);
      span.shard = partitioner.ShardFor(key, span.chunk);
      spans.push_back(span);
      offset += span.num_elements;
    }
    return spans;
  }
  size_t offset = 0;
  uint32_t chunk = 0;
  do {
    ChunkSpan span;
    span.chunk = chunk;
    span.offset = offset;
    span.num_elements = std::min(chunk_elements, num_elements - offset);
    span.shard = partitioner.ShardFor(key, chunk);
    spans.push_back(span);
    offset += span.num_elements;
    ++chunk;
  } while (offset < num_elements);
  return spans;
}

}  // namespace harrier
