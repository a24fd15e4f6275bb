#include "server/shard_store.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/crc32c.h"
#include "common/thread_pool.h"
#include "spdlog/spdlog.h"

namespace harrier {
namespace {

std::string Where(const std::string& key, uint32_t chunk) {
  return absl::StrCat("key '", key, "' chunk ", chunk);
}

// The biased exponent bits of 2^40 (about 1.1e12): a gradient element at or
// above it in magnitude is refused. No real gradient comes near it, while a
// few such pushes (FLT_MAX, say) would drive finite parameters to Inf.
// Bounded below it, the n pushes of a round sum far below FLT_MAX, and so do
// the squares Adam and AdaGrad keep (2^80 each: AdaGrad's sum would need
// 2^48 steps to overflow).
constexpr uint32_t kGradientLimitBits = (127u + 40u) << 23;

// True when every value is finite and, if `limit_bits` is set, below the
// magnitude whose exponent bits those are. On the bits, so the loop
// vectorises (a float comparison loop may not be reordered without
// -ffast-math): an exponent of all ones is Inf or NaN.
bool AllWithin(const float* values, size_t n, uint32_t limit_bits = 0x7f800000u) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) >= limit_bits);
  }
  return bad == 0;
}

absl::Status WithWhere(const std::string& key, uint32_t chunk, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(Where(key, chunk), ": ", status.message()));
}

bool IsDense(const std::string& codec_params) {
  return codec_params.empty() || codec_params == "none";
}

// The refusal a dense payload's fused pass found, if any.
absl::Status DensePayloadStatus(const proto::TensorChunk& chunk, const float* gradient, size_t n,
                                const FusedResult& result) {
  if (result.crc != chunk.checksum()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk.key(), chunk.chunk()), ": payload checksum mismatch"));
  }
  if (!result.within) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(chunk.key(), chunk.chunk()),
        AllWithin(gradient, n) ? ": gradient element of magnitude 2^40 (about 1.1e12) or more"
                               : ": gradient contains NaN or Inf"));
  }
  return absl::OkStatus();
}

// A call refused for its clock or rank is refused for a bad payload first
// (what it was told before the check moved into the fused pass): an extra
// pass, on a call refused anyway.
absl::Status BadPayloadFirst(const proto::TensorChunk& chunk, const float* gradient, size_t n,
                             bool deferred_check, absl::Status refusal) {
  if (!deferred_check) return refusal;
  FusedArgs args;
  args.gradient = gradient;
  args.n = n;
  args.limit_bits = kGradientLimitBits;
  absl::Status bad = DensePayloadStatus(chunk, gradient, n, FusedApply(args));
  return bad.ok() ? refusal : bad;
}

}  // namespace

ParamBuffer::ParamBuffer(size_t num_elements)
    : data_(static_cast<float*>(std::aligned_alloc(
          64, std::max<size_t>(64, (num_elements * sizeof(float) + 63) / 64 * 64)))),
      size_(num_elements) {
  if (data_ == nullptr) throw std::bad_alloc();  // as std::vector would
}

ParamBuffer::~ParamBuffer() { std::free(data_); }

uint32_t ParamBuffer::Crc() const {
  uint64_t cached = crc_.load(std::memory_order_acquire);
  if (cached == 0) {
    cached = (uint64_t{1} << 32) | Crc32c(data_, bytes());
    crc_.store(cached, std::memory_order_release);
  }
  return static_cast<uint32_t>(cached);
}

ShardStore::ShardStore(ShardStoreOptions options, std::unique_ptr<Optimizer> optimizer)
    : options_(options),
      controller_(options.sync, options.num_workers, options.staleness_aware_lr,
                  options.max_pending_rounds),
      optimizer_(controller_.ShardOptimizer(std::move(optimizer))),
      partitioner_(options.num_shards),
      membership_(options.num_workers),
      last_view_version_(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count())) {
  if (options_.apply_threads > 1) {
    // Bounded by its submitters: a call submits at most apply_threads - 1
    // tasks and finishes without waiting for queued ones.
    apply_pool_ = std::make_unique<ThreadPool>(options_.apply_threads - 1, ThreadPool::kUnbounded,
                                               "apply pool");
  }
}

ShardStore::~ShardStore() { Close(); }

