#include "bench/embedding_bench.h"

#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/bench_util.h"
#include "bench/flags.h"
#include "bench/server_cluster.h"
#include "bench/shared_flags.h"
#include "bench/zipf.h"
#include "common/cpu_time.h"
#include "common/json.h"
#include "common/row_placement.h"
#include "proto/harrier.grpc.pb.h"
#include "server/sparse_rows.h"
#include "worker/client.h"

ABSL_FLAG(std::string, dims, "16,64,128", "embedding: row dimensions, one pass each");
ABSL_FLAG(int, tables, 8, "embedding: sparse tables, each with its own id stream");
ABSL_FLAG(uint64_t, distinct_ids, 1000000,
          "embedding: ids each table's Zipf stream draws from (the stream touches few of them)");
ABSL_FLAG(double, zipf, 1.05, "embedding: Zipf exponent of the id stream");
ABSL_FLAG(int, batch, 4096, "embedding: ids per table per step, repeats included");
ABSL_FLAG(int, batches, 20, "embedding: timed steps (one batch per table each)");
ABSL_FLAG(int, warmup_batches, 5, "embedding: untimed steps first");
ABSL_FLAG(std::string, optimizer, "sgd",
          "embedding: the tables' optimizer in the rate, cache and budget cases");
ABSL_FLAG(std::string, optimizers, "sgd,adagrad,adam",
          "embedding: optimizers of the memory case, one line each");
ABSL_FLAG(uint64_t, fill_rows, 1000000, "embedding: rows the memory case stores");
ABSL_FLAG(uint64_t, cache_rows, 65536, "embedding: the worker's row cache in the cache case");
ABSL_FLAG(int64_t, cache_staleness, 2, "embedding: the row cache's staleness in table clocks");
ABSL_FLAG(uint64_t, max_rows, 8192, "embedding: rows per table per shard in the budget case");
ABSL_FLAG(std::string, wire_dtype, "float32", "embedding: rows on the wire: float32, fp16, bf16");
ABSL_FLAG(std::string, cases, "rate,memory,cache,budget", "embedding: what to measure");
ABSL_FLAG(bool, per_table_calls, false,
          "embedding: one operation per table a step (tables x shards calls) instead of one for "
          "all of the step's tables (one call per shard)");
ABSL_FLAG(int, calls_in_flight, 4,
          "embedding: the worker's shard calls in flight per direction "
          "(ClientOptions::max_calls_in_flight)");

