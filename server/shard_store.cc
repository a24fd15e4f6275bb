#include "server/shard_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"

namespace harrier {
namespace {

constexpr int64_t kEveryoneLeft = std::numeric_limits<int64_t>::max() / 4;

std::string Where(const std::string& key, uint32_t chunk) {
  return absl::StrCat("key '", key, "' chunk ", chunk);
}

bool AllFinite(const float* values, size_t n) {
  // On the bits, so the loop vectorises (a float sum may not be reordered
  // without -ffast-math): an exponent of all ones is Inf or NaN.
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace

ShardStore::ShardStore(ShardStoreOptions options, std::unique_ptr<Optimizer> optimizer)
    : options_(options),
      controller_(options.sync, options.num_workers),
      optimizer_(std::move(optimizer)),
      partitioner_(options.num_shards),
      departed_(new std::atomic<bool>[options.num_workers]),
      may_rebase_(new std::atomic<bool>[options.num_workers]),
      last_seen_(options.num_workers),
      seen_(options.num_workers, false) {
  for (int r = 0; r < options.num_workers; ++r) {
    departed_[r] = false;
    may_rebase_[r] = false;
  }
}

ShardStore::~ShardStore() { Close(); }

std::string ShardStore::SlotName(const std::string& key, uint32_t chunk) {
  return absl::StrCat(key, "#", chunk);
}

ShardStore::Slot* ShardStore::FindSlot(const std::string& key, uint32_t chunk) const {
  std::shared_lock<std::shared_mutex> lock(slots_mutex_);
  auto it = slots_.find(SlotName(key, chunk));
  return it == slots_.end() ? nullptr : it->second.get();
}

absl::Status ShardStore::CheckOwnership(const std::string& key, uint32_t chunk) const {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  const int owner = partitioner_.ShardFor(key, chunk);
  if (owner != options_.shard) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk), " belongs to shard ", owner,
                                                   ", not shard ", options_.shard,
                                                   " (client and server disagree on num_shards?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShardStore::Init(const proto::InitRequest& request) {
  if (closed_) return absl::UnavailableError("shard is shutting down");
  const std::string& key = request.key();
  if (auto status = CheckOwnership(key, request.chunk()); !status.ok()) return status;
  if (request.dtype() != proto::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, request.chunk()),
                                                   ": unsupported dtype ", request.dtype()));
  }
  const uint64_t n = request.num_elements();
  if (request.initial_values().size() != n * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(key, request.chunk()), ": ", request.initial_values().size(),
        " bytes of initial values for ", n, " float32 elements"));
  }
  if (Crc32c(request.initial_values().data(), request.initial_values().size()) !=
      request.checksum()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, request.chunk()), ": checksum mismatch in initial values"));
  }
  const auto* values = reinterpret_cast<const float*>(request.initial_values().data());
  if (!AllFinite(values, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, request.chunk()), ": initial values contain NaN or Inf"));
  }
  const std::vector<uint64_t> shape(request.shape().begin(), request.shape().end());

  std::unique_lock<std::shared_mutex> lock(slots_mutex_);
  auto& entry = slots_[SlotName(key, request.chunk())];
  if (entry) {
    Slot& slot = *entry;
    std::lock_guard<std::mutex> slot_lock(slot.mutex);
    if (slot.values.size() != n || slot.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(key, request.chunk()), ": shape [", absl::StrJoin(shape, ","), "] with ", n,
          " elements disagrees with the registered shape [", absl::StrJoin(slot.shape, ","),
          "] with ", slot.values.size(), " elements"));
    }
    return false;
  }
  entry = std::make_unique<Slot>();
  entry->key = key;
  entry->chunk = request.chunk();
  entry->shape = shape;
  entry->values.assign(values, values + n);
  entry->pushed.assign(options_.num_workers, 0);
  return true;
}

