#include "worker/sparse_tables.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec/codec.h"
#include "common/crc32c.h"
#include "common/partitioner.h"
#include "common/row_placement.h"
#include "worker/control_client.h"

namespace harrier {
namespace {

// Ids in one call of a shard (the shards refuse more: server/sparse_rows.h
// kMaxRowsPerCall).
constexpr size_t kMaxRowsPerCall = 1u << 20;

}  // namespace

int SparseRowShard(int64_t id, int num_shards) { return RowShard(id, num_shards); }

struct SparseTables::Table {
  std::string name;
  SparseTableOptions options;
  uint32_t dim = 0;
  std::string wire;                 // "" (float32), "fp16" or "bf16"
  std::vector<uint32_t> part;       // the table's chunk on each shard
  std::atomic<int64_t> clock{0};    // pushes started
  // Encoders of 16-bit pushes (stateless; one at a time).
  absl::Mutex codec_mutex;
  std::unique_ptr<Codec> encoder ABSL_GUARDED_BY(codec_mutex);
  std::unique_ptr<Codec> decoder;   // const Decode: shared
  absl::Mutex cache_mutex;
  std::unique_ptr<RowCache> cache ABSL_GUARDED_BY(cache_mutex);
  std::atomic<uint64_t> rows_pulled{0}, rows_pushed{0}, ids_requested{0};
  std::atomic<uint64_t> bytes_pushed{0}, bytes_pulled{0};
  // Per shard, one past the last clock it acknowledged (0: none).
  mutable absl::Mutex ack_mutex;
  std::vector<int64_t> acknowledged ABSL_GUARDED_BY(ack_mutex);
};

SparseTables::SparseTables(SparseTablesConfig config, std::vector<ShardTransport*> transports,
                           ControlClient& control, OperationEngine& engine,
                           const Partitioner& partitioner)
    : config_(std::move(config)),
      transports_(std::move(transports)),
      control_(control),
      engine_(engine),
      partitioner_(partitioner) {}

SparseTables::~SparseTables() = default;

std::shared_ptr<SparseTables::Table> SparseTables::Find(const std::string& name) const {
  absl::MutexLock lock(&mutex_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second;
}

bool SparseTables::Has(const std::string& name) const { return Find(name) != nullptr; }

absl::Status SparseTables::Register(const std::string& name, const SparseTableOptions& options) {
  if (name.empty()) return absl::InvalidArgumentError("sparse table: empty name");
  if (options.dim <= 0 || options.dim > (int64_t{1} << 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse table '", name, "': dim ", options.dim, " outside [1, 65536]"));
  }
  auto table = std::make_shared<Table>();
  table->name = name;
  table->options = options;
  table->dim = static_cast<uint32_t>(options.dim);
  if (options.wire_dtype == "fp16" || options.wire_dtype == "bf16") {
    table->wire = options.wire_dtype;
    auto spec = CodecSpec::Parse(table->wire);
    if (!spec.ok()) return spec.status();
    auto encoder = CreateCodec(*spec);
    auto decoder = CreateCodec(*spec);
    if (!encoder.ok()) return encoder.status();
    if (!decoder.ok()) return decoder.status();
    absl::MutexLock lock(&table->codec_mutex);
    table->encoder = std::move(*encoder);
    table->decoder = std::move(*decoder);
  } else if (options.wire_dtype != "float32" && !options.wire_dtype.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse table '", name, "': wire_dtype '", options.wire_dtype,
        "' is not float32, fp16 or bf16"));
  }
  if (options.cache_rows > 0) {
    if (options.cache_staleness < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", name,
                                                     "': negative cache_staleness"));
    }
    absl::MutexLock lock(&table->cache_mutex);
    table->cache =
        std::make_unique<RowCache>(options.cache_rows, table->dim, options.cache_staleness);
  }
  proto::InitRequest request;
  request.set_job(config_.job);
  request.set_rank(config_.rank);
  *request.mutable_session() = config_.session;
  request.set_key(name);
  request.set_dtype(proto::DTYPE_FLOAT32);
  request.set_kind(proto::TABLE_SPARSE);
  request.set_own_clock(true);
  proto::SparseTableConfig& sparse = *request.mutable_sparse();
  sparse.set_dim(table->dim);
  sparse.set_optimizer(options.optimizer);
  sparse.set_lr(options.lr);
  sparse.set_beta1(options.beta1);
  sparse.set_beta2(options.beta2);
  sparse.set_epsilon(options.epsilon);
  sparse.set_initial_accumulator(options.initial_accumulator);
  sparse.set_init_scale(options.init_scale);
  sparse.set_seed(options.seed);
  sparse.set_max_rows(options.max_rows);
  sparse.set_max_bytes(options.max_bytes);
  sparse.set_eviction(options.eviction);
  sparse.set_ttl_steps(options.ttl_steps);
  sparse.set_admit_after(options.admit_after);
  sparse.set_admit_probability(options.admit_probability);
  sparse.set_sync(options.sync);
  sparse.set_staleness(options.staleness);
  const int shards = static_cast<int>(transports_.size());
  table->part.assign(shards, 0);
  {
    absl::MutexLock lock(&table->ack_mutex);
    table->acknowledged.assign(shards, 0);
  }
  for (int shard = 0; shard < shards; ++shard) {
    // The table's part on a shard is a chunk the shards' partitioner places
    // there, so that every placement check of the request path holds.
    bool found = false;
    for (uint32_t chunk = 0; chunk < 64u * static_cast<uint32_t>(shards) && !found; ++chunk) {
      if (partitioner_.ShardFor(name, chunk) == shard) {
        table->part[shard] = chunk;
        found = true;
      }
    }
    if (!found) {
      return absl::InternalError(
          absl::StrCat("sparse table '", name, "': no chunk of it is placed on shard ", shard));
    }
    request.set_chunk(table->part[shard]);
    if (auto status = control_.Init(shard, request); !status.ok()) return status;
  }
  absl::MutexLock lock(&mutex_);
  auto [it, added] = tables_.emplace(name, table);
  if (!added) {
    return absl::AlreadyExistsError(
        absl::StrCat("sparse table '", name, "' is already registered by this worker"));
  }
  return absl::OkStatus();
}