std::shared_ptr<ShardStore::Slot> ShardStore::FindSlot(const std::string& key,
                                                       uint32_t chunk) const {
  absl::ReaderMutexLock lock(&slots_mutex_);
  auto it = slots_.find(SlotKey(key, chunk));
  return it == slots_.end() ? nullptr : it->second;
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
  // n * sizeof(float) must not wrap around: 2^62 elements would "match" an
  // empty payload.
  if (n > std::numeric_limits<uint64_t>::max() / sizeof(float) ||
      request.initial_values().size() != n * sizeof(float)) {
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
  if (!AllWithin(values, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, request.chunk()), ": initial values contain NaN or Inf"));
  }
  const std::vector<uint64_t> shape(request.shape().begin(), request.shape().end());
  // A chunk holds part of its tensor: never more elements than the shape
  // has (the product is taken without overflow; a shape of [] is a scalar).
  uint64_t tensor_elements = 1;
  bool shape_overflows = false;
  for (uint64_t dim : shape) {
    if (dim != 0 && tensor_elements > std::numeric_limits<uint64_t>::max() / dim) {
      shape_overflows = true;
      break;
    }
    tensor_elements *= dim;
  }
  if (n * sizeof(float) > options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Where(key, request.chunk()), ": ", n * sizeof(float), " bytes in one chunk, more than ",
        options_.max_chunk_bytes, " (--max_chunk_bytes)"));
  }
  if (shape_overflows || n > tensor_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(key, request.chunk()), ": ", n, " elements do not fit the shape [",
        absl::StrJoin(shape, ","), "]"));
  }

  absl::MutexLock lock(&slots_mutex_);
  auto existing = slots_.find(SlotKey(key, request.chunk()));
  if (existing == slots_.end()) {
    if (slots_.size() >= options_.max_chunks) {
      return absl::ResourceExhaustedError(
          absl::StrCat(Where(key, request.chunk()), ": shard ", options_.shard, " holds ",
                       slots_.size(), " chunks already (--max_chunks)"));
    }
    if (bytes_ + n * sizeof(float) > options_.max_param_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Where(key, request.chunk()), ": shard ", options_.shard, " holds ", bytes_,
          " parameter bytes; ", n * sizeof(float), " more would pass ", options_.max_param_bytes,
          " (--max_param_bytes)"));
    }
  }
  auto& entry = slots_[SlotKey(key, request.chunk())];
  if (entry) {
    if (entry->num_elements != n || entry->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(key, request.chunk()), ": shape [", absl::StrJoin(shape, ","), "] with ", n,
          " elements disagrees with the registered shape [", absl::StrJoin(entry->shape, ","),
          "] with ", entry->num_elements, " elements"));
    }
    return false;
  }
  ClockBook book = controller_.NewClockBook();
  // A key first seen after a restore: the workers are already past clock 0.
  if (restored_) book.Restore(std::vector<int64_t>(options_.num_workers, 0));
  // Ranks that left before this key existed (a Leave running now marks the
  // new slot itself: it walks the slots after this lock is released).
  for (int r = 0; r < options_.num_workers; ++r) {
    if (membership_.departed(static_cast<uint32_t>(r))) book.Depart(static_cast<uint32_t>(r));
  }
  entry = std::make_shared<Slot>(key, request.chunk(), shape, n, std::move(book));
  bytes_ += n * sizeof(float);
  absl::MutexLock slot_lock(&entry->mutex);
  entry->values = std::make_shared<ParamBuffer>(n);
  if (n > 0) std::memcpy(entry->values->data(), values, n * sizeof(float));
  return true;
}

absl::Status ShardStore::ValidateChunk(const proto::TensorChunk& chunk, absl::string_view payload,
                                       ValidatedChunk* out) {
  const std::string& key = chunk.key();
  if (auto status = CheckOwnership(key, chunk.chunk()); !status.ok()) return status;
  if (auto status = membership_.CheckRank(chunk.rank(), Where(key, chunk.chunk()));
      !status.ok()) {
    return status;
  }
  if (chunk.dtype() != proto::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, chunk.chunk()), ": unsupported dtype ", chunk.dtype()));
  }
  std::shared_ptr<Slot> held = FindSlot(key, chunk.chunk());
  Slot* slot = held.get();
  if (slot == nullptr) {
    return absl::NotFoundError(absl::StrCat(Where(key, chunk.chunk()),
                                            " is not registered on shard ", options_.shard));
  }
  const size_t n = slot->num_elements;
  if (chunk.num_elements() != n) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk.chunk()), ": ",
                                                   chunk.num_elements(), " elements, expected ",
                                                   n));
  }
  const bool dense = chunk.codec() == static_cast<uint32_t>(CodecId::kNone);
  if (dense && !IsDense(chunk.codec_params())) {
    // A round is keyed by its codec parameters: a dense gradient that names
    // a vote codec would join the vote's round and be dropped from it.
    return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk.chunk()),
                                                   ": dense payload (codec id 0) with codec '",
                                                   chunk.codec_params(), "'"));
  }
  if (dense && payload.size() != n * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk.chunk()), ": payload of ",
                                                   payload.size(), " bytes, expected ",
                                                   n * sizeof(float)));
  }
  if (dense) {
    // CRC and limit are checked under the call's locks, in the one pass
    // over the payload that also computes the step (StageLocked).
    out->gradient = reinterpret_cast<const float*>(payload.data());
    out->deferred_check = true;
  } else {
    if (Crc32c(payload.data(), payload.size()) != chunk.checksum()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(key, chunk.chunk()), ": payload checksum mismatch"));
    }
    // Compressed: the codec validates the whole payload while decoding it,
    // before anything is applied.
    auto codec = codecs_.Get(chunk.codec_params());
    if (!codec.ok()) return WithWhere(key, chunk.chunk(), codec.status());
    if (static_cast<uint32_t>((*codec)->spec.id) != chunk.codec()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk.chunk()), ": codec id ",
                                                     chunk.codec(), " disagrees with spec '",
                                                     chunk.codec_params(), "'"));
    }
    out->decoded.resize(n);
    if (auto status = (*codec)->decoder->Decode(payload, absl::MakeSpan(out->decoded));
        !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(key, chunk.chunk()), ": ", status.message()));
    }
    out->gradient = out->decoded.data();
    out->codec = std::move(*codec);
    if (!AllWithin(out->gradient, n, kGradientLimitBits)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(key, chunk.chunk()), AllWithin(out->gradient, n)
                                         ? ": gradient element of magnitude 2^40 (about 1.1e12) or more"
                                         : ": gradient contains NaN or Inf"));
    }
  }
  if (membership_.departed(chunk.rank())) {
    return BadPayloadFirst(chunk, out->gradient, n, out->deferred_check,
                           absl::FailedPreconditionError(
                               absl::StrCat(Where(key, chunk.chunk()), ": rank ", chunk.rank(),
                                            " has left the job")));
  }
  absl::Status refusal;
  {
    absl::MutexLock lock(&slot->mutex);
    absl::StatusOr<PushClass> push =
        slot->book.ClassifyPush(chunk.rank(), chunk.clock(), membership_);
    if (!push.ok()) {
      refusal = WithWhere(key, chunk.chunk(), push.status());
    } else if (*push == PushClass::kNew) {
      refusal = CheckRoundCodecLocked(*slot, chunk);
    }
  }
  if (!refusal.ok()) {
    return BadPayloadFirst(chunk, out->gradient, n, out->deferred_check, std::move(refusal));
  }
  out->slot = slot;
  out->held = std::move(held);
  return absl::OkStatus();
}

