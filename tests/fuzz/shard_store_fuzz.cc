// Stateful fuzz target: the input is a program of calls on one in-process
// ShardStore (Init, dense and compressed pushes from several ranks, pulls,
// Leave, heartbeats with the chunk clocks that re-base a restored rank,
// checkpoint Export/Import restores), and after every
// call the store's invariants are checked:
//   - every slot's values stay finite (gradients are bounded, so a
//     non-finite value is the store's doing);
//   - a refused call changes nothing: every slot's values and every rank's
//     pushed clock are as before (Snapshot and Export before and after);
//   - pushed clocks as Export reports them never go backwards, with one
//     exception by design: Export cuts every rank's clock at the first
//     incomplete BSP round (ClockBook::CheckpointClocks), so a push that
//     opens a round below a rank that was re-based or restored past it
//     lowers that rank's exported clock to the round, which is then the
//     highest clock in the export. A restore re-bases the reference;
//   - under BSP with every rank present, values move only when a round
//     completes, i.e. when the slowest rank's pushed clock moves.
// A violated invariant traps, which libFuzzer and fuzz_driver.cc report.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/codec/codec.h"
#include "common/crc32c.h"
#include "server/checkpoint.h"
#include "server/shard_store.h"

namespace {

// Reads the fuzz input as a stream of choices; past its end every read is 0.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : Byte() % n; }
  // Small bounded values, so only the store can make them non-finite.
  float Value() { return (static_cast<int>(Byte()) - 128) / 16.0f; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

struct SlotRef {
  const char* key;
  uint32_t chunk;
  uint32_t num_elements;
};
constexpr SlotRef kSlots[] = {{"a", 0, 8}, {"b", 0, 5}, {"b", 1, 5}};
constexpr int kNumSlots = sizeof(kSlots) / sizeof(kSlots[0]);
const char* const kPushCodecs[] = {"topk:ratio=0.5", "sign", "qsgd:levels=4,bucket=4", "fp16",
                                   "signum", "terngrad"};
const char* const kPullCodecs[] = {"", "none", "topk:ratio=0.5", "sign", "fp16"};

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

harrier::proto::InitRequest InitOf(const SlotRef& slot, const std::vector<float>& values) {
  harrier::proto::InitRequest init;
  init.set_key(slot.key);
  init.set_chunk(slot.chunk);
  init.add_shape(slot.key[0] == 'a' ? 8 : 10);
  init.set_num_elements(slot.num_elements);
  init.set_dtype(harrier::proto::DTYPE_FLOAT32);
  init.set_initial_values(Bytes(values));
  init.set_checksum(harrier::Crc32c(init.initial_values().data(), init.initial_values().size()));
  return init;
}

// What the invariants compare: every slot's values and pushed clocks.
struct State {
  std::vector<std::vector<float>> values;  // per kSlots entry; empty: absent
  std::vector<std::vector<int64_t>> pushed;

  static State Of(const harrier::ShardStore& store) {
    State state;
    state.values.resize(kNumSlots);
    state.pushed.resize(kNumSlots);
    for (int i = 0; i < kNumSlots; ++i) {
      auto snapshot = store.Snapshot(kSlots[i].key, kSlots[i].chunk);
      if (snapshot.ok()) state.values[i] = *std::move(snapshot);
    }
    for (const harrier::SlotCheckpoint& slot : store.Export().slots) {
      for (int i = 0; i < kNumSlots; ++i) {
        if (slot.key == kSlots[i].key && slot.chunk == kSlots[i].chunk) state.pushed[i] = slot.pushed;
      }
    }
    return state;
  }
};

class Harness {
 public:
  explicit Harness(Input& in) : in_(in) {
    options_.num_workers = 2 + in_.Below(2);
    switch (in_.Below(3)) {
      case 0: options_.sync.mode = harrier::SyncMode::kBsp; break;
      case 1:
        options_.sync.mode = harrier::SyncMode::kSsp;
        options_.sync.staleness = 2;
        break;
      default:
        options_.sync.mode = harrier::SyncMode::kAsp;
        options_.sync.staleness = -1;
        break;
    }
    options_.max_pending_rounds = 4;
    optimizer_.kind = in_.Below(2) == 0 ? "sgd" : "adam";
    store_ = NewStore();
    next_clock_.assign(options_.num_workers, 0);
    left_.assign(options_.num_workers, false);
    for (const SlotRef& slot : kSlots) {
      Check(store_->Init(InitOf(slot, std::vector<float>(slot.num_elements, 0.5f))).ok());
    }
    state_ = State::Of(*store_);
  }

  void Step() {
    const State before = state_;
    bool refused = false;
    bool restored = false;
    const uint32_t op = in_.Below(7);
    switch (op) {
      case 0: refused = !Init(); break;
      case 1: refused = !Push(/*compressed=*/false); break;
      case 2: refused = !Push(/*compressed=*/true); break;
      case 3: Pull(); break;
      case 4: refused = !Leave(); break;  // a Leave may complete a BSP round
      case 5: Restore(); restored = true; break;
      default: Heartbeat(); break;
    }
    state_ = State::Of(*store_);
    if (trace_) Trace(op, refused);
    for (int i = 0; i < kNumSlots; ++i) {
      for (float v : state_.values[i]) Check(std::isfinite(v));
      if (refused) {
        Check(state_.values[i] == before.values[i]);
        Check(state_.pushed[i] == before.pushed[i]);
      }
      if (restored) continue;
      if (!before.pushed[i].empty()) {
        Check(state_.pushed[i].size() == before.pushed[i].size());
        const int64_t cut = *std::max_element(state_.pushed[i].begin(), state_.pushed[i].end());
        for (size_t r = 0; r < before.pushed[i].size(); ++r) {
          if (state_.pushed[i][r] >= before.pushed[i][r]) continue;
          // Only an accepted BSP push opens a round, and a clock it lowers
          // falls to that round: the export's cut, its highest clock.
          Check(options_.sync.mode == harrier::SyncMode::kBsp && (op == 1 || op == 2) &&
                !refused && state_.pushed[i][r] == cut);
        }
      }
      if (options_.sync.mode == harrier::SyncMode::kBsp && !any_left_ &&
          !before.pushed[i].empty() && state_.values[i] != before.values[i]) {
        const auto slowest = [](const std::vector<int64_t>& p) {
          return *std::min_element(p.begin(), p.end());
        };
        Check(slowest(state_.pushed[i]) > slowest(before.pushed[i]));
      }
    }
  }

 private:
  std::unique_ptr<harrier::ShardStore> NewStore() {
    return std::make_unique<harrier::ShardStore>(options_, *harrier::CreateOptimizer(optimizer_));
  }

  // A re-Init of an existing slot (matching or not) or a malformed one.
  bool Init() {
    SlotRef slot = kSlots[in_.Below(kNumSlots)];
    std::vector<float> values(slot.num_elements, in_.Value());
    harrier::proto::InitRequest init = InitOf(slot, values);
    switch (in_.Below(4)) {
      case 0: init.set_num_elements(slot.num_elements + 1); break;
      case 1: init.set_checksum(init.checksum() ^ 1); break;
      case 2: init.set_initial_values(init.initial_values().substr(1)); break;
      default: break;
    }
    auto created = store_->Init(init);
    // An existing slot keeps its values either way.
    return created.ok() && *created;
  }

  bool Push(bool compressed) {
    const uint32_t rank = in_.Below(options_.num_workers + 1);  // one rank past the job
    int64_t clock = rank < next_clock_.size() ? next_clock_[rank] : 0;
    switch (in_.Below(8)) {
      case 0: clock -= 1; break;
      case 1: clock += 1 + in_.Below(6); break;
      default: break;
    }
    const char* codec_text = compressed ? kPushCodecs[in_.Below(6)] : "none";
    const auto spec = harrier::CodecSpec::Parse(codec_text);
    Check(spec.ok());
    std::vector<harrier::proto::TensorChunk> chunks;
    const int count = 1 + in_.Below(kNumSlots);
    for (int c = 0; c < count; ++c) {
      const SlotRef& slot = kSlots[in_.Below(kNumSlots)];
      std::vector<float> gradient(slot.num_elements);
      for (float& g : gradient) g = in_.Value();
      harrier::proto::TensorChunk chunk;
      chunk.set_key(slot.key);
      chunk.set_chunk(slot.chunk);
      chunk.set_rank(rank);
      chunk.set_clock(clock);
      chunk.set_num_elements(slot.num_elements);
      chunk.set_dtype(harrier::proto::DTYPE_FLOAT32);
      std::string payload = Bytes(gradient);
      if (compressed) {
        auto codec = harrier::CreateCodec(*spec);
        Check(codec.ok());
        payload.clear();
        Check((*codec)->Encode(gradient, harrier::CodecContext{static_cast<uint64_t>(clock) + 1}, &payload).ok());
        chunk.set_codec(static_cast<uint32_t>(spec->id));
        chunk.set_codec_params(spec->ToString());
      }
      switch (in_.Below(10)) {
        case 0: payload.resize(payload.size() / 2); break;              // short payload
        case 1: chunk.set_num_elements(slot.num_elements + 3); break;  // wrong size
        case 2: chunk.set_key("missing"); break;
        default: break;
      }
      chunk.set_payload(payload);
      chunk.set_checksum(harrier::Crc32c(payload.data(), payload.size()) ^ (in_.Below(12) == 0));
      chunks.push_back(std::move(chunk));
    }
    const bool ok = store_->Push(chunks).ok();
    if (ok && rank < next_clock_.size()) {
      next_clock_[rank] = std::max(next_clock_[rank], clock + 1);
      // What the worker would report in its heartbeats: this store
      // acknowledged these chunks' clock (kept across restores, as a worker
      // keeps it).
      for (const auto& chunk : chunks) {
        int64_t& next = acknowledged_[{chunk.key(), chunk.chunk(), rank}];
        next = std::max(next, clock + 1);
      }
    }
    return ok;
  }

  // A heartbeat, with the chunk clocks this rank had acknowledged (or, now
  // and then, a made-up one): re-bases the rank on a restored chunk
  // (ShardStore::RebaseFromWorker).
  void Heartbeat() {
    const uint32_t rank = in_.Below(options_.num_workers + 1);
    if (store_->membership().CheckRank(rank, "heartbeat").ok()) store_->membership().Heard(rank);
    google::protobuf::RepeatedPtrField<harrier::proto::ChunkClock> pushed;
    for (const auto& [chunk, next] : acknowledged_) {
      if (std::get<2>(chunk) != rank) continue;
      harrier::proto::ChunkClock* clock = pushed.Add();
      clock->set_key(std::get<0>(chunk));
      clock->set_chunk(std::get<1>(chunk));
      clock->set_next_clock(next + (in_.Below(16) == 0 ? in_.Below(4) : 0));
    }
    store_->RebaseFromWorker(rank, pushed);
  }

  void Pull() {
    const uint32_t rank = in_.Below(options_.num_workers);
    const SlotRef& slot = kSlots[in_.Below(kNumSlots)];
    harrier::proto::ChunkRef ref;
    ref.set_key(slot.key);
    ref.set_chunk(slot.chunk);
    ref.set_num_elements(slot.num_elements);
    ref.set_codec_params(kPullCodecs[in_.Below(5)]);
    const int64_t clock = static_cast<int64_t>(next_clock_[rank]) - 1 + in_.Below(3);
    harrier::proto::TensorChunk out;
    // A pull that would wait says so at once.
    std::string* payload = out.mutable_payload();
    harrier::PullTarget target;
    target.allocate = [payload](size_t bytes) {
      payload->resize(bytes);
      return payload->data();
    };
    const auto outcome = store_->TryPull(rank, clock, ref, &out, target);
    if (outcome.ok() && outcome->ready && out.codec() == 0) {
      Check(out.payload().size() == slot.num_elements * sizeof(float));
      std::vector<float> values(slot.num_elements);
      std::memcpy(values.data(), out.payload().data(), out.payload().size());
      for (float v : values) Check(std::isfinite(v));
    }
  }

  bool Leave() {
    const uint32_t rank = in_.Below(options_.num_workers + 1);
    const int64_t clock = rank < next_clock_.size() ? next_clock_[rank] : 0;
    const bool ok = store_->Leave(rank, clock).ok();
    if (ok && rank < left_.size() && !left_[rank]) {
      left_[rank] = true;
      any_left_ = true;
    }
    return ok;
  }

  // A shard restart from its checkpoint, through the file format.
  void Restore() {
    auto decoded = harrier::DecodeCheckpoint(harrier::EncodeCheckpoint(store_->Export()));
    Check(decoded.ok());
    std::unique_ptr<harrier::ShardStore> fresh = NewStore();
    Check(fresh->Import(*decoded).ok());
    store_ = std::move(fresh);
    // Departures are not in a checkpoint: the restored shard waits for
    // every rank again, and the worker's clocks are what the shard kept.
    left_.assign(options_.num_workers, false);
    any_left_ = false;
    for (int r = 0; r < options_.num_workers; ++r) {
      int64_t kept = 0;
      for (const harrier::SlotCheckpoint& slot : decoded->slots) {
        if (static_cast<size_t>(r) < slot.pushed.size()) kept = std::max(kept, slot.pushed[r]);
      }
      next_clock_[r] = kept;
    }
  }

  // HARRIER_FUZZ_TRACE=1: one line per call, to read a crash input.
  void Trace(uint32_t op, bool refused) const {
    std::fprintf(stderr, "op=%u refused=%d", op, refused);
    for (int i = 0; i < kNumSlots; ++i) {
      std::fprintf(stderr, " %s/%u:", kSlots[i].key, kSlots[i].chunk);
      for (int64_t p : state_.pushed[i]) std::fprintf(stderr, "%lld,", static_cast<long long>(p));
    }
    std::fprintf(stderr, "\n");
  }

  const bool trace_ = std::getenv("HARRIER_FUZZ_TRACE") != nullptr;
  Input& in_;
  harrier::ShardStoreOptions options_;
  harrier::OptimizerOptions optimizer_;
  std::unique_ptr<harrier::ShardStore> store_;
  std::vector<int64_t> next_clock_;
  std::map<std::tuple<std::string, uint32_t, uint32_t>, int64_t> acknowledged_;  // (key, chunk, rank)
  std::vector<bool> left_;
  bool any_left_ = false;
  State state_;
};

}  // namespace

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds;
  // BSP/SSP/ASP with 2 workers: each rank pushes dense, then compressed, then
  // pulls, with a restore in the middle.
  for (char mode : {'\0', '\1', '\2'}) {
    std::string seed = {'\0', mode, '\0'};
    for (int round = 0; round < 3; ++round) {
      for (char rank : {'\0', '\1'}) {
        seed += std::string{'\1', rank, '\2', '\0', '\3', '\0', '\40', '\2', '\3', '\4', '\5',
                            '\6', '\7', '\10', '\3', '\5'};
        seed += std::string{'\3', rank, '\0', '\1', '\1'};
      }
      seed += std::string{'\5'};
    }
    seed += std::string{'\2', '\0', '\2', '\1', '\7', '\3', '\1', '\1', '\1', '\1', '\1', '\1',
                        '\5', '\5'};
    seed += std::string{'\4', '\1'};
    seeds.push_back(seed);
  }
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Harness harness(in);
  for (int step = 0; step < 64 && !in.done(); ++step) harness.Step();
  return 0;
}