namespace harrier::bench {
namespace {

constexpr const char* kUsage =
    "usage: harrier-bench embedding [flags]\n"
    "Sparse embedding tables, DLRM-style: --tables tables, each fed batches of\n"
    "--batch ids drawn Zipf(--zipf) over --distinct_ids ids (ranks mixed by a\n"
    "64-bit hash, repeats kept), pulled and pushed by one worker's Client through\n"
    "real harrier-server shards on 127.0.0.1 (--sync=asp), next to the same\n"
    "tables' in-process rate (SparseRows::Lookup / Apply on the same ids, one\n"
    "SparseRows per table per shard, one thread) and a memcpy of the same row\n"
    "bytes, all in one run. One JSON line per (case, dim[, optimizer]) on stdout;\n"
    "progress on stderr. Figures are reported, never judged.\n"
    "Cases (--cases):\n"
    "  rate    ids/s pulled and pushed over the wire, in process, memcpy; ratios;\n"
    "          the timed steps run twice: cold (rows created as ids first appear)\n"
    "          and warm (the same steps again, every row held)\n"
    "  memory  bytes per row after storing --fill_rows rows, per optimizer, against\n"
    "          the raw row + optimizer state\n"
    "  cache   the worker's row cache: hit rate training (pull + push) and serving\n"
    "          (pulls only), and the serving pull rate with and without it\n"
    "  budget  tables of --max_rows rows per shard: rows held, evictions (in\n"
    "          process), rates at the budget\n"
    "Flags:\n"
    "  --dims=16,64,128            row dimensions, one pass each\n"
    "  --tables=8                  sparse tables\n"
    "  --distinct_ids=1000000      ids each stream draws from (10^8 works: the stream\n"
    "                              touches few of them; the memory case's --fill_rows\n"
    "                              is what must fit in RAM)\n"
    "  --zipf=1.05                 Zipf exponent\n"
    "  --batch=4096                ids per table per step, repeats included\n"
    "  --batches=20                timed steps; --warmup_batches=5 untimed steps first\n"
    "  --shards=2                  harrier-server shards (one worker)\n"
    "  --optimizer=sgd             the tables' optimizer (rate, cache, budget)\n"
    "  --optimizers=sgd,adagrad,adam  the memory case's (also rowwise_adagrad)\n"
    "  --fill_rows=1000000         rows the memory case stores (refused if they\n"
    "                              would not fit in the memory available)\n"
    "  --cache_rows=65536 --cache_staleness=2   the cache case's row cache\n"
    "  --max_rows=8192             the budget case's rows per table per shard\n"
    "  --wire_dtype=float32        rows on the wire: float32, fp16 or bf16\n"
    "  --calls_in_flight=4         the worker's shard calls in flight per direction\n"
    "  --per_table_calls           one PullRowsAsync / PushRowsAsync per table a step\n"
    "                              (tables x shards calls) instead of one for all of the\n"
    "                              step's tables (one call per shard)\n"
    "  --transport=tcp             the rows' data path: tcp, grpc or ucx (servers get --tcp\n"
    "                              or --ucx; UCX_TLS picks UCX's transports)\n"
    "  --cases=rate,memory,cache,budget\n"
    "  --quick                     tiny sizes (smoke tests); flags set to other than\n"
    "                              their default override it\n"
    "  --server_binary=PATH        harrier-server to start (default: from runfiles)\n"
    "  --help\n";

// Targets the lines carry beside the figures; the bench never judges them.
constexpr double kTargetWireOverInProcess = 0.5;  // at d = 64
constexpr double kTargetMemoryRatio = 1.5;
// Every pushed gradient element: small and finite (the shards refuse NaN).
constexpr float kGradient = 1e-3f;
constexpr absl::Duration kCallTimeout = absl::Seconds(120);

struct Options {
  std::vector<int> dims = {16, 64, 128};
  int tables = 8;
  uint64_t distinct_ids = 1000000;
  double zipf = 1.05;
  int batch = 4096;
  int batches = 20;
  int warmup_batches = 5;
  int shards = 2;
  std::string optimizer = "sgd";
  std::vector<std::string> optimizers = {"sgd", "adagrad", "adam"};
  uint64_t fill_rows = 1000000;
  uint64_t cache_rows = 65536;
  int64_t cache_staleness = 2;
  uint64_t max_rows = 8192;
  std::string wire_dtype = "float32";
  int calls_in_flight = 4;
  bool per_table_calls = false;
  std::string transport = "tcp";
  bool rate = true, memory = true, cache = true, budget = true;
  std::string server_binary;
};

// Whether a flag was set to other than its default (by the command line, a
// flagfile or the environment): such a flag overrides --quick.
template <typename T>
bool Given(const absl::Flag<T>& flag) {
  const absl::CommandLineFlag& reflection = absl::GetFlagReflectionHandle(flag);
  return reflection.CurrentValue() != reflection.DefaultValue();
}

// Bytes per row the memory case expects at most (rows, optimizer state,
// the row record and a hash-map slot at its lowest load): for the check
// that --fill_rows fits.
uint64_t FillBytesPerRow(int dim, const std::string& optimizer) {
  uint64_t state = 0;
  if (optimizer == "adagrad") state = dim;
  if (optimizer == "rowwise_adagrad") state = 1;
  if (optimizer == "adam") state = 2 * dim;
  return (dim + state) * sizeof(float) + 24 + 2 * 17;
}

uint64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string ParseArgs(Options* options) {
  if (absl::GetFlag(FLAGS_quick)) {
    // Seconds, not figures: a smoke test's sizes.
    options->dims = {16};
    options->tables = 2;
    options->distinct_ids = 10000;
    options->batch = 512;
    options->batches = 3;
    options->warmup_batches = 1;
    options->fill_rows = 20000;
    options->cache_rows = 1024;
    options->max_rows = 256;
  }
  if (Given(FLAGS_dims) || !absl::GetFlag(FLAGS_quick)) {
    auto dims = ParseIntList(absl::GetFlag(FLAGS_dims));
    if (!dims.ok()) return absl::StrCat("--dims: ", dims.status().message());
    for (int dim : *dims) {
      if (dim > static_cast<int>(kMaxSparseDim)) {
        return absl::StrCat("--dims: ", dim, " is above the largest row, ", kMaxSparseDim);
      }
    }
    options->dims = *dims;
  }
  auto take_int = [](const absl::Flag<int>& flag, int* out) {
    if (Given(flag) || !absl::GetFlag(FLAGS_quick)) *out = absl::GetFlag(flag);
  };
  take_int(FLAGS_tables, &options->tables);
  take_int(FLAGS_batch, &options->batch);
  take_int(FLAGS_batches, &options->batches);
  take_int(FLAGS_warmup_batches, &options->warmup_batches);
  auto take_u64 = [](const absl::Flag<uint64_t>& flag, uint64_t* out) {
    if (Given(flag) || !absl::GetFlag(FLAGS_quick)) *out = absl::GetFlag(flag);
  };
  take_u64(FLAGS_distinct_ids, &options->distinct_ids);
  take_u64(FLAGS_fill_rows, &options->fill_rows);
  take_u64(FLAGS_cache_rows, &options->cache_rows);
  take_u64(FLAGS_max_rows, &options->max_rows);
  options->zipf = absl::GetFlag(FLAGS_zipf);
  options->cache_staleness = absl::GetFlag(FLAGS_cache_staleness);
  options->optimizer = absl::GetFlag(FLAGS_optimizer);
  options->wire_dtype = absl::GetFlag(FLAGS_wire_dtype);
  options->calls_in_flight = absl::GetFlag(FLAGS_calls_in_flight);
  options->per_table_calls = absl::GetFlag(FLAGS_per_table_calls);
  if (options->calls_in_flight < 1) return "--calls_in_flight must be at least 1";
  options->transport = absl::GetFlag(FLAGS_transport);
  if (options->transport != "grpc" && options->transport != "ucx" && options->transport != "tcp") {
    return absl::StrCat("--transport: unknown transport '", options->transport,
                        "' (grpc, tcp or ucx)");
  }
  options->server_binary = absl::GetFlag(FLAGS_server_binary);
  if (const std::string error =
          NumberFlagOr(FLAGS_shards, "shards", options->shards, 1, &options->shards);
      !error.empty()) {
    return error;
  }
  if (options->shards > 255) return "bad --shards (at most 255)";
  if (options->tables < 1) return "bad --tables (at least 1)";
  if (options->batch < 1) return "bad --batch (at least 1)";
  if (static_cast<size_t>(options->batch) > kMaxRowsPerCall) {
    return absl::StrCat("bad --batch (at most ", kMaxRowsPerCall, ", a shard's limit per call)");
  }
  if (options->batches < 1) return "bad --batches (at least 1)";
  if (options->warmup_batches < 0) return "bad --warmup_batches (0 or more)";
  if (options->distinct_ids < 1 || options->distinct_ids > (uint64_t{1} << 48)) {
    return "bad --distinct_ids (1 to 2^48)";
  }
  if (!(options->zipf > 0) || options->zipf > 10) return "bad --zipf (in (0, 10])";
  if (options->cache_rows < 1) return "bad --cache_rows (at least 1)";
  if (options->cache_staleness < 0) return "bad --cache_staleness (0 or more)";
  if (options->max_rows < 1) return "bad --max_rows (at least 1)";
  if (options->fill_rows < 1) return "bad --fill_rows (at least 1)";
  auto known_optimizer = [](absl::string_view name) {
    return name == "sgd" || name == "adagrad" || name == "rowwise_adagrad" || name == "adam";
  };
  if (!known_optimizer(options->optimizer)) {
    return absl::StrCat("--optimizer: '", options->optimizer,
                        "' is not sgd, adagrad, rowwise_adagrad or adam");
  }
  options->optimizers.clear();
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_optimizers), ',', absl::SkipWhitespace())) {
    if (!known_optimizer(name)) {
      return absl::StrCat("--optimizers: '", name,
                          "' is not sgd, adagrad, rowwise_adagrad or adam");
    }
    options->optimizers.emplace_back(name);
  }
  if (options->optimizers.empty()) return "--optimizers: empty list";
  if (options->wire_dtype != "float32" && options->wire_dtype != "fp16" &&
      options->wire_dtype != "bf16") {
    return absl::StrCat("--wire_dtype: '", options->wire_dtype, "' is not float32, fp16 or bf16");
  }
  options->rate = options->memory = options->cache = options->budget = false;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_cases), ',', absl::SkipWhitespace())) {
    if (name == "rate") {
      options->rate = true;
    } else if (name == "memory") {
      options->memory = true;
    } else if (name == "cache") {
      options->cache = true;
    } else if (name == "budget") {
      options->budget = true;
    } else {
      return absl::StrCat("--cases: unknown case '", name, "' (rate, memory, cache, budget)");
    }
  }
  if (!(options->rate || options->memory || options->cache || options->budget)) {
    return "--cases: empty list";
  }
  if (options->memory) {
    // One table of --fill_rows rows lives at a time: the largest must fit.
    uint64_t largest = 0;
    for (int dim : options->dims) {
      for (const std::string& optimizer : options->optimizers) {
        largest = std::max(largest, options->fill_rows * FillBytesPerRow(dim, optimizer));
      }
    }
    const uint64_t available = MemAvailableBytes();
    if (available > 0 && largest > available / 10 * 8) {
      return absl::StrCat("--fill_rows=", options->fill_rows, " needs about ",
                          largest >> 20, " MiB for its largest table, more than 80% of the ",
                          available >> 20, " MiB available: lower --fill_rows, --dims or "
                          "--optimizers");
    }
  }
  return "";
}