absl::Status ShardStore::Push(const std::vector<proto::TensorChunk>& chunks,
                              PushResult* result) {
  std::vector<PushChunkView> views(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) views[i] = {&chunks[i], chunks[i].payload()};
  return Push(views, result);
}

absl::Status ShardStore::Push(const std::vector<PushChunkView>& views, PushResult* result) {
  if (closed_) return absl::UnavailableError("shard is shutting down");
  if (auto failure = membership_.failure(); !failure.ok()) return failure;
  std::vector<ValidatedChunk> valid(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const proto::TensorChunk& chunk = *views[i].header;
    for (size_t j = 0; j < i; ++j) {
      if (views[j].header->key() == chunk.key() && views[j].header->chunk() == chunk.chunk()) {
        counters_.rejected++;
        return absl::InvalidArgumentError(
            absl::StrCat(Where(chunk.key(), chunk.chunk()), ": pushed twice in one call"));
      }
    }
    if (auto status = ValidateChunk(chunk, views[i].payload, &valid[i]); !status.ok()) {
      counters_.rejected++;
      return status;
    }
  }
  // One decision for the whole call: every slot it touches is locked (in
  // address order, the one order every multi-slot lock uses), every chunk
  // re-checked, and then all are applied or none. Without this a call racing
  // another call of its own rank could be refused with some chunks applied.
  std::vector<Slot*> order;
  order.reserve(valid.size());
  for (const ValidatedChunk& chunk : valid) order.push_back(chunk.slot);
  std::sort(order.begin(), order.end());
  Wakeups wakeups(blocked_pulls_);  // after the locks are released
  SlotLocks locks(order);
  for (size_t i = 0; i < views.size(); ++i) {
    const proto::TensorChunk& chunk = *views[i].header;
    valid[i].slot->mutex.AssertHeld();  // by `locks`; tells the analysis so
    absl::StatusOr<PushClass> push = RecheckLocked(*valid[i].slot, chunk);
    if (!push.ok()) {
      counters_.rejected++;
      return push.status();
    }
    valid[i].duplicate = *push == PushClass::kDuplicate;
  }
  // Every chunk's remaining checks and its step, into shadows; a bad one
  // puts the shadows back and the call changes nothing.
  std::vector<StagedChunk> staged(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    valid[i].slot->mutex.AssertHeld();
    if (auto status = StageLocked(*valid[i].slot, *views[i].header, valid[i], &staged[i]);
        !status.ok()) {
      for (size_t j = 0; j <= i; ++j) {
        valid[j].slot->mutex.AssertHeld();
        UnstageLocked(*valid[j].slot, staged[j]);
      }
      counters_.rejected++;
      return status;
    }
  }
  PushResult counts;
  for (size_t i = 0; i < views.size(); ++i) {
    if (valid[i].duplicate) {
      ++counts.duplicate;
      continue;
    }
    Slot& slot = *valid[i].slot;
    slot.mutex.AssertHeld();
    CommitLocked(slot, *views[i].header, views[i].payload, valid[i], staged[i]);
    slot.changed.SignalAll();
    wakeups.Take(slot);
    ++counts.applied;
    counters_.pushes++;
    counters_.bytes_in += views[i].payload.size();
  }
  counters_.duplicate_pushes += counts.duplicate;
  if (result != nullptr) *result = counts;
  if (!views.empty()) membership_.Heard(views.front().header->rank());
  return absl::OkStatus();
}

absl::StatusOr<PushClass> ShardStore::RecheckLocked(Slot& slot, const proto::TensorChunk& chunk) {
  // Only a call racing another call of the same rank can fail here, or
  // turn from new into a duplicate (a retry racing its original).
  absl::StatusOr<PushClass> push =
      slot.book.ClassifyPush(chunk.rank(), chunk.clock(), membership_);
  if (!push.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(chunk.key(), chunk.chunk()), ": concurrent pushes from rank ", chunk.rank(),
        " for clock ", chunk.clock(), " (", push.status().message(),
        "); this call changed nothing"));
  }
  if (*push == PushClass::kDuplicate) return push;
  if (auto status = CheckRoundCodecLocked(slot, chunk); !status.ok()) return status;
  return push;
}

absl::Status ShardStore::CheckRoundCodecLocked(Slot& slot, const proto::TensorChunk& chunk) {
  auto round = slot.sums.find(chunk.clock());
  if (round != slot.sums.end() && round->second.codec_params != chunk.codec_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(chunk.key(), chunk.chunk()), ": codec '", chunk.codec_params(), "' but clock ",
        chunk.clock(), " was pushed with '", round->second.codec_params, "' by another worker"));
  }
  return absl::OkStatus();
}

FusedResult ShardStore::RunFused(const FusedArgs& args) {
  return FusedApplyParallel(args, apply_pool_.get(), options_.apply_threads);
}

std::shared_ptr<ParamBuffer> ShardStore::TakeSpareLocked(Slot& slot) {
  if (slot.spare) {
    spare_bytes_ -= slot.spare->bytes();
    std::shared_ptr<ParamBuffer> spare = std::move(slot.spare);
    spare->Invalidate();
    return spare;
  }
  return std::make_shared<ParamBuffer>(slot.num_elements);
}