absl::Status ShardStore::ValidateChunk(const proto::TensorChunk& chunk, absl::string_view payload,
                                       ValidatedChunk* out) const {
  const std::string& key = chunk.key();
  if (auto status = CheckOwnership(key, chunk.chunk()); !status.ok()) return status;
  if (chunk.rank() >= static_cast<uint32_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk.chunk()), ": rank ",
                                                   chunk.rank(), " out of range [0, ",
                                                   options_.num_workers, ")"));
  }
  if (chunk.dtype() != proto::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, chunk.chunk()), ": unsupported dtype ", chunk.dtype()));
  }
  Slot* slot = FindSlot(key, chunk.chunk());
  if (slot == nullptr) {
    return absl::NotFoundError(absl::StrCat(Where(key, chunk.chunk()),
                                            " is not registered on shard ", options_.shard));
  }
  if (chunk.num_elements() != slot->values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk.chunk()), ": ",
                                                   chunk.num_elements(), " elements, expected ",
                                                   slot->values.size()));
  }
  if (chunk.codec() == static_cast<uint32_t>(CodecId::kNone)) {
    if (payload.size() != slot->values.size() * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(key, chunk.chunk()), ": payload of ", payload.size(), " bytes, expected ",
          slot->values.size() * sizeof(float)));
    }
  }
  if (Crc32c(payload.data(), payload.size()) != chunk.checksum()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, chunk.chunk()), ": payload checksum mismatch"));
  }
  if (chunk.codec() == static_cast<uint32_t>(CodecId::kNone)) {
    out->gradient = reinterpret_cast<const float*>(payload.data());
  } else {
    // Compressed: the codec validates the whole payload while decoding it,
    // before anything is applied.
    auto spec = CodecSpec::Parse(chunk.codec_params());
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(key, chunk.chunk()), ": ", spec.status().message()));
    }
    if (static_cast<uint32_t>(spec->id) != chunk.codec()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk.chunk()), ": codec id ",
                                                     chunk.codec(), " disagrees with spec '",
                                                     chunk.codec_params(), "'"));
    }
    auto codec = CreateCodec(*spec);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(key, chunk.chunk()), ": ", codec.status().message()));
    }
    out->decoded.resize(slot->values.size());
    if (auto status = (*codec)->Decode(payload, absl::MakeSpan(out->decoded));
        !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(key, chunk.chunk()), ": ", status.message()));
    }
    out->gradient = out->decoded.data();
    out->majority_vote = (*codec)->IsMajorityVote();
  }
  if (!AllFinite(out->gradient, slot->values.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, chunk.chunk()), ": gradient contains NaN or Inf"));
  }
  if (departed_[chunk.rank()]) {
    return absl::FailedPreconditionError(absl::StrCat(Where(key, chunk.chunk()), ": rank ",
                                                      chunk.rank(), " has left the job"));
  }
  {
    std::lock_guard<std::mutex> lock(slot->mutex);
    const int64_t expected = slot->pushed[chunk.rank()];
    const bool rebase = may_rebase_[chunk.rank()] && chunk.clock() > expected;
    if (chunk.clock() != expected && !rebase) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(key, chunk.chunk()), ": push for clock ", chunk.clock(), " from rank ",
          chunk.rank(), " but its next clock is ", expected,
          chunk.clock() > expected ? " (clock from the future)" : " (already pushed)"));
    }
    auto round = slot->pending.find(chunk.clock());
    if (round != slot->pending.end() && round->second.codec_params != chunk.codec_params()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(key, chunk.chunk()), ": codec '", chunk.codec_params(), "' but clock ",
          chunk.clock(), " was pushed with '", round->second.codec_params, "' by another worker"));
    }
  }
  out->slot = slot;
  return absl::OkStatus();
}

absl::Status ShardStore::Push(const std::vector<proto::TensorChunk>& chunks) {
  std::vector<PushChunkView> views(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) views[i] = {&chunks[i], chunks[i].payload()};
  return Push(views);
}

absl::Status ShardStore::Push(const std::vector<PushChunkView>& views) {
  // The header fields are read through `chunks[i]`, the payload only
  // through `views[i].payload`.
  struct HeaderRef {
    const std::vector<PushChunkView>& views;
    const proto::TensorChunk& operator[](size_t i) const { return *views[i].header; }
    size_t size() const { return views.size(); }
    bool empty() const { return views.empty(); }
    const proto::TensorChunk& front() const { return *views.front().header; }
  } chunks{views};
  if (closed_) return absl::UnavailableError("shard is shutting down");
  if (auto failure = FailureStatus(); !failure.ok()) return failure;
  std::vector<ValidatedChunk> valid(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (chunks[j].key() == chunks[i].key() && chunks[j].chunk() == chunks[i].chunk()) {
        counters_.rejected++;
        return absl::InvalidArgumentError(absl::StrCat(
            Where(chunks[i].key(), chunks[i].chunk()), ": pushed twice in one call"));
      }
    }
    if (auto status = ValidateChunk(chunks[i], views[i].payload, &valid[i]); !status.ok()) {
      counters_.rejected++;
      return status;
    }
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const proto::TensorChunk& chunk = chunks[i];
    Slot& slot = *valid[i].slot;
    {
      std::lock_guard<std::mutex> lock(slot.mutex);
      if (may_rebase_[chunk.rank()] && chunk.clock() > slot.pushed[chunk.rank()]) {
        // The worker ran on while this shard was down and restored.
        slot.pushed[chunk.rank()] = chunk.clock();
      }
      // Re-checked under the lock: only a rank racing itself can fail here.
      if (slot.pushed[chunk.rank()] != chunk.clock()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Where(chunk.key(), chunk.chunk()), ": concurrent pushes from rank ",
                         chunk.rank(), " for clock ", chunk.clock()));
      }
      ApplyLocked(slot, chunk, views[i].payload, valid[i]);
    }
    slot.changed.notify_all();
    counters_.pushes++;
    counters_.bytes_in += views[i].payload.size();
  }
  if (!chunks.empty()) {
    Heartbeat(chunks.front().rank()).IgnoreError();
    may_rebase_[chunks.front().rank()] = false;
  }
  return absl::OkStatus();
}

