// ShardStore over its ClockBooks, in process: what the refactor into
// server/consistency.h fixed or must keep.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "common/cancellation.h"
#include "common/crc32c.h"
#include "common/partitioner.h"
#include "server/shard_store.h"
#include "tests/server/store_fixtures.h"

namespace harrier {
namespace {

using testing::Gradient;
using testing::Init;
using testing::MakeStore;

TEST_CASE("shard store: after a restore every tensor re-bases, not only the first pushed") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("a", 1)).ok());
  REQUIRE(store->Init(Init("b", 1)).ok());
  auto restored = MakeStore("bsp", 2);
  REQUIRE(restored->Import(store->Export()).ok());
  // The workers ran on to clock 5 while the shard was down.
  for (uint32_t rank = 0; rank < 2; ++rank) {
    REQUIRE(restored->Push({Gradient("a", rank, 5, {2})}).ok());
    REQUIRE(restored->Push({Gradient("b", rank, 5, {4})}).ok());
  }
  REQUIRE(*restored->Snapshot("a", 0) == std::vector<float>{-2});
  REQUIRE(*restored->Snapshot("b", 0) == std::vector<float>{-4});
}

TEST_CASE("shard store: local SGD subtracts the averaged deltas whatever the optimizer") {
  ShardStoreOptions options;
  options.num_workers = 2;
  options.sync = *SyncPolicy::FromFlags("local", 0, 4);
  OptimizerOptions adam;
  adam.kind = "adam";
  ShardStore store(options, *CreateOptimizer(adam));  // adam's step would not be -2, -4
  REQUIRE(store.Init(Init("w", 2)).ok());
  REQUIRE(store.Push({Gradient("w", 0, 0, {1, 2})}).ok());
  REQUIRE(store.Push({Gradient("w", 1, 0, {3, 6})}).ok());
  REQUIRE(*store.Snapshot("w", 0) == std::vector<float>{-2, -4});
}

proto::ChunkRef Ref(const std::string& key, size_t n) {
  proto::ChunkRef ref;
  ref.set_key(key);
  ref.set_num_elements(n);
  return ref;
}

TEST_CASE("shard store: a cancelled blocked pull wakes at once") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 4)).ok());
  const proto::ChunkRef ref = Ref("w", 4);
  Cancellation cancellation;
  const auto start = std::chrono::steady_clock::now();
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cancellation.Cancel();
  });
  proto::TensorChunk reply;
  // Clock 1 waits for both ranks' clock 0: never comes.
  const absl::Status status = store->Pull(0, 1, ref, start + std::chrono::seconds(10),
                                          &cancellation, &reply);
  canceller.join();
  const auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE(absl::IsCancelled(status));
  REQUIRE(waited < std::chrono::seconds(2));
  REQUIRE(store->blocked_pulls() == 0);
  // Cancelled before the call: refused without waiting.
  REQUIRE(absl::IsCancelled(store->Pull(0, 1, ref, start + std::chrono::seconds(10),
                                        &cancellation, &reply)));
}

TEST_CASE("shard store: close wakes a blocked pull, which fails UNAVAILABLE") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 4)).ok());
  const proto::ChunkRef ref = Ref("w", 4);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    store->Close();
  });
  proto::TensorChunk reply;
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status =
      store->Pull(0, 1, ref, start + std::chrono::seconds(10), nullptr, &reply);
  closer.join();
  REQUIRE(absl::IsUnavailable(status));
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
}

TEST_CASE("shard store: Init refuses an element count whose byte size wraps around") {
  auto store = MakeStore("bsp", 1);
  for (uint64_t n : {uint64_t{1} << 62, (uint64_t{1} << 62) + 1, (uint64_t{1} << 63) + 2}) {
    proto::InitRequest request = Init("w", 0);
    request.set_num_elements(n);
    request.set_initial_values(std::string(n == (uint64_t{1} << 62) ? 0 : 4, '\0'));
    request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
    REQUIRE(absl::IsInvalidArgument(store->Init(request).status()));
  }
  REQUIRE(absl::IsNotFound(store->Snapshot("w", 0).status()));
}

TEST_CASE("shard store: Init refuses more elements than the shape holds") {
  auto store = MakeStore("bsp", 1);
  proto::InitRequest request = Init("w", 1024);
  request.clear_shape();
  request.add_shape(3);
  REQUIRE(absl::IsInvalidArgument(store->Init(request).status()));
  request.clear_shape();
  for (int i = 0; i < 3; ++i) request.add_shape(uint64_t{1} << 32);  // the product overflows
  REQUIRE(absl::IsInvalidArgument(store->Init(request).status()));
  REQUIRE(absl::IsNotFound(store->Snapshot("w", 0).status()));
  request.clear_shape();
  request.add_shape(32);
  request.add_shape(32);
  REQUIRE(store->Init(request).ok());
}

