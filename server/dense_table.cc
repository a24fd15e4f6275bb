#include "server/dense_table.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/request_limits.h"

namespace harrier {
namespace {

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

std::string WhereOf(const std::string& key, uint32_t chunk) {
  return absl::StrCat("key '", key, "' chunk ", chunk);
}

absl::Status WithWhere(const std::string& where, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(where, ": ", status.message()));
}

bool IsDense(const std::string& codec_params) {
  return codec_params.empty() || codec_params == "none";
}

// What a refused gradient held: NaN or Inf, or only elements past the
// limit. `gradient` names the values (contiguous or split; the step is
// ignored).
const char* OutOfRange(FusedArgs gradient) {
  gradient.step = FusedStep::kCheck;
  gradient.base = nullptr;
  gradient.out = nullptr;
  gradient.limit_bits = 0x7f800000u;  // Inf and NaN only
  return FusedApply(gradient).within ? ": gradient element of magnitude 2^40 (about 1.1e12) or more"
                                     : ": gradient contains NaN or Inf";
}

FusedArgs ContiguousGradient(const float* gradient, size_t n) {
  FusedArgs args;
  args.gradient = gradient;
  args.n = n;
  return args;
}

// The refusal a dense payload's fused pass over `gradient` found, if any.
absl::Status DensePayloadStatus(const proto::TensorChunk& chunk, const FusedArgs& gradient,
                                const FusedResult& result) {
  if (result.crc != chunk.checksum()) {
    return absl::InvalidArgumentError(
        absl::StrCat(WhereOf(chunk.key(), chunk.chunk()), ": payload checksum mismatch"));
  }
  if (!result.within) {
    return absl::InvalidArgumentError(
        absl::StrCat(WhereOf(chunk.key(), chunk.chunk()), OutOfRange(gradient)));
  }
  return absl::OkStatus();
}

// A call refused for its clock or rank is refused for a bad payload first
// (what it was told before the check moved into the fused pass): an extra
// pass, on a call refused anyway.
absl::Status BadPayloadFirst(const proto::TensorChunk& chunk, const FusedArgs& gradient,
                             bool deferred_check, absl::Status refusal) {
  if (!deferred_check) return refusal;
  FusedArgs check = gradient;
  check.step = FusedStep::kCheck;
  check.limit_bits = kGradientLimitBits;
  absl::Status bad = DensePayloadStatus(chunk, gradient, FusedApply(check));
  return bad.ok() ? refusal : bad;
}

}  // namespace

// One chunk of a push call: validated, then (under the chunk's lock, which
// the store holds) rechecked, staged into shadows, and committed or put back.
class DenseTable::ChunkPush : public StagedPush {
 public:
  ChunkPush(DenseTable* table, const proto::TensorChunk& header, absl::string_view payload,
            size_t payload_bytes)
      : table_(table), header_(header), payload_(payload), payload_bytes_(payload_bytes) {}

  absl::Mutex& mutex() override { return slot_->mutex; }
  absl::StatusOr<bool> Recheck() override;
  absl::Status Stage() override;
  void Unstage() override;
  void Commit(PullWakeups& wakeups) override;
  size_t payload_bytes() const override { return payload_bytes_; }

 private:
  friend class DenseTable;

  DenseTable* const table_;
  const proto::TensorChunk& header_;
  // The gradient as the fused pass reads it (contiguous or split); the
  // step and its operands are the caller's.
  FusedArgs Gradient() const {
    FusedArgs args;
    args.gradient = gradient_;
    args.gradient_pieces = dense_pieces_;
    args.n = slot_->num_elements;
    return args;
  }

  const absl::string_view payload_;  // contiguous; empty when split
  const size_t payload_bytes_;
  std::shared_ptr<Slot> slot_;                      // kept alive across a new run
  const float* gradient_ = nullptr;                 // into the payload or `decoded_`
  // A split dense payload, read in place by the fused pass (`gradient_`
  // stays null).
  absl::Span<const absl::string_view> dense_pieces_;
  std::vector<float> decoded_;                      // compressed pushes, decoded
  std::shared_ptr<const CodecCache::Entry> codec_;  // compressed pushes
  // Dense: CRC and limit not checked yet; done in the pass that also
  // computes the step (Stage).
  bool deferred_check_ = false;
  bool duplicate_ = false;
  // What the push will do: the clock book as it will be, and the next
  // values or round sum (shadows; swapped in by Commit).
  std::unique_ptr<ClockBook> book_;
  PushDecision decision_;
  std::shared_ptr<ParamBuffer> next_values_;  // a fused SGD step
  bool staged_sum_ = false;                   // next sum in slot.spare_sum
};

