#include "server/sparse_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "common/crc32c.h"

namespace harrier {
namespace {

// As dense pushes: a gradient element at or above 2^40 in magnitude is
// refused (a few such pushes would drive finite rows to Inf).
constexpr uint32_t kGradientLimitBits = (127u + 40u) << 23;

bool AllWithin(const float* values, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) >= kGradientLimitBits);
  }
  return bad == 0;
}

bool IsFloat32Wire(const std::string& params) { return params.empty() || params == "none"; }
bool Is16BitWire(const std::string& params) { return params == "fp16" || params == "bf16"; }

int64_t IdAt(const std::string& ids, size_t i) {
  int64_t id;
  std::memcpy(&id, ids.data() + i * sizeof(int64_t), sizeof(id));
  return id;
}

// Rows looked at by the time-to-live sweep per row a push touches.
constexpr size_t kSweepPerRow = 2;

}  // namespace

// A validated push of rows: applied on Commit (now, scaled; or into its
// BSP round's sums).
class SparseTable::RowsPush : public StagedPush {
 public:
  RowsPush(SparseTable* table, const proto::TensorChunk& header)
      : table_(table), header_(header) {}

  absl::Mutex& mutex() override { return table_->mutex_; }

  absl::StatusOr<bool> Recheck() override {
    table_->mutex_.AssertHeld();
    if (table_->retired_ || table_->book_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(table_->Where(), ": the run ended and a new one started"));
    }
    absl::StatusOr<PushClass> push = table_->book_->ClassifyPush(
        header_.rank(), header_.clock(), *table_->env_.membership);
    if (!push.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(table_->Where(), ": rank ", header_.rank(), " clock ", header_.clock(),
                       ": ", push.status().message(), "; this call changed nothing"));
    }
    duplicate_ = *push == PushClass::kDuplicate;
    return !duplicate_;
  }

  absl::Status Stage() override {
    table_->mutex_.AssertHeld();
    if (duplicate_) return absl::OkStatus();
    book_ = std::make_unique<ClockBook>(*table_->book_);
    decision_ = book_->RecordPush(header_.rank(), header_.clock(), *table_->env_.membership);
    if (decision_.kind == PushDecision::Kind::kHoldForRound && count_ > 0) {
      // A round's sums hold a row per distinct id until the round is in:
      // counted in the shard's parameter budget, so pushes of many ids for
      // rounds ahead cannot make the shard hold more than it allows.
      auto round = table_->rounds_.find(decision_.round);
      size_t added = 0;
      for (size_t i = 0; i < count_; ++i) {
        if (round == table_->rounds_.end() ||
            round->second.index.count(IdAt(header_.row_ids(), i)) == 0) {
          ++added;
        }
      }
      if (auto status = reserved_.Resize(
              table_->env_.budget,
              [this] { return absl::StrCat(table_->Where(), " round ", decision_.round, " sums"); },
              added * table_->RoundRowBytes());
          !status.ok()) {
        book_.reset();
        return status;
      }
    }
    return absl::OkStatus();
  }

  void Unstage() override {
    book_.reset();
    reserved_.Reset();
  }

  void Commit(PullWakeups& wakeups) override {
    SparseTable& table = *table_;
    table.mutex_.AssertHeld();
    *table.book_ = std::move(*book_);
    const uint32_t dim = table.rows_->dim();
    const int64_t clock = header_.clock();
    table.now_ = std::max(table.now_, clock);
    if (decision_.kind == PushDecision::Kind::kApplyNow) {
      for (size_t i = 0; i < count_; ++i) {
        table.rows_->Apply(IdAt(header_.row_ids(), i), gradient_ + i * dim, decision_.scale,
                           clock);
      }
      if (count_ > 0) table.env_.counters->optimizer_steps++;
    } else {
      RoundRows& round = table.rounds_[decision_.round];
      round.held.Absorb(std::move(reserved_));
      for (size_t i = 0; i < count_; ++i) {
        const int64_t id = IdAt(header_.row_ids(), i);
        auto [it, added] = round.index.emplace(id, static_cast<uint32_t>(round.index.size()));
        if (added) round.sums.resize(round.sums.size() + dim, 0.0f);
        float* sum = round.sums.data() + size_t{it->second} * dim;
        const float* g = gradient_ + i * dim;
        for (uint32_t j = 0; j < dim; ++j) sum[j] += g[j];
      }
      table.FinishRoundsLocked(decision_.completed);
    }
    table.rows_->Expire(table.now_, kSweepPerRow * count_ + 16);
    table.TakeAnswerableWaitersLocked(wakeups);
  }

  size_t payload_bytes() const override { return payload_bytes_; }

 private:
  friend class SparseTable;
  SparseTable* const table_;
  const proto::TensorChunk& header_;
  size_t count_ = 0;
  const float* gradient_ = nullptr;  // into the payload or `decoded_`
  std::vector<float> decoded_;
  size_t payload_bytes_ = 0;
  HeldBudgetBytes reserved_;  // for the new rows of a round's sums
  bool duplicate_ = false;
  std::unique_ptr<ClockBook> book_;
  PushDecision decision_;
};