void ShardStore::StepLocked(Slot& slot, const float* gradient, float scale) {
  const size_t n = slot.values.size();
  if (controller_.PushesAreDeltas()) {
    for (size_t i = 0; i < n; ++i) slot.values[i] -= scale * gradient[i];
  } else {
    optimizer_->Step(absl::MakeSpan(slot.values), absl::MakeConstSpan(gradient, n), scale,
                     slot.optimizer_state);
  }
  counters_.optimizer_steps++;
}

void ShardStore::ApplyLocked(Slot& slot, const proto::TensorChunk& chunk,
                             absl::string_view payload, const ValidatedChunk& valid) {
  const size_t n = slot.values.size();
  const uint32_t rank = chunk.rank();
  const int64_t clock = chunk.clock();
  const float* gradient = valid.gradient;
  if (!controller_.AggregatesRounds()) {
    float scale = 1.0f / static_cast<float>(std::max(1, active_workers()));
    if (options_.staleness_aware_lr) {
      int64_t fastest = 0;
      for (int64_t pushed : slot.pushed) fastest = std::max(fastest, pushed);
      scale /= static_cast<float>(std::max<int64_t>(1, fastest - clock));
    }
    slot.pushed[rank] = clock + 1;
    StepLocked(slot, gradient, scale);
    return;
  }
  slot.pushed[rank] = clock + 1;
  PendingRound& round = slot.pending[clock];
  if (round.from_rank.empty()) {
    round.from_rank.assign(options_.num_workers, false);
    round.codec_params = chunk.codec_params();
  }
  if (valid.majority_vote) {
    if (!round.vote) {
      auto spec = CodecSpec::Parse(chunk.codec_params());
      auto aggregator = Aggregator::Create(*spec, n);
      round.vote = std::move(*aggregator);
    }
    // Validated above; Add only counts the payload's votes.
    round.vote->Add(payload).IgnoreError();
  } else if (round.sum.empty()) {
    round.sum.assign(gradient, gradient + n);
  } else {
    for (size_t i = 0; i < n; ++i) round.sum[i] += gradient[i];
  }
  round.from_rank[rank] = true;
  round.count++;
  CompleteRoundsLocked(slot);
}

bool ShardStore::RoundCompleteLocked(const Slot& slot, int64_t clock,
                                     const PendingRound& round) const {
  for (int r = 0; r < options_.num_workers; ++r) {
    // A rank is done with this round when it pushed for it, left the job, or
    // was re-based past it after a restore (its push for the round was lost
    // with the shard).
    if (!round.from_rank[r] && !departed_[r] && slot.pushed[r] <= clock) return false;
  }
  return true;
}

void ShardStore::CompleteRoundsLocked(Slot& slot) {
  // Rounds complete in clock order: every rank pushes its clocks in order,
  // so round t+1 cannot hold a rank that round t still waits for.
  while (!slot.pending.empty() &&
         RoundCompleteLocked(slot, slot.pending.begin()->first, slot.pending.begin()->second)) {
    PendingRound& done = slot.pending.begin()->second;
    if (done.vote) {
      done.sum.resize(slot.values.size());
      done.vote->Finish(absl::MakeSpan(done.sum)).IgnoreError();  // >= 1 vote, sizes match
    } else {
      // Division rather than multiplication by 1/n: the average of integer
      // gradients whose sum n divides is then exact, as tests assert.
      const float contributors = static_cast<float>(done.count);
      for (float& g : done.sum) g /= contributors;
    }
    StepLocked(slot, done.sum.data(), 1.0f);
    slot.pending.erase(slot.pending.begin());
  }
}

