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
using testing::PullWaiting;

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

// The restart deadlock of the shard-kill training tests under load: rank 0
// had its push of clock 3 acknowledged just before the crash (lost with the
// shard, not in the checkpoint) and will not send it again; rank 1 retries
// its own. Rank 1's pull for clock 4 waits for rank 0 until rank 0's
// heartbeat says its next clock on the chunk is 4.
TEST_CASE("shard store: a heartbeat's chunk clocks re-base a rank whose pushes were lost") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 1)).ok());
  for (int64_t clock = 0; clock < 3; ++clock) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      REQUIRE(store->Push({Gradient("w", rank, clock, {1})}).ok());
    }
  }
  const ShardCheckpoint checkpoint = store->Export();  // at clock 3
  REQUIRE(store->Push({Gradient("w", 0, 3, {1})}).ok());  // acknowledged, then the crash
  auto restored = MakeStore("bsp", 2);
  REQUIRE(restored->Import(checkpoint).ok());
  REQUIRE(*restored->Snapshot("w", 0) == std::vector<float>{-3});
  REQUIRE(restored->Push({Gradient("w", 1, 3, {4})}).ok());  // rank 1's retry

  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(1);
  proto::TensorChunk out;
  const absl::Status waited =
      PullWaiting(*restored, 1, 4, ref, ShardStore::Clock::now() + std::chrono::milliseconds(50), nullptr,
                     &out);
  REQUIRE(absl::IsDeadlineExceeded(waited));

  google::protobuf::RepeatedPtrField<proto::ChunkClock> pushed;
  proto::ChunkClock* clock = pushed.Add();
  clock->set_key("w");
  clock->set_next_clock(4);
  pushed.Add()->set_key("not-here");  // ignored
  restored->RebaseFromWorker(0, pushed);
  REQUIRE(PullWaiting(*restored, 1, 4, ref, ShardStore::Clock::now() + std::chrono::seconds(5), nullptr,
                         &out)
              .ok());
  // Round 3 is rank 1's gradient alone: rank 0's was lost with the shard.
  REQUIRE(*restored->Snapshot("w", 0) == std::vector<float>{-7});
  // Rank 0 goes on at clock 4; its lost clock 3 is refused, not applied.
  REQUIRE(absl::IsFailedPrecondition(restored->Push({Gradient("w", 0, 3, {1})})));
  REQUIRE(restored->Push({Gradient("w", 0, 4, {1})}).ok());
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

// The shape of a compressed PowerSGD pull reply: the layer's own matrix
// (rows of shape[1] elements), not the chunk folded near-square; a 1-D
// tensor gets PowerSGD's uncompressed form.
PayloadHeader PowerSgdPullHeader(const std::vector<uint64_t>& shape) {
  size_t n = 1;
  for (uint64_t dim : shape) n *= dim;
  auto store = MakeStore("asp", 1);
  proto::InitRequest init = Init("w", n);
  init.clear_shape();
  for (uint64_t dim : shape) init.add_shape(dim);
  REQUIRE(store->Init(init).ok());
  std::vector<float> gradient(n);
  for (size_t i = 0; i < n; ++i) gradient[i] = static_cast<float>((i * 7919) % 101) - 50.0f;
  proto::ChunkRef ref = Ref("w", n);
  ref.set_codec_params("powersgd:rank=2");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  proto::TensorChunk first;  // a rank's first compressed pull is dense
  REQUIRE(PullWaiting(*store, 0, 0, ref, deadline, nullptr, &first).ok());
  REQUIRE(first.codec() == 0);
  REQUIRE(store->Push({Gradient("w", 0, 0, gradient)}).ok());
  ref.set_view_version(first.view_version());
  proto::TensorChunk second;
  REQUIRE(PullWaiting(*store, 0, 1, ref, deadline, nullptr, &second).ok());
  REQUIRE(second.codec() == static_cast<uint32_t>(CodecId::kPowerSgd));
  // As asked (canonical, cols=0): the client checks it.
  REQUIRE(second.codec_params() == CodecSpec::Parse("powersgd:rank=2")->ToString());
  auto header = PeekPayloadHeader(second.payload());
  REQUIRE(header.ok());
  return *header;
}