TEST_CASE("shard store: gradients of 2^40 or more are refused: FLT_MAX cannot reach -Inf") {
  auto store = MakeStore("bsp", 1);
  REQUIRE(store->Init(Init("w", 2)).ok());
  const float huge = std::numeric_limits<float>::max();
  for (int64_t clock = 0; clock < 3; ++clock) {
    const absl::Status refused = store->Push({Gradient("w", 0, clock, {huge, 1})});
    REQUIRE(absl::IsInvalidArgument(refused));
    REQUIRE(std::string(refused.message()).find("2^40") != std::string::npos);
  }
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{0, 0});
  // Just below the bound is a gradient like any other.
  const float big = 1.0e12f;  // 2^40 is about 1.0995e12
  REQUIRE(store->Push({Gradient("w", 0, 0, {big, -big})}).ok());
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{-big, big});
}

TEST_CASE("shard store: majority-vote rounds reuse their aggregator and stay a vote") {
  auto store = MakeStore("bsp", 3);
  REQUIRE(store->Init(Init("w", 2)).ok());
  auto spec = CodecSpec::Parse("sign");
  REQUIRE(spec.ok());
  auto codec = CreateCodec(*spec);
  REQUIRE(codec.ok());
  const std::vector<std::vector<float>> votes = {{1, -1}, {1, -1}, {-1, 1}};
  for (int64_t clock = 0; clock < 3; ++clock) {
    for (uint32_t rank = 0; rank < 3; ++rank) {
      proto::TensorChunk chunk = Gradient("w", rank, clock, votes[rank]);
      std::string payload;
      REQUIRE((*codec)->Encode(votes[rank], CodecContext{}, &payload).ok());
      chunk.set_codec(static_cast<uint32_t>(CodecId::kSign));
      chunk.set_codec_params(spec->ToString());
      chunk.set_payload(payload);
      chunk.set_checksum(Crc32c(payload.data(), payload.size()));
      REQUIRE(store->Push({chunk}).ok());
    }
    // Two of three vote +1 for element 0 and -1 for element 1, each round.
    const float steps = static_cast<float>(clock + 1);
    REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{-steps, steps});
  }
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

using testing::Gradient;
using testing::Init;
using testing::MakeStore;

TEST_CASE("shard store: a call that loses a race with its own rank changes nothing") {
  // Calls [C, A] and [A] of rank 0 for clock 0 race; one of them gets A.
  // Whichever loses must leave every key as it was: C moves iff [C, A] won.
  constexpr int kRounds = 400;
  const std::vector<float> gradient(4096, 1.0f);
  int both_refused = 0, pair_won = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto store = MakeStore("asp", 1);
    REQUIRE(store->Init(Init("c", gradient.size())).ok());
    REQUIRE(store->Init(Init("a", gradient.size())).ok());
    const std::vector<proto::TensorChunk> pair = {Gradient("c", 0, 0, gradient),
                                                  Gradient("a", 0, 0, gradient)};
    const std::vector<proto::TensorChunk> single = {Gradient("a", 0, 0, gradient)};
    std::atomic<int> ready{0};
    absl::Status pair_status, single_status;
    auto start_together = [&ready] {
      ready++;
      while (ready.load() < 2) {
      }
    };
    std::thread first([&] {
      start_together();
      pair_status = store->Push(pair);
    });
    std::thread second([&] {
      start_together();
      single_status = store->Push(single);
    });
    first.join();
    second.join();
    REQUIRE(pair_status.ok() != single_status.ok());  // exactly one gets A
    const float c0 = (*store->Snapshot("c", 0))[0];
    const float a0 = (*store->Snapshot("a", 0))[0];
    REQUIRE(a0 == -1.0f);
    REQUIRE(c0 == (pair_status.ok() ? -1.0f : 0.0f));
    if (!pair_status.ok()) {
      REQUIRE(absl::IsFailedPrecondition(pair_status));
      // C's clock 0 is still free: the refused call left no trace.
      REQUIRE(store->Push({Gradient("c", 0, 0, gradient)}).ok());
    } else {
      ++pair_won;
    }
    both_refused += (!pair_status.ok() && !single_status.ok()) ? 1 : 0;
  }
  REQUIRE(both_refused == 0);
  INFO("the pair won " << pair_won << " of " << kRounds);
}

TEST_CASE("shard store: a dense push naming a vote codec is refused, not dropped from a vote") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 2)).ok());
  proto::TensorChunk dense = Gradient("w", 0, 0, {8, 8});
  dense.set_codec_params("sign");  // codec id stays 0: a dense payload
  REQUIRE(absl::IsInvalidArgument(store->Push({dense})));
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{0, 0});
  REQUIRE(store->Push({Gradient("w", 0, 0, {8, 8})}).ok());  // the clock is still free
}

}  // namespace
}  // namespace harrier