int64_t ShardStore::MinClockLocked(const Slot& slot, int* slowest_rank) const {
  int64_t min_clock = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < slot.pushed.size(); ++r) {
    if (departed_[r]) continue;  // a rank that left no longer holds anyone back
    if (slot.pushed[r] < min_clock) {
      min_clock = slot.pushed[r];
      if (slowest_rank != nullptr) *slowest_rank = static_cast<int>(r);
    }
  }
  // Every rank left: nothing can hold a pull back any more.
  if (min_clock == std::numeric_limits<int64_t>::max()) return kEveryoneLeft;
  return min_clock;
}

absl::Status ShardStore::Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                              Clock::time_point deadline, Cancellation* cancellation,
                              proto::TensorChunk* out) {
  std::string* payload = out->mutable_payload();
  return Pull(rank, clock, ref, deadline, cancellation, out, [payload](size_t bytes) {
    payload->resize(bytes);
    return payload->data();
  });
}

absl::Status ShardStore::Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                              Clock::time_point deadline, Cancellation* cancellation,
                              proto::TensorChunk* out, const PayloadAllocator& allocate) {
  if (auto status = CheckOwnership(ref.key(), ref.chunk()); !status.ok()) return status;
  if (rank >= static_cast<uint32_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(ref.key(), ref.chunk()), ": rank ", rank,
                                                   " out of range [0, ", options_.num_workers,
                                                   ")"));
  }
  if (clock < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(ref.key(), ref.chunk()), ": negative clock ", clock));
  }
  Slot* slot = FindSlot(ref.key(), ref.chunk());
  if (slot == nullptr) {
    return absl::NotFoundError(absl::StrCat(Where(ref.key(), ref.chunk()),
                                            " is not registered on shard ", options_.shard));
  }
  if (ref.num_elements() != slot->values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(ref.key(), ref.chunk()), ": pull of ",
                                                   ref.num_elements(), " elements, registered ",
                                                   slot->values.size()));
  }
  // Declared before the lock: its destructor must not run under the slot's
  // lock, which the wake-up takes.
  ScopedWake wake(cancellation, [slot] {
    { std::lock_guard<std::mutex> wake_lock(slot->mutex); }
    slot->changed.notify_all();
  });
  std::unique_lock<std::mutex> lock(slot->mutex);
  int slowest = 0;
  int64_t min_clock = MinClockLocked(*slot, &slowest);
  struct BlockedCount {
    std::atomic<int>& count;
    bool counted = false;
    ~BlockedCount() {
      if (counted) count--;
    }
  } blocked{blocked_pulls_};
  while (!controller_.PullMayProceed(clock, min_clock)) {
    if (!blocked.counted) {
      blocked.counted = true;
      blocked_pulls_++;
    }
    if (closed_) return absl::UnavailableError("shard is shutting down");
    if (auto failure = FailureStatus(); !failure.ok()) return failure;
    if (cancellation != nullptr && cancellation->cancelled()) {
      return absl::CancelledError(absl::StrCat("pull of ", Where(ref.key(), ref.chunk()),
                                               " cancelled by the client"));
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pull of ", Where(ref.key(), ref.chunk()), " at clock ", clock, " by rank ", rank,
          " waited for min clock >= ", controller_.RequiredMinClock(clock),
          "; slowest worker is rank ", slowest, " at clock ", min_clock));
    }
    slot->changed.wait_until(lock, deadline);
    min_clock = MinClockLocked(*slot, &slowest);
  }
  out->set_key(ref.key());
  out->set_chunk(ref.chunk());
  out->set_rank(rank);
  out->set_clock(clock);
  out->set_min_clock(min_clock);
  out->set_dtype(proto::DTYPE_FLOAT32);
  out->set_num_elements(slot->values.size());
  size_t bytes = slot->values.size() * sizeof(float);
  char* payload = nullptr;
  if (ref.codec_params().empty() || ref.codec_params() == "none") {
    payload = allocate(bytes);
    std::memcpy(payload, slot->values.data(), bytes);
  } else {
    std::string encoded;
    auto compressed = CompressPullLocked(*slot, rank, ref.codec_params(), out, &encoded);
    if (!compressed.ok()) {
      return absl::Status(compressed.code(), absl::StrCat("pull of ", Where(ref.key(), ref.chunk()),
                                                          ": ", compressed.message()));
    }
    bytes = encoded.size();
    payload = allocate(bytes);
    std::memcpy(payload, encoded.data(), bytes);
  }
  lock.unlock();
  out->set_checksum(Crc32c(payload, bytes));
  if (min_clock != kEveryoneLeft) {
    int64_t staleness = clock - min_clock, seen = counters_.max_staleness;
    while (staleness > seen && !counters_.max_staleness.compare_exchange_weak(seen, staleness)) {
    }
  }
  counters_.pulls++;
  counters_.bytes_out += bytes;
  return absl::OkStatus();
}