// The ids of every (step, table) batch, drawn once and shared by every
// dimension and case, and the shard that holds each.
struct Stream {
  int tables = 0;
  int steps = 0;   // warm-up steps included
  int warmup = 0;
  size_t max_batch = 0;
  // Ids of the timed steps in the stream the worker sends, repeats
  // included: what every rate counts, in this stream or one derived from it.
  uint64_t timed_ids = 0;
  std::vector<int64_t> ids;     // batch k = step * tables + table is
  std::vector<size_t> begin;    // ids[begin[k], begin[k + 1])
  std::vector<uint8_t> shard;   // RowShard of each id

  size_t Index(int step, int table) const {
    return static_cast<size_t>(step) * tables + table;
  }
  absl::Span<const int64_t> Batch(int step, int table) const {
    const size_t k = Index(step, table);
    return absl::MakeConstSpan(ids).subspan(begin[k], begin[k + 1] - begin[k]);
  }
  const uint8_t* ShardsOf(int step, int table) const {
    return shard.data() + begin[Index(step, table)];
  }
  // Ids in the timed steps of this stream.
  uint64_t TimedLength() const { return ids.size() - begin[Index(warmup, 0)]; }
};

Stream MakeStream(const Options& options) {
  Stream stream;
  stream.tables = options.tables;
  stream.warmup = options.warmup_batches;
  stream.steps = options.warmup_batches + options.batches;
  stream.max_batch = options.batch;
  const size_t batches = static_cast<size_t>(stream.steps) * stream.tables;
  stream.ids.resize(batches * options.batch);
  stream.shard.resize(stream.ids.size());
  for (size_t k = 0; k <= batches; ++k) stream.begin.push_back(k * options.batch);
  const ZipfSampler zipf(options.distinct_ids, options.zipf);
  for (int table = 0; table < stream.tables; ++table) {
    std::mt19937_64 random(0x5eed0000u + table);
    for (int step = 0; step < stream.steps; ++step) {
      const size_t base = stream.begin[stream.Index(step, table)];
      for (int i = 0; i < options.batch; ++i) {
        // The rank, made an id by a mixing hash (tables apart in its high
        // bits), so hot ids are spread over the id space and the shards as
        // real feature ids are, not the smallest numbers.
        const uint64_t rank = zipf.Sample(random);
        const int64_t id = static_cast<int64_t>(MixRowId(
            static_cast<int64_t>(rank + (static_cast<uint64_t>(table) << 48))));
        stream.ids[base + i] = id;
        stream.shard[base + i] = static_cast<uint8_t>(RowShard(id, options.shards));
      }
    }
  }
  stream.timed_ids = stream.TimedLength();
  return stream;
}

// Each batch's distinct ids in first-seen order: what the client sends the
// shards, so what their tables look up and apply.
Stream Deduplicated(const Stream& stream) {
  Stream distinct = stream;
  distinct.ids.clear();
  distinct.shard.clear();
  distinct.begin.assign(1, 0);
  absl::flat_hash_set<int64_t> seen;
  for (int step = 0; step < stream.steps; ++step) {
    for (int table = 0; table < stream.tables; ++table) {
      const auto batch = stream.Batch(step, table);
      const uint8_t* shard = stream.ShardsOf(step, table);
      seen.clear();
      for (size_t i = 0; i < batch.size(); ++i) {
        if (seen.insert(batch[i]).second) {
          distinct.ids.push_back(batch[i]);
          distinct.shard.push_back(shard[i]);
        }
      }
      distinct.begin.push_back(distinct.ids.size());
    }
  }
  return distinct;
}

// Distinct ids per batch over the timed steps, averaged.
double DistinctPerBatch(const Stream& distinct) {
  return static_cast<double>(distinct.TimedLength()) /
         ((distinct.steps - distinct.warmup) * distinct.tables);
}

SparseTableOptions TableOptions(const Options& options, int dim, const std::string& optimizer) {
  SparseTableOptions table;
  table.dim = dim;
  table.optimizer = optimizer;
  table.lr = 0.01f;
  table.init_scale = 0.01f;
  table.wire_dtype = options.wire_dtype;
  return table;
}

// The shard's reading of `table` (what Client::RegisterSparseTable sends).
absl::StatusOr<SparseRowsConfig> RowsConfig(const SparseTableOptions& table) {
  proto::SparseTableConfig config;
  config.set_dim(static_cast<uint32_t>(table.dim));
  config.set_optimizer(table.optimizer);
  config.set_lr(table.lr);
  config.set_beta1(table.beta1);
  config.set_beta2(table.beta2);
  config.set_epsilon(table.epsilon);
  config.set_initial_accumulator(table.initial_accumulator);
  config.set_init_scale(table.init_scale);
  config.set_seed(table.seed);
  config.set_max_rows(table.max_rows);
  config.set_eviction(table.eviction);
  config.set_ttl_steps(table.ttl_steps);
  config.set_admit_after(table.admit_after);
  config.set_admit_probability(table.admit_probability);
  return SparseRowsConfig::FromProto(config);
}

