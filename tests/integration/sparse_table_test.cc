// Sparse tables through real shards and the real client: exact values under
// BSP, SSP and ASP (and a hybrid job whose dense tensor runs BSP), repeated
// ids summed on the worker, per-row optimizers against a reference,
// admission, the row budget, 16-bit rows on the wire, and hostile pushes
// and pulls refused whole with nothing changed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "common/crc32c.h"
#include "common/partitioner.h"
#include "common/row_placement.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "tests/integration/raw_grpc_shard.h"
#include "worker/client.h"
#include "worker/control_client.h"
#include "worker/transport/transport_factory.h"

namespace harrier {
namespace {

constexpr int kDim = 4;

// Worker r's ids at step t: 0..9 for everyone (id 3 twice, each with half
// its gradient), and 100 + r for r alone.
std::vector<int64_t> IdsOf(int rank) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 10; ++id) ids.push_back(id);
  ids.push_back(3);
  ids.push_back(100 + rank);
  return ids;
}

// The gradient of one element of `id` from `rank` (integers: averages and
// sums stay exact in fp32 with lr = 1).
float GradientOf(int rank, int64_t id, int j) {
  return static_cast<float>((rank + 1) * (id % 5 + 1) * (j + 1));
}

std::vector<float> GradientsOf(int rank, const std::vector<int64_t>& ids) {
  std::vector<float> g(ids.size() * kDim);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < kDim; ++j) {
      // id 3 appears twice: half each, summed by the client.
      g[i * kDim + j] = GradientOf(rank, ids[i], j) * (ids[i] == 3 ? 0.5f : 1.0f);
    }
  }
  return g;
}

// The value of element j of `id` after `steps` steps of every worker (SGD,
// lr 1, rows starting at 0, each push scaled 1/n or averaged in a round).
float Expected(int workers, int64_t id, int j, int steps) {
  float per_step = 0;
  if (id >= 100) {
    per_step = GradientOf(static_cast<int>(id - 100), id, j) / workers;
  } else {
    for (int r = 0; r < workers; ++r) per_step += GradientOf(r, id, j);
    per_step /= workers;
  }
  return -per_step * steps;
}

ClientOptions OptionsFor(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers) {
  ClientOptions options;
  options.servers = testing::Addresses(servers);
  options.rpc_timeout = absl::Seconds(60);
  return options;
}

SparseTableOptions ExactTable() {
  SparseTableOptions table;
  table.dim = kDim;
  table.optimizer = "sgd";
  table.lr = 1.0f;
  table.init_scale = 0.0f;
  return table;
}

// Runs `workers` threads, each with its own client; returns the first
// failure ("" if none).
std::string RunWorkers(int workers, const std::function<std::string(Client&, int rank)>& body,
                       const std::vector<std::unique_ptr<testing::ServerProcess>>& servers) {
  std::vector<std::string> failures(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto client = Client::Create(OptionsFor(servers));
      if (!client.ok()) {
        failures[w] = client.status().ToString();
        return;
      }
      failures[w] = body(**client, (*client)->rank());
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    if (!failure.empty()) return failure;
  }
  return "";
}