void ShardStore::KeepSpareLocked(Slot& slot, std::shared_ptr<ParamBuffer> buffer) {
  // One spare at most; a version someone else still holds (a reply being
  // sent) is theirs to free.
  if (!buffer || slot.spare || slot.retired || buffer.use_count() != 1) return;
  spare_bytes_ += buffer->bytes();
  slot.spare = std::move(buffer);
}

void ShardStore::PublishLocked(Slot& slot, std::shared_ptr<ParamBuffer> next) {
  std::shared_ptr<ParamBuffer> old = std::move(slot.values);
  slot.values = std::move(next);
  KeepSpareLocked(slot, std::move(old));
}

ParamBuffer& ShardStore::WritableLocked(Slot& slot) {
  // Pulls take their reference under this lock, so a count of one cannot
  // grow while we write.
  if (slot.values.use_count() != 1) {
    std::shared_ptr<ParamBuffer> copy = TakeSpareLocked(slot);
    if (slot.num_elements > 0) std::memcpy(copy->data(), slot.values->data(), copy->bytes());
    PublishLocked(slot, std::move(copy));
  }
  slot.values->Invalidate();
  return *slot.values;
}

void ShardStore::StepLocked(Slot& slot, const float* gradient, float scale) {
  float lr, weight_decay;
  if (optimizer_->PlainSgd(&lr, &weight_decay)) {
    // Copy-on-write costs no copy here: the step writes the next version
    // from the current one.
    std::shared_ptr<ParamBuffer> next = TakeSpareLocked(slot);
    FusedArgs args;
    args.step = FusedStep::kSgd;
    args.gradient = gradient;
    args.n = slot.num_elements;
    args.base = slot.values->data();
    args.out = next->data();
    args.lr = lr;
    args.scale = scale;
    args.weight_decay = weight_decay;
    RunFused(args);
    PublishLocked(slot, std::move(next));
    ++slot.optimizer_state.steps;  // as Sgd::Step counts
  } else {
    ParamBuffer& values = WritableLocked(slot);
    optimizer_->Step(absl::MakeSpan(values.data(), values.size()),
                     absl::MakeConstSpan(gradient, slot.num_elements), scale,
                     slot.optimizer_state);
  }
  counters_.optimizer_steps++;
}

absl::Status ShardStore::StageLocked(Slot& slot, const proto::TensorChunk& chunk,
                                     const ValidatedChunk& valid, StagedChunk* staged) {
  const size_t n = slot.num_elements;
  FusedArgs args;
  args.step = FusedStep::kCheck;
  args.gradient = valid.gradient;
  args.n = n;
  args.limit_bits = kGradientLimitBits;
  if (!valid.duplicate) {
    // The decision on a copy of the book: the real one moves on only when
    // the whole call is applied.
    staged->book = std::make_unique<ClockBook>(slot.book);
    staged->decision = staged->book->RecordPush(chunk.rank(), chunk.clock(), membership_);
    float lr, weight_decay;
    if (!valid.deferred_check) {
      // Compressed: decoded and checked already; applied at commit.
    } else if (staged->decision.kind == PushDecision::Kind::kApplyNow) {
      if (optimizer_->PlainSgd(&lr, &weight_decay)) {
        staged->next_values = TakeSpareLocked(slot);
        args.step = FusedStep::kSgd;
        args.base = slot.values->data();
        args.out = staged->next_values->data();
        args.lr = lr;
        args.scale = staged->decision.scale;
        args.weight_decay = weight_decay;
      }
      // Otherwise (momentum, nesterov, adam, adagrad, delta) the pass only
      // checks, and CommitLocked runs Optimizer::Step: their state is
      // updated in place, which a shadow would have to copy.
    } else {
      auto round = slot.sums.find(staged->decision.round);
      const bool adding = round != slot.sums.end() && !round->second.sum.empty();
      slot.spare_sum.resize(n);
      args.step = adding ? FusedStep::kAdd : FusedStep::kCopy;
      args.base = adding ? round->second.sum.data() : nullptr;
      args.out = slot.spare_sum.data();
      staged->staged_sum = true;
    }
  }
  if (!valid.deferred_check) return absl::OkStatus();
  return DensePayloadStatus(chunk, valid.gradient, n, RunFused(args));
}

void ShardStore::UnstageLocked(Slot& slot, StagedChunk& staged) {
  KeepSpareLocked(slot, std::move(staged.next_values));
  staged = StagedChunk();
}

void ShardStore::CommitLocked(Slot& slot, const proto::TensorChunk& chunk,
                              absl::string_view payload, const ValidatedChunk& valid,
                              StagedChunk& staged) {
  const size_t n = slot.num_elements;
  slot.book = std::move(*staged.book);
  const PushDecision& decision = staged.decision;
  if (decision.kind == PushDecision::Kind::kApplyNow) {
    if (staged.next_values) {
      PublishLocked(slot, std::move(staged.next_values));
      ++slot.optimizer_state.steps;  // as Sgd::Step counts
      counters_.optimizer_steps++;
    } else {
      StepLocked(slot, valid.gradient, decision.scale);
    }
    return;
  }
  RoundSum& round = slot.sums[decision.round];
  if (!round.started) {
    round.started = true;
    round.codec_params = chunk.codec_params();
  }
  if (staged.staged_sum) {
    // The old sum (or nothing) becomes the spare.
    round.sum.swap(slot.spare_sum);
    if (slot.spare_sum.size() != n) slot.spare_sum.clear();
  } else if (valid.codec && valid.codec->decoder->IsMajorityVote()) {
    if (!round.vote) {
      if (slot.spare_vote && slot.spare_vote_params == chunk.codec_params()) {
        round.vote = std::move(slot.spare_vote);
      } else {
        // The spec was parsed and built when the push was validated.
        round.vote = std::move(*Aggregator::Create(valid.codec->spec, n));
      }
    }
    // Validated above; Add only counts the payload's votes.
    round.vote->Add(payload).IgnoreError();
  } else if (round.sum.empty()) {
    round.sum.assign(valid.gradient, valid.gradient + n);
  } else {
    for (size_t i = 0; i < n; ++i) round.sum[i] += valid.gradient[i];
  }
  FinishRoundsLocked(slot, decision.completed);
}