double Seconds(BenchClock::time_point start) {
  return std::chrono::duration<double>(BenchClock::now() - start).count();
}

double PerSecond(double count, double seconds) { return seconds > 0 ? count / seconds : 0; }
// A rate as a whole number, for the JSON lines.
int64_t Whole(double value) { return std::llround(value); }
double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// ---- in process --------------------------------------------------------------

// The timed steps are run twice: first as the stream comes (cold: a row is
// created when its id first appears, as in a job's first steps over a large
// id space), then the same steps again (warm: every row is held, as in a
// job that has seen its ids).
constexpr int kPasses = 2;
constexpr const char* kPassNames[kPasses] = {"cold", "warm"};

// Calls `body(step, clock, pass)` for every step of a run: the warm-up
// steps untimed (pass -1), the timed steps as pass 0, and with `passes` 2
// the timed steps again as pass 1. `clock` counts the calls (the tables'
// clock), `pass_start(pass)` and `pass_end(pass)` frame each timed pass.
template <typename Body, typename Start, typename End>
void ForEachStep(const Stream& stream, int passes, Body body, Start pass_start, End pass_end) {
  int64_t clock = 0;
  for (int step = 0; step < stream.warmup; ++step) body(step, clock++, -1);
  for (int pass = 0; pass < passes; ++pass) {
    pass_start(pass);
    for (int step = stream.warmup; step < stream.steps; ++step) body(step, clock++, pass);
    pass_end(pass);
  }
}

struct InProcessPass {
  double lookup_seconds = 0;
  double apply_seconds = 0;
  uint64_t admitted = 0;  // rows created in the pass
};

struct InProcessResult {
  InProcessPass pass[kPasses];
  uint64_t rows_min = 0, rows_max = 0;  // per table per shard, at the end
  uint64_t evicted = 0;
};

// The shards' tables rebuilt in this process: one SparseRows per table per
// shard, each fed the ids its shard holds, on this thread. Every id of each
// batch of `stream` is looked up and applied (with a gradient of its own):
// for the stream as the worker sends it, repeats included; for the
// Deduplicated one, what the shards' tables do. Each run starts from a
// trimmed heap, as a fresh shard does, so that one run does not reuse the
// pages an earlier one faulted in.
InProcessResult RunInProcess(const Stream& stream, const SparseRowsConfig& config, int shards,
                             int passes) {
  malloc_trim(0);
  std::vector<std::unique_ptr<SparseRows>> rows;
  for (int table = 0; table < stream.tables; ++table) {
    for (int shard = 0; shard < shards; ++shard) {
      rows.push_back(std::make_unique<SparseRows>(absl::StrCat("emb/t", table), config));
    }
  }
  auto admitted = [&rows] {
    uint64_t sum = 0;
    for (const auto& table : rows) sum += table->stats().admitted;
    return sum;
  };
  const uint32_t dim = config.dim;
  std::vector<float> out(stream.max_batch * dim);
  const std::vector<float> gradient(stream.max_batch * dim, kGradient);
  InProcessResult result;
  uint64_t admitted_before = 0;
  ForEachStep(
      stream, passes,
      [&](int step, int64_t clock, int pass) {
        auto start = BenchClock::now();
        for (int table = 0; table < stream.tables; ++table) {
          const auto ids = stream.Batch(step, table);
          const uint8_t* shard = stream.ShardsOf(step, table);
          const std::unique_ptr<SparseRows>* mine = &rows[static_cast<size_t>(table) * shards];
          for (size_t i = 0; i < ids.size(); ++i) {
            mine[shard[i]]->Lookup(ids[i], clock, out.data() + i * dim);
          }
        }
        if (pass >= 0) result.pass[pass].lookup_seconds += Seconds(start);
        start = BenchClock::now();
        for (int table = 0; table < stream.tables; ++table) {
          const auto ids = stream.Batch(step, table);
          const uint8_t* shard = stream.ShardsOf(step, table);
          const std::unique_ptr<SparseRows>* mine = &rows[static_cast<size_t>(table) * shards];
          for (size_t i = 0; i < ids.size(); ++i) {
            mine[shard[i]]->Apply(ids[i], gradient.data() + i * dim, 1.0f, clock);
          }
        }
        if (pass >= 0) result.pass[pass].apply_seconds += Seconds(start);
      },
      [&](int) { admitted_before = admitted(); },
      [&](int pass) { result.pass[pass].admitted = admitted() - admitted_before; });
  result.rows_min = std::numeric_limits<uint64_t>::max();
  for (const auto& table : rows) {
    const SparseRowsStats stats = table->stats();
    result.rows_min = std::min(result.rows_min, stats.rows);
    result.rows_max = std::max(result.rows_max, stats.rows);
    result.evicted += stats.evicted;
  }
  return result;
}

// Ids per second a single-thread memcpy of a batch's row bytes (batch x dim
// floats, one call) would serve: the floor of any lookup.
double MemcpyIdsPerSecond(int batch, int dim) {
  const size_t floats = static_cast<size_t>(batch) * dim;
  std::vector<float> source(floats, 1.0f), dest(floats, 0.0f);
  std::memcpy(dest.data(), source.data(), floats * sizeof(float));  // fault pages in
  uint64_t copies = 0;
  const auto start = BenchClock::now();
  double seconds = 0;
  while (seconds < 0.05 || copies < 10) {
    source[copies % floats] = static_cast<float>(copies);  // each copy reads changed data
    std::memcpy(dest.data(), source.data(), floats * sizeof(float));
    ++copies;
    seconds = Seconds(start);
  }
  volatile float sink = dest[floats / 2];
  (void)sink;
  return PerSecond(static_cast<double>(copies) * batch, seconds);
}

// ---- the wire ------------------------------------------------------------------

struct WirePass {
  double pull_seconds = 0;
  double push_seconds = 0;
  SparseTableStats timed;  // the pass's counters, every table
  // CPU time over the pass (pulls and pushes): this process (the client's
  // threads; nothing else runs meanwhile) and the shards together.
  double client_cpu_seconds = 0;
  double shard_cpu_seconds = 0;
};

struct WireResult {
  WirePass pass[kPasses];
};

double ShardsCpuSeconds(const std::vector<pid_t>& pids) {
  double sum = 0;
  for (pid_t pid : pids) sum += std::max(0.0, ProcessCpuSecondsOf(pid));
  return sum;
}