DenseTable::DenseTable(std::string name, const TableEnvironment& env, proto::TableKind kind)
    : name_(std::move(name)), env_(env), kind_(kind) {
  absl::MutexLock lock(&mutex_);
  own_clock_ = kind == proto::TABLE_AVERAGE;
}

DenseTable::~DenseTable() {
  absl::MutexLock lock(&mutex_);
  // One chunk and its bytes for every slot Init or a restore made.
  if (env_.budget != nullptr) env_.budget->Release(slots_.size(), bytes_);
}

std::unique_ptr<Table> MakeDenseTable(std::string name, const TableEnvironment& env) {
  return std::make_unique<DenseTable>(std::move(name), env);
}

std::unique_ptr<Table> MakeAverageTable(std::string name, const TableEnvironment& env) {
  TableEnvironment average = env;
  average.controller = env.round_controller;
  average.optimizer = env.average_optimizer;
  return std::make_unique<DenseTable>(std::move(name), average, proto::TABLE_AVERAGE);
}

bool DenseTable::own_clock() const {
  absl::ReaderMutexLock lock(&mutex_);
  return own_clock_;
}

std::string DenseTable::Where(uint32_t chunk) const { return WhereOf(name_, chunk); }

std::shared_ptr<DenseTable::Slot> DenseTable::FindSlot(uint32_t chunk) const {
  absl::ReaderMutexLock lock(&mutex_);
  auto it = slots_.find(chunk);
  return it == slots_.end() ? nullptr : it->second;
}

ClockBook DenseTable::NewBook() const {
  ClockBook book = env_.controller->NewClockBook();
  const int workers = env_.options->num_workers;
  // A key first seen after a restore: the workers are already past clock 0.
  if (*env_.restored) book.Restore(std::vector<int64_t>(workers, 0));
  // Ranks that left before this key existed (a Leave running now marks the
  // new slot itself: it walks the slots after this table's lock is
  // released).
  for (int r = 0; r < workers; ++r) {
    if (env_.membership->departed(static_cast<uint32_t>(r))) book.Depart(static_cast<uint32_t>(r));
  }
  return book;
}

absl::StatusOr<bool> DenseTable::Init(const proto::InitRequest& request) {
  const uint32_t chunk = request.chunk();
  if (request.dtype() != proto::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), ": unsupported dtype ", request.dtype()));
  }
  const uint64_t n = request.num_elements();
  // n * sizeof(float) must not wrap around: 2^62 elements would "match" an
  // empty payload.
  if (n > std::numeric_limits<uint64_t>::max() / sizeof(float) ||
      request.initial_values().size() != n * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), ": ", request.initial_values().size(),
                     " bytes of initial values for ", n, " float32 elements"));
  }
  if (Crc32c(request.initial_values().data(), request.initial_values().size()) !=
      request.checksum()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), ": checksum mismatch in initial values"));
  }
  const auto* values = reinterpret_cast<const float*>(request.initial_values().data());
  if (!AllWithin(values, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), ": initial values contain NaN or Inf"));
  }
  if (n * sizeof(float) > env_.options->max_chunk_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Where(chunk), ": ", n * sizeof(float), " bytes in one chunk, more than ",
                     env_.options->max_chunk_bytes, " (--max_chunk_bytes)"));
  }
  // The rank is bounded before the shape is copied (common/request_limits.h).
  if (auto status = CheckShape(Where(chunk), request.shape().data(),
                               static_cast<size_t>(request.shape_size()), n);
      !status.ok()) {
    return status;
  }
  std::vector<uint64_t> shape(request.shape().begin(), request.shape().end());

  absl::MutexLock lock(&mutex_);
  const bool own_clock = request.own_clock() || kind_ == proto::TABLE_AVERAGE;
  if (!slots_.empty() && own_clock != own_clock_) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(chunk), own_clock ? ": registered with a clock of its own, but '"
                                : ": registered on the training clock, but '",
        name_, own_clock_ ? "' keeps a clock of its own" : "' follows the training clock"));
  }
  own_clock_ = own_clock;
  auto existing = slots_.find(chunk);
  if (existing != slots_.end()) {
    const Slot& slot = *existing->second;
    if (slot.num_elements != n || slot.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(chunk), ": shape [", absl::StrJoin(shape, ","), "] with ", n,
                       " elements disagrees with the registered shape [",
                       absl::StrJoin(slot.shape, ","), "] with ", slot.num_elements, " elements"));
    }
    return false;
  }
  if (auto status = env_.budget->Reserve(Where(chunk), n * sizeof(float)); !status.ok()) {
    return status;
  }
  auto slot = std::make_shared<Slot>(chunk, std::move(shape), n, NewBook());
  bytes_ += n * sizeof(float);
  {
    absl::MutexLock slot_lock(&slot->mutex);
    slot->values = std::make_shared<ParamBuffer>(n);
    if (n > 0) std::memcpy(slot->values->data(), values, n * sizeof(float));
  }
  slots_[chunk] = std::move(slot);
  return true;
}