SparseTable::SparseTable(std::string name, const TableEnvironment& env)
    : name_(std::move(name)), env_(env) {}

// Rounds still open (a table freed without Retire) give their sums' budget
// back as they go, and so do the rows.
SparseTable::~SparseTable() = default;

std::unique_ptr<Table> MakeSparseTable(std::string name, const TableEnvironment& env) {
  return std::make_unique<SparseTable>(std::move(name), env);
}

std::string SparseTable::Where() const { return absl::StrCat("sparse table '", name_, "'"); }

const ConsistencyController& SparseTable::controller() const {
  return own_controller_ != nullptr ? *own_controller_ : *env_.controller;
}

absl::Status SparseTable::CheckIds(const std::string& ids, size_t* count, const char* what) const {
  if (ids.size() % sizeof(int64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": ", what, " row_ids of ", ids.size(),
                                                   " bytes, not a whole number of int64 ids"));
  }
  const size_t n = ids.size() / sizeof(int64_t);
  if (n > kMaxRowsPerCall) {
    return absl::ResourceExhaustedError(absl::StrCat(Where(), ": ", what, " of ", n,
                                                     " rows, over the limit of ", kMaxRowsPerCall,
                                                     " rows per call"));
  }
  const int shards = env_.options->num_shards;
  const int shard = env_.options->shard;
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = IdAt(ids, i);
    const int owner = RowShard(id, shards);
    if (owner != shard) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), ": ", what, " of row ", id,
                                                     ", which belongs to shard ", owner,
                                                     ", not shard ", shard));
    }
  }
  *count = n;
  return absl::OkStatus();
}

