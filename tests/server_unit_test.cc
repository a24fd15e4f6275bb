// Unit tests of the shard's components, in process: optimizers, the
// consistency rule, the partitioner and the shard store.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <set>

#include "common/codec/codec.h"
#include "absl/strings/match.h"
#include "common/crc32c.h"
#include "common/partitioner.h"
#include "server/consistency.h"
#include "server/optimizer.h"
#include "server/shard_store.h"
#include "tests/server/store_fixtures.h"

namespace harrier {
namespace {

TEST_CASE("optimizers take one step as defined") {
  OptimizerOptions options;
  options.lr = 0.5f;
  options.momentum = 0.5f;
  std::vector<float> g = {2.0f, -4.0f};

  SECTION("sgd") {
    auto opt = CreateOptimizer(options);
    REQUIRE(opt.ok());
    std::vector<float> w = {1.0f, 1.0f};
    OptimizerState state;
    (*opt)->Step(absl::MakeSpan(w), g, 0.5f, state);  // scale folds 1/n in
    REQUIRE(w == std::vector<float>{0.5f, 2.0f});
  }
  SECTION("momentum accumulates u = m u + g") {
    options.kind = "momentum";
    auto opt = CreateOptimizer(options);
    REQUIRE(opt.ok());
    std::vector<float> w = {0.0f, 0.0f};
    OptimizerState state;
    (*opt)->Step(absl::MakeSpan(w), g, 1.0f, state);
    (*opt)->Step(absl::MakeSpan(w), g, 1.0f, state);
    // u1 = g, u2 = 1.5 g; w = -0.5 (g + 1.5 g) = -1.25 g
    REQUIRE(w[0] == Approx(-2.5f));
    REQUIRE(w[1] == Approx(5.0f));
  }
  SECTION("nesterov looks ahead") {
    options.kind = "nesterov";
    auto opt = CreateOptimizer(options);
    REQUIRE(opt.ok());
    std::vector<float> w = {0.0f, 0.0f};
    OptimizerState state;
    (*opt)->Step(absl::MakeSpan(w), g, 1.0f, state);
    // u = g; w -= lr (g + m u) = 0.5 * 1.5 g
    REQUIRE(w[0] == Approx(-1.5f));
  }
  SECTION("adam's first step has magnitude lr") {
    options.kind = "adam";
    auto opt = CreateOptimizer(options);
    REQUIRE(opt.ok());
    std::vector<float> w = {0.0f, 0.0f};
    OptimizerState state;
    (*opt)->Step(absl::MakeSpan(w), g, 1.0f, state);
    REQUIRE(w[0] == Approx(-0.5f).epsilon(1e-4));
    REQUIRE(w[1] == Approx(0.5f).epsilon(1e-4));
  }
  SECTION("adagrad divides by the root of the accumulated squares") {
    options.kind = "adagrad";
    auto opt = CreateOptimizer(options);
    REQUIRE(opt.ok());
    std::vector<float> w = {0.0f, 0.0f};
    OptimizerState state;
    (*opt)->Step(absl::MakeSpan(w), g, 1.0f, state);
    REQUIRE(w[0] == Approx(-0.5f).epsilon(1e-4));
    (*opt)->Step(absl::MakeSpan(w), g, 1.0f, state);
    REQUIRE(w[0] == Approx(-0.5f - 0.5f / std::sqrt(2.0f)).epsilon(1e-4));
  }
  SECTION("bad options are refused") {
    options.kind = "rmsprop";
    REQUIRE(absl::IsInvalidArgument(CreateOptimizer(options).status()));
    options.kind = "sgd";
    options.lr = -1;
    REQUIRE(absl::IsInvalidArgument(CreateOptimizer(options).status()));
  }
}

TEST_CASE("the staleness rule: a pull at t waits for min_clock >= t - s") {
  auto bsp = SyncPolicy::FromFlags("bsp", 5, 1);
  REQUIRE(bsp.ok());
  ConsistencyController bsp_controller(*bsp, 4);
  REQUIRE(bsp_controller.PullMayProceed(3, 3));
  REQUIRE_FALSE(bsp_controller.PullMayProceed(4, 3));
  REQUIRE(bsp_controller.AggregatesRounds());

  auto ssp = SyncPolicy::FromFlags("ssp", 2, 1);
  REQUIRE(ssp.ok());
  ConsistencyController ssp_controller(*ssp, 4);
  REQUIRE(ssp_controller.PullMayProceed(5, 3));
  REQUIRE_FALSE(ssp_controller.PullMayProceed(6, 3));
  REQUIRE_FALSE(ssp_controller.AggregatesRounds());

  auto asp = SyncPolicy::FromFlags("asp", 0, 1);
  REQUIRE(asp.ok());
  REQUIRE(ConsistencyController(*asp, 4).PullMayProceed(1000000, 0));

  REQUIRE(absl::IsInvalidArgument(SyncPolicy::FromFlags("ssp", 0, 1).status()));
  REQUIRE(absl::IsInvalidArgument(SyncPolicy::FromFlags("local", 0, 0).status()));
  REQUIRE(absl::IsInvalidArgument(SyncPolicy::FromFlags("eventual", 0, 1).status()));
}

TEST_CASE("the partitioner covers a tensor with chunks spread over the shards") {
  HashPartitioner partitioner(3);
  const auto spans = SplitIntoChunks("layer", 10, 4, partitioner);
  REQUIRE(spans.size() == 3);
  REQUIRE(spans[2].offset == 8);
  REQUIRE(spans[2].num_elements == 2);
  std::set<int> shards;
  for (const auto& span : spans) shards.insert(span.shard);
  REQUIRE(shards.size() == 3);  // consecutive chunks land on different shards
  REQUIRE(SplitIntoChunks("empty", 0, 4, partitioner).size() == 1);
  REQUIRE(partitioner.ShardFor("layer", 7) == HashPartitioner(3).ShardFor("layer", 7));
}

using testing::Gradient;
using testing::Init;
using testing::MakeStore;
using testing::MakeStoreWithParamBudget;
using testing::PullWaiting;

TEST_CASE("shard store: BSP waits for every rank, then applies the average once") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 2)).ok());
  REQUIRE(store->Push({Gradient("w", 0, 0, {2, 4})}).ok());
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{0, 0});  // round incomplete
  REQUIRE(store->Push({Gradient("w", 1, 0, {4, 8})}).ok());
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{-3, -6});
}

