#include "server/shard_store.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/payload_view.h"
#include "server/sparse_table.h"
#include "spdlog/spdlog.h"

namespace harrier {
namespace {

std::string Where(const std::string& key, uint32_t chunk) {
  return absl::StrCat("key '", key, "' chunk ", chunk);
}

// Holds the locks of a call's parts, taken in the order given (sorted by
// address, so two calls never wait on each other's locks in a cycle). The
// set is known only at run time, which the thread-safety analysis cannot
// follow; each part asserts its own lock where it relies on it.
class PartLocks {
 public:
  explicit PartLocks(std::vector<absl::Mutex*> sorted) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : mutexes_(std::move(sorted)) {
    for (absl::Mutex* mutex : mutexes_) mutex->Lock();
  }
  ~PartLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = mutexes_.rbegin(); it != mutexes_.rend(); ++it) (*it)->Unlock();
  }
  PartLocks(const PartLocks&) = delete;
  PartLocks& operator=(const PartLocks&) = delete;

 private:
  const std::vector<absl::Mutex*> mutexes_;
};

// Copies `pieces` into `buffer` (float-aligned) and views the copy.
absl::string_view Join(absl::Span<const absl::string_view> pieces,
                       std::unique_ptr<float[]>* buffer) {
  size_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += piece.size();
  buffer->reset(new float[(bytes + sizeof(float) - 1) / sizeof(float)]);
  CopyPieces(pieces, buffer->get());
  return absl::string_view(reinterpret_cast<const char*>(buffer->get()), bytes);
}

}  // namespace

ShardStore::ShardStore(ShardStoreOptions options, std::unique_ptr<Optimizer> optimizer,
                       std::unique_ptr<Partitioner> partitioner)
    : options_(options),
      controller_(options.sync, options.num_workers, options.staleness_aware_lr,
                  options.max_pending_rounds),
      optimizer_(controller_.ShardOptimizer(std::move(optimizer))),
      round_controller_(SyncPolicy{}, options.num_workers, /*staleness_aware_lr=*/false,
                        options.max_pending_rounds),
      average_optimizer_(CreateAverageOptimizer()),
      partitioner_(partitioner ? std::move(partitioner)
                               : std::make_unique<HashPartitioner>(options.num_shards)),
      membership_(options.num_workers),
      budget_(options.shard, options.max_chunks, options.max_param_bytes),
      last_view_version_(
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count())) {
  if (options_.apply_threads > 1) {
    apply_pool_ = std::make_unique<ParallelForPool>(options_.apply_threads);
  }
  env_.options = &options_;
  env_.controller = &controller_;
  env_.optimizer = optimizer_.get();
  env_.round_controller = &round_controller_;
  env_.average_optimizer = average_optimizer_.get();
  env_.membership = &membership_;
  env_.codecs = &codecs_;
  env_.counters = &counters_;
  env_.budget = &budget_;
  env_.apply_pool = apply_pool_.get();
  env_.spare_bytes = &spare_bytes_;
  env_.blocked_pulls = &blocked_pulls_;
  env_.last_view_version = &last_view_version_;
  env_.closed = &closed_;
  env_.restored = &restored_;
}

ShardStore::~ShardStore() { Close(); }

std::shared_ptr<Table> ShardStore::FindTable(const std::string& name) const {
  absl::ReaderMutexLock lock(&tables_mutex_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second;
}

absl::Status ShardStore::CheckOwnership(const std::string& key, uint32_t chunk) const {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  const int owner = partitioner_->ShardFor(key, chunk);
  if (owner != options_.shard) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, chunk), " belongs to shard ", owner,
                                                   ", not shard ", options_.shard,
                                                   " (client and server disagree on num_shards?)"));
  }
  return absl::OkStatus();
}

void ShardStore::ForEachTable(const std::function<void(Table&, PullWakeups&)>& visit) {
  PullWakeups wakeups(blocked_pulls_);  // after every lock is released
  absl::ReaderMutexLock lock(&tables_mutex_);
  for (auto& entry : tables_) visit(*entry.second, wakeups);
}