SparseTableStats operator-(const SparseTableStats& a, const SparseTableStats& b) {
  SparseTableStats d;
  d.rows_pulled = a.rows_pulled - b.rows_pulled;
  d.rows_pushed = a.rows_pushed - b.rows_pushed;
  d.ids_requested = a.ids_requested - b.ids_requested;
  d.cache_hits = a.cache_hits - b.cache_hits;
  d.cache_misses = a.cache_misses - b.cache_misses;
  d.bytes_pushed = a.bytes_pushed - b.bytes_pushed;
  d.bytes_pulled = a.bytes_pulled - b.bytes_pulled;
  return d;
}

absl::StatusOr<SparseTableStats> SumStats(const Client& client,
                                          const std::vector<std::string>& names) {
  SparseTableStats sum;
  for (const std::string& name : names) {
    auto stats = client.SparseStats(name);
    if (!stats.ok()) return stats.status();
    sum.rows_pulled += stats->rows_pulled;
    sum.rows_pushed += stats->rows_pushed;
    sum.ids_requested += stats->ids_requested;
    sum.cache_hits += stats->cache_hits;
    sum.cache_misses += stats->cache_misses;
    sum.bytes_pushed += stats->bytes_pushed;
    sum.bytes_pulled += stats->bytes_pulled;
  }
  return sum;
}

// Registers tables `prefix`/t0.. with `table` and runs the stream through
// them (ForEachStep): each step pulls every table's batch (all tables in
// flight at once, then waits for all), then, with `push`, pushes a gradient
// for every id of every batch the same way (the client sums a repeated id's
// gradients). Pulls and pushes are timed apart.
absl::StatusOr<WireResult> RunWire(Client& client, const std::vector<pid_t>& shard_pids,
                                   const std::string& prefix, const SparseTableOptions& table,
                                   const Stream& stream, bool push, int passes,
                                   bool per_table_calls) {
  std::vector<std::string> names;
  for (int t = 0; t < stream.tables; ++t) {
    names.push_back(absl::StrCat(prefix, "/t", t));
    if (auto status = client.RegisterSparseTable(names.back(), table); !status.ok()) {
      return status;
    }
  }
  const size_t floats = stream.max_batch * table.dim;
  std::vector<std::vector<float>> out(stream.tables, std::vector<float>(floats));
  const std::vector<float> gradient(floats, kGradient);
  WireResult result;
  SparseTableStats before;
  double client_cpu = 0, shard_cpu = 0;
  std::vector<Client::Handle> handles;
  absl::Status failed;
  auto wait_all = [&](const char* what, int step) {
    for (size_t h = 0; h < handles.size(); ++h) {
      absl::Status status = client.Wait(handles[h], absl::Now() + kCallTimeout);
      if (!status.ok() && failed.ok()) {
        failed = absl::Status(status.code(),
                              absl::StrCat(what, handles.size() == 1 ? "" : " of ",
                                           handles.size() == 1 ? "" : names[h], " at step ",
                                           step, ": ", status.message()));
      }
    }
    handles.clear();
  };
  std::vector<SparseRowsPull> pulls(stream.tables);
  std::vector<SparseRowsPush> pushes(stream.tables);
  ForEachStep(
      stream, passes,
      [&](int step, int64_t, int pass) {
        if (!failed.ok()) return;
        auto start = BenchClock::now();
        for (int t = 0; t < stream.tables; ++t) {
          const auto ids = stream.Batch(step, t);
          pulls[t] = {names[t], ids, absl::MakeSpan(out[t]).subspan(0, ids.size() * table.dim)};
          if (per_table_calls) {
            handles.push_back(client.PullRowsAsync(pulls[t].table, pulls[t].ids, pulls[t].out));
          }
        }
        if (!per_table_calls) handles.push_back(client.PullRowsAsync(pulls));
        wait_all("pull", step);
        if (pass >= 0) result.pass[pass].pull_seconds += Seconds(start);
        if (!push) return;
        start = BenchClock::now();
        for (int t = 0; t < stream.tables; ++t) {
          const auto ids = stream.Batch(step, t);
          pushes[t] = {names[t], ids,
                       absl::MakeConstSpan(gradient).subspan(0, ids.size() * table.dim)};
          if (per_table_calls) {
            handles.push_back(
                client.PushRowsAsync(pushes[t].table, pushes[t].ids, pushes[t].gradients));
          }
        }
        if (!per_table_calls) handles.push_back(client.PushRowsAsync(pushes));
        wait_all("push", step);
        if (pass >= 0) result.pass[pass].push_seconds += Seconds(start);
      },
      [&](int) {
        auto stats = SumStats(client, names);
        if (!stats.ok() && failed.ok()) failed = stats.status();
        before = stats.ok() ? *stats : SparseTableStats{};
        client_cpu = ProcessCpuSeconds();
        shard_cpu = ShardsCpuSeconds(shard_pids);
      },
      [&](int pass) {
        WirePass& mine = result.pass[pass];
        mine.client_cpu_seconds = ProcessCpuSeconds() - client_cpu;
        mine.shard_cpu_seconds = ShardsCpuSeconds(shard_pids) - shard_cpu;
        auto after = SumStats(client, names);
        if (!after.ok() && failed.ok()) failed = after.status();
        if (after.ok()) mine.timed = *after - before;
      });
  if (!failed.ok()) return failed;
  return result;
}

// What every shard holds (AdminService.GetStatus; the shards have no job
// token, so it is answered on loopback): its parameter bytes and the rows of
// each sparse table whose name starts with `prefix`.
struct ShardHeld {
  uint64_t param_bytes = 0;
  std::vector<uint64_t> rows;  // one per table of the prefix
};

absl::StatusOr<std::vector<ShardHeld>> ReadShards(const std::vector<std::string>& addresses,
                                                  const std::string& prefix) {
  std::vector<ShardHeld> shards;
  for (size_t i = 0; i < addresses.size(); ++i) {
    auto stub = proto::AdminService::NewStub(
        grpc::CreateChannel(addresses[i], grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::StatusRequest request;
    request.set_include_tensors(true);
    proto::StatusResponse response;
    const grpc::Status status = stub->GetStatus(&context, request, &response);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("shard ", i, " (", addresses[i],
                                                 "): GetStatus: ", status.error_message()));
    }
    ShardHeld held;
    held.param_bytes = response.param_bytes();
    for (const proto::TensorHeld& tensor : response.tensors()) {
      if (absl::StartsWith(tensor.name(), prefix) && tensor.shape_size() >= 1) {
        held.rows.push_back(tensor.shape(0));
      }
    }
    shards.push_back(std::move(held));
  }
  return shards;
}