absl::StatusOr<bool> SparseTable::Init(const proto::InitRequest& request) {
  if (request.num_elements() != 0 || !request.initial_values().empty() ||
      request.shape_size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": a sparse table takes no shape, element count or initial values"));
  }
  auto parsed = SparseRowsConfig::FromProto(request.sparse());
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(Where(), ": ", parsed.status().message()));
  std::unique_ptr<ConsistencyController> own;
  const std::string& sync = request.sparse().sync();
  const ShardStoreOptions& options = *env_.options;
  if (!sync.empty() || options.sync.mode == SyncMode::kLocal) {
    // Local SGD's delta rounds are the dense tensors'; a sparse table there
    // runs BSP rounds of its own.
    const std::string mode = sync.empty() ? "bsp" : sync;
    auto policy = SyncPolicy::FromFlags(mode, mode == "asp" ? -1 : request.sparse().staleness(), 1);
    if (!policy.ok() || policy->mode == SyncMode::kLocal) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), ": sync '", sync.substr(0, 32), "' with staleness ",
          request.sparse().staleness(), " is not bsp, asp or ssp with a bound of at least 1",
          policy.ok() ? "" : absl::StrCat(" (", policy.status().message(), ")")));
    }
    own = std::make_unique<ConsistencyController>(*policy, options.num_workers,
                                                  options.staleness_aware_lr,
                                                  options.max_pending_rounds);
  }
  absl::MutexLock lock(&mutex_);
  if (created_) {
    if (request.chunk() != part_) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), ": registered as part ",
                                                     request.chunk(), ", held as part ", part_));
    }
    // Names each setting that differs, with both values.
    std::vector<std::string> differ;
    const google::protobuf::Descriptor& fields = *proto::SparseTableConfig::descriptor();
    for (int i = 0; i < fields.field_count(); ++i) {
      const google::protobuf::FieldDescriptor* field = fields.field(i);
      std::string asked, held;
      google::protobuf::TextFormat::PrintFieldValueToString(request.sparse(), field, -1, &asked);
      google::protobuf::TextFormat::PrintFieldValueToString(config_, field, -1, &held);
      if (asked != held) {
        differ.push_back(absl::StrCat(field->name(), " ", asked.substr(0, 64), " (the table's: ",
                                      held.substr(0, 64), ")"));
      }
    }
    if (!differ.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), ": registered again with other settings: ", absl::StrJoin(differ, ", ")));
    }
    return false;
  }
  config_ = request.sparse();
  part_ = request.chunk();
  own_controller_ = std::move(own);
  rows_ = std::make_unique<SparseRows>(name_, *parsed, env_.budget);
  rows_->TrackChanges(options.track_sparse_changes);
  ClockBook book = controller().NewClockBook();
  const int workers = options.num_workers;
  if (*env_.restored) book.Restore(std::vector<int64_t>(workers, 0));
  for (int r = 0; r < workers; ++r) {
    if (env_.membership->departed(static_cast<uint32_t>(r))) book.Depart(static_cast<uint32_t>(r));
  }
  book_ = std::make_unique<ClockBook>(std::move(book));
  created_ = true;
  return true;
}

absl::StatusOr<std::unique_ptr<StagedPush>> SparseTable::Validate(
    const proto::TensorChunk& chunk, absl::string_view payload) {
  if (chunk.dtype() != proto::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": unsupported dtype ", chunk.dtype()));
  }
  uint32_t dim;
  {
    absl::ReaderMutexLock lock(&mutex_);
    if (!created_ || chunk.chunk() != part_) {
      return absl::NotFoundError(absl::StrCat(Where(), " part ", chunk.chunk(),
                                              " is not registered on shard ",
                                              env_.options->shard));
    }
    dim = rows_->dim();
  }
  auto push = std::make_unique<RowsPush>(this, chunk);
  size_t n = 0;
  if (auto status = CheckIds(chunk.row_ids(), &n, "push"); !status.ok()) return status;
  if (chunk.num_elements() != n * dim) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": push of ", n, " rows with ",
                                                   chunk.num_elements(), " elements; rows have ",
                                                   dim, " elements (dimension mismatch?)"));
  }
  if (Crc32c(payload.data(), payload.size()) != chunk.checksum()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": payload checksum mismatch"));
  }
  const size_t elements = n * dim;
  if (IsFloat32Wire(chunk.codec_params()) && chunk.codec() == 0) {
    if (payload.size() != elements * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), ": payload of ", payload.size(),
                                                     " bytes for ", n, " rows of ", dim,
                                                     " floats"));
    }
    if (reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) == 0) {
      push->gradient_ = reinterpret_cast<const float*>(payload.data());
    } else {
      push->decoded_.resize(elements);
      std::memcpy(push->decoded_.data(), payload.data(), payload.size());
      push->gradient_ = push->decoded_.data();
    }
  } else if (Is16BitWire(chunk.codec_params())) {
    auto codec = env_.codecs->Get(chunk.codec_params());
    if (!codec.ok()) return codec.status();
    if (static_cast<uint32_t>((*codec)->spec.id) != chunk.codec()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), ": codec id ", chunk.codec(),
                                                     " disagrees with '", chunk.codec_params(),
                                                     "'"));
    }
    push->decoded_.resize(elements);
    if (elements > 0) {
      if (auto status = (*codec)->decoder->Decode(payload, absl::MakeSpan(push->decoded_));
          !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(Where(), ": ", status.message()));
      }
    }
    push->gradient_ = push->decoded_.data();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": rows travel as float32, fp16 or bf16, not '",
                     chunk.codec_params().substr(0, 64), "'"));
  }
  if (!AllWithin(push->gradient_, elements)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": gradient contains NaN, Inf or an element of magnitude 2^40 "
                              "(about 1.1e12) or more"));
  }
  {
    absl::flat_hash_set<int64_t> seen;
    seen.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (!seen.insert(IdAt(chunk.row_ids(), i)).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), ": row ", IdAt(chunk.row_ids(), i),
            " pushed twice in one call (sum a repeated id's gradients first)"));
      }
    }
  }
  if (env_.membership->departed(chunk.rank())) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(), ": rank ", chunk.rank(), " has left the job"));
  }
  {
    absl::ReaderMutexLock lock(&mutex_);
    absl::StatusOr<PushClass> push_class =
        book_->ClassifyPush(chunk.rank(), chunk.clock(), *env_.membership);
    if (!push_class.ok()) {
      return absl::Status(push_class.status().code(),
                          absl::StrCat(Where(), ": ", push_class.status().message()));
    }
  }
  push->count_ = n;
  push->payload_bytes_ = payload.size();
  return std::unique_ptr<StagedPush>(std::move(push));
}

