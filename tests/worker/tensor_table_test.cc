#include "worker/tensor_table.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/partitioner.h"

namespace harrier {
namespace {

TEST_CASE("a tensor's chunks are grouped by the shard the partitioner names") {
  HashPartitioner partitioner(3);
  TensorTable table(partitioner, 4);
  const TensorInfo info = table.Plan("w", {2, 5});
  CHECK(info.num_elements == 10);
  const auto spans = SplitIntoChunks("w", 10, 4, partitioner);
  size_t grouped = 0;
  for (const ShardGroup& group : info.groups) {
    for (const ChunkSpan& span : group.spans) {
      ++grouped;
      CHECK(span.shard == group.shard);
      CHECK(span.shard == spans[span.chunk].shard);
      CHECK(span.offset == spans[span.chunk].offset);
      CHECK(span.num_elements == spans[span.chunk].num_elements);
    }
  }
  CHECK(grouped == spans.size());
}

TEST_CASE("a tensor of 64 KiB a shard or more is cut into equal chunks, a multiple of the "
          "shard count, so every shard holds the same share") {
  for (const int shards : {2, 3, 4, 7}) {
    HashPartitioner partitioner(shards);
    for (const size_t elements : {size_t{16384} * shards, size_t{1000003}, size_t{25557032}}) {
      for (const size_t chunk_elements : {size_t{1} << 18, size_t{1} << 20}) {
        INFO(shards << " shards, " << elements << " elements, chunks of " << chunk_elements);
        const auto spans = SplitIntoChunks("layer", elements, chunk_elements, partitioner);
        CHECK(spans.size() % shards == 0);
        std::vector<size_t> per_shard(shards, 0);
        size_t offset = 0;
        for (size_t c = 0; c < spans.size(); ++c) {
          CHECK(spans[c].chunk == c);
          CHECK(spans[c].offset == offset);
          CHECK(spans[c].num_elements <= chunk_elements);
          CHECK(spans[c].num_elements + 1 >= spans[0].num_elements);
          CHECK(spans[c].shard == partitioner.ShardFor("layer", static_cast<uint32_t>(c)));
          per_shard[spans[c].shard] += spans[c].num_elements;
          offset += spans[c].num_elements;
        }
        CHECK(offset == elements);
        const auto [low, high] = std::minmax_element(per_shard.begin(), per_shard.end());
        // At most one element apart per chunk a shard holds.
        CHECK(*high - *low <= spans.size() / shards);
      }
    }
    // Below 64 KiB a shard: whole chunks of chunk_elements, the last shorter.
    const size_t small = 16384 * shards - 1;
    const auto spans = SplitIntoChunks("bias", small, 10000, partitioner);
    CHECK(spans.size() == (small + 9999) / 10000);
    CHECK(spans.front().num_elements == 10000);
    CHECK(spans.back().num_elements == small - 10000 * (spans.size() - 1));
  }
  // One shard: chunks of chunk_elements as before.
  const auto one = SplitIntoChunks("w", 2500000, 1u << 20, HashPartitioner(1));
  REQUIRE(one.size() == 3);
  CHECK(one[2].num_elements == 2500000 - 2 * (1u << 20));
}

TEST_CASE("lookups check the buffer size and see re-registrations") {
  HashPartitioner partitioner(2);
  TensorTable table(partitioner, 4);
  CHECK(absl::IsNotFound(table.Lookup("w", 3).status()));
  table.Add(table.Plan("w", {3}));
  auto first = table.Lookup("w", 3);
  REQUIRE(first.ok());
  CHECK(absl::IsInvalidArgument(table.Lookup("w", 4).status()));
  CHECK(absl::IsInvalidArgument(table.LookupPair("w", 3, 4).status()));
  table.Add(table.Plan("w", {9}));
  REQUIRE(table.Lookup("w", 9).ok());
  CHECK((*first)->num_elements == 3);  // a layout in use stays as it was
}

TEST_CASE("ChunkKey hashes by name and chunk") {
  absl::flat_hash_map<ChunkKey, int, absl::Hash<ChunkKey>> map;
  map[ChunkKey{"a", 0}] = 1;
  map[ChunkKey{"a", 1}] = 2;
  map[ChunkKey{"b", 0}] = 3;
  CHECK(map.size() == 3);
  CHECK(map[ChunkKey{"a", 1}] == 2);
}

TEST_CASE("KeyOnShard names, in order, the keys of a stem that live on a shard") {
  const HashPartitioner partitioner(3);
  for (int shard = 0; shard < 3; ++shard) {
    // The keys a search over the stem's suffixes finds, in the same order.
    std::vector<std::string> searched;
    for (int k = 0; searched.size() < 4; ++k) {
      const std::string key = "bucket/" + std::to_string(k);
      if (partitioner.ShardFor(key, 0) == shard) searched.push_back(key);
    }
    for (int index = 0; index < 4; ++index) {
      const std::string key = partitioner.KeyOnShard("bucket/", shard, index);
      CHECK(key == searched[index]);
      CHECK(partitioner.ShardFor(key, 0) == shard);
    }
  }
  CHECK(partitioner.KeyOnShard("bucket/", 3, 0).empty());
}

}  // namespace
}  // namespace harrier