// ---- the cases -------------------------------------------------------------------

// The id stream as the worker sends it, and each batch's distinct ids.
struct Streams {
  Stream sent;
  Stream distinct;
};

// A job for one dimension's wire cases: its shards and the worker.
struct Job {
  std::unique_ptr<ServerCluster> cluster;
  std::unique_ptr<Client> client;
};

Json Head(const char* kase, const Options& options, int dim) {
  return Json{{"bench", "embedding"},
              {"case", kase},
              {"dim", dim},
              {"tables", options.tables},
              {"batch", options.batch},
              {"distinct_ids", options.distinct_ids},
              {"zipf", options.zipf},
              {"shards", options.shards},
              {"workers", 1},
              {"optimizer", options.optimizer},
              {"wire_dtype", options.wire_dtype},
              {"calls_in_flight", options.calls_in_flight},
              {"per_table_calls", options.per_table_calls},
              {"transport", options.transport},
              {"batches", options.batches}};
}

void Print(const Json& line) {
  std::printf("%s\n", DumpJson(line).c_str());
  std::fflush(stdout);
}

absl::Status MemoryCase(const Options& options, int dim) {
  for (const std::string& optimizer : options.optimizers) {
    auto config = RowsConfig(TableOptions(options, dim, optimizer));
    if (!config.ok()) return config.status();
    SparseRows rows("fill", *config);
    std::vector<float> out(dim);
    const auto start = BenchClock::now();
    for (uint64_t i = 0; i < options.fill_rows; ++i) {
      rows.Lookup(static_cast<int64_t>(MixRowId(static_cast<int64_t>(i))), 0, out.data());
    }
    const double seconds = Seconds(start);
    const SparseRowsStats stats = rows.stats();
    const double ratio = Ratio(stats.bytes_per_row, static_cast<double>(stats.raw_row_bytes));
    Print(Json{{"bench", "embedding"},
               {"case", "memory"},
               {"dim", dim},
               {"optimizer", optimizer},
               {"rows", stats.rows},
               {"fill_seconds", RoundTo(seconds, 3)},
               {"reserved_bytes", stats.reserved_bytes},
               {"bytes_per_row", RoundTo(stats.bytes_per_row, 1)},
               {"raw_row_bytes", stats.raw_row_bytes},
               {"memory_ratio", RoundTo(ratio, 3)},
               {"target_memory_ratio", kTargetMemoryRatio}});
    std::fprintf(stderr, "memory  d=%-4d %-15s %llu rows: %.1f B/row, raw %llu B, x%.2f\n", dim,
                 optimizer.c_str(), static_cast<unsigned long long>(stats.rows),
                 stats.bytes_per_row, static_cast<unsigned long long>(stats.raw_row_bytes),
                 ratio);
  }
  return absl::OkStatus();
}

// The unbounded rates of a dimension, kept for the budget case's ratios.
struct Rates {
  double pull_ids_per_s = 0;
  double push_ids_per_s = 0;
};

absl::Status RateCase(const Options& options, const Streams& streams, int dim, Job& job,
                      Rates* rates) {
  const SparseTableOptions table = TableOptions(options, dim, options.optimizer);
  auto config = RowsConfig(table);
  if (!config.ok()) return config.status();
  const InProcessResult local = RunInProcess(streams.sent, *config, options.shards, kPasses);
  const InProcessResult shards_work =
      RunInProcess(streams.distinct, *config, options.shards, kPasses);
  const double memcpy_ids_per_s = MemcpyIdsPerSecond(options.batch, dim);
  const std::string prefix = absl::StrCat("rate/d", dim);
  auto wire = RunWire(*job.client, job.cluster->pids(), prefix, table, streams.sent,
                      /*push=*/true, kPasses, options.per_table_calls);
  if (!wire.ok()) return wire.status();
  auto held = ReadShards(job.cluster->addresses(), prefix);
  if (!held.ok()) return held.status();
  uint64_t shard_rows = 0, param_bytes = 0;
  for (const ShardHeld& shard : *held) {
    for (uint64_t rows : shard.rows) shard_rows += rows;
    param_bytes += shard.param_bytes;
  }
  const double ids = static_cast<double>(streams.sent.timed_ids);
  const double distinct_ids = static_cast<double>(streams.distinct.TimedLength());
  const double shards = options.shards;
  for (int p = 0; p < kPasses; ++p) {
    const WirePass& w = wire->pass[p];
    const InProcessPass& sent = local.pass[p];
    const InProcessPass& distinct = shards_work.pass[p];
    const double pull = PerSecond(ids, w.pull_seconds);
    const double push = PerSecond(ids, w.push_seconds);
    const double lookup = PerSecond(ids, sent.lookup_seconds);
    const double apply = PerSecond(ids, sent.apply_seconds);
    const double distinct_lookup = PerSecond(ids, distinct.lookup_seconds);
    const double distinct_apply = PerSecond(ids, distinct.apply_seconds);
    if (p == 0) {
      rates->pull_ids_per_s = pull;
      rates->push_ids_per_s = push;
    }
    Json line = Head("rate", options, dim);
    line["phase"] = kPassNames[p];
    line["ids"] = streams.sent.timed_ids;
    line["distinct_per_batch"] = RoundTo(DistinctPerBatch(streams.distinct), 1);
    line["new_row_fraction"] = RoundTo(Ratio(distinct.admitted, distinct_ids), 4);
    line["wire_pull_ids_per_s"] = Whole(pull);
    line["wire_push_ids_per_s"] = Whole(push);
    line["wire_pull_rows_per_s_per_shard"] =
        Whole(PerSecond(w.timed.rows_pulled / shards, w.pull_seconds));
    line["wire_push_rows_per_s_per_shard"] =
        Whole(PerSecond(w.timed.rows_pushed / shards, w.push_seconds));
    line["wire_pull_mb_per_s"] = RoundTo(PerSecond(w.timed.bytes_pulled / 1e6, w.pull_seconds), 1);
    line["wire_push_mb_per_s"] = RoundTo(PerSecond(w.timed.bytes_pushed / 1e6, w.push_seconds), 1);
    line["pull_step_ms"] = RoundTo(1e3 * w.pull_seconds / options.batches, 3);
    line["push_step_ms"] = RoundTo(1e3 * w.push_seconds / options.batches, 3);
    line["inproc_lookup_ids_per_s"] = Whole(lookup);
    line["inproc_apply_ids_per_s"] = Whole(apply);
    line["inproc_distinct_lookup_ids_per_s"] = Whole(distinct_lookup);
    line["inproc_distinct_apply_ids_per_s"] = Whole(distinct_apply);
    line["memcpy_ids_per_s"] = Whole(memcpy_ids_per_s);
    line["pull_wire_over_inproc"] = RoundTo(Ratio(pull, lookup), 4);
    line["push_wire_over_inproc"] = RoundTo(Ratio(push, apply), 4);
    line["pull_wire_over_inproc_distinct"] = RoundTo(Ratio(pull, distinct_lookup), 4);
    line["push_wire_over_inproc_distinct"] = RoundTo(Ratio(push, distinct_apply), 4);
    line["lookup_over_memcpy"] = RoundTo(Ratio(lookup, memcpy_ids_per_s), 4);
    line["apply_over_memcpy"] = RoundTo(Ratio(apply, memcpy_ids_per_s), 4);
    line["target_wire_over_inproc"] = kTargetWireOverInProcess;
    // CPU per id of a pull and a push together: the client's threads, the
    // shards' processes, and the in-process tables on the distinct ids.
    const double client_ns = 1e9 * w.client_cpu_seconds / ids;
    const double shard_ns = 1e9 * w.shard_cpu_seconds / ids;
    const double inproc_ns = 1e9 * (distinct.lookup_seconds + distinct.apply_seconds) / ids;
    line["wire_client_cpu_ns_per_id"] = RoundTo(client_ns, 1);
    line["wire_shard_cpu_ns_per_id"] = RoundTo(shard_ns, 1);
    line["inproc_distinct_ns_per_id"] = RoundTo(inproc_ns, 1);
    line["shard_rows"] = shard_rows;
    line["shard_bytes_per_row"] = RoundTo(Ratio(static_cast<double>(param_bytes), shard_rows), 1);
    line["raw_row_bytes"] = (uint64_t{config->dim} + config->state_floats()) * sizeof(float);
    Print(line);
    std::fprintf(stderr,
                 "rate    d=%-4d %s: pull %.3g ids/s (in process %.3g, x%.2f; distinct %.3g, "
                 "x%.2f), push %.3g ids/s (in process %.3g, x%.2f; distinct %.3g, x%.2f), "
                 "memcpy %.3g ids/s; cpu ns/id client %.0f shards %.0f in process %.0f\n",
                 dim, kPassNames[p], pull, lookup, Ratio(pull, lookup), distinct_lookup,
                 Ratio(pull, distinct_lookup), push, apply, Ratio(push, apply), distinct_apply,
                 Ratio(push, distinct_apply), memcpy_ids_per_s, client_ns, shard_ns, inproc_ns);
  }
  return absl::OkStatus();
}