absl::StatusOr<std::unique_ptr<StagedPush>> DenseTable::Validate(const proto::TensorChunk& chunk,
                                                                 absl::string_view payload) {
  return ValidatePush(chunk, payload, {});
}

bool DenseTable::ReadsSplitPayload(const proto::TensorChunk& header) const {
  // A plain SGD step and a round's sum are fused passes, which read split
  // payloads; other optimizers step from a contiguous gradient.
  float lr, weight_decay;
  return header.codec() == static_cast<uint32_t>(CodecId::kNone) &&
         IsDense(header.codec_params()) && env_.optimizer->PlainSgd(&lr, &weight_decay);
}

absl::StatusOr<std::unique_ptr<StagedPush>> DenseTable::ValidateSplit(
    const proto::TensorChunk& header, absl::Span<const absl::string_view> pieces) {
  if (!ReadsSplitPayload(header)) {
    return absl::InternalError(
        absl::StrCat(Where(header.chunk()), ": a split payload this table does not read split"));
  }
  return ValidatePush(header, absl::string_view(), pieces);
}

absl::StatusOr<std::unique_ptr<StagedPush>> DenseTable::ValidatePush(
    const proto::TensorChunk& chunk, absl::string_view payload,
    absl::Span<const absl::string_view> pieces) {
  // Named only in refusals: a push that is accepted builds no string.
  const auto where = [this, &chunk] { return Where(chunk.chunk()); };
  if (chunk.dtype() != proto::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(where(), ": unsupported dtype ", chunk.dtype()));
  }
  size_t payload_bytes = payload.size();
  for (absl::string_view piece : pieces) payload_bytes += piece.size();
  auto push = std::make_unique<ChunkPush>(this, chunk, payload, payload_bytes);
  push->slot_ = FindSlot(chunk.chunk());
  Slot* slot = push->slot_.get();
  if (slot == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(where(), " is not registered on shard ", env_.options->shard));
  }
  const size_t n = slot->num_elements;
  if (chunk.num_elements() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": ", chunk.num_elements(), " elements, expected ", n));
  }
  const bool dense = chunk.codec() == static_cast<uint32_t>(CodecId::kNone);
  if (dense && !IsDense(chunk.codec_params())) {
    // A round is keyed by its codec parameters: a dense gradient that names
    // a vote codec would join the vote's round and be dropped from it.
    return absl::InvalidArgumentError(absl::StrCat(
        where(), ": dense payload (codec id 0) with codec '", chunk.codec_params(), "'"));
  }
  if (dense && payload_bytes != n * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(where(), ": payload of ", payload_bytes,
                                                   " bytes, expected ", n * sizeof(float)));
  }
  if (dense) {
    // CRC and limit are checked under the call's locks, in the one pass
    // over the payload that also computes the step (Stage).
    if (pieces.empty()) {
      push->gradient_ = reinterpret_cast<const float*>(payload.data());
    } else {
      push->dense_pieces_ = pieces;
    }
    push->deferred_check_ = true;
  } else if (!pieces.empty()) {
    return absl::InternalError(absl::StrCat(where(), ": a compressed payload given split"));
  } else {
    if (Crc32c(payload.data(), payload.size()) != chunk.checksum()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": payload checksum mismatch"));
    }
    // Compressed: the codec validates the whole payload while decoding it,
    // before anything is applied.
    auto codec = env_.codecs->Get(chunk.codec_params());
    if (!codec.ok()) return WithWhere(where(), codec.status());
    if (static_cast<uint32_t>((*codec)->spec.id) != chunk.codec()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": codec id ", chunk.codec(),
                                                     " disagrees with spec '", chunk.codec_params(),
                                                     "'"));
    }
    push->decoded_.resize(n);
    if (auto status = (*codec)->decoder->Decode(payload, absl::MakeSpan(push->decoded_));
        !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": ", status.message()));
    }
    push->gradient_ = push->decoded_.data();
    push->codec_ = std::move(*codec);
    if (!AllWithin(push->gradient_, n, kGradientLimitBits)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), OutOfRange(ContiguousGradient(push->gradient_, n))));
    }
  }
  if (env_.membership->departed(chunk.rank())) {
    return BadPayloadFirst(chunk, push->Gradient(), push->deferred_check_,
                           absl::FailedPreconditionError(absl::StrCat(
                               where(), ": rank ", chunk.rank(), " has left the job")));
  }
  absl::Status refusal;
  {
    absl::MutexLock lock(&slot->mutex);
    absl::StatusOr<PushClass> push_class =
        slot->book.ClassifyPush(chunk.rank(), chunk.clock(), *env_.membership);
    if (!push_class.ok()) {
      refusal = WithWhere(where(), push_class.status());
    } else if (*push_class == PushClass::kNew) {
      refusal = CheckRoundCodecLocked(*slot, chunk);
    }
  }
  if (!refusal.ok()) {
    return BadPayloadFirst(chunk, push->Gradient(), push->deferred_check_, std::move(refusal));
  }
  return std::unique_ptr<StagedPush>(std::move(push));
}