void ShardStore::FinishRoundsLocked(Slot& slot,
                                    const std::vector<PushDecision::CompletedRound>& rounds) {
  for (const PushDecision::CompletedRound& completed : rounds) {
    auto it = slot.sums.find(completed.clock);
    if (it == slot.sums.end()) continue;  // every pusher of the round was re-based past it
    RoundSum& done = it->second;
    if (done.vote) {
      done.sum.resize(slot.num_elements);
      done.vote->Finish(absl::MakeSpan(done.sum)).IgnoreError();  // >= 1 vote, sizes match
      done.vote->Reset();
      slot.spare_vote_params = done.codec_params;
      slot.spare_vote = std::move(done.vote);
    } else {
      // Division rather than multiplication by 1/n: the average of integer
      // gradients whose sum n divides is then exact, as tests assert.
      const float contributors = static_cast<float>(completed.contributors);
      for (float& g : done.sum) g /= contributors;
    }
    StepLocked(slot, done.sum.data(), 1.0f);
    if (slot.spare_sum.empty()) slot.spare_sum.swap(done.sum);  // the next round's
    slot.sums.erase(it);
  }
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
  return Pull(rank, clock, ref, deadline, cancellation, out, allocate, nullptr);
}

absl::Status ShardStore::Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                              Clock::time_point deadline, Cancellation* cancellation,
                              proto::TensorChunk* out, const PayloadAllocator& allocate,
                              const PayloadBorrower& borrow) {
  if (auto status = CheckOwnership(ref.key(), ref.chunk()); !status.ok()) return status;
  if (auto status = membership_.CheckRank(rank, Where(ref.key(), ref.chunk())); !status.ok()) {
    return status;
  }
  if (clock < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(ref.key(), ref.chunk()), ": negative clock ", clock));
  }
  // Held for the call: a new run (StartRun) may drop the slot meanwhile.
  const std::shared_ptr<Slot> held = FindSlot(ref.key(), ref.chunk());
  Slot* slot = held.get();
  if (slot == nullptr) {
    return absl::NotFoundError(absl::StrCat(Where(ref.key(), ref.chunk()),
                                            " is not registered on shard ", options_.shard));
  }
  if (ref.num_elements() != slot->num_elements) {
    return absl::InvalidArgumentError(absl::StrCat(Where(ref.key(), ref.chunk()), ": pull of ",
                                                   ref.num_elements(), " elements, registered ",
                                                   slot->num_elements));
  }
  // Declared before the lock: its destructor must not run under the slot's
  // lock, which the wake-up takes.
  ScopedWake wake(cancellation, [slot] {
    absl::MutexLock wake_lock(&slot->mutex);
    slot->changed.SignalAll();
  });
  struct BlockedCount {
    std::atomic<int>& count;
    bool counted = false;
    ~BlockedCount() {
      if (counted) count--;
    }
  } blocked{blocked_pulls_};
  const absl::Time wait_until = absl::Now() + absl::FromChrono(deadline - Clock::now());
  absl::ReleasableMutexLock lock(&slot->mutex);
  PullVerdict verdict = slot->book.CheckPull(clock);
  while (!verdict.may_answer) {
    if (!blocked.counted) {
      blocked.counted = true;
      blocked_pulls_++;
    }
    if (closed_) return absl::UnavailableError("shard is shutting down");
    if (slot->retired) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pull of ", Where(ref.key(), ref.chunk()), ": the run ended and a new one started"));
    }
    if (auto failure = membership_.failure(); !failure.ok()) return failure;
    if (cancellation != nullptr && cancellation->cancelled()) {
      return absl::CancelledError(absl::StrCat("pull of ", Where(ref.key(), ref.chunk()),
                                               " cancelled by the client"));
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pull of ", Where(ref.key(), ref.chunk()), " at clock ", clock, " by rank ", rank,
          " waited for min clock >= ", verdict.required_min_clock, "; slowest worker is rank ",
          verdict.slowest_rank, " at clock ", verdict.min_clock));
    }
    slot->changed.WaitWithDeadline(&slot->mutex, wait_until);
    verdict = slot->book.CheckPull(clock);
  }
  out->set_key(ref.key());
  out->set_chunk(ref.chunk());
  out->set_rank(rank);
  out->set_clock(clock);
  out->set_min_clock(verdict.min_clock);
  out->set_dtype(proto::DTYPE_FLOAT32);
  out->set_num_elements(slot->num_elements);
  size_t bytes = slot->num_elements * sizeof(float);
  char* payload = nullptr;
  if (IsDense(ref.codec_params())) {
    // The version is immutable while held: copied without the lock, and
    // its CRC computed once for every pull of it.
    std::shared_ptr<const ParamBuffer> version = slot->values;
    lock.Release();
    out->set_checksum(version->Crc());
    if (borrow) {
      borrow(std::move(version));
    } else {
      payload = allocate(bytes);
      if (bytes > 0) std::memcpy(payload, version->data(), bytes);
    }
  } else {
    std::string encoded;
    auto compressed =
        CompressPullLocked(*slot, rank, ref.codec_params(), ref.view_version(), out, &encoded);
    if (!compressed.ok()) {
      return absl::Status(compressed.code(), absl::StrCat("pull of ", Where(ref.key(), ref.chunk()),
                                                          ": ", compressed.message()));
    }
    lock.Release();
    bytes = encoded.size();
    payload = allocate(bytes);
    std::memcpy(payload, encoded.data(), bytes);
    out->set_checksum(Crc32c(payload, bytes));
  }
  if (!verdict.everyone_left) {
    int64_t staleness = clock - verdict.min_clock, seen = counters_.max_staleness;
    while (staleness > seen && !counters_.max_staleness.compare_exchange_weak(seen, staleness)) {
    }
  }
  counters_.pulls++;
  counters_.bytes_out += bytes;
  return absl::OkStatus();
}