absl::Status ShardStore::CompressPullLocked(Slot& slot, uint32_t rank,
                                            const std::string& codec_params,
                                            proto::TensorChunk* out, std::string* payload) {
  auto spec = CodecSpec::Parse(codec_params);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  auto codec = CreateCodec(*spec);
  if (!codec.ok()) return absl::InvalidArgumentError(codec.status().message());
  const size_t n = slot.values.size();
  if (slot.pulled_views.empty()) slot.pulled_views.resize(options_.num_workers);
  std::vector<float>& view = slot.pulled_views[rank];
  if (view.size() != n) {
    // First compressed pull of this rank: dense, and the view starts there.
    view = slot.values;
    payload->assign(reinterpret_cast<const char*>(view.data()), n * sizeof(float));
    out->set_codec(0);
    return absl::OkStatus();
  }
  std::vector<float> delta(n);
  for (size_t i = 0; i < n; ++i) delta[i] = slot.values[i] - view[i];
  CodecContext context;
  context.seed = DeriveSeed(slot.key, slot.chunk, out->clock(), rank, spec->seed);
  if (auto status = (*codec)->Encode(delta, context, payload); !status.ok()) return status;
  // The view advances by what the rank will decode, so what the codec drops
  // stays in the next difference (error feedback on the shard's side).
  if (auto status = (*codec)->DecodeAdd(*payload, 1.0f, absl::MakeSpan(view)); !status.ok()) {
    return status;
  }
  out->set_codec(static_cast<uint32_t>(spec->id));
  out->set_codec_params(spec->ToString());
  return absl::OkStatus();
}

absl::Status ShardStore::FailureStatus() const {
  if (!failed_) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(membership_mutex_);
  return failure_;
}

void ShardStore::ForEachSlot(const std::function<void(Slot&)>& visit) {
  std::shared_lock<std::shared_mutex> lock(slots_mutex_);
  for (auto& entry : slots_) visit(*entry.second);
}

int ShardStore::active_workers() const {
  int active = 0;
  for (int r = 0; r < options_.num_workers; ++r) active += departed_[r] ? 0 : 1;
  return active;
}

absl::Status ShardStore::Leave(uint32_t rank, int64_t clock) {
  if (rank >= static_cast<uint32_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(absl::StrCat("leave: rank ", rank, " out of range [0, ",
                                                   options_.num_workers, ")"));
  }
  if (departed_[rank].exchange(true)) return absl::OkStatus();
  ForEachSlot([this](Slot& slot) {
    {
      std::lock_guard<std::mutex> lock(slot.mutex);
      if (controller_.AggregatesRounds()) CompleteRoundsLocked(slot);
    }
    slot.changed.notify_all();
  });
  (void)clock;
  return absl::OkStatus();
}

absl::Status ShardStore::Heartbeat(uint32_t rank) {
  if (rank >= static_cast<uint32_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat: rank ", rank, " out of range [0, ",
                                                   options_.num_workers, ")"));
  }
  std::lock_guard<std::mutex> lock(membership_mutex_);
  last_seen_[rank] = Clock::now();
  seen_[rank] = true;
  return absl::OkStatus();
}

