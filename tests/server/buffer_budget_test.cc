// BufferBudget: the per-connection and whole-shard bounds on payload bytes
// buffered before validation.
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "server/buffer_budget.h"

namespace harrier {
namespace {

TEST_CASE("a connection may hold up to its bound; a refusal reserves nothing") {
  BufferBudget budget(/*max_connection_bytes=*/100, /*max_buffered_bytes=*/1000);
  REQUIRE(budget.Reserve("a", 60).ok());
  REQUIRE(budget.Reserve("a", 40).ok());  // exactly at the bound
  const absl::Status refused = budget.Reserve("a", 1);
  REQUIRE(absl::IsResourceExhausted(refused));
  REQUIRE(refused.message().find("--max_connection_bytes") != absl::string_view::npos);
  REQUIRE(budget.buffered("a") == 100);
  REQUIRE(budget.Reserve("b", 100).ok());  // another connection has its own
  budget.Release("a", 60);
  REQUIRE(budget.Reserve("a", 60).ok());
  REQUIRE(budget.buffered() == 200);
}

TEST_CASE("the whole shard's bound holds across connections") {
  BufferBudget budget(100, 250);
  REQUIRE(budget.Reserve("a", 100).ok());
  REQUIRE(budget.Reserve("b", 100).ok());
  const absl::Status refused = budget.Reserve("c", 51);
  REQUIRE(absl::IsResourceExhausted(refused));
  REQUIRE(refused.message().find("--max_buffered_bytes") != absl::string_view::npos);
  REQUIRE(budget.buffered("c") == 0);
  REQUIRE(budget.Reserve("c", 50).ok());
  REQUIRE(budget.buffered() == 250);
}

TEST_CASE("sizes near 2^64 cannot wrap the sums") {
  BufferBudget budget(100, 250);
  REQUIRE(budget.Reserve("a", 10).ok());
  REQUIRE(absl::IsResourceExhausted(budget.Reserve("a", ~uint64_t{0})));
  REQUIRE(absl::IsResourceExhausted(budget.Reserve("a", ~uint64_t{0} - 5)));
  REQUIRE(budget.buffered() == 10);
}

TEST_CASE("release gives back at most what a connection holds, and forgets empty ones") {
  BufferBudget budget(100, 100);
  REQUIRE(budget.Reserve("a", 30).ok());
  budget.Release("a", 50);   // more than held: only the 30
  budget.Release("zz", 10);  // never reserved: nothing
  REQUIRE(budget.buffered() == 0);
  REQUIRE(budget.buffered("a") == 0);
  REQUIRE(budget.Reserve("b", 100).ok());
}

TEST_CASE("concurrent reserve and release keep the books exact") {
  BufferBudget budget(1 << 20, 1 << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&budget, t] {
      const std::string connection = "c" + std::to_string(t % 2);
      for (int i = 0; i < 10000; ++i) {
        if (budget.Reserve(connection, 7).ok()) budget.Release(connection, 7);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  REQUIRE(budget.buffered() == 0);
}

}  // namespace
}  // namespace harrier