absl::StatusOr<bool> ShardStore::Init(const proto::InitRequest& request) {
  if (closed_) return absl::UnavailableError("shard is shutting down");
  const std::string& key = request.key();
  if (auto status = CheckOwnership(key, request.chunk()); !status.ok()) return status;
  const TableFactory* make = FindTableKind(request.kind());
  if (make == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key, request.chunk()), ": unknown table kind ", request.kind()));
  }
  // Exclusive for the whole Init: a table and its first part are created
  // together, and a refused Init leaves no empty table behind.
  absl::MutexLock lock(&tables_mutex_);
  auto& table = tables_[key];
  const bool created = table == nullptr;
  if (created) table = (*make)(key, env_);
  if (table->kind() != request.kind()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, request.chunk()), ": table kind ",
                                                   request.kind(), " but '", key,
                                                   "' is a table of kind ", table->kind()));
  }
  absl::StatusOr<bool> init = table->Init(request);
  if (!init.ok() && created) tables_.erase(key);
  return init;
}

bool ShardStore::ReadsSplitPayload(const proto::TensorChunk& header) const {
  const std::shared_ptr<Table> table = FindTable(header.key());
  return table != nullptr && table->ReadsSplitPayload(header);
}

absl::Status ShardStore::Push(const std::vector<proto::TensorChunk>& chunks, PushResult* result) {
  std::vector<PushChunkView> views(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) views[i] = {&chunks[i], chunks[i].payload()};
  return Push(views, result);
}

absl::Status ShardStore::Push(const std::vector<PushChunkView>& views, PushResult* result) {
  if (closed_) return absl::UnavailableError("shard is shutting down");
  if (auto failure = membership_.failure(); !failure.ok()) return failure;
  auto refuse = [this](absl::Status status) {
    counters_.rejected++;
    return status;
  };
  // Every part validated by its table before anything changes.
  std::vector<std::unique_ptr<float[]>> joined;  // split payloads copied together
  std::vector<std::unique_ptr<StagedPush>> parts(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const proto::TensorChunk& chunk = *views[i].header;
    for (size_t j = 0; j < i; ++j) {
      if (views[j].header->key() == chunk.key() && views[j].header->chunk() == chunk.chunk()) {
        return refuse(absl::InvalidArgumentError(
            absl::StrCat(Where(chunk.key(), chunk.chunk()), ": pushed twice in one call")));
      }
    }
    if (auto status = CheckOwnership(chunk.key(), chunk.chunk()); !status.ok()) {
      return refuse(status);
    }
    if (auto status = membership_.CheckRank(chunk.rank(), Where(chunk.key(), chunk.chunk()));
        !status.ok()) {
      return refuse(status);
    }
    const std::shared_ptr<Table> table = FindTable(chunk.key());
    if (table == nullptr) {
      return refuse(absl::NotFoundError(absl::StrCat(
          Where(chunk.key(), chunk.chunk()), " is not registered on shard ", options_.shard)));
    }
    absl::StatusOr<std::unique_ptr<StagedPush>> part;
    if (views[i].pieces.empty()) {
      part = table->Validate(chunk, views[i].payload);
    } else if (table->ReadsSplitPayload(chunk)) {
      part = table->ValidateSplit(chunk, views[i].pieces);
    } else {
      // The transport asked before the key's table was replaced by one
      // that reads contiguous payloads only (a new run): joined here, for
      // this call.
      part = table->Validate(chunk, Join(views[i].pieces, &joined.emplace_back()));
    }
    if (!part.ok()) return refuse(part.status());
    parts[i] = std::move(*part);
  }
  // One decision for the whole call: every part it touches is locked (in
  // address order), re-checked and staged, and then all are applied or
  // none. Without this a call racing another call of its own rank could be
  // refused with some parts applied.
  std::vector<absl::Mutex*> order;
  order.reserve(parts.size());
  for (const auto& part : parts) order.push_back(&part->mutex());
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  PullWakeups wakeups(blocked_pulls_);  // after the locks are released
  PartLocks locks(std::move(order));
  std::vector<bool> fresh(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::StatusOr<bool> recheck = parts[i]->Recheck();
    if (!recheck.ok()) return refuse(recheck.status());
    fresh[i] = *recheck;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (auto status = parts[i]->Stage(); !status.ok()) {
      for (size_t j = 0; j <= i; ++j) parts[j]->Unstage();
      return refuse(status);
    }
  }
  PushResult counts;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!fresh[i]) {
      ++counts.duplicate;
      continue;
    }
    parts[i]->Commit(wakeups);
    ++counts.applied;
    counters_.pushes++;
    counters_.bytes_in += parts[i]->payload_bytes();
  }
  counters_.duplicate_pushes += counts.duplicate;
  if (result != nullptr) *result = counts;
  if (!views.empty()) membership_.Heard(views.front().header->rank());
  return absl::OkStatus();
}