absl::StatusOr<bool> DenseTable::ChunkPush::Recheck() {
  Slot& slot = *slot_;
  slot.mutex.AssertHeld();  // by the store; tells the analysis so
  // Only a call racing another call of the same rank can fail here, or
  // turn from new into a duplicate (a retry racing its original).
  absl::StatusOr<PushClass> push =
      slot.book.ClassifyPush(header_.rank(), header_.clock(), *table_->env_.membership);
  if (!push.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(WhereOf(header_.key(), header_.chunk()), ": concurrent pushes from rank ",
                     header_.rank(), " for clock ", header_.clock(), " (", push.status().message(),
                     "); this call changed nothing"));
  }
  duplicate_ = *push == PushClass::kDuplicate;
  if (duplicate_) return false;
  if (auto status = table_->CheckRoundCodecLocked(slot, header_); !status.ok()) return status;
  return true;
}

absl::Status DenseTable::CheckRoundCodecLocked(Slot& slot, const proto::TensorChunk& chunk) {
  const RoundSum* round = slot.book.PendingSum(chunk.clock());
  if (round != nullptr && round->started && round->codec_params != chunk.codec_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(chunk.chunk()), ": codec '", chunk.codec_params(), "' but clock ", chunk.clock(),
        " was pushed with '", round->codec_params, "' by another worker"));
  }
  return absl::OkStatus();
}

absl::Status DenseTable::ChunkPush::Stage() {
  Slot& slot = *slot_;
  slot.mutex.AssertHeld();
  const size_t n = slot.num_elements;
  FusedArgs args = Gradient();
  args.step = FusedStep::kCheck;
  args.limit_bits = kGradientLimitBits;
  if (!duplicate_) {
    // The decision on a copy of the book: the real one moves on only when
    // the whole call is applied. Round sums are shared, not copied.
    book_ = std::make_unique<ClockBook>(slot.book);
    decision_ = book_->RecordPush(header_.rank(), header_.clock(), *table_->env_.membership);
    float lr, weight_decay;
    if (!deferred_check_) {
      // Compressed: decoded and checked already; applied at commit.
    } else if (decision_.kind == PushDecision::Kind::kApplyNow) {
      if (table_->env_.optimizer->PlainSgd(&lr, &weight_decay)) {
        next_values_ = table_->TakeSpareLocked(slot);
        args.step = FusedStep::kSgd;
        args.base = slot.values->data();
        args.out = next_values_->data();
        args.lr = lr;
        args.scale = decision_.scale;
        args.weight_decay = weight_decay;
      }
      // Otherwise (momentum, nesterov, adam, adagrad, delta) the pass only
      // checks, and Commit runs Optimizer::Step: their state is updated in
      // place, which a shadow would have to copy.
    } else {
      const RoundSum& round = *decision_.held_sum;
      const bool adding = !round.sum.empty();
      slot.spare_sum.resize(n);
      args.step = adding ? FusedStep::kAdd : FusedStep::kCopy;
      args.base = adding ? round.sum.data() : nullptr;
      args.out = slot.spare_sum.data();
      staged_sum_ = true;
    }
  }
  if (!deferred_check_) return absl::OkStatus();
  return DensePayloadStatus(header_, Gradient(), table_->RunFused(args));
}

