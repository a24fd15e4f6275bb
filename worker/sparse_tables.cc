#include "worker/sparse_tables.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec/codec.h"
#include "common/crc32c.h"
#include "common/partitioner.h"
#include "common/request_limits.h"
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
  const SparseRowsPull pull{name, ids, out};
  return PullRows(absl::MakeConstSpan(&pull, 1));
}

OperationHandle SparseTables::PushRows(const std::string& name, absl::Span<const int64_t> ids,
                                       absl::Span<const float> gradients) {
  const SparseRowsPush push{name, ids, gradients};
  return PushRows(absl::MakeConstSpan(&push, 1));
}

namespace {

// What names an operation over `count` tables in errors and logs.
template <typename Item>
std::string Describe(const char* verb, absl::Span<const Item> items) {
  if (items.size() == 1) return absl::StrCat(verb, " rows of '", items[0].table, "'");
  std::string names;
  for (size_t i = 0; i < items.size() && i < 4; ++i) {
    absl::StrAppend(&names, i == 0 ? "" : ", ", "'", items[i].table, "'");
  }
  if (items.size() > 4) absl::StrAppend(&names, ", ...");
  return absl::StrCat(verb, " rows of ", items.size(), " tables (", names, ")");
}

}  // namespace

OperationHandle SparseTables::PullRows(absl::Span<const SparseRowsPull> pulls) {
  const std::string what = Describe("pull", pulls);
  // One table's part of the operation: its distinct ids, where each row
  // goes in the caller's output, and which ids each shard is asked for.
  struct TablePull {
    std::shared_ptr<Table> table;
    int64_t clock = 0;
    Distinct distinct;
    std::vector<uint32_t> first;  // per distinct id, its first position
    std::vector<uint32_t> next;   // per position, the next with the same id (~0u: none)
    float* out = nullptr;
    std::vector<std::vector<uint32_t>> of_shard;  // distinct indices per shard

    // Row bytes (any alignment) into every position of distinct id d.
    void Scatter(uint32_t d, const void* row) const {
      const size_t dim = table->dim;
      for (uint32_t i = first[d]; i != ~0u; i = next[i]) {
        std::memcpy(out + size_t{i} * dim, row, dim * sizeof(float));
      }
    }
  };
  // One call: a shard and the tables (indices into `parts`) it is asked
  // about, all at one clock.
  struct Call {
    int shard = 0;
    proto::PullRequest request;
    std::vector<uint32_t> tables;
  };
  struct Pull {
    std::vector<TablePull> parts;
    std::vector<Call> calls;
  };
  auto pull = std::make_shared<Pull>();
  pull->parts.resize(pulls.size());
  const int shards = static_cast<int>(transports_.size());
  for (size_t t = 0; t < pulls.size(); ++t) {
    const SparseRowsPull& asked = pulls[t];
    TablePull& part = pull->parts[t];
    part.table = Find(asked.table);
    if (part.table == nullptr) {
      return engine_.Failed(OpKind::kPull, what,
                            absl::NotFoundError(absl::StrCat("sparse table '", asked.table,
                                                             "' is not registered")));
    }
    for (size_t u = 0; u < t; ++u) {
      if (pull->parts[u].table == part.table) {
        return engine_.Failed(OpKind::kPull, what,
                              absl::InvalidArgumentError(absl::StrCat(
                                  what, ": table '", asked.table, "' asked twice")));
      }
    }
    const uint32_t dim = part.table->dim;
    if (asked.out.size() != asked.ids.size() * dim) {
      return engine_.Failed(
          OpKind::kPull, what,
          absl::InvalidArgumentError(absl::StrCat("pull rows of '", asked.table, "': ",
                                                  asked.ids.size(), " ids need ",
                                                  asked.ids.size() * dim,
                                                  " floats of output, got ", asked.out.size())));
    }
    part.clock = part.table->clock.load();
    part.distinct = Deduplicate(asked.ids);
    part.out = asked.out.data();
    const size_t distinct = part.distinct.ids.size();
    part.first.assign(distinct, ~0u);
    part.next.assign(asked.ids.size(), ~0u);
    for (size_t i = asked.ids.size(); i-- > 0;) {
      const uint32_t d = part.distinct.of_position[i];
      part.next[i] = part.first[d];
      part.first[d] = static_cast<uint32_t>(i);
    }
    part.of_shard.resize(shards);
    {
      absl::MutexLock lock(&part.table->cache_mutex);
      RowCache* cache = part.table->cache.get();
      std::vector<float> row(cache != nullptr ? dim : 0);
      for (uint32_t d = 0; d < distinct; ++d) {
        if (cache != nullptr && cache->Get(part.distinct.ids[d], part.clock, row.data())) {
          part.Scatter(d, row.data());
        } else {
          part.of_shard[SparseRowShard(part.distinct.ids[d], shards)].push_back(d);
        }
      }
    }
    for (int shard = 0; shard < shards; ++shard) {
      if (part.of_shard[shard].size() > kMaxRowsPerCall) {
        return engine_.Failed(
            OpKind::kPull, what,
            absl::InvalidArgumentError(absl::StrCat(
                "pull rows of '", asked.table, "': ", part.of_shard[shard].size(),
                " distinct ids on shard ", shard, ", over the limit of ", kMaxRowsPerCall,
                " per call")));
      }
    }
  }
  // The calls: per shard, the tables with rows there, grouped by clock (a
  // request has one clock) and at most kMaxChunksPerCall a call.
  for (int shard = 0; shard < shards; ++shard) {
    std::vector<uint32_t> open_calls;  // indices into calls of this shard's calls
    for (uint32_t t = 0; t < pull->parts.size(); ++t) {
      TablePull& part = pull->parts[t];
      const std::vector<uint32_t>& mine = part.of_shard[shard];
      if (mine.empty()) continue;
      Call* call = nullptr;
      for (uint32_t c : open_calls) {
        Call& candidate = pull->calls[c];
        if (candidate.request.clock() == part.clock &&
            candidate.tables.size() < kMaxChunksPerCall) {
          call = &candidate;
          break;
        }
      }
      if (call == nullptr) {
        open_calls.push_back(static_cast<uint32_t>(pull->calls.size()));
        call = &pull->calls.emplace_back();
        call->shard = shard;
        call->request.set_job(config_.job);
        call->request.set_rank(config_.rank);
        *call->request.mutable_session() = config_.session;
        call->request.set_clock(part.clock);
      }
      call->tables.push_back(t);
      const uint32_t dim = part.table->dim;
      proto::ChunkRef* ref = call->request.add_chunks();
      ref->set_key(part.table->name);
      ref->set_chunk(part.table->part[shard]);
      ref->set_num_elements(mine.size() * dim);
      if (!part.table->wire.empty()) ref->set_codec_params(part.table->wire);
      std::string* id_bytes = ref->mutable_row_ids();
      id_bytes->resize(mine.size() * sizeof(int64_t));
      for (size_t k = 0; k < mine.size(); ++k) {
        std::memcpy(&(*id_bytes)[k * sizeof(int64_t)], &part.distinct.ids[mine[k]],
                    sizeof(int64_t));
      }
    }
  }
  for (TablePull& part : pull->parts) {
    size_t asked = 0;
    for (const auto& mine : part.of_shard) asked += mine.size();
    part.table->ids_requested += part.next.size();  // one per position
    part.table->rows_pulled += asked;
  }
  std::vector<OperationEngine::Task> tasks;
  for (size_t c = 0; c < pull->calls.size(); ++c) {
    tasks.push_back([this, pull, c](Operation& op, OperationEngine::TaskDone done) {
      const Call& call = pull->calls[c];
      const int shard = call.shard;
      // Which of the call's tables have replied (each exactly once).
      auto replied = std::make_shared<std::vector<std::atomic<bool>>>(call.tables.size());
      auto sink = std::make_shared<LandedChunkSink>(
          [pull, c, shard, replied](const proto::TensorChunk& header, const PayloadView& payload,
                                    MemoryKind) -> absl::Status {
            const Call& call = pull->calls[c];
            size_t slot = call.tables.size();
            for (size_t k = 0; k < call.tables.size(); ++k) {
              if (pull->parts[call.tables[k]].table->name == header.key()) slot = k;
            }
            if (slot == call.tables.size()) {
              return absl::DataLossError(
                  absl::StrCat("rows of '", header.key(), "': a reply for a table not asked"));
            }
            if ((*replied)[slot].exchange(true)) {
              return absl::DataLossError(
                  absl::StrCat("rows of '", header.key(), "': replied twice"));
            }
            const TablePull& part = pull->parts[call.tables[slot]];
            Table& table = *part.table;
            const std::vector<uint32_t>& mine = part.of_shard[shard];
            const uint32_t dim = table.dim;
            const size_t n = mine.size() * dim;
            if (payload.Crc32cOfBytes() != header.checksum()) {
              return absl::DataLossError(absl::StrCat("rows of '", table.name,
                                                      "': reply checksum mismatch"));
            }
            if (header.num_elements() != n) {
              return absl::DataLossError(absl::StrCat("rows of '", table.name, "': reply of ",
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
                return absl::DataLossError(absl::StrCat("rows of '", table.name, "': reply of ",
                                                        payload.size(), " bytes"));
              }
            } else {
              if (table.decoder == nullptr ||
                  static_cast<uint32_t>(table.decoder->id()) != header.codec()) {
                return absl::DataLossError(absl::StrCat("rows of '", table.name,
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
              if (auto status = table.decoder->Decode(bytes, absl::MakeSpan(decoded));
                  !status.ok()) {
                return absl::DataLossError(absl::StrCat("rows of '", table.name, "': ",
                                                        status.message()));
              }
              rows = PayloadView(absl::string_view(reinterpret_cast<const char*>(decoded.data()),
                                                   n * sizeof(float)));
            }
            ForEachRow(rows, row_bytes,
                       [&](size_t k, const char* row) { part.Scatter(mine[k], row); });
            {
              absl::MutexLock lock(&table.cache_mutex);
              if (RowCache* cache = table.cache.get(); cache != nullptr) {
                ForEachRow(rows, row_bytes, [&](size_t k, const char* row) {
                  cache->Put(part.distinct.ids[mine[k]], part.clock, row);
                });
              }
            }
            table.bytes_pulled += payload.size();
            return absl::OkStatus();
          });
      ShardTransport* transport = transports_[shard];
      CallCanceller* canceller = &op.canceller();
      const proto::PullRequest* request = &call.request;
      OnShard(
          op, shard,
          [this, transport, request, sink, canceller, pull](CallDone try_done) {
            transport->StartPull(*request, nullptr, *sink, Deadline(), *canceller,
                                 std::move(try_done));
          },
          [pull, c, replied, done = std::move(done)](absl::Status status) {
            const Call& call = pull->calls[c];
            for (size_t k = 0; status.ok() && k < call.tables.size(); ++k) {
              if (!(*replied)[k].load()) {
                status = absl::DataLossError(
                    absl::StrCat("rows of '", pull->parts[call.tables[k]].table->name,
                                 "': the shard sent no reply"));
              }
            }
            done(std::move(status));
          });
    });
  }
  return engine_.Start(OpKind::kPull, what, std::move(tasks));
}

OperationHandle SparseTables::PushRows(absl::Span<const SparseRowsPush> pushes) {
  const std::string what = Describe("push", pushes);
  const int shards = static_cast<int>(transports_.size());
  const size_t count = pushes.size();
  std::vector<std::shared_ptr<Table>> tables(count);
  // Everything is checked before any table's clock moves: a refused push
  // changes nothing.
  for (size_t t = 0; t < count; ++t) {
    const SparseRowsPush& asked = pushes[t];
    tables[t] = Find(asked.table);
    if (tables[t] == nullptr) {
      return engine_.Failed(OpKind::kPush, what,
                            absl::NotFoundError(absl::StrCat("sparse table '", asked.table,
                                                             "' is not registered")));
    }
    for (size_t u = 0; u < t; ++u) {
      if (tables[u] == tables[t]) {
        return engine_.Failed(OpKind::kPush, what,
                              absl::InvalidArgumentError(absl::StrCat(
                                  what, ": table '", asked.table, "' pushed twice")));
      }
    }
    const uint32_t dim = tables[t]->dim;
    if (asked.gradients.size() != asked.ids.size() * dim) {
      return engine_.Failed(
          OpKind::kPush, what,
          absl::InvalidArgumentError(absl::StrCat("push rows of '", asked.table, "': ",
                                                  asked.ids.size(), " ids need ",
                                                  asked.ids.size() * dim,
                                                  " gradient floats, got ",
                                                  asked.gradients.size())));
    }
  }
  // Per table and shard: its chunk (rows summed, encoded), its clock after.
  struct TablePush {
    std::vector<OutgoingChunk> chunks;  // one per shard
    int64_t clock = 0;
    uint64_t rows = 0;
  };
  std::vector<TablePush> parts(count);
  for (size_t t = 0; t < count; ++t) {
    const SparseRowsPush& asked = pushes[t];
    Table& table = *tables[t];
    const uint32_t dim = table.dim;
    Distinct distinct = Deduplicate(asked.ids);
    const size_t rows = distinct.ids.size();
    // Each distinct id's shard and its row in that shard's payload.
    std::vector<std::vector<int64_t>> ids_of(shards);
    std::vector<std::pair<int, uint32_t>> where(rows);
    for (uint32_t d = 0; d < rows; ++d) {
      const int shard = SparseRowShard(distinct.ids[d], shards);
      where[d] = {shard, static_cast<uint32_t>(ids_of[shard].size())};
      ids_of[shard].push_back(distinct.ids[d]);
    }
    for (int shard = 0; shard < shards; ++shard) {
      if (ids_of[shard].size() > kMaxRowsPerCall) {
        return engine_.Failed(
            OpKind::kPush, what,
            absl::InvalidArgumentError(absl::StrCat(
                "push rows of '", asked.table, "': ", ids_of[shard].size(),
                " distinct ids on shard ", shard, ", over the limit of ", kMaxRowsPerCall,
                " per call")));
      }
    }
    // The gradients of a repeated id are summed straight into its shard's
    // payload (float32), or into a staging buffer for 16-bit rows.
    const size_t row_bytes = size_t{dim} * sizeof(float);
    std::vector<std::string> summed(shards);
    for (int shard = 0; shard < shards; ++shard) {
      summed[shard].assign(ids_of[shard].size() * row_bytes, '\0');
    }
    for (size_t i = 0; i < asked.ids.size(); ++i) {
      const auto [shard, row] = where[distinct.of_position[i]];
      float* sum = reinterpret_cast<float*>(summed[shard].data() + size_t{row} * row_bytes);
      const float* g = asked.gradients.data() + i * dim;
      for (uint32_t j = 0; j < dim; ++j) sum[j] += g[j];
    }
    TablePush& part = parts[t];
    part.rows = rows;
    part.chunks.resize(shards);
    for (int shard = 0; shard < shards; ++shard) {
      OutgoingChunk& chunk = part.chunks[shard];
      proto::TensorChunk& header = chunk.header;
      header.set_job(config_.job);
      header.set_rank(config_.rank);
      *header.mutable_session() = config_.session;
      header.set_key(table.name);
      header.set_chunk(table.part[shard]);
      header.set_num_elements(ids_of[shard].size() * dim);
      header.set_dtype(proto::DTYPE_FLOAT32);
      header.set_row_ids(reinterpret_cast<const char*>(ids_of[shard].data()),
                         ids_of[shard].size() * sizeof(int64_t));
      if (table.wire.empty() || ids_of[shard].empty()) {
        chunk.owned = std::move(summed[shard]);
      } else {
        const auto* sums = reinterpret_cast<const float*>(summed[shard].data());
        absl::MutexLock lock(&table.codec_mutex);
        if (auto status = table.encoder->Encode(
                absl::MakeConstSpan(sums, ids_of[shard].size() * dim), CodecContext{},
                &chunk.owned);
            !status.ok()) {
          return engine_.Failed(
              OpKind::kPush, what,
              absl::InvalidArgumentError(absl::StrCat("push rows of '", table.name, "': ",
                                                      status.message())));
        }
        header.set_codec(static_cast<uint32_t>(table.encoder->id()));
        header.set_codec_params(table.wire);
      }
      header.set_checksum(Crc32c(chunk.owned.data(), chunk.owned.size()));
    }
  }
  // Every shard gets each table's push, empty where it holds none of the
  // table's ids: the table's clock advances on each. Per shard, one call
  // carries every table's chunk (at most kMaxChunksPerCall a call).
  struct Call {
    int shard = 0;
    std::vector<OutgoingChunk> chunks;
    std::vector<uint32_t> tables;
  };
  auto calls = std::make_shared<std::vector<Call>>();
  for (size_t t = 0; t < count; ++t) {
    TablePush& part = parts[t];
    Table& table = *tables[t];
    part.clock = table.clock.fetch_add(1);
    for (int shard = 0; shard < shards; ++shard) {
      OutgoingChunk& chunk = part.chunks[shard];
      chunk.header.set_clock(part.clock);
      table.bytes_pushed += chunk.owned.size();
    }
    table.rows_pushed += part.rows;
  }
  for (int shard = 0; shard < shards; ++shard) {
    for (size_t t = 0; t < count; ++t) {
      if (t % kMaxChunksPerCall == 0) {
        Call& call = calls->emplace_back();
        call.shard = shard;
      }
      Call& call = calls->back();
      call.chunks.push_back(std::move(parts[t].chunks[shard]));
      call.tables.push_back(static_cast<uint32_t>(t));
    }
  }
  auto clocks = std::make_shared<std::vector<std::pair<std::shared_ptr<Table>, int64_t>>>();
  for (size_t t = 0; t < count; ++t) clocks->emplace_back(tables[t], parts[t].clock);
  std::vector<OperationEngine::Task> tasks;
  for (size_t c = 0; c < calls->size(); ++c) {
    tasks.push_back([this, calls, clocks, c](Operation& op, OperationEngine::TaskDone done) {
      const Call& call = (*calls)[c];
      const int shard = call.shard;
      ShardTransport* transport = transports_[shard];
      CallCanceller* canceller = &op.canceller();
      const std::vector<OutgoingChunk>* mine = &call.chunks;
      OnShard(
          op, shard,
          [this, transport, mine, canceller, calls](CallDone try_done) {
            transport->StartPush(*mine, Deadline(), *canceller, std::move(try_done));
          },
          [calls, clocks, c, shard, done = std::move(done)](absl::Status status) {
            if (status.ok()) {
              for (uint32_t t : (*calls)[c].tables) {
                const auto& [table, clock] = (*clocks)[t];
                absl::MutexLock lock(&table->ack_mutex);
                int64_t& next = table->acknowledged[shard];
                next = std::max(next, clock + 1);
              }
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