TEST_CASE("shard store: compressed PowerSGD pulls factor the layer's matrix") {
  const PayloadHeader matrix = PowerSgdPullHeader({256, 784});
  CHECK(matrix.param0 == 2);    // rank
  CHECK(matrix.param1 == 256);  // m: the layer's rows (near-square would be 448)
  const PayloadHeader conv = PowerSgdPullHeader({32, 16, 3, 3});
  CHECK(conv.param1 == 32);     // rows of 16*3*3
  const PayloadHeader bias = PowerSgdPullHeader({8192});
  CHECK(bias.param0 == 0);      // 1-D: PowerSGD's uncompressed form
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
  const absl::Status status = PullWaiting(*store, 0, 1, ref, start + std::chrono::seconds(10),
                                          &cancellation, &reply);
  canceller.join();
  const auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE(absl::IsCancelled(status));
  REQUIRE(waited < std::chrono::seconds(2));
  REQUIRE(store->blocked_pulls() == 0);
  // Cancelled before the call: refused without waiting.
  REQUIRE(absl::IsCancelled(PullWaiting(*store, 0, 1, ref, start + std::chrono::seconds(10),
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
      PullWaiting(*store, 0, 1, ref, start + std::chrono::seconds(10), nullptr, &reply);
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
using testing::PullWaiting;

TEST_CASE("shard store: a call racing a call of its own rank applies each chunk exactly once") {
  // Calls [C, A] and [A] of rank 0 for clock 0 race (a retry racing its
  // original). Until exactly-once pushes, the loser was refused whole and
  // changed nothing; now whichever locks second finds A a duplicate: both
  // calls succeed, A is applied once and C once.
  constexpr int kRounds = 400;
  const std::vector<float> gradient(4096, 1.0f);
  int pair_duplicate = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto store = MakeStore("asp", 1);
    REQUIRE(store->Init(Init("c", gradient.size())).ok());
    REQUIRE(store->Init(Init("a", gradient.size())).ok());
    const std::vector<proto::TensorChunk> pair = {Gradient("c", 0, 0, gradient),
                                                  Gradient("a", 0, 0, gradient)};
    const std::vector<proto::TensorChunk> single = {Gradient("a", 0, 0, gradient)};
    std::atomic<int> ready{0};
    absl::Status pair_status, single_status;
    PushResult pair_result, single_result;
    auto start_together = [&ready] {
      ready++;
      while (ready.load() < 2) {
      }
    };
    std::thread first([&] {
      start_together();
      pair_status = store->Push(pair, &pair_result);
    });
    std::thread second([&] {
      start_together();
      single_status = store->Push(single, &single_result);
    });
    first.join();
    second.join();
    REQUIRE(pair_status.ok());
    REQUIRE(single_status.ok());
    REQUIRE((*store->Snapshot("a", 0))[0] == -1.0f);
    REQUIRE((*store->Snapshot("c", 0))[0] == -1.0f);
    // A was applied by exactly one of the two calls.
    REQUIRE(pair_result.duplicate + single_result.duplicate == 1);
    REQUIRE(pair_result.applied + single_result.applied == 2);
    REQUIRE(store->counters().duplicate_pushes == 1);
    pair_duplicate += pair_result.duplicate;
  }
  INFO("the pair found A a duplicate " << pair_duplicate << " times of " << kRounds);
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

// Exactly-once pushes: a push seen before (a retry) is acknowledged
// as a duplicate, not applied again and not refused.
namespace harrier {
namespace {

using testing::Gradient;
using testing::Init;
using testing::MakeStore;
using testing::PullWaiting;

proto::TensorChunk ChunkGradient(const std::string& key, uint32_t chunk, uint32_t rank,
                                 int64_t clock, const std::vector<float>& values) {
  proto::TensorChunk pushed = Gradient(key, rank, clock, values);
  pushed.set_chunk(chunk);
  return pushed;
}

proto::InitRequest ChunkInit(const std::string& key, uint32_t chunk, size_t n) {
  proto::InitRequest request = Init(key, n);
  request.set_chunk(chunk);
  request.clear_shape();
  request.add_shape(4 * n);
  return request;
}

TEST_CASE("exactly once: a retried push is acknowledged as a duplicate and applied once") {
  for (const char* sync : {"asp", "ssp", "bsp"}) {
    INFO(sync);
    auto store = MakeStore(sync, 2);
    REQUIRE(store->Init(Init("w", 1)).ok());
    PushResult result;
    REQUIRE(store->Push({Gradient("w", 0, 0, {2})}, &result).ok());
    REQUIRE(result.applied == 1);
    REQUIRE(result.duplicate == 0);
    // The reply was lost; the retry (held in BSP's pending round, applied in
    // the others) is answered OK and changes nothing.
    const std::vector<float> before = *store->Snapshot("w", 0);
    REQUIRE(store->Push({Gradient("w", 0, 0, {2})}, &result).ok());
    REQUIRE(result.applied == 0);
    REQUIRE(result.duplicate == 1);
    REQUIRE(*store->Snapshot("w", 0) == before);
    REQUIRE(store->counters().duplicate_pushes == 1);
    REQUIRE(store->Push({Gradient("w", 1, 0, {4})}).ok());
    // BSP: one averaged step (-3); ASP/SSP: each push scaled 1/2 (-1, -2).
    REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{-3});
    REQUIRE(store->Push({Gradient("w", 1, 0, {4})}).ok());  // duplicate again
    REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{-3});
    // A duplicate is still validated whole: a bad payload is refused.
    proto::TensorChunk corrupt = Gradient("w", 0, 0, {2});
    corrupt.set_checksum(corrupt.checksum() ^ 1);
    REQUIRE(absl::IsInvalidArgument(store->Push({corrupt})));
    // The future is still refused.
    REQUIRE(absl::IsFailedPrecondition(store->Push({Gradient("w", 0, 5, {2})})));
  }
}

TEST_CASE("exactly once: a rank that left gets a clear error, not an acknowledgement") {
  auto store = MakeStore("asp", 2);
  REQUIRE(store->Init(Init("w", 1)).ok());
  REQUIRE(store->Push({Gradient("w", 1, 0, {2})}).ok());
  REQUIRE(store->Leave(1, 1).ok());
  const absl::Status refused = store->Push({Gradient("w", 1, 0, {2})});
  REQUIRE(absl::IsFailedPrecondition(refused));
  REQUIRE(refused.message().find("has left the job") != absl::string_view::npos);
}

TEST_CASE("exactly once: after a restore a call mixing a checkpointed chunk and a lost one "
          "applies only the lost one") {
  // BSP, 2 ranks, tensor w in two chunks. Rank 0 pushes both chunks for
  // clock 0 in one call; rank 1 has pushed chunk 0 only when the checkpoint
  // is taken: chunk 0's round is applied (in the checkpoint), chunk 1's is
  // pending (not in it; rank 0 rolled back there).
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(ChunkInit("w", 0, 1)).ok());
  REQUIRE(store->Init(ChunkInit("w", 1, 1)).ok());
  REQUIRE(store->Push({ChunkGradient("w", 0, 0, 0, {2}), ChunkGradient("w", 1, 0, 0, {2})}).ok());
  REQUIRE(store->Push({ChunkGradient("w", 0, 1, 0, {4})}).ok());
  const ShardCheckpoint checkpoint = store->Export();

  auto restored = MakeStore("bsp", 2);
  REQUIRE(restored->Import(checkpoint).ok());
  REQUIRE(*restored->Snapshot("w", 0) == std::vector<float>{-3});
  REQUIRE(*restored->Snapshot("w", 1) == std::vector<float>{0});
  // Rank 0 retries its call (its reply was lost with the shard): chunk 0 is
  // a duplicate, chunk 1 joins the round again. Neither refused nor twice.
  PushResult result;
  REQUIRE(restored
              ->Push({ChunkGradient("w", 0, 0, 0, {2}), ChunkGradient("w", 1, 0, 0, {2})},
                     &result)
              .ok());
  REQUIRE(result.duplicate == 1);
  REQUIRE(result.applied == 1);
  // Rank 1 retries chunk 0 (a duplicate) with chunk 1 (new): round complete.
  REQUIRE(restored
              ->Push({ChunkGradient("w", 0, 1, 0, {4}), ChunkGradient("w", 1, 1, 0, {4})},
                     &result)
              .ok());
  REQUIRE(result.duplicate == 1);
  REQUIRE(*restored->Snapshot("w", 0) == std::vector<float>{-3});
  REQUIRE(*restored->Snapshot("w", 1) == std::vector<float>{-3});
  // A refused chunk refuses the whole call, duplicates and all.
  const std::vector<float> w1 = *restored->Snapshot("w", 1);
  REQUIRE(absl::IsFailedPrecondition(restored->Push(
      {ChunkGradient("w", 0, 0, 1, {2}), ChunkGradient("w", 1, 0, 7, {2})})));
  REQUIRE(*restored->Snapshot("w", 1) == w1);
}

TEST_CASE("exactly once: a push retried after a restart is applied once whether or not the "
          "checkpoint holds it") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 1)).ok());
  REQUIRE(store->Push({Gradient("w", 0, 0, {1})}).ok());
  const ShardCheckpoint with_clock0 = store->Export();
  REQUIRE(store->Push({Gradient("w", 0, 1, {1})}).ok());  // applied, then the shard dies
  // Restarted from the checkpoint before clock 1: clock 0 is a duplicate,
  // clock 1 applied (once), a retry of it then a duplicate.
  auto restored = MakeStore("asp", 1);
  REQUIRE(restored->Import(with_clock0).ok());
  PushResult result;
  REQUIRE(restored->Push({Gradient("w", 0, 0, {1})}, &result).ok());
  REQUIRE(result.duplicate == 1);
  REQUIRE(restored->Push({Gradient("w", 0, 1, {1})}, &result).ok());
  REQUIRE(result.applied == 1);
  REQUIRE(restored->Push({Gradient("w", 0, 1, {1})}, &result).ok());
  REQUIRE(result.duplicate == 1);
  REQUIRE(*restored->Snapshot("w", 0) == std::vector<float>{-2});
  // A rank that ran on (re-based from 0 to 4 on a fresh restore) gets a
  // clear error for the clocks in between, which this shard never applied.
  auto again = MakeStore("asp", 1);
  REQUIRE(again->Import(with_clock0).ok());
  REQUIRE(again->Push({Gradient("w", 0, 4, {1})}).ok());
  const absl::Status lost = again->Push({Gradient("w", 0, 2, {1})});
  REQUIRE(absl::IsFailedPrecondition(lost));
  REQUIRE(lost.message().find("was lost") != absl::string_view::npos);
  REQUIRE(again->Push({Gradient("w", 0, 0, {1})}).ok());  // in the checkpoint
}

}  // namespace
}  // namespace harrier