void SparseTables::OnShard(Operation& op, int shard, OperationEngine::Attempt attempt,
                           OperationEngine::TaskDone done) {
  engine_.WithRetries(op.canceller(), std::move(attempt),
                      [this, shard, done = std::move(done)](absl::Status status) {
                        if (!status.ok()) {
                          status = absl::Status(
                              status.code(),
                              absl::StrCat(config_.shard_name(shard), ": ", status.message()));
                        }
                        done(std::move(status));
                      });
}

namespace {

// The distinct ids of a call, in first-seen order, and for each position of
// the caller's list the distinct id it is.
struct Distinct {
  std::vector<int64_t> ids;
  std::vector<uint32_t> of_position;
};

Distinct Deduplicate(absl::Span<const int64_t> ids) {
  Distinct distinct;
  absl::flat_hash_map<int64_t, uint32_t> index;
  index.reserve(ids.size());
  distinct.of_position.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, added] = index.emplace(ids[i], static_cast<uint32_t>(distinct.ids.size()));
    if (added) distinct.ids.push_back(ids[i]);
    distinct.of_position[i] = it->second;
  }
  return distinct;
}


// Calls fn(k, row) for each of the rows of `row_bytes` in `payload`, in
// order; a row split over two pieces is gathered into a buffer first.
template <typename Fn>
void ForEachRow(const PayloadView& payload, size_t row_bytes, Fn fn) {
  std::string straddling(row_bytes, '\0');
  size_t k = 0;
  size_t filled = 0;  // bytes of row k gathered into `straddling`
  for (absl::string_view piece : payload.pieces()) {
    const char* at = piece.data();
    size_t left = piece.size();
    if (filled > 0) {
      const size_t take = std::min(left, row_bytes - filled);
      std::memcpy(straddling.data() + filled, at, take);
      filled += take;
      at += take;
      left -= take;
      if (filled < row_bytes) continue;
      fn(k++, straddling.data());
      filled = 0;
    }
    for (; left >= row_bytes; at += row_bytes, left -= row_bytes) fn(k++, at);
    if (left > 0) {
      std::memcpy(straddling.data(), at, left);
      filled = left;
    }
  }
}

}  // namespace

