// MemoryAccount: each named budget refuses past its bound, naming itself and
// its flag, reserves nothing when it refuses, and the figures say what each
// holds.
#include "server/memory_account.h"

#include <catch2/catch.hpp>

namespace harrier {
namespace {

TEST_CASE("a named budget holds up to its bound and names its flag when full") {
  NamedBudget budget("parked pulls", "--max_parked_pull_bytes", 100);
  REQUIRE(budget.Reserve(60).ok());
  REQUIRE(budget.Reserve(40).ok());  // exactly at the bound
  const absl::Status refused = budget.Reserve(1);
  REQUIRE(absl::IsResourceExhausted(refused));
  REQUIRE(refused.message().find("parked pulls") != absl::string_view::npos);
  REQUIRE(refused.message().find("--max_parked_pull_bytes") != absl::string_view::npos);
  REQUIRE(budget.held_bytes() == 100);
  REQUIRE(absl::IsResourceExhausted(budget.Reserve(uint64_t{1} << 63)));  // no overflow
  budget.Release(60);
  REQUIRE(budget.held_bytes() == 40);
  budget.Release(1000);  // at most what it holds
  REQUIRE(budget.held_bytes() == 0);
}

TEST_CASE("the account's figures list every budget with its flag, holding and bound") {
  MemoryAccountOptions options;
  options.max_connection_bytes = 10;
  options.max_buffered_bytes = 20;
  options.max_parked_pull_bytes = 30;
  options.max_probe_bytes_in_flight = 40;
  MemoryAccount account(options);
  REQUIRE(account.payloads().Reserve("c", 7).ok());
  REQUIRE(account.parked_pulls().Reserve(8).ok());
  REQUIRE(account.probes().Reserve(9).ok());
  const auto figures = account.Figures();
  REQUIRE(figures.size() == 3);
  CHECK(figures[0].name == "push payloads");
  CHECK(figures[0].flag == "--max_buffered_bytes");
  CHECK(figures[0].held_bytes == 7);
  CHECK(figures[0].limit_bytes == 20);
  CHECK(figures[1].name == "parked pulls");
  CHECK(figures[1].held_bytes == 8);
  CHECK(figures[1].limit_bytes == 30);
  CHECK(figures[2].name == "probes in flight");
  CHECK(figures[2].flag == "--max_probe_bytes_in_flight");
  CHECK(figures[2].held_bytes == 9);
  CHECK(figures[2].limit_bytes == 40);
}

}  // namespace
}  // namespace harrier