bool ShardStore::Park(int64_t clock, const proto::ChunkRef& ref,
                      std::shared_ptr<PullWaiter> waiter) {
  const std::shared_ptr<Slot> held = FindSlot(ref.key(), ref.chunk());
  if (held == nullptr) return false;
  Slot& slot = *held;
  absl::MutexLock lock(&slot.mutex);
  // closed_ is set before Close visits the slots: either this sees it, or
  // Close wakes the waiter after it is on the list. The same holds for
  // retired and for a membership failure.
  if (closed_ || slot.retired || !membership_.failure().ok()) return false;
  if (slot.book.CheckPull(clock).may_answer) return false;
  slot.waiters.push_back(std::move(waiter));
  blocked_pulls_++;
  return true;
}

void ShardStore::Unpark(const proto::ChunkRef& ref, const PullWaiter* waiter) {
  const std::shared_ptr<Slot> held = FindSlot(ref.key(), ref.chunk());
  if (held == nullptr) return;  // dropped by StartRun, which woke its waiters
  absl::MutexLock lock(&held->mutex);
  auto& waiters = held->waiters;
  for (size_t i = 0; i < waiters.size(); ++i) {
    if (waiters[i].get() != waiter) continue;
    waiters[i] = std::move(waiters.back());
    waiters.pop_back();
    blocked_pulls_--;
    return;
  }
}

// PowerSGD factors the layer's own matrix, as the client does for pushes
// (worker/chunk_codec.cc): rows of shape[1] * shape[2] * ... elements. A
// 1-D tensor, or a chunk that is not whole rows, gets PowerSGD's
// uncompressed form (a column count that does not divide the chunk). The
// reply's codec_params stay the requested spec; the client decodes the
// shape from the payload header.
static CodecSpec PullEncoderSpec(const CodecSpec& spec, const std::vector<uint64_t>& shape,
                                 size_t num_elements) {
  if (spec.id != CodecId::kPowerSgd || spec.cols != 0) return spec;
  CodecSpec chunk_spec = spec;
  uint64_t row = 1;
  for (size_t i = 1; i < shape.size(); ++i) row *= shape[i];
  const bool whole_rows = shape.size() >= 2 && row > 0 && num_elements % row == 0;
  chunk_spec.cols = whole_rows ? row : static_cast<uint64_t>(num_elements) + 1;
  return chunk_spec;
}

absl::Status ShardStore::CompressPullLocked(Slot& slot, uint32_t rank,
                                            const std::string& codec_params,
                                            uint64_t held_version, proto::TensorChunk* out,
                                            std::string* payload) {
  auto codec = codecs_.Get(codec_params);
  if (!codec.ok()) return codec.status();
  const CodecSpec& spec = (*codec)->spec;
  const size_t n = slot.num_elements;
  if (slot.pulled_views.empty()) slot.pulled_views.resize(options_.num_workers);
  PulledView& view = slot.pulled_views[rank];
  const bool holds_current = held_version != 0 && held_version == view.version &&
                             view.values.size() == n;
  const bool holds_previous = held_version != 0 && held_version == view.previous_version &&
                              view.previous.size() == n;
  if (!holds_current && !holds_previous) {
    // The rank's first compressed pull, or a view this shard does not hold
    // (version 0, one from before a restart, garbage): dense, and the view
    // starts there. The old views are no base for anything the rank holds.
    if (view.values.size() == n || held_version != 0) counters_.pull_view_resets++;
    view.values.assign(slot.values->data(), slot.values->data() + n);
    view.version = ++last_view_version_;
    view.previous_version = 0;
    view.previous.clear();
    payload->assign(reinterpret_cast<const char*>(view.values.data()), n * sizeof(float));
    out->set_codec(0);
    out->set_view_version(view.version);
    return absl::OkStatus();
  }
  if (!view.encoder || view.encoder_params != codec_params) {
    auto encoder = CreateCodec(PullEncoderSpec(spec, slot.shape, slot.num_elements));
    if (!encoder.ok()) return absl::InvalidArgumentError(encoder.status().message());
    view.encoder = std::move(*encoder);
    view.encoder_params = codec_params;
  }
  if (holds_current) {
    // The usual case: the current view becomes the previous one (what the
    // rank holds until this reply arrives).
    view.previous.swap(view.values);
    view.previous_version = view.version;
    view.values = view.previous;
  } else {
    // The rank lost the latest reply: re-make it from the view it holds.
    // That reply's view is dropped; the previous one stays as it is.
    counters_.pull_view_remakes++;
    view.values = view.previous;
  }
  std::vector<float> delta(n);
  const float* current = slot.values->data();
  for (size_t i = 0; i < n; ++i) delta[i] = current[i] - view.values[i];
  CodecContext context;
  context.seed = DeriveSeed(slot.key, slot.chunk, out->clock(), rank, spec.seed);
  absl::Status status = view.encoder->Encode(delta, context, payload);
  // The view advances by what the rank will decode, so what the codec drops
  // stays in the next difference (error feedback on the shard's side).
  if (status.ok()) status = view.encoder->DecodeAdd(*payload, 1.0f, absl::MakeSpan(view.values));
  if (!status.ok()) {
    // Nothing was sent: the rank holds the previous view, the only one left.
    view.values = view.previous;
    view.version = view.previous_version;
    return status;
  }
  out->set_pull_view_version(view.previous_version);  // the base: what the rank holds
  view.version = ++last_view_version_;
  out->set_codec(static_cast<uint32_t>(spec.id));
  out->set_codec_params(spec.ToString());
  out->set_view_version(view.version);
  return absl::OkStatus();
}