OperationHandle SparseTables::PullRows(const std::string& name, absl::Span<const int64_t> ids,
                                       absl::Span<float> out) {
  const std::string what = absl::StrCat("pull rows of '", name, "'");
  std::shared_ptr<Table> table = Find(name);
  if (table == nullptr) {
    return engine_.Failed(OpKind::kPull, what,
                          absl::NotFoundError(absl::StrCat("sparse table '", name,
                                                           "' is not registered")));
  }
  const uint32_t dim = table->dim;
  if (out.size() != ids.size() * dim) {
    return engine_.Failed(
        OpKind::kPull, what,
        absl::InvalidArgumentError(absl::StrCat(what, ": ", ids.size(), " ids need ",
                                                ids.size() * dim, " floats of output, got ",
                                                out.size())));
  }
  const int64_t clock = table->clock.load();
  table->ids_requested += ids.size();
  // Shared by the shards' calls: what each distinct id is and where its row
  // goes.
  struct Pull {
    Distinct distinct;
    std::vector<uint32_t> first;  // per distinct id, its first position
    std::vector<uint32_t> next;   // per position, the next with the same id (~0u: none)
    float* out = nullptr;
    std::vector<std::vector<uint32_t>> of_shard;  // distinct indices per shard
    std::vector<proto::PullRequest> requests;
  };
  auto pull = std::make_shared<Pull>();
  pull->distinct = Deduplicate(ids);
  pull->out = out.data();
  const size_t distinct = pull->distinct.ids.size();
  pull->first.assign(distinct, ~0u);
  pull->next.assign(ids.size(), ~0u);
  for (size_t i = ids.size(); i-- > 0;) {
    const uint32_t d = pull->distinct.of_position[i];
    pull->next[i] = pull->first[d];
    pull->first[d] = static_cast<uint32_t>(i);
  }
  // Row bytes (any alignment) into every position of distinct id d.
  auto scatter = [pull, dim](uint32_t d, const void* row) {
    for (uint32_t i = pull->first[d]; i != ~0u; i = pull->next[i]) {
      std::memcpy(pull->out + size_t{i} * dim, row, dim * sizeof(float));
    }
  };
  std::vector<uint32_t> missing;
  {
    absl::MutexLock lock(&table->cache_mutex);
    std::vector<float> row(dim);
    for (uint32_t d = 0; d < distinct; ++d) {
      if (table->cache != nullptr && table->cache->Get(pull->distinct.ids[d], clock, row.data())) {
        scatter(d, row.data());
      } else {
        missing.push_back(d);
      }
    }
  }
  const int shards = static_cast<int>(transports_.size());
  pull->of_shard.resize(shards);
  for (uint32_t d : missing) {
    pull->of_shard[SparseRowShard(pull->distinct.ids[d], shards)].push_back(d);
  }
  for (int shard = 0; shard < shards; ++shard) {
    if (pull->of_shard[shard].size() > kMaxRowsPerCall) {
      return engine_.Failed(
          OpKind::kPull, what,
          absl::InvalidArgumentError(absl::StrCat(what, ": ", pull->of_shard[shard].size(),
                                                  " distinct ids on shard ", shard,
                                                  ", over the limit of ", kMaxRowsPerCall,
                                                  " per call")));
    }
  }
  table->rows_pulled += missing.size();
  pull->requests.resize(shards);
  std::vector<OperationEngine::Task> tasks;
  for (int shard = 0; shard < shards; ++shard) {
    const std::vector<uint32_t>& mine = pull->of_shard[shard];
    if (mine.empty()) continue;
    proto::PullRequest& request = pull->requests[shard];
    request.set_job(config_.job);
    request.set_rank(config_.rank);
    *request.mutable_session() = config_.session;
    request.set_clock(clock);
    proto::ChunkRef* ref = request.add_chunks();
    ref->set_key(name);
    ref->set_chunk(table->part[shard]);
    ref->set_num_elements(mine.size() * dim);
    if (!table->wire.empty()) ref->set_codec_params(table->wire);
    std::string* id_bytes = ref->mutable_row_ids();
    id_bytes->resize(mine.size() * sizeof(int64_t));
    for (size_t k = 0; k < mine.size(); ++k) {
      std::memcpy(&(*id_bytes)[k * sizeof(int64_t)], &pull->distinct.ids[mine[k]],
                  sizeof(int64_t));
    }
    tasks.push_back([this, pull, table, shard, clock, scatter](Operation& op,
                                                                OperationEngine::TaskDone done) {
      auto received = std::make_shared<std::atomic<bool>>(false);
      auto sink = std::make_shared<LandedChunkSink>(
          [pull, table, shard, clock, scatter, received](
              const proto::TensorChunk& header, const PayloadView& payload,
              MemoryKind) -> absl::Status {
            const std::vector<uint32_t>& mine = pull->of_shard[shard];
            const uint32_t dim = table->dim;
            const size_t n = mine.size() * dim;
            uint32_t crc = 0;
            for (absl::string_view piece : payload.pieces()) {
              crc = Crc32cExtend(crc, piece.data(), piece.size());
            }
            if (crc != header.checksum()) {
              return absl::DataLossError(absl::StrCat("rows of '", table->name,
                                                      "': reply checksum mismatch"));
            }
            if (header.num_elements() != n) {
              return absl::DataLossError(absl::StrCat("rows of '", table->name, "': reply of ",
                                                      header.num_elements(), " elements, asked ",
                                                      n));
            }
            const size_t row_bytes = size_t{dim} * sizeof(float);
            // Float32 rows are scattered straight from the reply's pieces
            // (no copy of their own; only a row that straddles two pieces
            // is gathered first); 16-bit rows are decoded first.
            std::vector<float> decoded;
            PayloadView rows = payload;
            if (header.codec() == 0) {
              if (payload.size() != n * sizeof(float)) {
                return absl::DataLossError(absl::StrCat("rows of '", table->name,
                                                        "': reply of ", payload.size(),
                                                        " bytes"));
              }
            } else {
              if (table->decoder == nullptr ||
                  static_cast<uint32_t>(table->decoder->id()) != header.codec()) {
                return absl::DataLossError(absl::StrCat("rows of '", table->name,
                                                        "': reply in codec ", header.codec()));
              }
              std::string copied;
              absl::string_view bytes = payload.first();
              if (!payload.contiguous()) {
                copied.resize(payload.size());
                payload.CopyTo(copied.data());
                bytes = copied;
              }
              decoded.resize(n);
              if (auto status = table->decoder->Decode(bytes, absl::MakeSpan(decoded));
                  !status.ok()) {
                return absl::DataLossError(absl::StrCat("rows of '", table->name, "': ",
                                                        status.message()));
              }
              rows = PayloadView(absl::string_view(reinterpret_cast<const char*>(decoded.data()),
                                                   n * sizeof(float)));
            }
            ForEachRow(rows, row_bytes, [&](size_t k, const char* row) { scatter(mine[k], row); });
            {
              absl::MutexLock lock(&table->cache_mutex);
              if (RowCache* cache = table->cache.get(); cache != nullptr) {
                ForEachRow(rows, row_bytes, [&](size_t k, const char* row) {
                  cache->Put(pull->distinct.ids[mine[k]], clock, row);
                });
              }
            }
            table->bytes_pulled += payload.size();
            received->store(true);
            return absl::OkStatus();
          });
      ShardTransport* transport = transports_[shard];
      CallCanceller* canceller = &op.canceller();
      const proto::PullRequest* request = &pull->requests[shard];
      OnShard(
          op, shard,
          [this, transport, request, sink, canceller, pull](CallDone try_done) {
            transport->StartPull(*request, nullptr, *sink, Deadline(), *canceller,
                                 std::move(try_done));
          },
          [received, table, done = std::move(done)](absl::Status status) {
            if (status.ok() && !received->load()) {
              status = absl::DataLossError(
                  absl::StrCat("rows of '", table->name, "': the shard sent no reply"));
            }
            done(std::move(status));
          });
    });
  }
  return engine_.Start(OpKind::kPull, what, std::move(tasks));
}