TEST_CASE("shard store: a rank that leaves completes the rounds waiting for it") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 1)).ok());
  REQUIRE(store->Push({Gradient("w", 0, 0, {2})}).ok());
  REQUIRE(store->Leave(1, 0).ok());
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{-2});
  REQUIRE(store->active_workers() == 1);
  REQUIRE(absl::IsFailedPrecondition(store->Push({Gradient("w", 1, 0, {2})})));
}

TEST_CASE("shard store: SSP applies each push on arrival scaled 1/n") {
  auto store = MakeStore("ssp", 2);
  REQUIRE(store->Init(Init("w", 1)).ok());
  REQUIRE(store->Push({Gradient("w", 0, 0, {2})}).ok());
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{-1});
}

TEST_CASE("shard store: export drops incomplete rounds and import restores the rest") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 1)).ok());
  REQUIRE(store->Push({Gradient("w", 0, 0, {2})}).ok());
  REQUIRE(store->Push({Gradient("w", 1, 0, {2})}).ok());
  REQUIRE(store->Push({Gradient("w", 0, 1, {2})}).ok());  // round 1 incomplete
  ShardCheckpoint checkpoint = store->Export();
  REQUIRE(checkpoint.slots.size() == 1);
  REQUIRE(checkpoint.slots[0].values == std::vector<float>{-2});
  REQUIRE(checkpoint.slots[0].pushed == std::vector<int64_t>{1, 1});  // rank 0 rolled back

  auto restored = MakeStore("bsp", 2);
  REQUIRE(restored->Import(checkpoint).ok());
  REQUIRE(*restored->Snapshot("w", 0) == std::vector<float>{-2});
  // Workers ran on to clock 3 meanwhile: each rank re-bases once.
  REQUIRE(restored->Push({Gradient("w", 0, 3, {4})}).ok());
  REQUIRE(restored->Push({Gradient("w", 1, 3, {4})}).ok());
  REQUIRE(*restored->Snapshot("w", 0) == std::vector<float>{-6});
  REQUIRE(absl::IsFailedPrecondition(restored->Push({Gradient("w", 0, 9, {4})})));
  REQUIRE(absl::IsFailedPrecondition(MakeStore("bsp", 3)->Import(checkpoint)));
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