void ShardStore::ForEachSlotLocked(const std::function<void(Slot&)>& visit) {
  Wakeups wakeups(blocked_pulls_);
  absl::ReaderMutexLock lock(&slots_mutex_);
  for (auto& entry : slots_) {
    Slot& slot = *entry.second;
    absl::MutexLock slot_lock(&slot.mutex);
    visit(slot);
    slot.changed.SignalAll();
    wakeups.Take(slot);
  }
}

absl::Status ShardStore::Leave(uint32_t rank, int64_t clock) {
  if (auto status = membership_.CheckRank(rank, "leave"); !status.ok()) return status;
  if (Depart(rank)) {
    spdlog::info("event=leave shard={} rank={} clock={} present={}", options_.shard, rank, clock,
                 membership_.present());
  }
  return absl::OkStatus();
}

bool ShardStore::Depart(uint32_t rank) {
  if (!membership_.Depart(rank)) return false;
  // Slot by slot, under each slot's lock, the rank stops counting and the
  // rounds that waited only for it are applied in the same step: a pull
  // never sees the rank gone from a slot whose rounds still lack it.
  ForEachSlotLocked([this, rank](Slot& slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    FinishRoundsLocked(slot, slot.book.Depart(rank));
  });
  return true;
}

void ShardStore::RebaseFromWorker(
    uint32_t rank, const google::protobuf::RepeatedPtrField<proto::ChunkClock>& pushed) {
  if (rank >= static_cast<uint32_t>(options_.num_workers)) return;
  Wakeups wakeups(blocked_pulls_);
  for (const proto::ChunkClock& chunk : pushed) {
    const std::shared_ptr<Slot> held = FindSlot(chunk.key(), chunk.chunk());
    Slot* slot = held.get();
    if (slot == nullptr) continue;
    absl::MutexLock lock(&slot->mutex);
    std::vector<PushDecision::CompletedRound> completed;
    if (!slot->book.RebaseFromWorker(rank, chunk.next_clock(), &completed)) continue;
    FinishRoundsLocked(*slot, completed);
    slot->changed.SignalAll();
    wakeups.Take(*slot);
  }
}

absl::Status ShardStore::Heartbeat(uint32_t rank) {
  if (auto status = membership_.CheckRank(rank, "heartbeat"); !status.ok()) return status;
  membership_.Heard(rank);
  return absl::OkStatus();
}

void ShardStore::CheckLiveness(std::chrono::milliseconds timeout, WorkerLossPolicy policy) {
  std::vector<Membership::Lost> lost;
  membership_.FindLost(timeout, policy, &lost);
  if (lost.empty()) return;
  const bool carry_on = policy == WorkerLossPolicy::kContinue;
  for (const Membership::Lost& worker : lost) {
    if (carry_on) Depart(worker.rank);
    spdlog::warn(
        "event=worker_lost shard={} rank={} last_heartbeat_ms={} timeout_ms={} policy={} "
        "present={}",
        options_.shard, worker.rank, worker.silent.count(), timeout.count(),
        carry_on ? "continue" : "fail", membership_.present());
  }
  if (!carry_on) ForEachSlotLocked([](Slot&) {});  // blocked pulls wake and fail
}

void ShardStore::Close() {
  closed_ = true;
  ForEachSlotLocked([](Slot&) {});
}

absl::Status ShardStore::CheckPullCodec(const std::string& codec_params) {
  if (IsDense(codec_params)) return absl::OkStatus();
  auto codec = codecs_.Get(codec_params);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull codec '", codec_params, "': ", codec.status().message()));
  }
  return absl::OkStatus();
}

proto::ChunkRef ShardStore::PushPullRef(const proto::TensorChunk& pushed, int64_t* clock) {
  proto::ChunkRef ref;
  ref.set_key(pushed.key());
  ref.set_chunk(pushed.chunk());
  ref.set_num_elements(pushed.num_elements());
  ref.set_codec_params(pushed.pull_codec_params());
  ref.set_view_version(pushed.pull_view_version());
  *clock = pushed.clock() + 1;
  return ref;
}

void ShardStore::StartRun() {
  absl::flat_hash_map<SlotKey, std::shared_ptr<Slot>> ended;
  {
    absl::MutexLock lock(&slots_mutex_);
    ended.swap(slots_);
    bytes_ = 0;
    restored_ = false;
  }
  membership_.Reset();
  // Calls still holding an old slot finish on it (it is freed with the last
  // of them); pulls waiting on one are woken and refused.
  Wakeups wakeups(blocked_pulls_);
  for (auto& entry : ended) {
    Slot& slot = *entry.second;
    absl::MutexLock lock(&slot.mutex);
    slot.retired = true;
    if (slot.spare) spare_bytes_ -= slot.spare->bytes();
    slot.spare.reset();
    slot.spare_sum = std::vector<float>();
    slot.changed.SignalAll();
    wakeups.Take(slot);
  }
}

void ShardStore::Release(uint32_t rank) {
  if (rank >= static_cast<uint32_t>(options_.num_workers)) return;
  membership_.Release(rank);
  spdlog::info("event=worker_done shard={} rank={} present={}", options_.shard, rank,
               membership_.present());
}