OperationHandle SparseTables::PushRows(const std::string& name, absl::Span<const int64_t> ids,
                                       absl::Span<const float> gradients) {
  const std::string what = absl::StrCat("push rows of '", name, "'");
  std::shared_ptr<Table> table = Find(name);
  if (table == nullptr) {
    return engine_.Failed(OpKind::kPush, what,
                          absl::NotFoundError(absl::StrCat("sparse table '", name,
                                                           "' is not registered")));
  }
  const uint32_t dim = table->dim;
  if (gradients.size() != ids.size() * dim) {
    return engine_.Failed(
        OpKind::kPush, what,
        absl::InvalidArgumentError(absl::StrCat(what, ": ", ids.size(), " ids need ",
                                                ids.size() * dim, " gradient floats, got ",
                                                gradients.size())));
  }
  Distinct distinct = Deduplicate(ids);
  const size_t count = distinct.ids.size();
  const int shards = static_cast<int>(transports_.size());
  // Each distinct id's shard and its row in that shard's payload.
  std::vector<std::vector<int64_t>> ids_of(shards);
  std::vector<std::pair<int, uint32_t>> where(count);
  for (uint32_t d = 0; d < count; ++d) {
    const int shard = SparseRowShard(distinct.ids[d], shards);
    where[d] = {shard, static_cast<uint32_t>(ids_of[shard].size())};
    ids_of[shard].push_back(distinct.ids[d]);
  }
  for (int shard = 0; shard < shards; ++shard) {
    if (ids_of[shard].size() > kMaxRowsPerCall) {
      return engine_.Failed(
          OpKind::kPush, what,
          absl::InvalidArgumentError(absl::StrCat(what, ": ", ids_of[shard].size(),
                                                  " distinct ids on shard ", shard,
                                                  ", over the limit of ", kMaxRowsPerCall,
                                                  " per call")));
    }
  }
  // The gradients of a repeated id are summed straight into its shard's
  // payload (float32), or into a staging buffer for 16-bit rows.
  const size_t row_bytes = size_t{dim} * sizeof(float);
  std::vector<std::string> summed(shards);
  for (int shard = 0; shard < shards; ++shard) summed[shard].assign(ids_of[shard].size() * row_bytes, '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto [shard, row] = where[distinct.of_position[i]];
    float* sum = reinterpret_cast<float*>(summed[shard].data() + size_t{row} * row_bytes);
    const float* g = gradients.data() + i * dim;
    for (uint32_t j = 0; j < dim; ++j) sum[j] += g[j];
  }
  // Every shard gets the push, empty where it holds none of the ids: the
  // table's clock advances on each.
  const int64_t clock = table->clock.fetch_add(1);
  auto chunks = std::make_shared<std::vector<std::vector<OutgoingChunk>>>(shards);
  for (int shard = 0; shard < shards; ++shard) {
    OutgoingChunk chunk;
    proto::TensorChunk& header = chunk.header;
    header.set_job(config_.job);
    header.set_rank(config_.rank);
    *header.mutable_session() = config_.session;
    header.set_key(name);
    header.set_chunk(table->part[shard]);
    header.set_clock(clock);
    header.set_num_elements(ids_of[shard].size() * dim);
    header.set_dtype(proto::DTYPE_FLOAT32);
    header.set_row_ids(reinterpret_cast<const char*>(ids_of[shard].data()),
                       ids_of[shard].size() * sizeof(int64_t));
    if (table->wire.empty() || ids_of[shard].empty()) {
      chunk.owned = std::move(summed[shard]);
    } else {
      const auto* rows = reinterpret_cast<const float*>(summed[shard].data());
      absl::MutexLock lock(&table->codec_mutex);
      if (auto status = table->encoder->Encode(
              absl::MakeConstSpan(rows, ids_of[shard].size() * dim), CodecContext{}, &chunk.owned);
          !status.ok()) {
        return engine_.Failed(OpKind::kPush, what,
                              absl::InvalidArgumentError(absl::StrCat(what, ": ",
                                                                      status.message())));
      }
      header.set_codec(static_cast<uint32_t>(table->encoder->id()));
      header.set_codec_params(table->wire);
    }
    header.set_checksum(Crc32c(chunk.owned.data(), chunk.owned.size()));
    table->bytes_pushed += chunk.owned.size();
    (*chunks)[shard].push_back(std::move(chunk));
  }
  table->rows_pushed += count;
  std::vector<OperationEngine::Task> tasks;
  for (int shard = 0; shard < shards; ++shard) {
    tasks.push_back([this, chunks, shard, table, clock](Operation& op,
                                                        OperationEngine::TaskDone done) {
      ShardTransport* transport = transports_[shard];
      CallCanceller* canceller = &op.canceller();
      const std::vector<OutgoingChunk>* mine = &(*chunks)[shard];
      OnShard(
          op, shard,
          [this, transport, mine, canceller, chunks](CallDone try_done) {
            transport->StartPush(*mine, Deadline(), *canceller, std::move(try_done));
          },
          [table, shard, clock, done = std::move(done)](absl::Status status) {
            if (status.ok()) {
              absl::MutexLock lock(&table->ack_mutex);
              int64_t& next = table->acknowledged[shard];
              next = std::max(next, clock + 1);
            }
            done(std::move(status));
          });
    });
  }
  return engine_.Start(OpKind::kPush, what, std::move(tasks));
}