// Applies a pull reply to a worker's view the way the client does.
void ApplyReply(const proto::TensorChunk& reply, std::vector<float>* view) {
  if (reply.codec() == 0) {
    view->resize(reply.num_elements());
    std::memcpy(view->data(), reply.payload().data(), reply.payload().size());
    return;
  }
  auto spec = CodecSpec::Parse(reply.codec_params());
  REQUIRE(spec.ok());
  auto codec = CreateCodec(*spec);
  REQUIRE((*codec)->DecodeAdd(reply.payload(), 1.0f, absl::MakeSpan(*view)).ok());
}

TEST_CASE("compressed pulls: dense first, then top-k of the difference, nothing lost") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 100)).ok());
  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(100);
  ref.set_codec_params("topk:ratio=0.1");
  const auto forever = ShardStore::Clock::now() + std::chrono::seconds(5);
  std::vector<float> view;
  proto::TensorChunk reply;
  REQUIRE(PullWaiting(*store, 0, 0, ref, forever, {}, &reply).ok());
  REQUIRE(reply.codec() == 0);
  ApplyReply(reply, &view);
  ref.set_view_version(reply.view_version());  // the client says which view it holds

  std::vector<float> gradient(100);
  for (int i = 0; i < 100; ++i) gradient[i] = static_cast<float>(i + 1);
  REQUIRE(store->Push({Gradient("w", 0, 0, gradient)}).ok());
  const std::vector<float> target = *store->Snapshot("w", 0);
  // Each pull sends the 10 largest remaining differences: 10 pulls drain it.
  for (int pull = 0; pull < 10; ++pull) {
    reply.Clear();
    REQUIRE(PullWaiting(*store, 0, 1, ref, forever, {}, &reply).ok());
    REQUIRE(reply.codec() == static_cast<uint32_t>(CodecId::kTopK));
    REQUIRE(reply.payload().size() == HeaderBytes() + 10 * 8);  // vs 400 dense
    ApplyReply(reply, &view);
    ref.set_view_version(reply.view_version());
    if (pull == 0) {
      REQUIRE(view[99] == target[99]);  // the largest change arrives first
      REQUIRE(view[0] == 0.0f);
    }
  }
  REQUIRE(view == target);
  ref.set_codec_params("zip");
  REQUIRE(absl::IsInvalidArgument(PullWaiting(*store, 0, 1, ref, forever, {}, &reply)));
}

