// Sparse rows spread evenly over shards whatever the ids look like:
// consecutive, sharing their low bits (multiples of a power of two), or
// drawn by a skewed process where each id is one row.
#include "common/row_placement.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

namespace harrier {
namespace {

// The largest shard's share over the mean: 1 is perfectly even.
double Imbalance(const std::vector<int64_t>& ids, int shards) {
  std::vector<int64_t> count(shards, 0);
  for (int64_t id : ids) {
    const int shard = RowShard(id, shards);
    REQUIRE(shard >= 0);
    REQUIRE(shard < shards);
    ++count[shard];
  }
  int64_t most = 0;
  for (int64_t c : count) most = std::max(most, c);
  return static_cast<double>(most) * shards / static_cast<double>(ids.size());
}

TEST_CASE("row placement spreads consecutive, strided and negative ids evenly") {
  constexpr int64_t kIds = 200000;
  std::vector<int64_t> consecutive, strided, negative, high;
  for (int64_t i = 0; i < kIds; ++i) {
    consecutive.push_back(i);
    strided.push_back(i * 4096);  // the low 12 bits all zero
    negative.push_back(-i - 1);
    high.push_back((i << 40) | 7);  // only the high bits differ
  }
  for (int shards : {2, 3, 4, 7, 8, 16}) {
    INFO(shards << " shards");
    for (const auto* ids : {&consecutive, &strided, &negative, &high}) {
      CHECK(Imbalance(*ids, shards) < 1.03);
    }
  }
}

TEST_CASE("row placement is a pure function of the id (every process agrees)") {
  CHECK(MixRowId(0) == 0xe220a8397b1dcdafull);
  CHECK(RowShard(12345, 4) == RowShard(12345, 4));
  CHECK(RowShard(-1, 1) == 0);
}

}  // namespace
}  // namespace harrier
