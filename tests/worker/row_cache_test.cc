#include "worker/row_cache.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <random>
#include <vector>

namespace harrier {
namespace {

// A row whose every element names (id, clock, version), so a wrong row, a
// stale copy or a row cut short all show as a value mismatch.
std::vector<float> MakeRow(uint32_t dim, int64_t id, int64_t clock, int version = 0) {
  std::vector<float> row(dim);
  for (uint32_t j = 0; j < dim; ++j) {
    row[j] = static_cast<float>(id * 1000 + clock * 10 + version) + 0.001f * j;
  }
  return row;
}

TEST_CASE("hits and misses are counted and a hit copies the row") {
  RowCache cache(4, 3, 0);
  std::vector<float> out(3, -1.0f);
  CHECK_FALSE(cache.Get(7, 0, out.data()));
  CHECK(out == std::vector<float>(3, -1.0f));
  CHECK(cache.hits() == 0);
  CHECK(cache.misses() == 1);

  const std::vector<float> row = MakeRow(3, 7, 0);
  cache.Put(7, 0, row.data());
  CHECK(cache.size() == 1);
  REQUIRE(cache.Get(7, 0, out.data()));
  CHECK(out == row);
  CHECK(cache.hits() == 1);
  CHECK(cache.misses() == 1);

  // Put of a held id replaces its row and clock.
  const std::vector<float> newer = MakeRow(3, 7, 5);
  cache.Put(7, 5, newer.data());
  CHECK(cache.size() == 1);
  REQUIRE(cache.Get(7, 5, out.data()));
  CHECK(out == newer);
  CHECK(cache.hits() == 2);
  CHECK(cache.misses() == 1);
}

TEST_CASE("a row is fresh up to exactly `staleness` clocks and dropped after") {
  for (int64_t staleness : {0, 1, 3}) {
    CAPTURE(staleness);
    RowCache cache(8, 2, staleness);
    const std::vector<float> row = MakeRow(2, 1, 10);
    cache.Put(1, 10, row.data());
    std::vector<float> out(2);
    for (int64_t clock = 10; clock <= 10 + staleness; ++clock) {
      CAPTURE(clock);
      REQUIRE(cache.Get(1, clock, out.data()));
      CHECK(out == row);
    }
    CHECK(cache.hits() == static_cast<uint64_t>(staleness + 1));
    CHECK(cache.misses() == 0);

    CHECK_FALSE(cache.Get(1, 10 + staleness + 1, out.data()));
    CHECK(cache.misses() == 1);
    CHECK(cache.size() == 0);
    // Dropped, not kept: going back to a fresh clock still misses.
    CHECK_FALSE(cache.Get(1, 10, out.data()));
    CHECK(cache.misses() == 2);
    CHECK(cache.hits() == static_cast<uint64_t>(staleness + 1));
  }
}

TEST_CASE("a row stored at a later clock than asked is fresh") {
  RowCache cache(2, 1, 0);
  const float value = 4.5f;
  cache.Put(3, 9, &value);
  float out = 0.0f;
  REQUIRE(cache.Get(3, 8, &out));
  CHECK(out == 4.5f);
}

TEST_CASE("the least recently used row is evicted, and a Get protects a row") {
  RowCache cache(3, 1, 100);
  for (int64_t id = 1; id <= 3; ++id) {
    const float value = static_cast<float>(id);
    cache.Put(id, 0, &value);
  }
  float out = 0.0f;
  // Order, most recent first: 3 2 1. Touching 1 makes it 1 3 2.
  REQUIRE(cache.Get(1, 0, &out));
  CHECK(out == 1.0f);
  const float four = 4.0f;
  cache.Put(4, 0, &four);  // evicts 2
  CHECK(cache.size() == 3);
  CHECK_FALSE(cache.Get(2, 0, &out));
  CHECK(cache.Get(1, 0, &out));
  CHECK(cache.Get(3, 0, &out));
  CHECK(cache.Get(4, 0, &out));
  CHECK(out == 4.0f);

  // Order now 4 3 1; a Put of a held id refreshes it too: 1 4 3.
  const float one = 10.0f;
  cache.Put(1, 0, &one);
  const float five = 5.0f;
  cache.Put(5, 0, &five);  // evicts 3
  CHECK_FALSE(cache.Get(3, 0, &out));
  REQUIRE(cache.Get(1, 0, &out));
  CHECK(out == 10.0f);
  CHECK(cache.Get(4, 0, &out));
  CHECK(cache.Get(5, 0, &out));
  CHECK(cache.hits() == 7);
  CHECK(cache.misses() == 2);
}

TEST_CASE("a miss does not touch the recency of other rows") {
  RowCache cache(2, 1, 0);
  const float a = 1.0f;
  const float b = 2.0f;
  cache.Put(1, 0, &a);
  cache.Put(2, 0, &b);  // order 2 1
  float out = 0.0f;
  CHECK_FALSE(cache.Get(9, 0, &out));
  const float c = 3.0f;
  cache.Put(3, 0, &c);  // evicts 1
  CHECK_FALSE(cache.Get(1, 0, &out));
  CHECK(cache.Get(2, 0, &out));
  CHECK(cache.Get(3, 0, &out));
}

TEST_CASE("Invalidate drops the named rows only and counts nothing") {
  RowCache cache(8, 2, 5);
  for (int64_t id = 0; id < 5; ++id) {
    const std::vector<float> row = MakeRow(2, id, 0);
    cache.Put(id, 0, row.data());
  }
  const std::vector<int64_t> gone = {1, 3, 42};
  cache.Invalidate(gone);
  CHECK(cache.size() == 3);
  CHECK(cache.hits() == 0);
  CHECK(cache.misses() == 0);
  std::vector<float> out(2);
  for (int64_t id = 0; id < 5; ++id) {
    CAPTURE(id);
    const bool held = id != 1 && id != 3;
    CHECK(cache.Get(id, 1, out.data()) == held);
    if (held) CHECK(out == MakeRow(2, id, 0));
  }
  CHECK(cache.hits() == 3);
  CHECK(cache.misses() == 2);

  // Freed slots are reused: the cache fills to its capacity again without
  // evicting the rows still held.
  for (int64_t id = 10; id < 15; ++id) {
    const std::vector<float> row = MakeRow(2, id, 1);
    cache.Put(id, 1, row.data());
  }
  CHECK(cache.size() == 8);
  for (int64_t id : {0, 2, 4, 10, 11, 12, 13, 14}) {
    CAPTURE(id);
    CHECK(cache.Get(id, 1, out.data()));
  }
}

TEST_CASE("Clear drops every row and keeps the counters") {
  RowCache cache(4, 1, 0);
  const float value = 1.0f;
  cache.Put(1, 0, &value);
  cache.Put(2, 0, &value);
  float out = 0.0f;
  CHECK(cache.Get(1, 0, &out));
  CHECK_FALSE(cache.Get(3, 0, &out));
  cache.Clear();
  CHECK(cache.size() == 0);
  CHECK(cache.hits() == 1);
  CHECK(cache.misses() == 1);
  CHECK_FALSE(cache.Get(1, 0, &out));
  CHECK_FALSE(cache.Get(2, 0, &out));
  CHECK(cache.misses() == 3);
  // Usable again after Clear, up to the full capacity.
  for (int64_t id = 0; id < 6; ++id) cache.Put(id, 0, &value);
  CHECK(cache.size() == 4);
  CHECK(cache.Get(5, 0, &out));
  CHECK(cache.Get(2, 0, &out));
  CHECK_FALSE(cache.Get(1, 0, &out));
}

TEST_CASE("capacity 0 is off: nothing is held and nothing is counted") {
  RowCache cache(0, 4, 10);
  const std::vector<float> row = MakeRow(4, 1, 0);
  cache.Put(1, 0, row.data());
  const std::vector<int64_t> ids = {1, 2};
  cache.Insert(ids, 0, MakeRow(8, 1, 0).data());
  CHECK(cache.size() == 0);
  std::vector<float> out(8, -1.0f);
  CHECK_FALSE(cache.Get(1, 0, out.data()));
  std::vector<size_t> missing;
  CHECK(cache.Lookup(ids, 0, out.data(), &missing) == 0);
  CHECK(missing == std::vector<size_t>{0, 1});
  CHECK(out == std::vector<float>(8, -1.0f));
  cache.Invalidate(ids);
  cache.Clear();
  CHECK(cache.hits() == 0);
  CHECK(cache.misses() == 0);
}

TEST_CASE("capacity 1 holds the last row put") {
  RowCache cache(1, 2, 0);
  std::vector<float> out(2);
  for (int64_t id = 0; id < 4; ++id) {
    const std::vector<float> row = MakeRow(2, id, 0);
    cache.Put(id, 0, row.data());
    CHECK(cache.size() == 1);
    REQUIRE(cache.Get(id, 0, out.data()));
    CHECK(out == row);
    if (id > 0) CHECK_FALSE(cache.Get(id - 1, 0, out.data()));
  }
  CHECK(cache.hits() == 4);
  CHECK(cache.misses() == 3);
  const std::vector<int64_t> only = {3};
  cache.Invalidate(only);
  CHECK(cache.size() == 0);
  const std::vector<float> row = MakeRow(2, 9, 0);
  cache.Put(9, 0, row.data());
  REQUIRE(cache.Get(9, 0, out.data()));
  CHECK(out == row);
}

TEST_CASE("Lookup and Insert: hits copied, misses listed in order and untouched") {
  for (uint32_t dim : {1u, 128u}) {
    CAPTURE(dim);
    RowCache cache(16, dim, 1);
    const std::vector<int64_t> stored = {5, -3, 1LL << 40};
    std::vector<float> rows;
    for (int64_t id : stored) {
      const std::vector<float> row = MakeRow(dim, id % 1000, 2);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    cache.Insert(stored, 2, rows.data());
    CHECK(cache.size() == 3);

    const std::vector<int64_t> asked = {7, 5, 1LL << 40, 5, 8, -3};
    std::vector<float> out(asked.size() * dim, -1.0f);
    std::vector<size_t> missing = {99};  // appended to, not replaced
    CHECK(cache.Lookup(asked, 3, out.data(), &missing) == 4);
    CHECK(missing == std::vector<size_t>{99, 0, 4});
    CHECK(cache.hits() == 4);
    CHECK(cache.misses() == 2);
    auto row_of = [&](size_t i) {
      return std::vector<float>(out.begin() + i * dim, out.begin() + (i + 1) * dim);
    };
    CHECK(row_of(0) == std::vector<float>(dim, -1.0f));
    CHECK(row_of(1) == MakeRow(dim, 5, 2));
    CHECK(row_of(2) == MakeRow(dim, (1LL << 40) % 1000, 2));
    CHECK(row_of(3) == MakeRow(dim, 5, 2));
    CHECK(row_of(4) == std::vector<float>(dim, -1.0f));
    CHECK(row_of(5) == MakeRow(dim, -3, 2));

    // One clock later than the bound: every row is stale and dropped.
    missing.clear();
    CHECK(cache.Lookup(stored, 4, out.data(), &missing) == 0);
    CHECK(missing == std::vector<size_t>{0, 1, 2});
    CHECK(cache.size() == 0);

    // A repeated id in Insert keeps its last row.
    const std::vector<int64_t> twice = {11, 11};
    std::vector<float> both = MakeRow(dim, 11, 4, 1);
    const std::vector<float> second = MakeRow(dim, 11, 4, 2);
    both.insert(both.end(), second.begin(), second.end());
    cache.Insert(twice, 4, both.data());
    CHECK(cache.size() == 1);
    std::vector<float> got(dim);
    REQUIRE(cache.Get(11, 4, got.data()));
    CHECK(got == second);
  }
}

// The reference: a map of id -> (clock, row) and a list of ids, most
// recently used first; every operation spelled out the plain way.
class ReferenceCache {
 public:
  ReferenceCache(size_t capacity, uint32_t dim, int64_t staleness)
      : capacity_(capacity), dim_(dim), staleness_(staleness) {}

  bool Get(int64_t id, int64_t clock, float* out) {
    if (capacity_ == 0) return false;
    auto it = rows_.find(id);
    if (it == rows_.end()) {
      ++misses_;
      return false;
    }
    if (clock - it->second.clock > staleness_) {
      order_.erase(it->second.position);
      rows_.erase(it);
      ++misses_;
      return false;
    }
    std::copy(it->second.row.begin(), it->second.row.end(), out);
    order_.splice(order_.begin(), order_, it->second.position);
    ++hits_;
    return true;
  }

  void Put(int64_t id, int64_t clock, const float* row) {
    if (capacity_ == 0) return;
    auto it = rows_.find(id);
    if (it != rows_.end()) {
      order_.erase(it->second.position);
      rows_.erase(it);
    } else if (rows_.size() == capacity_) {
      rows_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(id);
    rows_[id] = Entry{clock, std::vector<float>(row, row + dim_), order_.begin()};
  }

  void Invalidate(const std::vector<int64_t>& ids) {
    for (int64_t id : ids) {
      auto it = rows_.find(id);
      if (it == rows_.end()) continue;
      order_.erase(it->second.position);
      rows_.erase(it);
    }
  }

  void Clear() {
    rows_.clear();
    order_.clear();
  }

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  size_t size() const { return rows_.size(); }

 private:
  struct Entry {
    int64_t clock;
    std::vector<float> row;
    std::list<int64_t>::iterator position;
  };
  const size_t capacity_;
  const uint32_t dim_;
  const int64_t staleness_;
  std::map<int64_t, Entry> rows_;
  std::list<int64_t> order_;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

TEST_CASE("100k random operations agree with the reference model") {
  struct Config {
    size_t capacity;
    uint32_t dim;
    int64_t staleness;
  };
  // The last two span several blocks of row memory (512 rows of dim 128),
  // the last one partly filled.
  const Config configs[] = {
      {1, 1, 0}, {1, 128, 2}, {7, 1, 1}, {16, 4, 3}, {300, 128, 2}, {1100, 128, 5},
  };
  for (const Config& config : configs) {
    CAPTURE(config.capacity, config.dim, config.staleness);
    const uint32_t dim = config.dim;
    RowCache cache(config.capacity, dim, config.staleness);
    ReferenceCache reference(config.capacity, dim, config.staleness);
    std::mt19937_64 random(config.capacity * 131 + dim);
    // Ids from a range a bit over twice the capacity: hits, misses and
    // evictions all common.
    const int64_t id_range = static_cast<int64_t>(2 * config.capacity + 3);
    auto random_id = [&] {
      return std::uniform_int_distribution<int64_t>(-2, id_range - 3)(random);
    };
    auto random_ids = [&] {
      std::vector<int64_t> ids(std::uniform_int_distribution<size_t>(0, 8)(random));
      for (int64_t& id : ids) id = random_id();
      return ids;
    };
    int64_t clock = 0;
    int version = 0;
    std::vector<float> out(8 * dim);
    std::vector<float> expected(8 * dim);
    for (int op = 0; op < 100000; ++op) {
      CAPTURE(op);
      const int kind = std::uniform_int_distribution<int>(0, 99)(random);
      if (kind < 3) {
        ++clock;
      } else if (kind < 40) {
        const int64_t id = random_id();
        // Rows are sometimes put at an older clock, as a late pull reply is.
        const int64_t at = clock - std::uniform_int_distribution<int64_t>(0, 1)(random);
        const std::vector<float> row = MakeRow(dim, id, at, ++version);
        cache.Put(id, at, row.data());
        reference.Put(id, at, row.data());
      } else if (kind < 80) {
        const int64_t id = random_id();
        std::fill(out.begin(), out.end(), -1.0f);
        std::fill(expected.begin(), expected.end(), -1.0f);
        const bool hit = cache.Get(id, clock, out.data());
        REQUIRE(hit == reference.Get(id, clock, expected.data()));
        REQUIRE(out == expected);
      } else if (kind < 88) {
        const std::vector<int64_t> ids = random_ids();
        std::fill(out.begin(), out.end(), -1.0f);
        std::fill(expected.begin(), expected.end(), -1.0f);
        std::vector<size_t> missing;
        std::vector<size_t> expected_missing;
        size_t expected_hits = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (reference.Get(ids[i], clock, expected.data() + i * dim)) {
            ++expected_hits;
          } else {
            expected_missing.push_back(i);
          }
        }
        REQUIRE(cache.Lookup(ids, clock, out.data(), &missing) == expected_hits);
        REQUIRE(missing == expected_missing);
        REQUIRE(out == expected);
      } else if (kind < 94) {
        const std::vector<int64_t> ids = random_ids();
        std::vector<float> rows;
        for (int64_t id : ids) {
          const std::vector<float> row = MakeRow(dim, id, clock, ++version);
          rows.insert(rows.end(), row.begin(), row.end());
        }
        cache.Insert(ids, clock, rows.data());
        for (size_t i = 0; i < ids.size(); ++i) {
          reference.Put(ids[i], clock, rows.data() + i * dim);
        }
      } else if (kind < 99) {
        const std::vector<int64_t> ids = random_ids();
        cache.Invalidate(ids);
        reference.Invalidate(ids);
      } else if (std::uniform_int_distribution<int>(0, 9)(random) == 0) {
        cache.Clear();
        reference.Clear();
      }
      REQUIRE(cache.size() == reference.size());
      REQUIRE(cache.hits() == reference.hits());
      REQUIRE(cache.misses() == reference.misses());
    }
    CHECK(cache.hits() > 0);
    CHECK(cache.misses() > 0);
    CHECK(cache.size() <= config.capacity);
  }
}

}  // namespace
}  // namespace harrier