TEST_CASE("compressed pulls are idempotent: a lost reply is re-made from the view the rank holds") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 100)).ok());
  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(100);
  ref.set_codec_params("topk:ratio=0.1");
  const auto forever = ShardStore::Clock::now() + std::chrono::seconds(5);
  std::vector<float> view;
  proto::TensorChunk reply;
  REQUIRE(PullWaiting(*store, 0, 0, ref, forever, {}, &reply).ok());
  ApplyReply(reply, &view);
  ref.set_view_version(reply.view_version());
  REQUIRE(reply.view_version() != 0);

  std::vector<float> gradient(100);
  for (int i = 0; i < 100; ++i) gradient[i] = static_cast<float>(i + 1);
  int64_t clock = 0;
  REQUIRE(store->Push({Gradient("w", 0, clock++, gradient)}).ok());
  // Every other reply is lost: the rank keeps its view and its version.
  for (int pull = 0; pull < 40; ++pull) {
    reply.Clear();
    REQUIRE(PullWaiting(*store, 0, clock, ref, forever, {}, &reply).ok());
    REQUIRE(reply.codec() == static_cast<uint32_t>(CodecId::kTopK));
    REQUIRE(reply.pull_view_version() == ref.view_version());  // made for the view held
    if (pull % 2 == 1) {
      ApplyReply(reply, &view);
      ref.set_view_version(reply.view_version());
    }
    if (pull == 10) REQUIRE(store->Push({Gradient("w", 0, clock++, gradient)}).ok());
  }
  REQUIRE(store->counters().pull_view_remakes == 20);
  // 20 applied replies drain 200 differences of 10 each: the view is the
  // parameters exactly, as the shard's own view is.
  REQUIRE(view == *store->Snapshot("w", 0));

  // A version the shard does not hold (0, garbage, from before a restart):
  // a dense reply that resets the view.
  for (uint64_t unknown : {uint64_t{0}, uint64_t{12345}}) {
    ref.set_view_version(unknown);
    reply.Clear();
    REQUIRE(PullWaiting(*store, 0, clock, ref, forever, {}, &reply).ok());
    REQUIRE(reply.codec() == 0);
    ApplyReply(reply, &view);
    REQUIRE(view == *store->Snapshot("w", 0));
  }
  REQUIRE(store->counters().pull_view_resets == 2);
  // After a reset, the version before it is no base any more either.
  const uint64_t reset_version = reply.view_version();
  ref.set_view_version(reset_version);
  REQUIRE(PullWaiting(*store, 0, clock, ref, forever, {}, &reply).ok());
  REQUIRE(reply.codec() != 0);
}

TEST_CASE("ranks holding the same view share one encode of a deterministic pull codec") {
  // ASP, 4 ranks: a push is applied on arrival (scaled 1/4), so every rank
  // pulls the same parameters from the same view.
  auto store = MakeStore("asp", 4);
  REQUIRE(store->Init(Init("w", 100)).ok());
  REQUIRE(store->Init(Init("q", 100)).ok());
  const auto forever = ShardStore::Clock::now() + std::chrono::seconds(5);
  struct Rank {
    proto::ChunkRef w, q;
    std::vector<float> w_view, q_view;
  };
  std::vector<Rank> ranks(4);
  proto::TensorChunk reply;
  auto pull = [&](uint32_t rank, proto::ChunkRef& ref, std::vector<float>* view, bool apply) {
    reply.Clear();
    REQUIRE(PullWaiting(*store, rank, 0, ref, forever, {}, &reply).ok());
    if (!apply) return;  // the reply is lost
    ApplyReply(reply, view);
    ref.set_view_version(reply.view_version());
  };
  for (uint32_t r = 0; r < 4; ++r) {
    ranks[r].w.set_key("w");
    ranks[r].w.set_num_elements(100);
    ranks[r].w.set_codec_params("fp16");
    ranks[r].q.set_key("q");
    ranks[r].q.set_num_elements(100);
    ranks[r].q.set_codec_params("qsgd:levels=127,bucket=512");
    pull(r, ranks[r].w, &ranks[r].w_view, true);  // dense: every view starts here
    pull(r, ranks[r].q, &ranks[r].q_view, true);
  }
  std::vector<float> gradient(100);
  for (int i = 0; i < 100; ++i) gradient[i] = static_cast<float>(4 * (i + 1));
  REQUIRE(store->Push({Gradient("w", 0, 0, gradient), Gradient("q", 0, 0, gradient)}).ok());

  // fp16: one encode, the same payload for all four.
  std::string first;
  for (uint32_t r = 0; r < 4; ++r) {
    pull(r, ranks[r].w, &ranks[r].w_view, true);
    REQUIRE(reply.codec() == static_cast<uint32_t>(CodecId::kFp16));
    if (r == 0) first = reply.payload();
    REQUIRE(reply.payload() == first);
    REQUIRE(ranks[r].w_view == *store->Snapshot("w", 0));  // -(i + 1): exact in fp16
  }
  REQUIRE(store->counters().pull_replies_shared == 3);
  // QSGD draws from each rank's seed: an encode per rank.
  for (uint32_t r = 0; r < 4; ++r) pull(r, ranks[r].q, &ranks[r].q_view, true);
  REQUIRE(store->counters().pull_replies_shared == 3);

  // The parameters move; ranks 0-2 pull (one encode), rank 3's reply of
  // the same encode is lost.
  REQUIRE(store->Push({Gradient("w", 1, 0, gradient)}).ok());
  for (uint32_t r = 0; r < 3; ++r) pull(r, ranks[r].w, &ranks[r].w_view, true);
  pull(3, ranks[3].w, &ranks[3].w_view, false);
  REQUIRE(store->counters().pull_replies_shared == 6);
  // They move again: rank 3 asks from its older view, a reply of its own.
  REQUIRE(store->Push({Gradient("w", 2, 0, gradient)}).ok());
  pull(3, ranks[3].w, &ranks[3].w_view, true);
  REQUIRE(store->counters().pull_view_remakes == 1);
  REQUIRE(store->counters().pull_replies_shared == 6);
  for (uint32_t r = 0; r < 3; ++r) pull(r, ranks[r].w, &ranks[r].w_view, true);
  REQUIRE(store->counters().pull_replies_shared == 8);
  for (uint32_t r = 0; r < 4; ++r) REQUIRE(ranks[r].w_view == *store->Snapshot("w", 0));
}