absl::StatusOr<PullOutcome> ShardStore::TryPull(uint32_t rank, int64_t clock,
                                                const proto::ChunkRef& ref, proto::TensorChunk* out,
                                                const PullTarget& target) {
  if (auto status = CheckOwnership(ref.key(), ref.chunk()); !status.ok()) return status;
  if (auto status = membership_.CheckRank(rank, Where(ref.key(), ref.chunk())); !status.ok()) {
    return status;
  }
  if (clock < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(ref.key(), ref.chunk()), ": negative clock ", clock));
  }
  const std::shared_ptr<Table> table = FindTable(ref.key());
  if (table == nullptr) {
    return absl::NotFoundError(absl::StrCat(Where(ref.key(), ref.chunk()),
                                            " is not registered on shard ", options_.shard));
  }
  return table->TryPull(PullQuery{rank, clock, &ref}, out, target);
}

bool ShardStore::Park(int64_t clock, const proto::ChunkRef& ref,
                      std::shared_ptr<PullWaiter> waiter) {
  const std::shared_ptr<Table> table = FindTable(ref.key());
  if (table == nullptr) return false;
  return table->Park(PullQuery{0, clock, &ref}, std::move(waiter));
}

void ShardStore::Unpark(const proto::ChunkRef& ref, const PullWaiter* waiter) {
  const std::shared_ptr<Table> table = FindTable(ref.key());
  if (table == nullptr) return;  // dropped by StartRun, which woke its waiters
  table->Unpark(PullQuery{0, 0, &ref}, waiter);
}

absl::Status ShardStore::CheckPullCodec(const std::string& codec_params) {
  if (codec_params.empty() || codec_params == "none") return absl::OkStatus();
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
  ForEachTable([rank](Table& table, PullWakeups& wakeups) { table.Depart(rank, wakeups); });
  return true;
}

void ShardStore::RebaseFromWorker(
    uint32_t rank, const google::protobuf::RepeatedPtrField<proto::ChunkClock>& pushed) {
  if (rank >= static_cast<uint32_t>(options_.num_workers)) return;
  PullWakeups wakeups(blocked_pulls_);
  for (const proto::ChunkClock& chunk : pushed) {
    const std::shared_ptr<Table> table = FindTable(chunk.key());
    if (table != nullptr) table->RebaseFromWorker(rank, chunk.chunk(), chunk.next_clock(), wakeups);
  }
}

void ShardStore::WakeAllPulls() {
  ForEachTable([](Table& table, PullWakeups& wakeups) { table.WakeAll(wakeups); });
}

void ShardStore::Close() {
  closed_ = true;
  WakeAllPulls();
}

void ShardStore::StartRun() {
  absl::flat_hash_map<std::string, std::shared_ptr<Table>> ended;
  {
    absl::MutexLock lock(&tables_mutex_);
    ended.swap(tables_);
    restored_ = false;
  }
  membership_.Reset();
  // Calls still holding an old table finish on it (it is freed with the
  // last of them, and gives its parameter budget back then: until then its
  // memory still counts against the new run's); pulls waiting on one are
  // woken and refused.
  PullWakeups wakeups(blocked_pulls_);
  for (auto& entry : ended) entry.second->Retire(wakeups);
}

int64_t ShardStore::NextClock(uint32_t rank) const {
  if (rank >= static_cast<uint32_t>(options_.num_workers)) return -1;
  return NextClocks()[rank];
}

std::vector<int64_t> ShardStore::NextClocks() const {
  std::vector<int64_t> next(options_.num_workers, -1);
  absl::ReaderMutexLock lock(&tables_mutex_);
  for (const auto& entry : tables_) entry.second->MergeNextClocks(&next);
  return next;
}

ShardStore::Holdings ShardStore::holdings() const {
  Holdings holdings;
  absl::ReaderMutexLock lock(&tables_mutex_);
  holdings.keys = tables_.size();
  holdings.chunks = budget_.chunks();
  holdings.param_bytes = budget_.bytes();
  holdings.spare_bytes = spare_bytes_;
  return holdings;
}