void DenseTable::ChunkPush::Unstage() {
  slot_->mutex.AssertHeld();
  table_->KeepSpareLocked(*slot_, std::move(next_values_));
  next_values_.reset();
  book_.reset();
  staged_sum_ = false;
}

void DenseTable::ChunkPush::Commit(PullWakeups& wakeups) {
  Slot& slot = *slot_;
  slot.mutex.AssertHeld();
  const size_t n = slot.num_elements;
  slot.book = std::move(*book_);
  if (decision_.kind == PushDecision::Kind::kApplyNow) {
    if (next_values_) {
      table_->PublishLocked(slot, std::move(next_values_));
      ++slot.optimizer_state.steps;  // as Sgd::Step counts
      table_->env_.counters->optimizer_steps++;
    } else {
      table_->StepLocked(slot, gradient_, decision_.scale);
    }
  } else {
    RoundSum& round = *decision_.held_sum;
    if (!round.started) {
      round.started = true;
      round.codec_params = header_.codec_params();
    }
    if (staged_sum_) {
      // The old sum (or nothing) becomes the spare.
      round.sum.swap(slot.spare_sum);
      if (slot.spare_sum.size() != n) slot.spare_sum.clear();
    } else if (codec_ && codec_->decoder->IsMajorityVote()) {
      if (!round.vote) {
        if (slot.spare_vote && slot.spare_vote_params == header_.codec_params()) {
          round.vote = std::move(slot.spare_vote);
        } else {
          // The spec was parsed and built when the push was validated.
          round.vote = std::move(*Aggregator::Create(codec_->spec, n));
        }
      }
      // Validated above; Add only counts the payload's votes.
      round.vote->Add(payload_).IgnoreError();
    } else if (round.sum.empty()) {
      round.sum.assign(gradient_, gradient_ + n);
    } else {
      for (size_t i = 0; i < n; ++i) round.sum[i] += gradient_[i];
    }
    table_->FinishRoundsLocked(slot, decision_.completed);
  }
  TakeAnswerableWaitersLocked(slot, wakeups);
}

FusedResult DenseTable::RunFused(const FusedArgs& args) const {
  return FusedApplyParallel(args, env_.apply_pool, env_.options->apply_threads);
}

std::shared_ptr<ParamBuffer> DenseTable::TakeSpareLocked(Slot& slot) {
  if (slot.spare) {
    *env_.spare_bytes -= slot.spare->bytes();
    std::shared_ptr<ParamBuffer> spare = std::move(slot.spare);
    spare->Invalidate();
    return spare;
  }
  return std::make_shared<ParamBuffer>(slot.num_elements);
}

void DenseTable::KeepSpareLocked(Slot& slot, std::shared_ptr<ParamBuffer> buffer) {
  // One spare at most; a version someone else still holds (a reply being
  // sent) is theirs to free.
  if (!buffer || slot.spare || slot.retired || buffer.use_count() != 1) return;
  *env_.spare_bytes += buffer->bytes();
  slot.spare = std::move(buffer);
}

void DenseTable::PublishLocked(Slot& slot, std::shared_ptr<ParamBuffer> next) {
  std::shared_ptr<ParamBuffer> old = std::move(slot.values);
  slot.values = std::move(next);
  ++slot.values_version;
  KeepSpareLocked(slot, std::move(old));
}