TEST_CASE("compressed pull views count against --max_param_bytes") {
  // One chunk of 100 floats (400 bytes) and room for three view buffers.
  auto owned = MakeStoreWithParamBudget("asp", 2, 4 * 400);
  ShardStore& store = *owned;
  REQUIRE(store.Init(Init("w", 100)).ok());
  REQUIRE(store.holdings().param_bytes == 400);
  const auto forever = ShardStore::Clock::now() + std::chrono::seconds(5);
  std::vector<proto::ChunkRef> refs(2);
  std::vector<std::vector<float>> views(2);
  proto::TensorChunk reply;
  auto pull = [&](uint32_t rank) {
    reply.Clear();
    absl::Status status = PullWaiting(store, rank, 0, refs[rank], forever, {}, &reply);
    if (status.ok()) {
      ApplyReply(reply, &views[rank]);
      refs[rank].set_view_version(reply.view_version());
    }
    return status;
  };
  for (auto& ref : refs) {
    ref.set_key("w");
    ref.set_num_elements(100);
    ref.set_codec_params("fp16");
  }
  std::vector<float> gradient(100);
  for (int i = 0; i < 100; ++i) gradient[i] = static_cast<float>(2 * (i + 1));
  int64_t clock = 0;
  auto push = [&] {
    REQUIRE(store.Push({Gradient("w", 0, clock++, gradient)}).ok());
  };

  // The dense view both ranks start from: one buffer.
  REQUIRE(pull(0).ok());
  REQUIRE(pull(1).ok());
  REQUIRE(store.holdings().param_bytes == 2 * 400);
  // An advanced view, shared by both ranks (one encode, one buffer).
  push();
  REQUIRE(pull(0).ok());
  REQUIRE(pull(1).ok());
  REQUIRE(store.holdings().param_bytes == 3 * 400);
  push();
  REQUIRE(pull(0).ok());
  REQUIRE(pull(1).ok());
  REQUIRE(store.holdings().param_bytes == 4 * 400);
  // A fourth view would pass the bound: refused, naming it, and nothing
  // changes (the rank pulls fine once room is made).
  push();
  absl::Status refused = pull(0);
  REQUIRE(absl::IsResourceExhausted(refused));
  REQUIRE(absl::StrContains(refused.message(), "--max_param_bytes"));
  REQUIRE(absl::StrContains(refused.message(), "compressed pull view of w"));
  REQUIRE(store.holdings().param_bytes == 4 * 400);
  // A rank that starts over (view 0) gets a dense reply: the old dense
  // view, which no rank holds any more, is given back before the new one
  // is counted.
  refs[0].set_view_version(0);
  REQUIRE(pull(0).ok());
  REQUIRE(reply.codec() == 0);
  REQUIRE(store.holdings().param_bytes == 4 * 400);
  REQUIRE(views[0] == *store.Snapshot("w", 0));
}