void SparseTables::AddAcknowledgedClocks(int shard, proto::HeartbeatRequest* request) const {
  std::vector<std::shared_ptr<Table>> tables;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& entry : tables_) tables.push_back(entry.second);
  }
  for (const auto& table : tables) {
    absl::MutexLock lock(&table->ack_mutex);
    if (shard < 0 || static_cast<size_t>(shard) >= table->acknowledged.size() ||
        table->acknowledged[shard] == 0) {
      continue;
    }
    proto::ChunkClock* entry = request->add_pushed();
    entry->set_key(table->name);
    entry->set_chunk(table->part[shard]);
    entry->set_next_clock(table->acknowledged[shard]);
  }
}

absl::StatusOr<int64_t> SparseTables::Clock(const std::string& name) const {
  std::shared_ptr<Table> table = Find(name);
  if (table == nullptr) {
    return absl::NotFoundError(absl::StrCat("sparse table '", name, "' is not registered"));
  }
  return table->clock.load();
}

absl::StatusOr<SparseTableStats> SparseTables::Stats(const std::string& name) const {
  std::shared_ptr<Table> table = Find(name);
  if (table == nullptr) {
    return absl::NotFoundError(absl::StrCat("sparse table '", name, "' is not registered"));
  }
  SparseTableStats stats;
  stats.rows_pulled = table->rows_pulled;
  stats.rows_pushed = table->rows_pushed;
  stats.ids_requested = table->ids_requested;
  stats.bytes_pushed = table->bytes_pushed;
  stats.bytes_pulled = table->bytes_pulled;
  absl::MutexLock lock(&table->cache_mutex);
  if (table->cache != nullptr) {
    stats.cache_hits = table->cache->hits();
    stats.cache_misses = table->cache->misses();
  }
  return stats;
}

}  // namespace harrier