ParamBuffer& DenseTable::WritableLocked(Slot& slot) {
  // Pulls take their reference under this lock, so a count of one cannot
  // grow while we write.
  if (slot.values.use_count() != 1) {
    std::shared_ptr<ParamBuffer> copy = TakeSpareLocked(slot);
    if (slot.num_elements > 0) std::memcpy(copy->data(), slot.values->data(), copy->bytes());
    PublishLocked(slot, std::move(copy));
  }
  slot.values->Invalidate();
  ++slot.values_version;
  return *slot.values;
}

void DenseTable::StepLocked(Slot& slot, const float* gradient, float scale) {
  float lr, weight_decay;
  if (env_.optimizer->PlainSgd(&lr, &weight_decay)) {
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
    env_.optimizer->Step(absl::MakeSpan(values.data(), values.size()),
                         absl::MakeConstSpan(gradient, slot.num_elements), scale,
                         slot.optimizer_state);
  }
  env_.counters->optimizer_steps++;
}

void DenseTable::FinishRoundsLocked(Slot& slot,
                                    const std::vector<PushDecision::CompletedRound>& rounds) {
  for (const PushDecision::CompletedRound& completed : rounds) {
    RoundSum& done = *completed.sum;
    if (!done.started) continue;  // every pusher of the round was re-based past it
    done.Finish(completed.contributors, slot.num_elements);
    if (done.vote) {
      done.vote->Reset();
      slot.spare_vote_params = done.codec_params;
      slot.spare_vote = std::move(done.vote);
    }
    StepLocked(slot, done.sum.data(), 1.0f);
    if (slot.spare_sum.empty()) slot.spare_sum.swap(done.sum);  // the next round's
  }
}

absl::StatusOr<PullOutcome> DenseTable::TryPull(const PullQuery& query, proto::TensorChunk* out,
                                                const PullTarget& target) {
  const proto::ChunkRef& ref = *query.ref;
  // Held for the call: a new run may drop the slot meanwhile.
  const std::shared_ptr<Slot> held = FindSlot(ref.chunk());
  Slot* slot = held.get();
  if (slot == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(Where(ref.chunk()), " is not registered on shard ", env_.options->shard));
  }
  if (ref.num_elements() != slot->num_elements) {
    return absl::InvalidArgumentError(absl::StrCat(Where(ref.chunk()), ": pull of ",
                                                   ref.num_elements(), " elements, registered ",
                                                   slot->num_elements));
  }
  PullOutcome outcome;
  absl::ReleasableMutexLock lock(&slot->mutex);
  outcome.verdict = slot->book.CheckPull(query.clock);
  const PullVerdict& verdict = outcome.verdict;
  if (!verdict.may_answer) {
    if (*env_.closed) return absl::UnavailableError("shard is shutting down");
    if (slot->retired) {
      return absl::FailedPreconditionError(
          absl::StrCat("pull of ", Where(ref.chunk()), ": the run ended and a new one started"));
    }
    if (auto failure = env_.membership->failure(); !failure.ok()) return failure;
    return outcome;
  }
  outcome.ready = true;
  out->set_key(ref.key());
  out->set_chunk(ref.chunk());
  out->set_rank(query.rank);
  out->set_clock(query.clock);
  out->set_min_clock(verdict.min_clock);
  out->set_dtype(proto::DTYPE_FLOAT32);
  out->set_num_elements(slot->num_elements);
  size_t bytes = slot->num_elements * sizeof(float);
  if (IsDense(ref.codec_params())) {
    // The version is immutable while held: copied without the lock, and
    // its CRC computed once for every pull of it.
    std::shared_ptr<const ParamBuffer> version = slot->values;
    lock.Release();
    out->set_checksum(version->Crc());
    if (target.borrow) {
      target.borrow(std::move(version));
    } else {
      char* payload = target.allocate(bytes);
      if (bytes > 0) std::memcpy(payload, version->data(), bytes);
    }
  } else {
    std::string encoded;
    PullViewEnvironment views_env{env_.codecs, env_.counters, env_.last_view_version,
                                  env_.options->num_workers, env_.budget};
    PullViews::Chunk chunk{&name_, slot->chunk, &slot->shape, slot->values->data(),
                           slot->num_elements, slot->values_version};
    auto compressed = slot->views.Compress(views_env, chunk, query.rank, ref.codec_params(),
                                           ref.view_version(), out, &encoded);
    if (!compressed.ok()) {
      return absl::Status(compressed.code(),
                          absl::StrCat("pull of ", Where(ref.chunk()), ": ", compressed.message()));
    }
    lock.Release();
    bytes = encoded.size();
    char* payload = target.allocate(bytes);
    std::memcpy(payload, encoded.data(), bytes);
    out->set_checksum(Crc32c(payload, bytes));
  }
  ShardCounters& counters = *env_.counters;
  if (!verdict.everyone_left) {
    int64_t staleness = query.clock - verdict.min_clock, seen = counters.max_staleness;
    while (staleness > seen && !counters.max_staleness.compare_exchange_weak(seen, staleness)) {
    }
  }
  counters.pulls++;
  counters.bytes_out += bytes;
  return outcome;
}