int64_t ShardStore::NextClock(uint32_t rank) const {
  if (rank >= static_cast<uint32_t>(options_.num_workers)) return -1;
  int64_t next = -1;
  absl::ReaderMutexLock map_lock(&slots_mutex_);
  for (const auto& entry : slots_) {
    Slot& slot = *entry.second;
    absl::MutexLock lock(&slot.mutex);
    const int64_t pushed = slot.book.pushed(rank);
    next = next < 0 ? pushed : std::min(next, pushed);
  }
  return next;
}

std::vector<int64_t> ShardStore::NextClocks() const {
  std::vector<int64_t> next(options_.num_workers, -1);
  absl::ReaderMutexLock map_lock(&slots_mutex_);
  for (const auto& entry : slots_) {
    Slot& slot = *entry.second;
    absl::MutexLock lock(&slot.mutex);
    for (int rank = 0; rank < options_.num_workers; ++rank) {
      const int64_t pushed = slot.book.pushed(static_cast<uint32_t>(rank));
      next[rank] = next[rank] < 0 ? pushed : std::min(next[rank], pushed);
    }
  }
  return next;
}

ShardStore::Holdings ShardStore::holdings() const {
  Holdings holdings;
  absl::ReaderMutexLock map_lock(&slots_mutex_);
  absl::flat_hash_set<std::string> keys;
  for (const auto& entry : slots_) keys.insert(entry.first.first);
  holdings.keys = keys.size();
  holdings.chunks = slots_.size();
  holdings.param_bytes = bytes_;
  holdings.spare_bytes = spare_bytes_;
  return holdings;
}

std::vector<ShardStore::TensorHeld> ShardStore::tensors_held() const {
  std::map<std::string, TensorHeld> by_name;
  {
    // key, shape and num_elements are a slot's constants: the map's lock
    // is enough.
    absl::ReaderMutexLock map_lock(&slots_mutex_);
    for (const auto& entry : slots_) {
      const Slot& slot = *entry.second;
      TensorHeld& held = by_name[slot.key];
      if (held.chunks == 0) {
        held.name = slot.key;
        held.shape = slot.shape;
      }
      held.chunks++;
      held.elements += slot.num_elements;
    }
  }
  std::vector<TensorHeld> out;
  out.reserve(by_name.size());
  for (auto& entry : by_name) out.push_back(std::move(entry.second));
  return out;
}

ShardCheckpoint ShardStore::Export() const {
  ShardCheckpoint checkpoint;
  checkpoint.shard = options_.shard;
  checkpoint.num_shards = options_.num_shards;
  checkpoint.num_workers = options_.num_workers;
  checkpoint.sync = options_.sync.ToString();
  checkpoint.optimizer = optimizer_->options().kind;
  absl::ReaderMutexLock map_lock(&slots_mutex_);
  checkpoint.slots.reserve(slots_.size());
  for (const auto& entry : slots_) {
    Slot& slot = *entry.second;
    absl::MutexLock lock(&slot.mutex);
    SlotCheckpoint saved;
    saved.key = slot.key;
    saved.chunk = slot.chunk;
    saved.shape = slot.shape;
    saved.values.assign(slot.values->data(), slot.values->data() + slot.num_elements);
    saved.optimizer_first = slot.optimizer_state.first;
    saved.optimizer_second = slot.optimizer_state.second;
    saved.optimizer_steps = slot.optimizer_state.steps;
    saved.pushed = slot.book.CheckpointClocks();
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
  // Optimizer state of another kind would be read as this kind's (Adam's
  // first moment as momentum's velocity, say): refused. A format-1
  // checkpoint does not say its kind and is taken as it is.
  const std::string& kind = optimizer_->options().kind;
  if (!checkpoint.optimizer.empty() && checkpoint.optimizer != kind) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint version ", checkpoint.version, " holds optimizer state of kind '",
        checkpoint.optimizer, "' but this shard runs optimizer '", kind,
        "'; start it with --optimizer=", checkpoint.optimizer,
        " (the same --sync), or with another --checkpoint_dir"));
  }
  absl::MutexLock lock(&slots_mutex_);
  if (!slots_.empty()) return absl::FailedPreconditionError("import into a non-empty shard");
  for (const SlotCheckpoint& saved : checkpoint.slots) {
    ClockBook book = controller_.NewClockBook();
    book.Restore(saved.pushed);
    auto slot = std::make_shared<Slot>(saved.key, saved.chunk, saved.shape, saved.values.size(),
                                       std::move(book));
    {
      absl::MutexLock slot_lock(&slot->mutex);
      slot->values = std::make_shared<ParamBuffer>(saved.values.size());
      if (!saved.values.empty()) {
        std::memcpy(slot->values->data(), saved.values.data(), saved.values.size() * sizeof(float));
      }
      slot->optimizer_state.first = saved.optimizer_first;
      slot->optimizer_state.second = saved.optimizer_second;
      slot->optimizer_state.steps = saved.optimizer_steps;
    }
    bytes_ += saved.values.size() * sizeof(float);
    slots_[SlotKey(saved.key, saved.chunk)] = std::move(slot);
  }
  restored_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ShardStore::Snapshot(const std::string& key,
                                                        uint32_t chunk) const {
  const std::shared_ptr<Slot> held = FindSlot(key, chunk);
  Slot* slot = held.get();
  if (slot == nullptr) return absl::NotFoundError(absl::StrCat(Where(key, chunk), " not found"));
  absl::MutexLock lock(&slot->mutex);
  return std::vector<float>(slot->values->data(), slot->values->data() + slot->num_elements);
}

ShardStore::BuffersForTesting ShardStore::BuffersOfForTesting(const std::string& key,
                                                              uint32_t chunk) const {
  const std::shared_ptr<Slot> held = FindSlot(key, chunk);
  if (held == nullptr) return {};
  absl::MutexLock lock(&held->mutex);
  return {held->values.get(), held->spare.get()};
}

}  // namespace harrier