uint64_t SparseTable::RoundRowBytes() const {
  return uint64_t{rows_->dim()} * sizeof(float) + sizeof(std::pair<const int64_t, uint32_t>) + 1;
}

void SparseTable::FinishRoundsLocked(const std::vector<PushDecision::CompletedRound>& rounds) {
  const uint32_t dim = rows_->dim();
  for (const PushDecision::CompletedRound& completed : rounds) {
    auto it = rounds_.find(completed.clock);
    if (it == rounds_.end()) continue;  // nobody pushed a row that round
    const float scale = completed.contributors > 0 ? 1.0f / completed.contributors : 1.0f;
    RoundRows& round = it->second;
    // The sums' budget goes back first: the rows they create draw on it.
    round.held.Reset();
    for (const auto& [id, row] : round.index) {
      rows_->Apply(id, round.sums.data() + size_t{row} * dim, scale, completed.clock);
    }
    if (!round.index.empty()) env_.counters->optimizer_steps++;
    rounds_.erase(it);
  }
}

absl::StatusOr<PullOutcome> SparseTable::TryPull(const PullQuery& query, proto::TensorChunk* out,
                                                 const PullTarget& target) {
  const proto::ChunkRef& ref = *query.ref;
  size_t n = 0;
  if (auto status = CheckIds(ref.row_ids(), &n, "pull"); !status.ok()) return status;
  const bool half = Is16BitWire(ref.codec_params());
  if (!half && !IsFloat32Wire(ref.codec_params())) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": rows travel as float32, fp16 or bf16, not '",
                     ref.codec_params().substr(0, 64), "'"));
  }
  PullOutcome outcome;
  absl::MutexLock lock(&mutex_);
  if (!created_ || ref.chunk() != part_) {
    return absl::NotFoundError(absl::StrCat(Where(), " part ", ref.chunk(),
                                            " is not registered on shard ", env_.options->shard));
  }
  const uint32_t dim = rows_->dim();
  if (ref.num_elements() != n * dim) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": pull of ", n, " rows with ",
                                                   ref.num_elements(), " elements; rows have ",
                                                   dim, " elements (dimension mismatch?)"));
  }
  outcome.verdict = book_->CheckPull(query.clock);
  const PullVerdict& verdict = outcome.verdict;
  if (!verdict.may_answer) {
    if (*env_.closed) return absl::UnavailableError("shard is shutting down");
    if (retired_) {
      return absl::FailedPreconditionError(
          absl::StrCat("pull of ", Where(), ": the run ended and a new one started"));
    }
    if (auto failure = env_.membership->failure(); !failure.ok()) return failure;
    return outcome;
  }
  outcome.ready = true;
  now_ = std::max(now_, query.clock);
  out->set_key(ref.key());
  out->set_chunk(ref.chunk());
  out->set_rank(query.rank);
  out->set_clock(query.clock);
  out->set_min_clock(verdict.min_clock);
  out->set_dtype(proto::DTYPE_FLOAT32);
  out->set_num_elements(n * dim);
  size_t bytes = n * dim * sizeof(float);
  if (!half) {
    char* payload = target.allocate(bytes);
    // Rows straight into the reply: an aligned buffer from the sink.
    std::vector<float> row(payload != nullptr && reinterpret_cast<uintptr_t>(payload) % 4 == 0
                               ? 0
                               : dim);
    for (size_t i = 0; i < n; ++i) {
      if (row.empty()) {
        rows_->Lookup(IdAt(ref.row_ids(), i), query.clock,
                      reinterpret_cast<float*>(payload) + i * dim);
      } else {
        rows_->Lookup(IdAt(ref.row_ids(), i), query.clock, row.data());
        std::memcpy(payload + i * dim * sizeof(float), row.data(), dim * sizeof(float));
      }
    }
    out->set_checksum(Crc32c(payload, bytes));
  } else {
    std::vector<float> values(n * dim);
    for (size_t i = 0; i < n; ++i) {
      rows_->Lookup(IdAt(ref.row_ids(), i), query.clock, values.data() + i * dim);
    }
    std::unique_ptr<Codec>& codec = ref.codec_params() == "fp16" ? fp16_ : bf16_;
    if (codec == nullptr) {
      auto spec = env_.codecs->Get(ref.codec_params());
      if (!spec.ok()) return spec.status();
      auto made = CreateCodec((*spec)->spec);
      if (!made.ok()) return made.status();
      codec = std::move(*made);
    }
    std::string encoded;
    if (auto status = codec->Encode(values, CodecContext{}, &encoded); !status.ok()) {
      return absl::Status(status.code(), absl::StrCat("pull of ", Where(), ": ", status.message()));
    }
    bytes = encoded.size();
    char* payload = target.allocate(bytes);
    std::memcpy(payload, encoded.data(), bytes);
    out->set_codec(static_cast<uint32_t>(codec->id()));
    out->set_codec_params(ref.codec_params());
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

bool SparseTable::Park(const PullQuery& query, std::shared_ptr<PullWaiter> waiter) {
  absl::MutexLock lock(&mutex_);
  if (*env_.closed || retired_ || !created_ || !env_.membership->failure().ok()) return false;
  if (book_->CheckPull(query.clock).may_answer) return false;
  waiters_.push_back({query.clock, std::move(waiter)});
  (*env_.blocked_pulls)++;
  return true;
}

void SparseTable::Unpark(const PullQuery& query, const PullWaiter* waiter) {
  (void)query;
  absl::MutexLock lock(&mutex_);
  for (size_t i = 0; i < waiters_.size(); ++i) {
    if (waiters_[i].waiter.get() != waiter) continue;
    waiters_[i] = std::move(waiters_.back());
    waiters_.pop_back();
    (*env_.blocked_pulls)--;
    return;
  }
}

void SparseTable::TakeAllWaitersLocked(PullWakeups& wakeups) {
  for (Parked& parked : waiters_) wakeups.Take(std::move(parked.waiter));
  waiters_.clear();
}

void SparseTable::TakeAnswerableWaitersLocked(PullWakeups& wakeups) {
  for (size_t i = 0; i < waiters_.size();) {
    if (!book_->CheckPull(waiters_[i].clock).may_answer) {
      ++i;
      continue;
    }
    wakeups.Take(std::move(waiters_[i].waiter));
    waiters_[i] = std::move(waiters_.back());
    waiters_.pop_back();
  }
}

void SparseTable::Depart(uint32_t rank, PullWakeups& wakeups) {
  absl::MutexLock lock(&mutex_);
  if (!created_) return;
  FinishRoundsLocked(book_->Depart(rank));
  TakeAllWaitersLocked(wakeups);
}

void SparseTable::RebaseFromWorker(uint32_t rank, uint32_t part, int64_t next_clock,
                                   PullWakeups& wakeups) {
  absl::MutexLock lock(&mutex_);
  if (!created_ || part != part_) return;
  std::vector<PushDecision::CompletedRound> completed;
  if (!book_->RebaseFromWorker(rank, next_clock, &completed)) return;
  FinishRoundsLocked(completed);
  TakeAllWaitersLocked(wakeups);
}

void SparseTable::MergeNextClocks(std::vector<int64_t>* next) const {
  // The table's clock is its own, not the training clock.
  (void)next;
}

void SparseTable::WakeAll(PullWakeups& wakeups) {
  absl::MutexLock lock(&mutex_);
  TakeAllWaitersLocked(wakeups);
}

void SparseTable::Retire(PullWakeups& wakeups) {
  absl::MutexLock lock(&mutex_);
  retired_ = true;
  rounds_.clear();  // their sums' budget goes back with them
  TakeAllWaitersLocked(wakeups);
}

void SparseTable::Export(std::vector<SlotCheckpoint>* out, bool changes_only) const {
  absl::MutexLock lock(&mutex_);
  if (!created_) return;
  SparseRows::Dump dump = rows_->Export(changes_only);
  // Taken under the same lock as the rows: the next change set starts here.
  rows_->MarkClean();
  SlotCheckpoint saved;
  saved.key = name_;
  saved.chunk = part_;
  saved.values = std::move(dump.values);
  saved.optimizer_first = std::move(dump.state);
  saved.pushed = book_->CheckpointClocks();
  saved.kind = static_cast<uint32_t>(proto::TABLE_SPARSE);
  saved.own_clock = true;
  saved.sparse_config = config_.SerializeAsString();
  saved.row_ids = std::move(dump.ids);
  saved.removed_row_ids = std::move(dump.removed);
  saved.row_steps.assign(dump.steps.begin(), dump.steps.end());
  out->push_back(std::move(saved));
}

absl::Status SparseTable::Import(const SlotCheckpoint& saved) {
  if (saved.kind != static_cast<uint32_t>(proto::TABLE_SPARSE)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint holds ", Where(), " as table kind ", saved.kind));
  }
  proto::InitRequest init;
  init.set_key(name_);
  init.set_chunk(saved.chunk);
  init.set_kind(proto::TABLE_SPARSE);
  if (!init.mutable_sparse()->ParseFromString(saved.sparse_config)) {
    return absl::DataLossError(absl::StrCat("checkpoint of ", Where(), ": unreadable settings"));
  }
  {
    absl::MutexLock lock(&mutex_);
    if (created_) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint holds ", Where(), " twice"));
    }
  }
  auto created = Init(init);
  if (!created.ok()) return created.status();
  absl::MutexLock lock(&mutex_);
  ClockBook book = controller().NewClockBook();
  book.Restore(saved.pushed);
  *book_ = std::move(book);
  SparseRows::Dump dump;
  dump.ids = saved.row_ids;
  dump.values = saved.values;
  dump.state = saved.optimizer_first;
  dump.steps.reserve(saved.row_steps.size());
  for (uint64_t steps : saved.row_steps) {
    dump.steps.push_back(static_cast<uint32_t>(std::min<uint64_t>(steps, ~0u - 1)));
  }
  return rows_->Import(dump);
}

TensorHeld SparseTable::held() const {
  absl::MutexLock lock(&mutex_);
  TensorHeld held;
  held.name = name_;
  if (!created_) return held;
  const SparseRowsStats stats = rows_->stats();
  held.shape = {stats.rows, rows_->dim()};
  held.chunks = 1;
  held.elements = stats.rows * rows_->dim();
  return held;
}

uint64_t SparseTable::param_bytes() const {
  absl::MutexLock lock(&mutex_);
  return created_ ? rows_->stats().reserved_bytes : 0;
}

absl::StatusOr<std::vector<float>> SparseTable::Snapshot(uint32_t part) const {
  absl::MutexLock lock(&mutex_);
  if (!created_ || part != part_) {
    return absl::NotFoundError(absl::StrCat(Where(), " part ", part, " not found"));
  }
  return rows_->Export(false).values;
}

SparseRowsStats SparseTable::stats() const {
  absl::MutexLock lock(&mutex_);
  return created_ ? rows_->stats() : SparseRowsStats{};
}

bool SparseTable::FindRowForTesting(int64_t id, std::vector<float>* values) const {
  absl::MutexLock lock(&mutex_);
  return created_ && rows_->Find(id, values);
}

}  // namespace harrier