bool DenseTable::Park(const PullQuery& query, std::shared_ptr<PullWaiter> waiter) {
  const std::shared_ptr<Slot> held = FindSlot(query.ref->chunk());
  if (held == nullptr) return false;
  Slot& slot = *held;
  absl::MutexLock lock(&slot.mutex);
  // `closed` is set before the store wakes every table: either this sees
  // it, or the wake-up finds the waiter on the list. The same holds for
  // retired and for a membership failure.
  if (*env_.closed || slot.retired || !env_.membership->failure().ok()) return false;
  if (slot.book.CheckPull(query.clock).may_answer) return false;
  slot.waiters.push_back({query.clock, std::move(waiter)});
  (*env_.blocked_pulls)++;
  return true;
}

void DenseTable::TakeAllWaitersLocked(Slot& slot, PullWakeups& wakeups) {
  for (Slot::Parked& parked : slot.waiters) wakeups.Take(std::move(parked.waiter));
  slot.waiters.clear();
}

void DenseTable::TakeAnswerableWaitersLocked(Slot& slot, PullWakeups& wakeups) {
  auto& waiters = slot.waiters;
  for (size_t i = 0; i < waiters.size();) {
    if (!slot.book.CheckPull(waiters[i].clock).may_answer) {
      ++i;
      continue;
    }
    wakeups.Take(std::move(waiters[i].waiter));
    waiters[i] = std::move(waiters.back());
    waiters.pop_back();
  }
}

void DenseTable::Unpark(const PullQuery& query, const PullWaiter* waiter) {
  const std::shared_ptr<Slot> held = FindSlot(query.ref->chunk());
  if (held == nullptr) return;  // dropped by a new run, which woke its waiters
  absl::MutexLock lock(&held->mutex);
  auto& waiters = held->waiters;
  for (size_t i = 0; i < waiters.size(); ++i) {
    if (waiters[i].waiter.get() != waiter) continue;
    waiters[i] = std::move(waiters.back());
    waiters.pop_back();
    (*env_.blocked_pulls)--;
    return;
  }
}

void DenseTable::ForEachSlot(PullWakeups& wakeups, const std::function<void(Slot&)>& visit) const {
  absl::ReaderMutexLock lock(&mutex_);
  for (const auto& entry : slots_) {
    Slot& slot = *entry.second;
    absl::MutexLock slot_lock(&slot.mutex);
    visit(slot);
    TakeAllWaitersLocked(slot, wakeups);
  }
}

void DenseTable::Depart(uint32_t rank, PullWakeups& wakeups) {
  // Slot by slot, under each slot's lock, the rank stops counting and the
  // rounds that waited only for it are applied in the same step: a pull
  // never sees the rank gone from a slot whose rounds still lack it.
  ForEachSlot(wakeups, [this, rank](Slot& slot) {
    slot.mutex.AssertHeld();
    FinishRoundsLocked(slot, slot.book.Depart(rank));
  });
}

void DenseTable::RebaseFromWorker(uint32_t rank, uint32_t part, int64_t next_clock,
                                  PullWakeups& wakeups) {
  const std::shared_ptr<Slot> held = FindSlot(part);
  if (held == nullptr) return;
  Slot& slot = *held;
  absl::MutexLock lock(&slot.mutex);
  std::vector<PushDecision::CompletedRound> completed;
  if (!slot.book.RebaseFromWorker(rank, next_clock, &completed)) return;
  FinishRoundsLocked(slot, completed);
  TakeAllWaitersLocked(slot, wakeups);
}

