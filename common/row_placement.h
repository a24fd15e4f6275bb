#ifndef HARRIER_COMMON_ROW_PLACEMENT_H_
#define HARRIER_COMMON_ROW_PLACEMENT_H_

// Where the rows of sparse tables live: row `id` of every sparse table is on
// shard MixRowId(id) mod num_shards. The mix is splitmix64's finalizer, so
// hot ids, consecutive ids and ids that share low bits spread evenly over
// the shards. Workers and shards must agree on it: it is part of the wire.

#include <cstdint>

namespace harrier {

inline uint64_t MixRowId(int64_t id) {
  uint64_t x = static_cast<uint64_t>(id) + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline int RowShard(int64_t id, int num_shards) {
  return static_cast<int>(MixRowId(id) % static_cast<uint64_t>(num_shards));
}

}  // namespace harrier

#endif  // HARRIER_COMMON_ROW_PLACEMENT_H_
