// ShardStore over its ClockBooks, in process: what the refactor into
// server/consistency.h fixed or must keep.

#include <catch2/catch.hpp>

#include <chrono>
#include <limits>
#include <thread>

#include "common/cancellation.h"
#include "common/crc32c.h"
#include "common/partitioner.h"
#include "server/shard_store.h"

namespace harrier {
namespace {

// A key this single-shard store owns; shapes are 1-D.
proto::InitRequest Init(const std::string& key, size_t n) {
  std::vector<float> zeros(n, 0.0f);
  proto::InitRequest request;
  request.set_key(key);
  request.add_shape(n);
  request.set_num_elements(n);
  request.set_dtype(proto::DTYPE_FLOAT32);
  request.set_initial_values(std::string(reinterpret_cast<const char*>(zeros.data()), n * 4));
  request.set_checksum(Crc32c(request.initial_values().data(), n * 4));
  return request;
}

proto::TensorChunk Gradient(const std::string& key, uint32_t rank, int64_t clock,
                            const std::vector<float>& values) {
  proto::TensorChunk chunk;
  chunk.set_key(key);
  chunk.set_rank(rank);
  chunk.set_clock(clock);
  chunk.set_num_elements(values.size());
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.set_payload(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

std::unique_ptr<ShardStore> MakeStore(const std::string& sync, int workers) {
  ShardStoreOptions options;
  options.num_workers = workers;
  options.sync = *SyncPolicy::FromFlags(sync, 1, 4);
  OptimizerOptions sgd;
  sgd.lr = 1.0f;
  return std::make_unique<ShardStore>(options, *CreateOptimizer(sgd));
}

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
  ShardStore store(options, *CreateOptimizer(adam));
  REQUIRE(store.Init(Init("w", 2)).ok());
  REQUIRE(store.Push({Gradient("w", 0, 0, {1, 2})}).ok());
  REQUIRE(store.Push({Gradient("w", 1, 0, {3, 6})}).ok());
  REQUIRE(*store.Snapshot("w", 0) == std::vector<float>{-2, -4});
}

TEST_CASE("shard store: a cancelled blocked pull wakes at once") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 4)).ok());
  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(4);
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
  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(4);
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