SparseRowsStats ShardStore::sparse_stats() const {
  SparseRowsStats sum;
  absl::ReaderMutexLock lock(&tables_mutex_);
  for (const auto& entry : tables_) {
    if (entry.second->kind() != proto::TABLE_SPARSE) continue;
    const SparseRowsStats one = static_cast<const SparseTable&>(*entry.second).stats();
    sum.rows += one.rows;
    sum.admitted += one.admitted;
    sum.evicted += one.evicted;
    sum.expired += one.expired;
    sum.not_admitted_pushes += one.not_admitted_pushes;
    sum.reserved_bytes += one.reserved_bytes;
  }
  sum.bytes_per_row = sum.rows == 0 ? 0.0 : static_cast<double>(sum.reserved_bytes) / sum.rows;
  return sum;
}

std::vector<TensorHeld> ShardStore::tensors_held() const {
  std::map<std::string, TensorHeld> by_name;
  {
    absl::ReaderMutexLock lock(&tables_mutex_);
    for (const auto& entry : tables_) by_name[entry.first] = entry.second->held();
  }
  std::vector<TensorHeld> out;
  out.reserve(by_name.size());
  for (auto& entry : by_name) out.push_back(std::move(entry.second));
  return out;
}

ShardCheckpoint ShardStore::Export(bool changes_only) const {
  ShardCheckpoint checkpoint;
  checkpoint.shard = options_.shard;
  checkpoint.num_shards = options_.num_shards;
  checkpoint.num_workers = options_.num_workers;
  checkpoint.sync = options_.sync.ToString();
  checkpoint.optimizer = optimizer_->options().kind;
  absl::ReaderMutexLock lock(&tables_mutex_);
  for (const auto& entry : tables_) entry.second->Export(&checkpoint.slots, changes_only);
  return checkpoint;
}

absl::Status ShardStore::Import(const ShardCheckpoint& checkpoint) {
  if (checkpoint.shard != options_.shard || checkpoint.num_shards != options_.num_shards ||
      checkpoint.num_workers != options_.num_workers) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint is for shard ", checkpoint.shard, "/", checkpoint.num_shards,
                     " with ", checkpoint.num_workers, " workers; this is shard ", options_.shard,
                     "/", options_.num_shards, " with ", options_.num_workers));
  }
  // Optimizer state of another kind would be read as this kind's (Adam's
  // first moment as momentum's velocity, say): refused. A format-1
  // checkpoint does not say its kind and is taken as it is.
  const std::string& kind = optimizer_->options().kind;
  if (!checkpoint.optimizer.empty() && checkpoint.optimizer != kind) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint version ", checkpoint.version, " holds optimizer state of kind '",
                     checkpoint.optimizer, "' but this shard runs optimizer '", kind,
                     "'; start it with --optimizer=", checkpoint.optimizer,
                     " (the same --sync), or with another --checkpoint_dir"));
  }
  absl::MutexLock lock(&tables_mutex_);
  if (!tables_.empty()) return absl::FailedPreconditionError("import into a non-empty shard");
  for (const SlotCheckpoint& saved : checkpoint.slots) {
    const TableFactory* make = FindTableKind(static_cast<proto::TableKind>(saved.kind));
    if (make == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint holds '", saved.key, "' as table kind ", saved.kind,
          ", which this shard does not know"));
    }
    auto& table = tables_[saved.key];
    if (table == nullptr) table = (*make)(saved.key, env_);
    if (auto status = table->Import(saved); !status.ok()) return status;
  }
  restored_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ShardStore::Snapshot(const std::string& key,
                                                        uint32_t chunk) const {
  const std::shared_ptr<Table> table = FindTable(key);
  if (table == nullptr) return absl::NotFoundError(absl::StrCat(Where(key, chunk), " not found"));
  return table->Snapshot(chunk);
}

ShardStore::BuffersForTesting ShardStore::BuffersOfForTesting(const std::string& key,
                                                              uint32_t chunk) const {
  const std::shared_ptr<Table> table = FindTable(key);
  if (table == nullptr ||
      (table->kind() != proto::TABLE_DENSE && table->kind() != proto::TABLE_AVERAGE)) {
    return {};
  }
  return static_cast<const DenseTable&>(*table).BuffersOfForTesting(chunk);
}

}  // namespace harrier
