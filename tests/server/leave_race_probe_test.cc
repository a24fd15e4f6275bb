// Can a BSP pull see a leaver gone before the round that waited for it is
// applied? ShardStore::Leave used to mark the rank departed for every slot
// first and then complete the pending rounds slot by slot; a pull arriving
// in between found min_clock satisfied without the leaver and copied the
// values without that round. Each slot's ClockBook now records the
// departure in the same locked step that applies those rounds.

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/shard_store.h"
#include "tests/server/store_fixtures.h"

namespace harrier {
namespace {

using testing::Gradient;
using testing::Init;
using testing::MakeStore;
using testing::PullWaiting;

TEST_CASE("probe: a BSP pull never sees a leaver gone before its round is applied") {
  int stale = 0, answered = 0;
  for (int trial = 0; trial < 20; ++trial) {
    auto store = MakeStore("bsp", 2);
    // Many slots, so Leave's walk over them takes a while.
    for (int i = 0; i < 20000; ++i) REQUIRE(store->Init(Init(absl::StrCat("pad", i), 1)).ok());
    REQUIRE(store->Init(Init("w", 1)).ok());
    // Rank 0 pushes clock 0; round 0 waits for rank 1, which will leave.
    REQUIRE(store->Push({Gradient("w", 0, 0, {2})}).ok());
    proto::ChunkRef ref;
    ref.set_key("w");
    ref.set_num_elements(1);
    std::atomic<bool> left{false};
    std::thread puller([&] {
      // Rank 0 pulls clock 1: answerable once rank 1 is gone, and then
      // round 0 (value 0 - 2 = -2) must be in it.
      while (!left.load()) {
        proto::TensorChunk reply;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
        if (PullWaiting(*store, 0, 1, ref, deadline, nullptr, &reply).ok()) {
          ++answered;
          float value = 0;
          std::memcpy(&value, reply.payload().data(), sizeof(value));
          if (value != -2.0f) ++stale;
          return;
        }
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(store->Leave(1, 0).ok());
    left = true;
    puller.join();
  }
  INFO("stale reads: " << stale << " of " << answered << " answered pulls");
  CHECK(stale == 0);
}

}  // namespace
}  // namespace harrier