TEST_CASE("what a pull encoder keeps between calls counts against --max_param_bytes") {
  // A 20 x 20 matrix (1600 bytes) pulled with PowerSGD rank 2: the encoder
  // keeps its warm-start factor Q, 20 x 2 floats (160 bytes), between calls.
  constexpr uint64_t kMatrix = 1600, kFactor = 160;
  auto make_store = [](uint64_t max_param_bytes) {
    auto store = MakeStoreWithParamBudget("asp", 1, max_param_bytes);
    proto::InitRequest init = Init("w", 400);
    init.clear_shape();
    init.add_shape(20);
    init.add_shape(20);
    REQUIRE(store->Init(init).ok());
    return store;
  };
  const auto forever = ShardStore::Clock::now() + std::chrono::seconds(5);
  proto::ChunkRef ref;
  ref.set_key("w");
  ref.set_num_elements(400);
  ref.set_codec_params("powersgd:rank=2");
  std::vector<float> gradient(400);
  for (int i = 0; i < 400; ++i) gradient[i] = static_cast<float>((i * 7919) % 23) - 11.0f;
  proto::TensorChunk reply;
  std::vector<float> view;
  auto pull = [&](ShardStore& store) {
    reply.Clear();
    absl::Status status = PullWaiting(store, 0, 0, ref, forever, {}, &reply);
    if (status.ok()) {
      ApplyReply(reply, &view);
      ref.set_view_version(reply.view_version());
    }
    return status;
  };

  SECTION("counted once, and not again as the encoder goes on") {
    auto store = make_store(uint64_t{1} << 20);
    REQUIRE(pull(*store).ok());  // dense: the view starts there
    REQUIRE(store->holdings().param_bytes == 2 * kMatrix);
    for (int64_t clock = 0; clock < 4; ++clock) {
      REQUIRE(store->Push({Gradient("w", 0, clock, gradient)}).ok());
      REQUIRE(pull(*store).ok());
      REQUIRE(reply.codec() == static_cast<uint32_t>(CodecId::kPowerSgd));
      // The parameters, the dense view (kept for ranks that start over),
      // the view the rank held (the dense one at first) and the one this
      // reply makes, and the factor once: it does not grow per encode.
      const uint64_t matrices = clock == 0 ? 3 : 4;
      REQUIRE(store->holdings().param_bytes == matrices * kMatrix + kFactor);
    }
  }
  SECTION("refused when the factor does not fit, and the rank keeps its view") {
    auto store = make_store(3 * kMatrix + kFactor - 1);
    REQUIRE(pull(*store).ok());
    const uint64_t held = ref.view_version();
    REQUIRE(store->Push({Gradient("w", 0, 0, gradient)}).ok());
    const absl::Status refused = pull(*store);
    INFO(refused.ToString());
    REQUIRE(absl::IsResourceExhausted(refused));
    REQUIRE(absl::StrContains(refused.message(), "--max_param_bytes"));
    REQUIRE(absl::StrContains(refused.message(), "pull encoder state of w chunk 0 rank 0"));
    REQUIRE(ref.view_version() == held);
    // The next view's buffer is given back with the refused encoder.
    REQUIRE(store->holdings().param_bytes == 2 * kMatrix);
  }
}

}  // namespace
}  // namespace harrier