void ShardStore::CheckLiveness(std::chrono::milliseconds timeout, WorkerLossPolicy policy) {
  std::vector<uint32_t> lost;
  {
    std::lock_guard<std::mutex> lock(membership_mutex_);
    const auto now = Clock::now();
    for (int r = 0; r < options_.num_workers; ++r) {
      if (seen_[r] && !departed_[r] && now - last_seen_[r] > timeout) {
        lost.push_back(static_cast<uint32_t>(r));
        if (policy == WorkerLossPolicy::kFail && !failed_) {
          failure_ = absl::AbortedError(absl::StrCat(
              "worker rank ", r, " lost: no heartbeat for ",
              std::chrono::duration_cast<std::chrono::milliseconds>(now - last_seen_[r]).count(),
              " ms (--on_worker_loss=fail)"));
          failed_ = true;
        }
        seen_[r] = false;  // reported once
      }
    }
  }
  if (lost.empty()) return;
  if (policy == WorkerLossPolicy::kContinue) {
    for (uint32_t rank : lost) Leave(rank, -1).IgnoreError();
  } else {
    // Under each slot's lock, so a pull between its check and its wait
    // cannot miss the wake-up.
    ForEachSlot([](Slot& slot) {
      { std::lock_guard<std::mutex> lock(slot.mutex); }
      slot.changed.notify_all();
    });
  }
}

void ShardStore::Close() {
  closed_ = true;
  std::shared_lock<std::shared_mutex> lock(slots_mutex_);
  for (auto& entry : slots_) {
    // Under the slot's lock, so a pull between its check and its wait cannot
    // miss the wake-up.
    { std::lock_guard<std::mutex> slot_lock(entry.second->mutex); }
    entry.second->changed.notify_all();
  }
}

proto::ChunkRef ShardStore::PushPullRef(const proto::TensorChunk& pushed, int64_t* clock) {
  proto::ChunkRef ref;
  ref.set_key(pushed.key());
  ref.set_chunk(pushed.chunk());
  ref.set_num_elements(pushed.num_elements());
  ref.set_codec_params(pushed.pull_codec_params());
  *clock = pushed.clock() + 1;
  return ref;
}

ShardCheckpoint ShardStore::Export() const {
  ShardCheckpoint checkpoint;
  checkpoint.shard = options_.shard;
  checkpoint.num_shards = options_.num_shards;
  checkpoint.num_workers = options_.num_workers;
  checkpoint.sync = options_.sync.ToString();
  std::shared_lock<std::shared_mutex> map_lock(slots_mutex_);
  checkpoint.slots.reserve(slots_.size());
  for (const auto& entry : slots_) {
    Slot& slot = *entry.second;
    std::lock_guard<std::mutex> lock(slot.mutex);
    SlotCheckpoint saved;
    saved.key = slot.key;
    saved.chunk = slot.chunk;
    saved.shape = slot.shape;
    saved.values = slot.values;
    saved.optimizer_first = slot.optimizer_state.first;
    saved.optimizer_second = slot.optimizer_state.second;
    saved.optimizer_steps = slot.optimizer_state.steps;
    saved.pushed = slot.pushed;
    if (!slot.pending.empty()) {
      const int64_t first_pending = slot.pending.begin()->first;
      for (int64_t& pushed : saved.pushed) pushed = std::min(pushed, first_pending);
    }
    checkpoint.slots.push_back(std::move(saved));
  }
  return checkpoint;
}

absl::Status ShardStore::Import(const ShardCheckpoint& checkpoint) {
  if (checkpoint.shard != options_.shard || checkpoint.num_shards != options_.num_shards ||
      checkpoint.num_workers != options_.num_workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint is for shard ", checkpoint.shard, "/", checkpoint.num_shards, " with ",
        checkpoint.num_workers, " workers; this is shard ", options_.shard, "/",
        options_.num_shards, " with ", options_.num_workers));
  }
  std::unique_lock<std::shared_mutex> lock(slots_mutex_);
  if (!slots_.empty()) return absl::FailedPreconditionError("import into a non-empty shard");
  for (const SlotCheckpoint& saved : checkpoint.slots) {
    auto slot = std::make_unique<Slot>();
    slot->key = saved.key;
    slot->chunk = saved.chunk;
    slot->shape = saved.shape;
    slot->values = saved.values;
    slot->optimizer_state.first = saved.optimizer_first;
    slot->optimizer_state.second = saved.optimizer_second;
    slot->optimizer_state.steps = saved.optimizer_steps;
    slot->pushed = saved.pushed;
    slots_[SlotName(saved.key, saved.chunk)] = std::move(slot);
  }
  for (int r = 0; r < options_.num_workers; ++r) may_rebase_[r] = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ShardStore::Snapshot(const std::string& key,
                                                        uint32_t chunk) const {
  Slot* slot = FindSlot(key, chunk);
  if (slot == nullptr) return absl::NotFoundError(absl::StrCat(Where(key, chunk), " not found"));
  std::lock_guard<std::mutex> lock(slot->mutex);
  return slot->values;
}

}  // namespace harrier