void DenseTable::MergeNextClocks(std::vector<int64_t>* next) const {
  absl::ReaderMutexLock lock(&mutex_);
  // Its clock is not the training clock: a worker resumes from the others.
  if (own_clock_) return;
  for (const auto& entry : slots_) {
    Slot& slot = *entry.second;
    absl::MutexLock slot_lock(&slot.mutex);
    for (size_t rank = 0; rank < next->size(); ++rank) {
      const int64_t pushed = slot.book.pushed(static_cast<uint32_t>(rank));
      (*next)[rank] = (*next)[rank] < 0 ? pushed : std::min((*next)[rank], pushed);
    }
  }
}

void DenseTable::WakeAll(PullWakeups& wakeups) {
  ForEachSlot(wakeups, [](Slot&) {});
}

void DenseTable::Retire(PullWakeups& wakeups) {
  ForEachSlot(wakeups, [this](Slot& slot) {
    slot.mutex.AssertHeld();
    slot.retired = true;
    if (slot.spare) *env_.spare_bytes -= slot.spare->bytes();
    slot.spare.reset();
    slot.spare_sum = SumBuffer();
  });
}

void DenseTable::Export(std::vector<SlotCheckpoint>* out, bool /*changes_only*/) const {
  // Always whole: a dense tensor's every value changes with every step.
  absl::ReaderMutexLock lock(&mutex_);
  for (const auto& entry : slots_) {
    Slot& slot = *entry.second;
    absl::MutexLock slot_lock(&slot.mutex);
    SlotCheckpoint saved;
    saved.key = name_;
    saved.chunk = slot.chunk;
    saved.shape = slot.shape;
    saved.values.assign(slot.values->data(), slot.values->data() + slot.num_elements);
    saved.optimizer_first = slot.optimizer_state.first;
    saved.optimizer_second = slot.optimizer_state.second;
    saved.optimizer_steps = slot.optimizer_state.steps;
    saved.pushed = slot.book.CheckpointClocks();
    saved.kind = static_cast<uint32_t>(kind_);
    saved.own_clock = own_clock_;
    out->push_back(std::move(saved));
  }
}

absl::Status DenseTable::Import(const SlotCheckpoint& saved) {
  ClockBook book = env_.controller->NewClockBook();
  book.Restore(saved.pushed);
  auto slot =
      std::make_shared<Slot>(saved.chunk, saved.shape, saved.values.size(), std::move(book));
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
  const uint64_t bytes = saved.values.size() * sizeof(float);
  absl::MutexLock lock(&mutex_);
  if (saved.kind != static_cast<uint32_t>(kind_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint holds ", Where(saved.chunk), " as table kind ", saved.kind, ", not ", kind_));
  }
  if (!slots_.empty() && saved.own_clock != own_clock_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint holds chunks of '", name_, "' with and without a clock of their own"));
  }
  own_clock_ = saved.own_clock;
  if (slots_.count(saved.chunk) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint holds ", Where(saved.chunk), " twice"));
  }
  env_.budget->Add(bytes);
  bytes_ += bytes;
  slots_[saved.chunk] = std::move(slot);
  return absl::OkStatus();
}

TensorHeld DenseTable::held() const {
  TensorHeld held;
  held.name = name_;
  // Shape and element count are a slot's constants: the table's lock is
  // enough.
  absl::ReaderMutexLock lock(&mutex_);
  for (const auto& entry : slots_) {
    if (held.chunks == 0) held.shape = entry.second->shape;
    held.chunks++;
    held.elements += entry.second->num_elements;
  }
  return held;
}

uint64_t DenseTable::param_bytes() const {
  absl::ReaderMutexLock lock(&mutex_);
  return bytes_;
}

absl::StatusOr<std::vector<float>> DenseTable::Snapshot(uint32_t part) const {
  const std::shared_ptr<Slot> held = FindSlot(part);
  if (held == nullptr) return absl::NotFoundError(absl::StrCat(Where(part), " not found"));
  absl::MutexLock lock(&held->mutex);
  return std::vector<float>(held->values->data(), held->values->data() + held->num_elements);
}

DenseTable::BuffersForTesting DenseTable::BuffersOfForTesting(uint32_t chunk) const {
  const std::shared_ptr<Slot> held = FindSlot(chunk);
  if (held == nullptr) return {};
  absl::MutexLock lock(&held->mutex);
  return {held->values.get(), held->spare.get()};
}

}  // namespace harrier