absl::Status CacheCase(const Options& options, const Streams& streams, int dim, Job& job) {
  const Stream& stream = streams.sent;
  const std::vector<pid_t>& pids = job.cluster->pids();
  SparseTableOptions table = TableOptions(options, dim, options.optimizer);
  auto uncached = RunWire(*job.client, pids, absl::StrCat("serve/d", dim), table, stream,
                          /*push=*/false, 1, options.per_table_calls);
  if (!uncached.ok()) return uncached.status();
  table.cache_rows = options.cache_rows;
  table.cache_staleness = options.cache_staleness;
  auto train = RunWire(*job.client, pids, absl::StrCat("cache_train/d", dim), table, stream,
                       /*push=*/true, 1, options.per_table_calls);
  if (!train.ok()) return train.status();
  auto serve = RunWire(*job.client, pids, absl::StrCat("cache_serve/d", dim), table, stream,
                       /*push=*/false, 1, options.per_table_calls);
  if (!serve.ok()) return serve.status();
  auto hit_rate = [](const SparseTableStats& s) {
    return Ratio(static_cast<double>(s.cache_hits),
                 static_cast<double>(s.cache_hits + s.cache_misses));
  };
  auto wire_fraction = [](const SparseTableStats& s) {
    return Ratio(static_cast<double>(s.rows_pulled), static_cast<double>(s.ids_requested));
  };
  const double ids = static_cast<double>(stream.timed_ids);
  const double serve_pull = PerSecond(ids, serve->pass[0].pull_seconds);
  const double uncached_pull = PerSecond(ids, uncached->pass[0].pull_seconds);
  Json line = Head("cache", options, dim);
  line["cache_rows"] = options.cache_rows;
  line["cache_staleness"] = options.cache_staleness;
  line["train_hit_rate"] = RoundTo(hit_rate(train->pass[0].timed), 4);
  line["train_wire_fraction"] = RoundTo(wire_fraction(train->pass[0].timed), 4);
  line["serve_hit_rate"] = RoundTo(hit_rate(serve->pass[0].timed), 4);
  line["serve_wire_fraction"] = RoundTo(wire_fraction(serve->pass[0].timed), 4);
  line["uncached_wire_fraction"] = RoundTo(wire_fraction(uncached->pass[0].timed), 4);
  line["serve_pull_ids_per_s"] = Whole(serve_pull);
  line["uncached_pull_ids_per_s"] = Whole(uncached_pull);
  line["cache_speedup"] = RoundTo(Ratio(serve_pull, uncached_pull), 3);
  Print(line);
  std::fprintf(stderr,
               "cache   d=%-4d hit rate training %.3f, serving %.3f; serving pulls %.3g ids/s "
               "(uncached %.3g, x%.2f)\n",
               dim, hit_rate(train->pass[0].timed), hit_rate(serve->pass[0].timed), serve_pull, uncached_pull,
               Ratio(serve_pull, uncached_pull));
  return absl::OkStatus();
}

