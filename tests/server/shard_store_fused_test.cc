// The shard's one-pass push (server/fused_apply.h inside ShardStore):
// results bit-identical to the two-pass reference for every thread count
// and kernel, a bad payload found anywhere changes nothing (values, spare,
// round sums), and a pull racing pushes gets a whole version.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "common/crc32c.h"
#include "server/fused_apply.h"
#include "server/shard_store.h"
#include "tests/server/store_fixtures.h"

namespace harrier {
namespace {

using testing::Gradient;
using testing::Init;
using testing::PullWaiting;

constexpr size_t kLarge = (1u << 20) + 5;  // past the 1 MiB split threshold

std::unique_ptr<ShardStore> MakeStore(const std::string& sync, int workers, int apply_threads,
                                      const std::string& kind = "sgd") {
  ShardStoreOptions options;
  options.num_workers = workers;
  options.sync = *SyncPolicy::FromFlags(sync, 1, 1);
  options.apply_threads = apply_threads;
  OptimizerOptions optimizer;
  optimizer.kind = kind;
  optimizer.lr = 0.25f;
  optimizer.weight_decay = 0.01f;
  return std::make_unique<ShardStore>(options, *CreateOptimizer(optimizer));
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The reference: Optimizer::Step on a copy, pushes applied one by one.
std::vector<float> Reference(const std::string& kind, size_t n,
                             const std::vector<std::vector<float>>& gradients) {
  OptimizerOptions options;
  options.kind = kind;
  options.lr = 0.25f;
  options.weight_decay = 0.01f;
  auto optimizer = *CreateOptimizer(options);
  std::vector<float> w(n, 0.0f);
  OptimizerState state;
  for (const auto& g : gradients) {
    optimizer->Step(absl::MakeSpan(w), absl::MakeConstSpan(g), 1.0f, state);
  }
  return w;
}

TEST_CASE("fused store: pushes applied bit-identically for 1, 2, 3 threads and the scalar kernel") {
  for (const std::string kind : {"sgd", "momentum"}) {
    for (bool scalar : {false, true}) {
      for (int threads : {1, 2, 3}) {
        for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, kLarge}) {
          CAPTURE(kind, scalar, threads, n);
          SetFusedScalarForTesting(scalar);
          auto store = MakeStore("asp", 1, threads, kind);
          REQUIRE(store->Init(Init("w", n)).ok());
          std::vector<std::vector<float>> gradients;
          for (int64_t clock = 0; clock < 3; ++clock) {
            gradients.push_back(Random(n, static_cast<uint32_t>(clock + n)));
            REQUIRE(store->Push({Gradient("w", 0, clock, gradients.back())}).ok());
          }
          CHECK(SameBits(*store->Snapshot("w", 0), Reference(kind, n, gradients)));
        }
      }
    }
  }
  SetFusedScalarForTesting(false);
}

// `chunk`'s payload cut as a gRPC message arrives: frame-sized pieces, the
// first cut two bytes into a float, so most floats straddle a cut.
std::vector<absl::string_view> FramePieces(const proto::TensorChunk& chunk) {
  const absl::string_view payload = chunk.payload();
  std::vector<absl::string_view> pieces = {payload.substr(0, std::min<size_t>(2, payload.size()))};
  for (size_t at = pieces[0].size(); at < payload.size(); at += 16375) {
    pieces.push_back(payload.substr(at, 16375));
  }
  return pieces;
}

TEST_CASE("fused store: a payload split over pieces applies as the contiguous one") {
  for (const std::string kind : {"sgd", "momentum"}) {
    for (const std::string sync : {"asp", "bsp"}) {
      for (int threads : {1, 3}) {
        CAPTURE(kind, sync, threads);
        const int workers = sync == "bsp" ? 2 : 1;
        auto contiguous = MakeStore(sync, workers, threads, kind);
        auto split = MakeStore(sync, workers, threads, kind);
        for (ShardStore* store : {contiguous.get(), split.get()}) {
          REQUIRE(store->Init(Init("w", kLarge)).ok());
        }
        const proto::TensorChunk probe = Gradient("w", 0, 0, {});
        // Plain SGD reads it split; momentum steps from contiguous memory.
        CHECK(split->ReadsSplitPayload(probe) == (kind == "sgd"));
        CHECK_FALSE(split->ReadsSplitPayload(Gradient("unknown", 0, 0, {})));
        for (int64_t clock = 0; clock < 2; ++clock) {
          for (uint32_t rank = 0; rank < static_cast<uint32_t>(workers); ++rank) {
            const proto::TensorChunk chunk = Gradient(
                "w", rank, clock, Random(kLarge, static_cast<uint32_t>(7 + clock * 2 + rank)));
            REQUIRE(contiguous->Push({chunk}).ok());
            const std::vector<absl::string_view> pieces = FramePieces(chunk);
            ShardStore::PushChunkView view;
            view.header = &chunk;
            view.pieces = pieces;
            // A byte flipped in the last piece: refused, nothing changes.
            proto::TensorChunk flipped = chunk;
            std::vector<absl::string_view> flipped_pieces = FramePieces(flipped);
            const_cast<char*>(flipped_pieces.back().data())[flipped_pieces.back().size() - 1] ^= 1;
            ShardStore::PushChunkView bad;
            bad.header = &flipped;
            bad.pieces = flipped_pieces;
            const std::vector<float> before = *split->Snapshot("w", 0);
            REQUIRE(
                absl::IsInvalidArgument(split->Push(std::vector<ShardStore::PushChunkView>{bad})));
            REQUIRE(SameBits(*split->Snapshot("w", 0), before));
            REQUIRE(split->Push(std::vector<ShardStore::PushChunkView>{view}).ok());
          }
          REQUIRE(SameBits(*split->Snapshot("w", 0), *contiguous->Snapshot("w", 0)));
        }
      }
    }
  }
}

// What a refused call must leave exactly as it was.
struct Before {
  std::vector<float> values;
  ShardStore::BuffersForTesting buffers;
  uint64_t spare_bytes;
};
Before Capture(const ShardStore& store, const std::string& key) {
  return {*store.Snapshot(key, 0), store.BuffersOfForTesting(key, 0),
          store.holdings().spare_bytes};
}
void RequireUnchanged(const ShardStore& store, const std::string& key, const Before& before) {
  REQUIRE(SameBits(*store.Snapshot(key, 0), before.values));
  const ShardStore::BuffersForTesting now = store.BuffersOfForTesting(key, 0);
  REQUIRE(now.values == before.buffers.values);  // nothing swapped in
  REQUIRE(now.spare == before.buffers.spare);    // the spare kept, nothing allocated
  REQUIRE(store.holdings().spare_bytes == before.spare_bytes);
}

TEST_CASE("fused store: a bad last byte, a NaN last, an element at 2^40 change nothing") {
  for (int threads : {1, 3}) {
    for (const std::string sync : {"asp", "bsp"}) {
      CAPTURE(threads, sync);
      // BSP with two workers: rank 0's push is held in a round sum that a
      // refused push of rank 1 must not touch.
      const int workers = sync == "bsp" ? 2 : 1;
      auto store = MakeStore(sync, workers, threads);
      REQUIRE(store->Init(Init("w", kLarge)).ok());
      REQUIRE(store->Init(Init("v", 5)).ok());
      const std::vector<float> g0 = Random(kLarge, 1), g1 = Random(kLarge, 2);
      // One full step first, so the slot has a spare and non-zero values.
      const std::vector<float> small = {1, 2, 3, 4, 5};
      REQUIRE(store->Push({Gradient("w", 0, 0, g0), Gradient("v", 0, 0, small)}).ok());
      if (workers == 2) {
        REQUIRE(store->Push({Gradient("w", 1, 0, g1), Gradient("v", 1, 0, small)}).ok());
      }
      REQUIRE(store->BuffersOfForTesting("w", 0).spare != nullptr);
      if (workers == 2) {
        REQUIRE(store->Push({Gradient("w", 0, 1, g0), Gradient("v", 0, 1, small)}).ok());  // held
      }
      const uint32_t bad_rank = workers == 2 ? 1 : 0;
      const Before before = Capture(*store, "w");
      const std::vector<float> v_before = *store->Snapshot("v", 0);

      proto::TensorChunk flipped = Gradient("w", bad_rank, 1, g1);
      (*flipped.mutable_payload())[flipped.payload().size() - 1] ^= 1;
      std::vector<float> nan_last = g1;
      nan_last.back() = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> at_limit = g1;
      at_limit.back() = std::ldexp(1.0f, 40);
      for (const proto::TensorChunk& bad :
           {flipped, Gradient("w", bad_rank, 1, nan_last), Gradient("w", bad_rank, 1, at_limit)}) {
        // Alone, and after a good chunk of another slot in the same call.
        const absl::Status alone = store->Push({bad});
        REQUIRE(absl::IsInvalidArgument(alone));
        RequireUnchanged(*store, "w", before);
        const absl::Status paired = store->Push({Gradient("v", bad_rank, 1, {1, 2, 3, 4, 5}), bad});
        REQUIRE(absl::IsInvalidArgument(paired));
        RequireUnchanged(*store, "w", before);
        REQUIRE(SameBits(*store->Snapshot("v", 0), v_before));
      }
      // The same clock, good this time, applies exactly.
      REQUIRE(store->Push({Gradient("w", bad_rank, 1, g1)}).ok());
      OptimizerOptions options;
      options.lr = 0.25f;
      options.weight_decay = 0.01f;
      auto sgd = *CreateOptimizer(options);
      std::vector<float> expect(kLarge, 0.0f);
      OptimizerState state;
      if (workers == 2) {
        // Each round: the average of the two ranks' sum.
        std::vector<float> average(kLarge);
        for (size_t i = 0; i < kLarge; ++i) average[i] = (g0[i] + g1[i]) / 2.0f;
        sgd->Step(absl::MakeSpan(expect), absl::MakeConstSpan(average), 1.0f, state);
        sgd->Step(absl::MakeSpan(expect), absl::MakeConstSpan(average), 1.0f, state);
      } else {
        sgd->Step(absl::MakeSpan(expect), absl::MakeConstSpan(g0), 1.0f, state);
        sgd->Step(absl::MakeSpan(expect), absl::MakeConstSpan(g1), 1.0f, state);
      }
      REQUIRE(SameBits(*store->Snapshot("w", 0), expect));
    }
  }
}

TEST_CASE("fused store: a pull racing pushes gets one whole version, its CRC matching") {
  ShardStoreOptions options;
  options.sync = *SyncPolicy::FromFlags("asp", 1, 1);
  options.apply_threads = 3;
  OptimizerOptions sgd;
  sgd.lr = 1.0f;
  ShardStore store(options, *CreateOptimizer(sgd));
  REQUIRE(store.Init(Init("w", kLarge)).ok());
  const proto::TensorChunk ones = Gradient("w", 0, 0, std::vector<float>(kLarge, 1.0f));
  std::atomic<bool> done{false};
  std::atomic<int> failed_pushes{0};  // Catch2 asserts on the main thread only
  std::thread pusher([&] {
    for (int64_t clock = 0; clock < 40; ++clock) {
      proto::TensorChunk chunk = ones;
      chunk.set_clock(clock);
      if (!store.Push({chunk}).ok()) failed_pushes++;
    }
    done = true;
  });
  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(kLarge);
  int pulls = 0;
  float last = 1.0f;
  // Failures end the loop (the pusher is joined before any REQUIRE).
  bool whole = true, crc_ok = true, monotonic = true, pulled = true;
  while ((!done || pulls < 3) && whole && crc_ok && monotonic && pulled) {
    proto::TensorChunk out;
    pulled = PullWaiting(store, 0, 0, ref, ShardStore::Clock::now() + std::chrono::seconds(10), nullptr,
                        &out).ok();
    if (!pulled) break;
    ++pulls;
    crc_ok = Crc32c(out.payload().data(), out.payload().size()) == out.checksum();
    std::vector<float> values(kLarge);
    std::memcpy(values.data(), out.payload().data(), kLarge * 4);
    // Every push subtracts 1 everywhere: a whole version has one value.
    whole = std::count(values.begin(), values.end(), values.front()) ==
            static_cast<std::ptrdiff_t>(kLarge);
    monotonic = values.front() <= last;  // versions never go back
    last = values.front();
  }
  pusher.join();
  REQUIRE(pulled);
  REQUIRE(crc_ok);
  REQUIRE(whole);
  REQUIRE(monotonic);
  REQUIRE(failed_pushes == 0);
  REQUIRE(*store.Snapshot("w", 0) == std::vector<float>(kLarge, -40.0f));
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

TEST_CASE("fused store: a borrowed reply is the parameter memory, and stays as it was") {
  auto store = MakeStore("asp", 1, 1);
  const size_t n = 4099;
  REQUIRE(store->Init(Init("w", n)).ok());
  REQUIRE(store->Push({Gradient("w", 0, 0, Random(n, 3))}).ok());
  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(n);
  std::shared_ptr<const ParamBuffer> borrowed;
  bool allocated = false;
  proto::TensorChunk header;
  PullTarget target;
  target.allocate = [&](size_t bytes) {
    allocated = true;
    static std::string unused;
    unused.resize(bytes);
    return unused.data();
  };
  target.borrow = [&](std::shared_ptr<const ParamBuffer> version) {
    borrowed = std::move(version);
  };
  const absl::StatusOr<PullOutcome> outcome = store->TryPull(0, 0, ref, &header, target);
  REQUIRE((outcome.ok() && outcome->ready));
  REQUIRE_FALSE(allocated);
  REQUIRE(borrowed.get() == store->BuffersOfForTesting("w", 0).values);  // no copy
  REQUIRE(header.checksum() == Crc32c(borrowed->data(), borrowed->bytes()));
  const std::vector<float> sent(borrowed->data(), borrowed->data() + n);
  // Pushes while the reply is "on the wire" write other buffers.
  for (int64_t clock = 1; clock < 4; ++clock) {
    REQUIRE(store->Push({Gradient("w", 0, clock, Random(n, 10 + clock))}).ok());
    REQUIRE(store->BuffersOfForTesting("w", 0).values != borrowed.get());
    REQUIRE(store->BuffersOfForTesting("w", 0).spare != borrowed.get());
  }
  REQUIRE(SameBits(std::vector<float>(borrowed->data(), borrowed->data() + n), sent));
  // Bounded: one spare, whatever the replies hold.
  REQUIRE(store->holdings().spare_bytes == n * sizeof(float));
}

}  // namespace
}  // namespace harrier
