// The benches' shared parsing: byte lists and the consistency models' names.

#include "bench/bench_util.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace harrier::bench {
namespace {

using Flags = std::vector<std::string>;

TEST_CASE("a consistency model's name gives the shards' flags") {
  CHECK(*SyncServerFlags("bsp") == Flags{"--sync=bsp"});
  CHECK(*SyncServerFlags("asp") == Flags{"--sync=asp"});
  CHECK(*SyncServerFlags("ssp2") == Flags{"--sync=ssp", "--staleness=2"});
  CHECK(*SyncServerFlags("ssp10") == Flags{"--sync=ssp", "--staleness=10"});
  CHECK(*SyncServerFlags("local4") == Flags{"--sync=local", "--local_steps=4"});
  for (const char* wrong : {"", "ssp", "ssp0", "ssp-1", "sspx", "local", "local0", "BSP", "bsp2",
                            "ssp+2", "ssp 2", "ssp2 ", "local+4", "ssp99999999999999999999"}) {
    INFO(wrong);
    const auto flags = SyncServerFlags(wrong);
    REQUIRE_FALSE(flags.ok());
    CHECK(flags.status().message().find("ssp<N>") != std::string::npos);
  }
}

TEST_CASE("byte lists take binary suffixes and refuse what is not a size") {
  CHECK(*ParseByteList("4K,1M,2G") ==
        std::vector<size_t>{4096, size_t{1} << 20, size_t{2} << 30});
  CHECK_FALSE(ParseByteList("0").ok());
  CHECK_FALSE(ParseByteList("4X").ok());
  CHECK(*ParseIntList("1,2,4") == std::vector<int>{1, 2, 4});
}

}  // namespace
}  // namespace harrier::bench
