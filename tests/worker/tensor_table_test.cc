#include "worker/tensor_table.h"

#include <catch2/catch.hpp>

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