absl::Status BudgetCase(const Options& options, const Streams& streams, int dim, Job& job,
                        const Rates& unbounded) {
  const Stream& stream = streams.sent;
  SparseTableOptions table = TableOptions(options, dim, options.optimizer);
  table.max_rows = options.max_rows;
  auto config = RowsConfig(table);
  if (!config.ok()) return config.status();
  // The shards' tables: the distinct ids of each batch, so that their rows
  // and evictions are the shards' (up to the order of the sampled evictions).
  const InProcessResult local = RunInProcess(streams.distinct, *config, options.shards, 1);
  const std::string prefix = absl::StrCat("budget/d", dim);
  auto wire = RunWire(*job.client, job.cluster->pids(), prefix, table, stream, /*push=*/true, 1,
                      options.per_table_calls);
  if (!wire.ok()) return wire.status();
  auto held = ReadShards(job.cluster->addresses(), prefix);
  if (!held.ok()) return held.status();
  uint64_t rows_min = std::numeric_limits<uint64_t>::max(), rows_max = 0;
  for (const ShardHeld& shard : *held) {
    for (uint64_t rows : shard.rows) {
      rows_min = std::min(rows_min, rows);
      rows_max = std::max(rows_max, rows);
    }
  }
  if (rows_max == 0) rows_min = 0;
  const double ids = static_cast<double>(stream.timed_ids);
  const double pull = PerSecond(ids, wire->pass[0].pull_seconds);
  const double push = PerSecond(ids, wire->pass[0].push_seconds);
  Json line = Head("budget", options, dim);
  line["max_rows"] = options.max_rows;
  line["wire_rows_min"] = rows_min;
  line["wire_rows_max"] = rows_max;
  line["wire_pull_ids_per_s"] = Whole(pull);
  line["wire_push_ids_per_s"] = Whole(push);
  // -1: no unbounded figure (--cases without rate).
  line["pull_over_unbounded"] =
      unbounded.pull_ids_per_s > 0 ? RoundTo(Ratio(pull, unbounded.pull_ids_per_s), 4) : -1;
  line["push_over_unbounded"] =
      unbounded.push_ids_per_s > 0 ? RoundTo(Ratio(push, unbounded.push_ids_per_s), 4) : -1;
  line["inproc_rows_min"] = local.rows_min;
  line["inproc_rows_max"] = local.rows_max;
  line["inproc_evicted"] = local.evicted;
  line["inproc_distinct_lookup_ids_per_s"] = Whole(PerSecond(ids, local.pass[0].lookup_seconds));
  line["inproc_distinct_apply_ids_per_s"] = Whole(PerSecond(ids, local.pass[0].apply_seconds));
  Print(line);
  std::fprintf(stderr,
               "budget  d=%-4d max_rows %llu: shards hold %llu-%llu rows a table, in process "
               "%llu-%llu with %llu evicted; pull %.3g ids/s, push %.3g ids/s\n",
               dim, static_cast<unsigned long long>(options.max_rows),
               static_cast<unsigned long long>(rows_min), static_cast<unsigned long long>(rows_max),
               static_cast<unsigned long long>(local.rows_min),
               static_cast<unsigned long long>(local.rows_max),
               static_cast<unsigned long long>(local.evicted), pull, push);
  return absl::OkStatus();
}

absl::Status RunDim(const Options& options, const std::string& binary, const Streams& streams,
                    int dim) {
  if (options.memory) {
    if (auto status = MemoryCase(options, dim); !status.ok()) return status;
  }
  if (!(options.rate || options.cache || options.budget)) return absl::OkStatus();
  // ASP: a pull never waits for a round, so what is timed is the client,
  // gRPC, loopback and the shards' row path. A fresh job per dimension.
  Job job;
  std::vector<std::string> flags = {"--sync=asp", "--job=bench", "--optimizer=sgd", "--lr=0.001",
                                    "--shutdown_grace_ms=500"};
  if (options.transport == "ucx") flags.push_back("--ucx");
  if (options.transport == "tcp") flags.push_back("--tcp");
  auto cluster = ServerCluster::Start(binary, options.shards, /*num_workers=*/1, flags);
  if (!cluster.ok()) return cluster.status();
  job.cluster = std::move(*cluster);
  ClientOptions client_options;
  client_options.servers = job.cluster->addresses();
  client_options.job = "bench";
  client_options.rank = 0;
  client_options.worker_name = "bench-embedding";
  client_options.connect_timeout = absl::Seconds(10);
  client_options.rpc_timeout = kCallTimeout;
  client_options.max_calls_in_flight = options.calls_in_flight;
  client_options.transport = options.transport;
  auto client = Client::Create(client_options);
  if (!client.ok()) return client.status();
  job.client = std::move(*client);
  Rates rates;
  if (options.rate) {
    if (auto status = RateCase(options, streams, dim, job, &rates); !status.ok()) return status;
  }
  if (options.cache) {
    if (auto status = CacheCase(options, streams, dim, job); !status.ok()) return status;
  }
  if (options.budget) {
    if (auto status = BudgetCase(options, streams, dim, job, rates); !status.ok()) return status;
  }
  // The client goes before its shards.
  job.client.reset();
  return absl::OkStatus();
}

}  // namespace

int RunEmbeddingBench(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseSubcommandFlags(
          argc, argv, kUsage,
          {"dims", "tables", "distinct_ids", "zipf", "batch", "batches", "warmup_batches",
           "shards", "optimizer", "optimizers", "fill_rows", "cache_rows", "cache_staleness",
           "max_rows", "wire_dtype", "cases", "quick", "server_binary", "calls_in_flight", "per_table_calls",
           "transport"},
          ParseArgs, &options)) {
    return *exit_code;
  }
  std::string binary;
  if (options.rate || options.cache || options.budget) {
    auto found = PrepareServerBench("embedding", options.server_binary);
    if (!found.ok()) return 2;
    binary = *found;
  }
  const auto started = BenchClock::now();
  Streams streams;
  streams.sent = MakeStream(options);
  streams.distinct = Deduplicated(streams.sent);
  std::fprintf(stderr,
               "embedding: %d tables x %d ids a batch, Zipf(%g) over %llu ids, %.0f distinct a "
               "batch; %d+%d steps; %d shards\n",
               options.tables, options.batch, options.zipf,
               static_cast<unsigned long long>(options.distinct_ids),
               DistinctPerBatch(streams.distinct), options.warmup_batches, options.batches,
               options.shards);
  for (int dim : options.dims) {
    if (auto status = RunDim(options, binary, streams, dim); !status.ok()) {
      std::fprintf(stderr, "harrier-bench embedding: d=%d: %s\n", dim, status.ToString().c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "embedding: done in %.1f s\n", Seconds(started));
  return 0;
}

}  // namespace harrier::bench