TEST_CASE("sparse BSP: 2 shards, 2 workers, every pull exact") {
  constexpr int kWorkers = 2, kSteps = 12;
  auto servers = testing::StartCluster(2, kWorkers, {"--sync=bsp", "--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  const std::string failure = RunWorkers(
      kWorkers,
      [&](Client& client, int rank) -> std::string {
        if (auto status = client.RegisterSparseTable("emb", ExactTable()); !status.ok()) {
          return status.ToString();
        }
        const std::vector<int64_t> ids = IdsOf(rank);
        const std::vector<float> grads = GradientsOf(rank, ids);
        std::vector<float> rows(ids.size() * kDim);
        for (int t = 0; t < kSteps; ++t) {
          if (auto status = client.PullRows("emb", ids, absl::MakeSpan(rows)); !status.ok()) {
            return status.ToString();
          }
          for (size_t i = 0; i < ids.size(); ++i) {
            for (int j = 0; j < kDim; ++j) {
              const float want = Expected(kWorkers, ids[i], j, t);
              if (rows[i * kDim + j] != want) {
                return absl::StrCat("rank ", rank, " step ", t, " id ", ids[i], " element ", j,
                                    ": ", rows[i * kDim + j], " != ", want);
              }
            }
          }
          if (auto status = client.PushRows("emb", ids, grads); !status.ok()) {
            return status.ToString();
          }
        }
        auto clock = client.TensorClock("emb");
        if (!clock.ok() || *clock != kSteps) return "table clock is not the push count";
        auto stats = client.SparseStats("emb");
        if (!stats.ok()) return stats.status().ToString();
        // 12 ids asked per step, 11 distinct: the repeat never left.
        if (stats->ids_requested != 12u * kSteps || stats->rows_pulled != 11u * kSteps) {
          return absl::StrCat("ids asked ", stats->ids_requested, ", rows pulled ",
                              stats->rows_pulled);
        }
        return "";
      },
      *servers);
  INFO(failure);
  CHECK(failure.empty());
}

// SSP and ASP apply each push on arrival, scaled 1/n: once every worker is
// done (a barrier), every row holds the same total as under BSP.
void RunAsync(const std::vector<std::string>& flags, const std::string& table_sync,
              int64_t staleness) {
  constexpr int kWorkers = 2, kSteps = 10;
  auto servers = testing::StartCluster(2, kWorkers, flags);
  REQUIRE(servers.ok());
  const std::string failure = RunWorkers(
      kWorkers,
      [&](Client& client, int rank) -> std::string {
        SparseTableOptions table = ExactTable();
        table.sync = table_sync;
        table.staleness = staleness;
        if (auto status = client.RegisterSparseTable("emb", table); !status.ok()) {
          return status.ToString();
        }
        // A dense tensor beside it, on the job's --sync.
        if (auto status = client.RegisterTensor("dense", {3}, {}); !status.ok()) {
          return status.ToString();
        }
        std::vector<float> dense(3), ones(3, 1.0f);
        const std::vector<int64_t> ids = IdsOf(rank);
        const std::vector<float> grads = GradientsOf(rank, ids);
        std::vector<float> rows(ids.size() * kDim);
        for (int t = 0; t < kSteps; ++t) {
          if (auto status = client.PullRows("emb", ids, absl::MakeSpan(rows)); !status.ok()) {
            return status.ToString();
          }
          if (auto status = client.PushRows("emb", ids, grads); !status.ok()) {
            return status.ToString();
          }
          if (auto status = client.PushPull("dense", ones, absl::MakeSpan(dense)); !status.ok()) {
            return status.ToString();
          }
          client.Clock();
        }
        if (auto status = client.Barrier("done"); !status.ok()) return status.ToString();
        if (auto status = client.PullRows("emb", ids, absl::MakeSpan(rows)); !status.ok()) {
          return status.ToString();
        }
        if (auto status = client.Pull("dense", absl::MakeSpan(dense)); !status.ok()) {
          return status.ToString();
        }
        for (size_t i = 0; i < ids.size(); ++i) {
          for (int j = 0; j < kDim; ++j) {
            const float want = Expected(kWorkers, ids[i], j, kSteps);
            if (rows[i * kDim + j] != want) {
              return absl::StrCat("id ", ids[i], " element ", j, ": ", rows[i * kDim + j],
                                  " != ", want);
            }
          }
        }
        // The dense tensor ran its own mode: lr 1, average gradient 1.
        if (dense[0] != -static_cast<float>(kSteps)) {
          return absl::StrCat("dense value ", dense[0]);
        }
        return "";
      },
      *servers);
  INFO(failure);
  CHECK(failure.empty());
}

TEST_CASE("sparse SSP and ASP: totals exact after every push") {
  SECTION("ssp job") { RunAsync({"--sync=ssp", "--staleness=2", "--optimizer=sgd", "--lr=1"}, "", 0); }
  SECTION("asp job") { RunAsync({"--sync=asp", "--optimizer=sgd", "--lr=1"}, "", 0); }
  SECTION("hybrid: dense BSP, sparse ASP") {
    RunAsync({"--sync=bsp", "--optimizer=sgd", "--lr=1"}, "asp", 0);
  }
  SECTION("hybrid: dense BSP, sparse SSP 3") {
    RunAsync({"--sync=bsp", "--optimizer=sgd", "--lr=1"}, "ssp", 3);
  }
}

// The per-row optimizers against a reference computed here, one worker.
TEST_CASE("sparse optimizers: adagrad, rowwise adagrad and adam per row") {
  auto servers = testing::StartCluster(1, 1, {"--sync=asp", "--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  auto client = Client::Create(OptionsFor(*servers));
  REQUIRE(client.ok());
  for (const std::string optimizer : {"adagrad", "rowwise_adagrad", "adam"}) {
    SparseTableOptions table = ExactTable();
    table.optimizer = optimizer;
    table.lr = 0.1f;
    table.initial_accumulator = 0.1f;
    REQUIRE((*client)->RegisterSparseTable("opt_" + optimizer, table).ok());
    const std::vector<int64_t> ids = {7, -5, int64_t{1} << 62};
    std::vector<float> value(ids.size() * kDim, 0.0f), first(value.size(), 0.0f),
        second(value.size(), optimizer == "adam" ? 0.0f : 0.1f);
    std::vector<float> row_acc(ids.size(), 0.1f);
    for (int t = 0; t < 5; ++t) {
      std::vector<float> g(ids.size() * kDim);
      for (size_t k = 0; k < g.size(); ++k) g[k] = std::sin(static_cast<float>(k + 3 * t));
      REQUIRE((*client)->PushRows("opt_" + optimizer, ids, g).ok());
      for (size_t i = 0; i < ids.size(); ++i) {
        double squares = 0;
        for (int j = 0; j < kDim; ++j) squares += double{g[i * kDim + j]} * g[i * kDim + j];
        row_acc[i] += static_cast<float>(squares / kDim);
        for (int j = 0; j < kDim; ++j) {
          const size_t k = i * kDim + j;
          if (optimizer == "adagrad") {
            second[k] += g[k] * g[k];
            value[k] -= 0.1f * g[k] / (std::sqrt(second[k]) + 1e-8f);
          } else if (optimizer == "rowwise_adagrad") {
            value[k] -= 0.1f / (std::sqrt(row_acc[i]) + 1e-8f) * g[k];
          } else {
            first[k] = 0.9f * first[k] + 0.1f * g[k];
            second[k] = 0.999f * second[k] + 0.001f * g[k] * g[k];
            const float m = first[k] / (1.0f - std::pow(0.9f, t + 1.0f));
            const float v = second[k] / (1.0f - std::pow(0.999f, t + 1.0f));
            value[k] -= 0.1f * m / (std::sqrt(v) + 1e-8f);
          }
        }
      }
    }
    std::vector<float> rows(ids.size() * kDim);
    REQUIRE((*client)->PullRows("opt_" + optimizer, ids, absl::MakeSpan(rows)).ok());
    for (size_t k = 0; k < rows.size(); ++k) {
      INFO(optimizer << " element " << k);
      CHECK(rows[k] == Approx(value[k]).margin(1e-5));
    }
  }
}

TEST_CASE("sparse rows: initializer, admission, row budget, 16-bit wire, cache") {
  auto servers = testing::StartCluster(2, 1, {"--sync=asp", "--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  auto client = Client::Create(OptionsFor(*servers));
  REQUIRE(client.ok());
  Client& c = **client;

  SECTION("rows start from (seed, table, id) alone, the same on every pull") {
    SparseTableOptions table = ExactTable();
    table.init_scale = 0.5f;
    table.seed = 11;
    REQUIRE(c.RegisterSparseTable("a", table).ok());
    REQUIRE(c.RegisterSparseTable("b", table).ok());
    const std::vector<int64_t> ids = {1, 2, 1};
    std::vector<float> a(ids.size() * kDim), a2(a.size()), b(a.size());
    REQUIRE(c.PullRows("a", ids, absl::MakeSpan(a)).ok());
    REQUIRE(c.PullRows("a", ids, absl::MakeSpan(a2)).ok());
    REQUIRE(c.PullRows("b", ids, absl::MakeSpan(b)).ok());
    CHECK(a == a2);
    CHECK(a != b);  // another table, other rows
    for (int j = 0; j < kDim; ++j) CHECK(a[j] == a[2 * kDim + j]);  // the repeat
    for (float v : a) CHECK(std::abs(v) < 0.5f);
  }

  SECTION("large replies: rows of 132 bytes cross the reply's pieces, each exact") {
    // 60000 rows of 33 floats come back as about 4 MB a shard, in pieces
    // whose boundaries fall inside rows; the cache keeps them too.
    SparseTableOptions table = ExactTable();
    table.dim = 33;
    table.cache_rows = 1 << 17;
    table.cache_staleness = 1;
    REQUIRE(c.RegisterSparseTable("wide", table).ok());
    std::vector<int64_t> ids(60000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 7919 - 100000;
    auto value = [](int64_t id, int j) { return static_cast<float>((id % 1000) * 33 + j); };
    std::vector<float> grads(ids.size() * 33);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < 33; ++j) grads[i * 33 + j] = -value(ids[i], j);
    }
    REQUIRE(c.PushRows("wide", ids, grads).ok());
    for (int pass = 0; pass < 2; ++pass) {  // from the shards, then from the cache
      std::vector<float> rows(grads.size(), -1.0f);
      REQUIRE(c.PullRows("wide", ids, absl::MakeSpan(rows)).ok());
      size_t wrong = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int j = 0; j < 33; ++j) wrong += rows[i * 33 + j] != value(ids[i], j);
      }
      CHECK(wrong == 0);
    }
    auto stats = c.SparseStats("wide");
    REQUIRE(stats.ok());
    CHECK(stats->cache_hits == ids.size());
  }

  SECTION("admission after 3 pushes: pulls get the initializer's row until then") {
    SparseTableOptions table = ExactTable();
    table.init_scale = 0.25f;
    table.admit_after = 3;
    REQUIRE(c.RegisterSparseTable("admit", table).ok());
    const std::vector<int64_t> ids = {42};
    std::vector<float> initial(kDim), now(kDim), g(kDim, 1.0f);
    REQUIRE(c.PullRows("admit", ids, absl::MakeSpan(initial)).ok());
    for (int push = 1; push <= 4; ++push) {
      REQUIRE(c.PushRows("admit", ids, g).ok());
      REQUIRE(c.PullRows("admit", ids, absl::MakeSpan(now)).ok());
      for (int j = 0; j < kDim; ++j) {
        // Pushes 1 and 2 are counted only; push 3 admits and applies.
        const float want = push < 3 ? initial[j] : initial[j] - (push - 2);
        CHECK(now[j] == want);
      }
    }
  }

  SECTION("admission with probability: a new draw on every push") {
    SparseTableOptions table = ExactTable();
    table.admit_probability = 0.3f;
    REQUIRE(c.RegisterSparseTable("maybe", table).ok());
    // Each of 40 ids pushed 20 times: each is admitted at some push (a
    // fixed draw would leave about 70 % of them out for ever), and once in,
    // every later push is applied.
    std::vector<int64_t> ids(40);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 1013;
    std::vector<float> g(ids.size() * kDim, 1.0f), rows(g.size());
    for (int push = 0; push < 20; ++push) REQUIRE(c.PushRows("maybe", ids, g).ok());
    REQUIRE(c.PullRows("maybe", ids, absl::MakeSpan(rows)).ok());
    int admitted = 0;
    for (size_t i = 0; i < ids.size(); ++i) admitted += rows[i * kDim] < 0.0f ? 1 : 0;
    CHECK(admitted == static_cast<int>(ids.size()));
  }

  SECTION("registering again with other settings names them") {
    REQUIRE(c.RegisterSparseTable("settings", ExactTable()).ok());
    SparseTableOptions other = ExactTable();
    other.lr = 0.5f;
    other.eviction = "lfu";
    // The shards answer first (as they would another worker).
    absl::Status status = c.RegisterSparseTable("settings", other);
    CHECK(absl::IsInvalidArgument(status));
    CHECK(status.message().find("lr 0.5 (the table's: 1)") != absl::string_view::npos);
    CHECK(status.message().find("eviction \"lfu\"") != absl::string_view::npos);
  }

  SECTION("a row budget of 64 per shard holds, and recent rows stay") {
    SparseTableOptions table = ExactTable();
    table.max_rows = 64;
    REQUIRE(c.RegisterSparseTable("budget", table).ok());
    std::vector<float> g(kDim, 1.0f), row(kDim);
    for (int64_t id = 0; id < 1000; ++id) {
      REQUIRE(c.PushRows("budget", std::vector<int64_t>{id}, g).ok());
    }
    // The latest row was just written: it is held (LRU keeps it).
    REQUIRE(c.PullRows("budget", std::vector<int64_t>{999}, absl::MakeSpan(row)).ok());
    CHECK(row[0] == -1.0f);
    // An evicted row comes back as the initializer's.
    REQUIRE(c.PullRows("budget", std::vector<int64_t>{0}, absl::MakeSpan(row)).ok());
    CHECK(row[0] == 0.0f);
  }

  SECTION("fp16 and bf16 rows on the wire") {
    for (const std::string wire : {"fp16", "bf16"}) {
      SparseTableOptions table = ExactTable();
      table.wire_dtype = wire;
      table.lr = 0.5f;
      REQUIRE(c.RegisterSparseTable("wire_" + wire, table).ok());
      std::vector<int64_t> ids(300);
      std::vector<float> g(ids.size() * kDim);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919);
      for (size_t k = 0; k < g.size(); ++k) g[k] = std::cos(static_cast<float>(k));
      REQUIRE(c.PushRows("wire_" + wire, ids, g).ok());
      std::vector<float> rows(g.size());
      REQUIRE(c.PullRows("wire_" + wire, ids, absl::MakeSpan(rows)).ok());
      const float tolerance = wire == "fp16" ? 2e-3f : 1e-2f;
      for (size_t k = 0; k < g.size(); ++k) CHECK(std::abs(rows[k] + 0.5f * g[k]) < tolerance);
      auto stats = c.SparseStats("wire_" + wire);
      REQUIRE(stats.ok());
      // Half the bytes of float32 (plus a codec header per call).
      CHECK(stats->bytes_pushed < g.size() * sizeof(float) * 6 / 10);
    }
  }

  SECTION("the hot-row cache serves rows within its staleness, counts hits") {
    SparseTableOptions table = ExactTable();
    table.cache_rows = 16;
    table.cache_staleness = 2;
    REQUIRE(c.RegisterSparseTable("cached", table).ok());
    const std::vector<int64_t> ids = {1, 2, 3};
    const std::vector<int64_t> other = {50};
    std::vector<float> rows(ids.size() * kDim), g(kDim, 1.0f);
    REQUIRE(c.PullRows("cached", ids, absl::MakeSpan(rows)).ok());   // clock 0: 3 misses
    REQUIRE(c.PullRows("cached", ids, absl::MakeSpan(rows)).ok());   // 3 hits
    REQUIRE(c.PushRows("cached", std::vector<int64_t>{1}, g).ok());  // clock 1
    // Within the bound the cached row is served, this worker's own update
    // not yet in it.
    REQUIRE(c.PullRows("cached", ids, absl::MakeSpan(rows)).ok());   // 3 hits
    CHECK(rows[0] == 0.0f);
    REQUIRE(c.PushRows("cached", other, g).ok());                    // clock 2
    REQUIRE(c.PullRows("cached", ids, absl::MakeSpan(rows)).ok());   // 3 hits (2 behind)
    CHECK(rows[0] == 0.0f);
    REQUIRE(c.PushRows("cached", other, g).ok());                    // clock 3
    REQUIRE(c.PullRows("cached", ids, absl::MakeSpan(rows)).ok());   // 3 misses: too old
    CHECK(rows[0] == -1.0f);
    auto stats = c.SparseStats("cached");
    REQUIRE(stats.ok());
    CHECK(stats->cache_hits == 9);
    CHECK(stats->cache_misses == 6);
    CHECK(stats->rows_pulled == 6);  // only the misses went to the shards
  }
}

TEST_CASE("sparse metrics: rows held, admitted, evicted, bytes per row") {
  const int metrics_port = testing::FreePort();
  auto servers = testing::StartCluster(
      1, 1, {"--sync=asp", "--lr=1", absl::StrCat("--metrics_port=", metrics_port)});
  REQUIRE(servers.ok());
  auto client = Client::Create(OptionsFor(*servers));
  REQUIRE(client.ok());
  SparseTableOptions table = ExactTable();
  table.max_rows = 64;
  REQUIRE((*client)->RegisterSparseTable("m", table).ok());
  SparseTableOptions counted = ExactTable();
  counted.admit_after = 2;
  REQUIRE((*client)->RegisterSparseTable("counted", counted).ok());
  std::vector<int64_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 31;
  std::vector<float> g(ids.size() * kDim, 1.0f);
  REQUIRE((*client)->PushRows("m", ids, g).ok());
  REQUIRE((*client)->PushRows("counted", absl::MakeConstSpan(ids).subspan(0, 10),
                              absl::MakeConstSpan(g).subspan(0, 10 * kDim))
              .ok());
  auto metric = [&](const char* name) { return testing::MetricValue(metrics_port, name); };
  CHECK(metric("harrier_server_sparse_rows") == 64);
  CHECK(metric("harrier_server_sparse_rows_admitted_total") == 300);
  CHECK(metric("harrier_server_sparse_rows_evicted_total") == 300 - 64);
  CHECK(metric("harrier_server_sparse_pushes_not_admitted_total") == 10);
  CHECK(metric("harrier_server_sparse_bytes_per_row") > 0);
  // A budget in bytes: 10000 bytes of rows of 4 floats (16 bytes, a 24-byte
  // record, at most 34 of index) is 135 rows.
  SparseTableOptions by_bytes = ExactTable();
  by_bytes.max_bytes = 10000;
  REQUIRE((*client)->RegisterSparseTable("bytes", by_bytes).ok());
  REQUIRE((*client)->PushRows("bytes", ids, g).ok());
  CHECK(metric("harrier_server_sparse_rows") == 64 + 135);
}

proto::TensorChunk RowsChunk(const std::string& key, uint32_t chunk, int64_t clock,
                             const std::vector<int64_t>& ids, const std::vector<float>& grads) {
  proto::TensorChunk c;
  c.set_job("harrier");
  c.set_rank(1);  // the raw caller's rank; the client is rank 0
  c.set_key(key);
  c.set_chunk(chunk);
  c.set_clock(clock);
  c.set_dtype(proto::DTYPE_FLOAT32);
  c.set_num_elements(grads.size());
  c.set_row_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
  c.set_payload(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
  c.set_checksum(Crc32c(c.payload().data(), c.payload().size()));
  return c;
}

// The part number a one-shard cluster's shard holds of `table`: the first
// that the partitioner places there.
uint32_t PartOnOneShard(const std::string& table) {
  uint32_t part = 0;
  HashPartitioner partitioner(1);
  while (partitioner.ShardFor(table, part) != 0) ++part;
  return part;
}

// One shard and two ranks: a Client as rank 0 with the sparse table
// `table` registered, and raw gRPC calls as rank 1 (RowsChunk) to the
// shard's part of it.
struct OneShardTable {
  OneShardTable(const std::string& table, const std::vector<std::string>& flags) {
    auto started = testing::StartCluster(1, 2, flags);
    REQUIRE(started.ok());
    servers = std::move(*started);
    auto created = Client::Create(OptionsFor(servers));
    REQUIRE(created.ok());
    client = std::move(*created);
    REQUIRE(client->RegisterSparseTable(table, ExactTable()).ok());
    part = PartOnOneShard(table);
    shard = std::make_unique<testing::RawGrpcShard>(testing::Addresses(servers)[0]);
  }

  // Declared so that the calls go before the shard processes.
  std::vector<std::unique_ptr<testing::ServerProcess>> servers;
  std::unique_ptr<Client> client;
  uint32_t part = 0;
  std::unique_ptr<testing::RawGrpcShard> shard;
};

TEST_CASE("sparse hostile input: refused whole, nothing changes") {
  // Two workers: the client (rank 0) and raw calls as rank 1.
  auto servers = testing::StartCluster(2, 2, {"--sync=asp", "--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  auto client = Client::Create(OptionsFor(*servers));
  REQUIRE(client.ok());
  Client& c = **client;
  REQUIRE(c.RegisterSparseTable("t", ExactTable()).ok());
  std::vector<std::string> addresses = testing::Addresses(*servers);
  // Ids of shard 0 and of shard 1, and the table's part on shard 0.
  std::vector<int64_t> mine, theirs;
  for (int64_t id = 0; mine.size() < 4 || theirs.empty(); ++id) {
    (RowShard(id, 2) == 0 ? mine : theirs).push_back(id);
  }
  mine.resize(4);
  uint32_t part = 0;
  {
    HashPartitioner partitioner(2);
    while (partitioner.ShardFor("t", part) != 0) ++part;
  }
  testing::RawGrpcShard shard0(addresses[0]);
  const std::vector<float> good(mine.size() * kDim, 1.0f);
  auto unchanged = [&] {
    std::vector<float> rows(mine.size() * kDim);
    REQUIRE(c.PullRows("t", mine, absl::MakeSpan(rows)).ok());
    for (float v : rows) CHECK(v == 0.0f);
  };
  SECTION("dimension mismatch") {
    std::vector<float> wrong(mine.size() * (kDim + 1), 1.0f);
    auto status = shard0.Push({RowsChunk("t", part, 0, mine, wrong)});
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(status.error_message().find("dimension") != std::string::npos);
  }
  SECTION("a row another shard owns, beside good ones") {
    std::vector<int64_t> ids = mine;
    ids.push_back(theirs[0]);
    std::vector<float> grads(ids.size() * kDim, 1.0f);
    auto status = shard0.Push({RowsChunk("t", part, 0, ids, grads)});
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(status.error_message().find("belongs to shard 1") != std::string::npos);
  }
  SECTION("NaN and huge gradients") {
    for (float bad : {std::nanf(""), 1e30f, -INFINITY}) {
      std::vector<float> grads = good;
      grads[5] = bad;
      auto status = shard0.Push({RowsChunk("t", part, 0, mine, grads)});
      CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    }
  }
  SECTION("a repeated id, ragged ids, a bad checksum") {
    std::vector<int64_t> twice = {mine[0], mine[0]};
    std::vector<float> grads(2 * kDim, 1.0f);
    CHECK(shard0.Push({RowsChunk("t", part, 0, twice, grads)}).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
    proto::TensorChunk ragged = RowsChunk("t", part, 0, mine, good);
    ragged.mutable_row_ids()->push_back('x');
    CHECK(shard0.Push({ragged}).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    proto::TensorChunk corrupt = RowsChunk("t", part, 0, mine, good);
    corrupt.set_checksum(corrupt.checksum() ^ 1);
    CHECK(shard0.Push({corrupt}).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  SECTION("more ids than a call may carry") {
    std::vector<int64_t> many;
    for (int64_t id = 0; many.size() <= (size_t{1} << 20); ++id) {
      if (RowShard(id, 2) == 0) many.push_back(id);
    }
    proto::TensorChunk chunk = RowsChunk("t", part, 0, many, {});
    auto status = shard0.Push({chunk});
    CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  SECTION("an unknown table") {
    auto status = shard0.Push({RowsChunk("nope", part, 0, mine, good)});
    CHECK(status.error_code() != grpc::StatusCode::OK);
  }
  SECTION("the client refuses a wrong output or gradient size before sending") {
    std::vector<float> small(3);
    CHECK(absl::IsInvalidArgument(c.PullRows("t", mine, absl::MakeSpan(small))));
    CHECK(absl::IsInvalidArgument(c.PushRows("t", mine, small)));
    CHECK(absl::IsNotFound(c.PullRows("unknown", mine, absl::MakeSpan(small))));
    // A refused push did not use the table's clock.
    CHECK(*c.TensorClock("t") == 0);
  }
  unchanged();
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

TEST_CASE("sparse pushes are applied exactly once when retried") {
  OneShardTable t("once", {"--sync=asp", "--optimizer=sgd", "--lr=1"});
  const std::vector<int64_t> ids = {5, 6};
  const std::vector<float> grads(ids.size() * kDim, 1.0f);
  // Rank 1's push for clock 0, sent three times (a retry after a lost
  // reply): applied once, scaled 1/2 (two workers, ASP).
  for (int attempt = 0; attempt < 3; ++attempt) {
    CHECK(t.shard->Push({RowsChunk("once", t.part, 0, ids, grads)}).ok());
  }
  std::vector<float> rows(ids.size() * kDim);
  REQUIRE(t.client->PullRows("once", ids, absl::MakeSpan(rows)).ok());
  for (float v : rows) CHECK(v == -0.5f);
  // Its next clock is applied as new.
  CHECK(t.shard->Push({RowsChunk("once", t.part, 1, ids, grads)}).ok());
  REQUIRE(t.client->PullRows("once", ids, absl::MakeSpan(rows)).ok());
  for (float v : rows) CHECK(v == -1.0f);
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

TEST_CASE("sparse BSP round sums count against --max_param_bytes") {
  OneShardTable t("rounds",
                  {"--sync=bsp", "--optimizer=sgd", "--lr=1", "--max_param_bytes=2000000"});
  // Rank 1 runs ahead of rank 0 with 40000 distinct rows a round: each
  // round's sums hold 40000 x (16 + 17) bytes until rank 0 pushes it.
  auto rows_from = [](int64_t first) {
    std::vector<int64_t> ids(40000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = first + static_cast<int64_t>(i);
    return ids;
  };
  const std::vector<float> grads(40000 * kDim, 1.0f);
  const std::vector<float> one_row(kDim, 1.0f);
  CHECK(t.shard->Push({RowsChunk("rounds", t.part, 0, {7}, one_row)}).ok());
  CHECK(t.shard->Push({RowsChunk("rounds", t.part, 1, rows_from(1000), grads)}).ok());
  const grpc::Status third =
      t.shard->Push({RowsChunk("rounds", t.part, 2, rows_from(1000000), grads)});
  CHECK(third.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(third.error_message().find("--max_param_bytes") != std::string::npos);
  // Refused whole: rank 1's clock 2 is still to come, and round 0 completes
  // with rank 0's push as before.
  std::vector<float> row(kDim);
  REQUIRE(
      t.client->PushRows("rounds", std::vector<int64_t>{7}, std::vector<float>(kDim, 2.0f)).ok());
  REQUIRE(t.client->PullRows("rounds", std::vector<int64_t>{7}, absl::MakeSpan(row)).ok());
  CHECK(row[0] == -1.5f);  // (2 + 1) / 2
}

// The shard's whole parameter account (StatusResponse.param_bytes), asked
// over the admin service as harrier-ctl does.
uint64_t ParamBytes(const testing::ServerProcess& shard) {
  auto admin = proto::AdminService::NewStub(
      grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::StatusResponse status;
  const grpc::Status answered = admin->GetStatus(&context, {}, &status);
  INFO(answered.error_message());
  REQUIRE(answered.ok());
  return status.param_bytes();
}

TEST_CASE("a sparse BSP round's sums are given back when the round completes") {
  OneShardTable t("rounds", {"--sync=bsp", "--optimizer=sgd", "--lr=1"});
  std::vector<int64_t> ids(40000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + static_cast<int64_t>(i);
  const std::vector<float> grads(ids.size() * kDim, 1.0f);
  // Round 0 makes the rows; every later round only updates them, so the
  // table itself holds the same bytes from here on.
  REQUIRE(t.shard->Push({RowsChunk("rounds", t.part, 0, ids, grads)}).ok());
  REQUIRE(t.client->PushRows("rounds", ids, grads).ok());
  const uint64_t rows_only = ParamBytes(*t.servers[0]);
  // Rank 1 runs a round ahead: the round's sums are held until rank 0 comes.
  REQUIRE(t.shard->Push({RowsChunk("rounds", t.part, 1, ids, grads)}).ok());
  const uint64_t with_sums = ParamBytes(*t.servers[0]);
  CHECK(with_sums - rows_only >= ids.size() * kDim * sizeof(float));
  // Rank 0's push completes round 1: its sums are applied and given back.
  REQUIRE(t.client->PushRows("rounds", ids, grads).ok());
  CHECK(ParamBytes(*t.servers[0]) == rows_only);
  std::vector<float> row(kDim);
  REQUIRE(t.client->PullRows("rounds", std::vector<int64_t>{1000}, absl::MakeSpan(row)).ok());
  CHECK(row[0] == -2.0f);  // two rounds of lr 1 x the mean gradient 1
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

// The same rows over UCX (UCX_TLS=tcp on loopback): ids ride in the chunk
// header on either transport.
TEST_CASE("sparse tables over UCX: BSP pulls exact, 16-bit rows") {
  constexpr int kWorkers = 2, kSteps = 5;
  auto servers = testing::StartCluster(2, kWorkers, {"--sync=bsp", "--lr=1", "--ucx"});
  REQUIRE(servers.ok());
  std::vector<std::string> failures(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions options = OptionsFor(*servers);
      options.transport = "ucx";
      auto client = Client::Create(options);
      if (!client.ok()) {
        failures[w] = client.status().ToString();
        return;
      }
      const int rank = (*client)->rank();
      SparseTableOptions half = ExactTable();
      half.wire_dtype = "fp16";
      if (auto status = (*client)->RegisterSparseTable("ucx", ExactTable()); !status.ok()) {
        failures[w] = status.ToString();
        return;
      }
      if (auto status = (*client)->RegisterSparseTable("ucx16", half); !status.ok()) {
        failures[w] = status.ToString();
        return;
      }
      const std::vector<int64_t> ids = IdsOf(rank);
      const std::vector<float> grads = GradientsOf(rank, ids);
      std::vector<float> rows(ids.size() * kDim);
      for (int t = 0; t < kSteps; ++t) {
        for (const char* table : {"ucx", "ucx16"}) {
          if (auto status = (*client)->PullRows(table, ids, absl::MakeSpan(rows)); !status.ok()) {
            failures[w] = status.ToString();
            return;
          }
          for (size_t i = 0; i < ids.size(); ++i) {
            for (int j = 0; j < kDim; ++j) {
              // Small integers and halves: exact in fp16 too.
              if (rows[i * kDim + j] != Expected(kWorkers, ids[i], j, t)) {
                failures[w] = absl::StrCat(table, " step ", t, " id ", ids[i], ": ",
                                           rows[i * kDim + j]);
                return;
              }
            }
          }
          if (auto status = (*client)->PushRows(table, ids, grads); !status.ok()) {
            failures[w] = status.ToString();
            return;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    INFO(failure);
    CHECK(failure.empty());
  }
}

// A shard's data path that counts the calls it starts (what the client
// sends over the real gRPC transport underneath).
class CountingTransport : public ShardTransport {
 public:
  explicit CountingTransport(std::unique_ptr<ShardTransport> inner)
      : ShardTransport(inner->traits()), inner_(std::move(inner)) {}
  void StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                 CallCanceller& canceller, CallDone done) override {
    ++pushes;
    inner_->StartPush(chunks, deadline, canceller, std::move(done));
  }
  void StartPull(const proto::PullRequest& request, const ReplyLandingChooser* choose,
                 const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                 CallDone done) override {
    ++pulls;
    inner_->StartPull(request, choose, sink, deadline, canceller, std::move(done));
  }
  void StartPushPull(const std::vector<OutgoingChunk>& chunks, const ReplyLandingChooser* choose,
                     const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                     CallDone done) override {
    inner_->StartPushPull(chunks, choose, sink, deadline, canceller, std::move(done));
  }
  std::atomic<int> pushes{0}, pulls{0};

 private:
  std::unique_ptr<ShardTransport> inner_;
};

// A client whose gRPC data paths count their calls.
absl::StatusOr<std::unique_ptr<Client>> CountingClient(
    const std::vector<std::unique_ptr<testing::ServerProcess>>& servers,
    std::vector<CountingTransport*>* counters) {
  ClientOptions options = OptionsFor(servers);
  auto control = GrpcControlClient::Connect(options.servers, absl::Seconds(10),
                                            options.rpc_timeout);
  if (!control.ok()) return control.status();
  std::vector<ShardLink> links;
  for (int shard = 0; shard < (*control)->num_shards(); ++shard) {
    ShardLink link;
    link.name = (*control)->ShardName(shard);
    link.channel = (*control)->channel(shard);
    links.push_back(std::move(link));
  }
  auto inner = CreateShardTransports("grpc", "counting", links, absl::Now() + absl::Seconds(10));
  if (!inner.ok()) return inner.status();
  std::vector<std::unique_ptr<ShardTransport>> transports;
  for (auto& transport : *inner) {
    auto counting = std::make_unique<CountingTransport>(std::move(transport));
    counters->push_back(counting.get());
    transports.push_back(std::move(counting));
  }
  return Client::Create(options, std::move(*control), std::move(transports));
}

TEST_CASE("sparse calls of several tables: one call per shard, exact under BSP") {
  // Two workers, 3 tables (one with fp16 rows) stepped together: each
  // step's pull and push of all three are one call per shard each, and
  // every row is exact. A table pushed once more than the others has
  // another clock: its pull goes in a call of its own.
  constexpr int kWorkers = 2, kSteps = 4;
  auto servers = testing::StartCluster(2, kWorkers, {"--sync=bsp", "--lr=1"});
  REQUIRE(servers.ok());
  const std::vector<std::string> names = {"x", "y", "z16"};
  std::vector<std::string> failures(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<CountingTransport*> counters;
      auto client = CountingClient(*servers, &counters);
      if (!client.ok()) {
        failures[w] = client.status().ToString();
        return;
      }
      Client& c = **client;
      for (const std::string& name : names) {
        SparseTableOptions table = ExactTable();
        if (name == "z16") table.wire_dtype = "fp16";
        if (auto status = c.RegisterSparseTable(name, table); !status.ok()) {
          failures[w] = status.ToString();
          return;
        }
      }
      const int rank = c.rank();
      const std::vector<int64_t> ids = IdsOf(rank);
      const std::vector<float> grads = GradientsOf(rank, ids);
      std::vector<std::vector<float>> rows(names.size(), std::vector<float>(ids.size() * kDim));
      std::vector<SparseRowsPull> pulls;
      std::vector<SparseRowsPush> pushes;
      for (size_t t = 0; t < names.size(); ++t) {
        pulls.push_back({names[t], ids, absl::MakeSpan(rows[t])});
        pushes.push_back({names[t], ids, grads});
      }
      for (int step = 0; step < kSteps; ++step) {
        const int pulls_before = counters[0]->pulls + counters[1]->pulls;
        if (auto status = c.Wait(c.PullRowsAsync(pulls)); !status.ok()) {
          failures[w] = status.ToString();
          return;
        }
        const int pull_calls = counters[0]->pulls + counters[1]->pulls - pulls_before;
        if (pull_calls != 2) failures[w] = absl::StrCat("step ", step, ": ", pull_calls, " pulls");
        for (size_t t = 0; t < names.size(); ++t) {
          for (size_t i = 0; i < ids.size(); ++i) {
            for (int j = 0; j < kDim; ++j) {
              if (rows[t][i * kDim + j] != Expected(kWorkers, ids[i], j, step)) {
                failures[w] = absl::StrCat(names[t], " step ", step, " id ", ids[i], ": ",
                                           rows[t][i * kDim + j]);
                return;
              }
            }
          }
        }
        const int pushes_before = counters[0]->pushes + counters[1]->pushes;
        if (auto status = c.Wait(c.PushRowsAsync(pushes)); !status.ok()) {
          failures[w] = status.ToString();
          return;
        }
        const int push_calls = counters[0]->pushes + counters[1]->pushes - pushes_before;
        if (push_calls != 2) failures[w] = absl::StrCat("step ", step, ": ", push_calls, " pushes");
        if (!failures[w].empty()) return;
      }
      // "x" one step ahead: its pull waits for that round, in a call of
      // its own on each shard.
      if (auto status = c.PushRows("x", ids, grads); !status.ok()) {
        failures[w] = status.ToString();
        return;
      }
      const int pulls_before = counters[0]->pulls + counters[1]->pulls;
      if (auto status = c.Wait(c.PullRowsAsync(pulls)); !status.ok()) {
        failures[w] = status.ToString();
        return;
      }
      const int pull_calls = counters[0]->pulls + counters[1]->pulls - pulls_before;
      if (pull_calls != 4) failures[w] = absl::StrCat("two clocks: ", pull_calls, " pulls");
      for (size_t t = 0; t < names.size(); ++t) {
        const int steps = t == 0 ? kSteps + 1 : kSteps;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (rows[t][i * kDim] != Expected(kWorkers, ids[i], 0, steps)) {
            failures[w] = absl::StrCat(names[t], " after the extra push, id ", ids[i], ": ",
                                       rows[t][i * kDim]);
            return;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    INFO(failure);
    CHECK(failure.empty());
  }
}

TEST_CASE("sparse calls of several tables: a bad part refuses the whole call") {
  auto servers = testing::StartCluster(1, 1, {"--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  auto client = Client::Create(OptionsFor(*servers));
  REQUIRE(client.ok());
  Client& c = **client;
  REQUIRE(c.RegisterSparseTable("a", ExactTable()).ok());
  REQUIRE(c.RegisterSparseTable("b", ExactTable()).ok());
  const std::vector<int64_t> ids = {1, 2};
  const std::vector<float> good(ids.size() * kDim, 1.0f), short_grads(3, 1.0f);
  std::vector<float> out(ids.size() * kDim);
  const std::vector<SparseRowsPush> bad_size = {{"a", ids, good}, {"b", ids, short_grads}};
  absl::Status status = c.Wait(c.PushRowsAsync(bad_size));
  CHECK(absl::IsInvalidArgument(status));
  CHECK(status.message().find("'b'") != absl::string_view::npos);
  const std::vector<SparseRowsPush> twice = {{"a", ids, good}, {"a", ids, good}};
  CHECK(absl::IsInvalidArgument(c.Wait(c.PushRowsAsync(twice))));
  const std::vector<SparseRowsPush> unknown = {{"a", ids, good}, {"nope", ids, good}};
  CHECK(absl::IsNotFound(c.Wait(c.PushRowsAsync(unknown))));
  // Nothing moved: neither clock, nor a row.
  CHECK(*c.TensorClock("a") == 0);
  CHECK(*c.TensorClock("b") == 0);
  const std::vector<SparseRowsPull> pull = {{"a", ids, absl::MakeSpan(out)}};
  REQUIRE(c.Wait(c.PullRowsAsync(pull)).ok());
  CHECK(out == std::vector<float>(out.size(), 0.0f));
  const std::vector<SparseRowsPull> bad_out = {{"a", ids, absl::MakeSpan(out)},
                                               {"b", ids, absl::MakeSpan(out).subspan(1)}};
  CHECK(absl::IsInvalidArgument(c.Wait(c.PullRowsAsync(bad_out))));
}

// Calls of thousands of ids: their ids (8 bytes each) are far more than
// UCX takes in an active message's header (about 8 KiB over shared
// memory, where it aborts the sender), so they travel ahead of the rows.
TEST_CASE("sparse tables over UCX: calls of 20000 ids over TCP and shared memory") {
  for (const char* tls : {"tcp", "sm,self"}) {
    INFO("UCX_TLS=" << tls);
    setenv("UCX_TLS", tls, 1);
    auto servers = testing::StartCluster(2, 1, {"--sync=asp", "--lr=1", "--ucx"});
    REQUIRE(servers.ok());
    ClientOptions options = OptionsFor(*servers);
    options.transport = "ucx";
    auto client = Client::Create(options);
    REQUIRE(client.ok());
    Client& c = **client;
    SparseTableOptions table = ExactTable();
    table.dim = 8;
    REQUIRE(c.RegisterSparseTable("many", table).ok());
    std::vector<int64_t> ids(20000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 1000003 + 5;
    auto value = [](int64_t id, int j) { return static_cast<float>(id % 4099 + j); };
    std::vector<float> grads(ids.size() * 8);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < 8; ++j) grads[i * 8 + j] = -value(ids[i], j);
    }
    REQUIRE(c.PushRows("many", ids, grads).ok());
    std::vector<float> rows(grads.size(), -1.0f);
    REQUIRE(c.PullRows("many", ids, absl::MakeSpan(rows)).ok());
    size_t wrong = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < 8; ++j) wrong += rows[i * 8 + j] != value(ids[i], j);
    }
    CHECK(wrong == 0);
    client->reset();
    servers->clear();
  }
  setenv("UCX_TLS", "tcp", 1);
}

}  // namespace
}  // namespace harrier
