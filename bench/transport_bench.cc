#include "bench/transport_bench.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/bench_util.h"
#include "bench/flags.h"
#include "bench/server_cluster.h"
#include "bench/shared_flags.h"
#include "bench/tcp_baseline.h"
#include "common/json.h"
#include "common/process.h"
#include "worker/client.h"

ABSL_FLAG(std::string, bytes_per_point, "",
          "transport: payload each point aims to move, all workers together (default 256M; "
          "16M with --quick)");
ABSL_FLAG(int, min_iterations, 3, "transport: timed ops per worker at least ...");
ABSL_FLAG(int, max_iterations, 0, "transport: ... and at most (0: 300; 50 with --quick)");
ABSL_FLAG(std::string, max_point_bytes, "0",
          "transport: skip points whose workers x size exceeds this (0: none)");
ABSL_FLAG(int, grpc_connections, harrier::ClientOptions().grpc_connections,
          "transport: ClientOptions::grpc_connections");
ABSL_FLAG(bool, skip_tcp, false, "transport: no TCP reference (tcp_gbps and ratio 0)");
ABSL_FLAG(bool, staging_buffers, false,
          "transport: register the tensors with TensorOptions::staging_buffers");

namespace harrier::bench {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

constexpr const char* kUsage =
    "usage: harrier-bench transport [flags]\n"
    "Push, pull and push-pull goodput of the Harrier client against real\n"
    "harrier-server processes on 127.0.0.1 (--sync=asp), each next to raw\n"
    "loopback TCP and single-thread memcpy measured in the same run. One JSON\n"
    "line per point on stdout, a summary table on stderr.\n"
    "  --sizes=4K,64K,1M,16M,64M   tensor sizes in bytes (K/M/G = KiB/MiB/GiB)\n"
    "  --shards=1,2                server shard counts\n"
    "  --workers=1,2,4             concurrent workers (threads, one Client each)\n"
    "  --ops=push,pull,pushpull    operations to measure\n"
    "  --transport=tcp             tcp, grpc or ucx (servers get --tcp or --ucx; UCX_TLS=tcp or "
    "sm,self\n"
    "                              picks UCX's transports, in this process and the servers)\n"
    "  --quick                     small fast subset (smoke tests); explicit flags refine it\n"
    "  --bytes_per_point=256M      payload each point aims to move (all workers together)\n"
    "  --min_iterations=3          timed ops per worker at least ...\n"
    "  --max_iterations=300        ... and at most\n"
    "  --max_point_bytes=0         skip points whose workers x size exceeds this (0: none)\n"
    "  --chunk_bytes=4M            ClientOptions::chunk_bytes\n"
    "  --grpc_connections=1        ClientOptions::grpc_connections\n"
    "  --server_binary=PATH        harrier-server to start (default: from runfiles)\n"
    "  --skip_tcp                  no TCP reference (tcp_gbps and ratio 0): for profiling\n"
    "  --staging_buffers           tensors registered with staging buffers, as the comm\n"
    "                              scheduler and harrier.torch do: pushes sent and pulls\n"
    "                              received in place where the transport can\n"
    "  --help\n";

enum class Op { kPush, kPull, kPushPull };

const char* OpName(Op op) {
  switch (op) {
    case Op::kPush: return "push";
    case Op::kPull: return "pull";
    case Op::kPushPull: return "pushpull";
  }
  return "?";
}

struct Options {
  std::vector<size_t> sizes = {4 * kKiB, 64 * kKiB, 1 * kMiB, 16 * kMiB, 64 * kMiB};
  std::vector<int> shards = {1, 2};
  std::vector<int> workers = {1, 2, 4};
  std::vector<Op> ops = {Op::kPush, Op::kPull, Op::kPushPull};
  std::string server_binary;
  uint64_t bytes_per_point = 256 * kMiB;
  int min_iterations = 3;
  int max_iterations = 300;
  uint64_t max_point_bytes = 0;
  size_t chunk_bytes = 4 * kMiB;
  int grpc_connections = ClientOptions().grpc_connections;
  bool skip_tcp = false;
  bool staging_buffers = false;
  std::string transport = "tcp";
};

// --quick: a small fast subset; the flags given explicitly refine it.
void ApplyQuick(Options* options) {
  options->sizes = {4 * kKiB, 1 * kMiB};
  options->shards = {1, 2};
  options->workers = {2};
  options->bytes_per_point = 16 * kMiB;
  options->min_iterations = 3;
  options->max_iterations = 50;
}

// One byte count with an optional K/M/G suffix; "" when it parsed.
std::string ParseBytes(absl::string_view name, absl::string_view value, uint64_t* out) {
  auto parsed = ParseByteList(value);
  if (!parsed.ok() || parsed->size() != 1) return absl::StrCat("bad --", name, "='", value, "'");
  *out = (*parsed)[0];
  return "";
}

// Returns a message for a usage error, "" on success.
std::string ParseArgs(Options* options) {
  if (absl::GetFlag(FLAGS_quick)) ApplyQuick(options);
  if (const std::string value = absl::GetFlag(FLAGS_sizes); !value.empty()) {
    auto sizes = ParseTensorSizes(value);
    if (!sizes.ok()) return absl::StrCat("--sizes: ", sizes.status().message());
    options->sizes = *sizes;
  }
  for (auto [name, flag, out] : {std::make_tuple("shards", &FLAGS_shards, &options->shards),
                                 std::make_tuple("workers", &FLAGS_workers, &options->workers)}) {
    if (const std::string value = absl::GetFlag(*flag); !value.empty()) {
      auto counts = ParseIntList(value);
      if (!counts.ok()) return absl::StrCat("--", name, ": ", counts.status().message());
      *out = *counts;
    }
  }
  if (const std::string value = absl::GetFlag(FLAGS_ops); !value.empty()) {
    options->ops.clear();
    for (absl::string_view op : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      if (op == "push") {
        options->ops.push_back(Op::kPush);
      } else if (op == "pull") {
        options->ops.push_back(Op::kPull);
      } else if (op == "pushpull") {
        options->ops.push_back(Op::kPushPull);
      } else {
        return absl::StrCat("--ops: unknown op '", op, "' (expected push, pull, pushpull)");
      }
    }
    if (options->ops.empty()) return "--ops: empty list";
  }
  options->transport = absl::GetFlag(FLAGS_transport);
  if (options->transport != "grpc" && options->transport != "ucx" && options->transport != "tcp") {
    return absl::StrCat("--transport: unknown transport '", options->transport,
                        "' (grpc, tcp or ucx)");
  }
  options->server_binary = absl::GetFlag(FLAGS_server_binary);
  if (const std::string value = absl::GetFlag(FLAGS_bytes_per_point); !value.empty()) {
    if (auto error = ParseBytes("bytes_per_point", value, &options->bytes_per_point);
        !error.empty()) {
      return error;
    }
  }
  if (const std::string value = absl::GetFlag(FLAGS_max_point_bytes); value != "0") {
    if (auto error = ParseBytes("max_point_bytes", value, &options->max_point_bytes);
        !error.empty()) {
      return error;
    }
  }
  if (const std::string value = absl::GetFlag(FLAGS_chunk_bytes); !value.empty()) {
    uint64_t chunk = 0;
    if (auto error = ParseBytes("chunk_bytes", value, &chunk); !error.empty()) return error;
    options->chunk_bytes = chunk;
  }
  options->grpc_connections = absl::GetFlag(FLAGS_grpc_connections);
  options->skip_tcp = absl::GetFlag(FLAGS_skip_tcp);
  options->staging_buffers = absl::GetFlag(FLAGS_staging_buffers);
  options->min_iterations = absl::GetFlag(FLAGS_min_iterations);
  if (const int count = absl::GetFlag(FLAGS_max_iterations); count != 0) {
    options->max_iterations = count;
  }
  if (options->min_iterations < 1) return "bad --min_iterations (at least 1)";
  if (options->max_iterations < 1) return "bad --max_iterations (at least 1)";
  if (options->min_iterations > options->max_iterations) {
    return "--min_iterations must not exceed --max_iterations";
  }
  return "";
}

// Timed ops per worker: enough to move about bytes_per_point in total, so
// big tensors are timed over many milliseconds and small ones over enough
// round trips for a p99.
int IterationsFor(const Options& options, size_t size, int workers) {
  const uint64_t wanted = options.bytes_per_point / (static_cast<uint64_t>(size) * workers);
  return static_cast<int>(std::clamp<uint64_t>(wanted, options.min_iterations,
                                               options.max_iterations));
}

int WarmupFor(size_t size) { return size >= kMiB ? 1 : 10; }

struct Measurement {
  double seconds = 0;
  uint64_t payload_bytes = 0;
  std::vector<double> latency_us;
  double gbps() const { return seconds > 0 ? payload_bytes / seconds / 1e9 : 0; }
};

// One worker of a point: its own Client (own connections and threads) and
// its own tensor, so workers share only the servers, the CPUs and loopback,
// never a tensor's lock.
struct Worker {
  std::unique_ptr<Client> client;
  std::string tensor;
  std::vector<float> gradient;
  std::vector<float> values;
};

absl::StatusOr<std::vector<Worker>> ConnectWorkers(const Options& options,
                                                   const ServerCluster& cluster, size_t size,
                                                   int workers) {
  std::vector<Worker> result(workers);
  const size_t elements = size / sizeof(float);
  for (int rank = 0; rank < workers; ++rank) {
    ClientOptions client_options;
    client_options.servers = cluster.addresses();
    client_options.job = "bench";
    client_options.rank = rank;
    client_options.worker_name = absl::StrCat("bench-", rank);
    client_options.chunk_bytes = options.chunk_bytes;
    client_options.grpc_connections = options.grpc_connections;
    client_options.connect_timeout = absl::Seconds(10);
    client_options.transport = options.transport;
    auto client = Client::Create(client_options);
    if (!client.ok()) return client.status();
    Worker& worker = result[rank];
    worker.client = std::move(*client);
    worker.tensor = absl::StrCat("bench/", size, "/rank", rank);
    // Small finite values: the shard rejects NaN/Inf, and the SGD steps of
    // the run keep the parameters finite.
    worker.gradient.assign(elements, 1e-3f);
    worker.values.assign(elements, 0.0f);
    TensorOptions tensor;
    tensor.staging_buffers = options.staging_buffers;
    if (auto status = worker.client->RegisterTensor(worker.tensor, {static_cast<int64_t>(elements)},
                                                    worker.values, tensor);
        !status.ok()) {
      return status;
    }
  }
  return result;
}

absl::Status DoOp(Worker& worker, Op op) {
  switch (op) {
    case Op::kPush: {
      absl::Status status = worker.client->Push(worker.tensor, worker.gradient);
      // Each push is for the worker's next clock; the shard refuses a second
      // push for the same clock.
      worker.client->Clock();
      return status;
    }
    case Op::kPull:
      return worker.client->Pull(worker.tensor, absl::MakeSpan(worker.values));
    case Op::kPushPull: {
      absl::Status status =
          worker.client->PushPull(worker.tensor, worker.gradient, absl::MakeSpan(worker.values));
      worker.client->Clock();
      return status;
    }
  }
  return absl::InternalError("unknown op");
}

absl::StatusOr<Measurement> MeasureHarrier(std::vector<Worker>& workers, Op op, size_t size,
                                           int iterations) {
  const int count = static_cast<int>(workers.size());
  StartGate gate(count);
  std::vector<absl::Status> status(count);
  std::vector<BenchClock::time_point> end(count);
  std::vector<std::vector<double>> latency(count);
  std::vector<std::thread> threads;
  for (int w = 0; w < count; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < WarmupFor(size); ++i) {
        if (status[w] = DoOp(workers[w], op); !status[w].ok()) {
          gate.Abort();
          return;
        }
      }
      if (!gate.ArriveAndWait()) {
        status[w] = absl::AbortedError("another worker failed");
        return;
      }
      latency[w].reserve(iterations);
      for (int i = 0; i < iterations; ++i) {
        const auto start = BenchClock::now();
        if (status[w] = DoOp(workers[w], op); !status[w].ok()) return;
        latency[w].push_back(MicrosSince(start));
      }
      end[w] = BenchClock::now();
    });
  }
  const auto start = gate.WaitAllThenOpen();
  for (auto& thread : threads) thread.join();
  for (const absl::Status& s : status) {
    if (!s.ok() && !absl::IsAborted(s)) return s;
  }
  Measurement result;
  auto last = start;
  for (int w = 0; w < count; ++w) {
    if (!status[w].ok()) return status[w];
    last = std::max(last, end[w]);
    result.latency_us.insert(result.latency_us.end(), latency[w].begin(), latency[w].end());
  }
  result.seconds = std::chrono::duration<double>(last - start).count();
  const uint64_t per_op = op == Op::kPushPull ? 2 * size : size;
  result.payload_bytes = per_op * static_cast<uint64_t>(iterations) * count;
  return result;
}

// The TCP reference of a point: as many connections as the client uses
// (one per worker per shard holding chunks of the tensor; a tensor of one
// chunk lives on one shard) and the same bytes per connection.
absl::StatusOr<Measurement> MeasureTcp(const Options& options, TcpPattern pattern, size_t size,
                                       int shards, int workers, int iterations,
                                       int* connections_out) {
  const size_t chunks = (size + options.chunk_bytes - 1) / options.chunk_bytes;
  const int per_worker = static_cast<int>(std::min<size_t>(shards, chunks));
  TcpPoint point;
  point.pattern = pattern;
  point.message_bytes = size / per_worker;
  point.connections = per_worker * workers;
  point.iterations = iterations;
  point.warmup = WarmupFor(size);
  *connections_out = point.connections;
  auto tcp = MeasureLoopbackTcp(point);
  if (!tcp.ok()) return tcp.status();
  Measurement result;
  result.seconds = tcp->seconds;
  result.payload_bytes = tcp->payload_bytes;
  result.latency_us = std::move(tcp->round_trip_us);
  return result;
}

// Single-thread memcpy of `size` bytes between two buffers, the reference
// for shared-memory transports (which at best copy once). Cached per size.
double MemcpyGbps(size_t size) {
  static std::map<size_t, double> cache;
  if (auto it = cache.find(size); it != cache.end()) return it->second;
  std::vector<char> source(size, 1), dest(size, 0);
  const int iterations =
      static_cast<int>(std::clamp<uint64_t>((256 * kMiB) / std::max<size_t>(size, 1), 3, 20000));
  for (int i = 0; i < 2; ++i) std::memcpy(dest.data(), source.data(), size);  // fault pages in
  const auto start = BenchClock::now();
  for (int i = 0; i < iterations; ++i) {
    source[i % size] = static_cast<char>(i);  // each copy reads changed data
    std::memcpy(dest.data(), source.data(), size);
  }
  const double seconds = std::chrono::duration<double>(BenchClock::now() - start).count();
  // Keep the copies observable so they are not optimised away.
  volatile char sink = dest[size / 2];
  (void)sink;
  const double gbps = seconds > 0 ? static_cast<double>(size) * iterations / seconds / 1e9 : 0;
  cache[size] = gbps;
  return gbps;
}

struct Row {
  std::string op;
  size_t size;
  int shards, workers;
  double gbps, tcp_gbps, p50, p99, tcp_p50, memcpy_gbps;
};

void PrintLine(const char* transport, bool staging_buffers, const char* op, size_t size, int shards,
               int workers, int iterations, Measurement& ours, Measurement& tcp,
               int tcp_connections, std::vector<Row>* rows) {
  const double memcpy_gbps = MemcpyGbps(size);
  const double p50 = Percentile(ours.latency_us, 0.50);
  const double p99 = Percentile(ours.latency_us, 0.99);
  const double tcp_p50 = Percentile(tcp.latency_us, 0.50);
  const double tcp_p99 = Percentile(tcp.latency_us, 0.99);
  const double ratio = tcp.gbps() > 0 ? ours.gbps() / tcp.gbps() : 0;
  const Json line = {
      {"bench", "transport"},
      {"transport", transport},
      {"staging_buffers", staging_buffers},
      {"op", op},
      {"size_bytes", size},
      {"shards", shards},
      {"workers", workers},
      {"iterations", iterations},
      {"payload_bytes", ours.payload_bytes},
      {"seconds", RoundTo(ours.seconds, 6)},
      {"goodput_gbps", RoundTo(ours.gbps(), 4)},
      {"p50_us", RoundTo(p50, 1)},
      {"p99_us", RoundTo(p99, 1)},
      {"tcp_gbps", RoundTo(tcp.gbps(), 4)},
      {"tcp_p50_us", RoundTo(tcp_p50, 1)},
      {"tcp_p99_us", RoundTo(tcp_p99, 1)},
      {"tcp_connections", tcp_connections},
      {"ratio", RoundTo(ratio, 4)},
      {"memcpy_gbps", RoundTo(memcpy_gbps, 4)},
      {"memcpy_ratio", RoundTo(memcpy_gbps > 0 ? ours.gbps() / memcpy_gbps : 0, 4)},
  };
  std::printf("%s\n", DumpJson(line).c_str());
  std::fflush(stdout);
  rows->push_back(
      {op, size, shards, workers, ours.gbps(), tcp.gbps(), p50, p99, tcp_p50, memcpy_gbps});
}

// Round-trip latency of 4 KiB on one raw connection, the reference for the
// 4 KiB push-pull p50. Measured before any server runs, on a quiet machine.
absl::Status MeasurePingPong(std::vector<Row>* rows) {
  TcpPoint point;
  point.pattern = TcpPattern::kEcho;
  point.message_bytes = 4 * kKiB;
  point.iterations = 2000;
  point.warmup = 100;
  auto tcp = MeasureLoopbackTcp(point);
  if (!tcp.ok()) return tcp.status();
  Measurement m;
  m.seconds = tcp->seconds;
  m.payload_bytes = tcp->payload_bytes;
  m.latency_us = std::move(tcp->round_trip_us);
  Measurement copy = m;
  PrintLine("tcp", false, "tcp_pingpong", point.message_bytes, 1, 1, point.iterations, m, copy, 1,
            rows);
  return absl::OkStatus();
}

void PrintTable(const std::vector<Row>& rows) {
  std::fprintf(stderr, "%-12s %5s %6s %7s %9s %9s %6s %9s %9s %9s %9s\n", "op", "size",
               "shards", "workers", "GB/s", "tcp GB/s", "ratio", "p50 us", "p99 us", "tcp p50",
               "memcpy");
  for (const Row& row : rows) {
    std::fprintf(stderr, "%-12s %5s %6d %7d %9.3f %9.3f %6.2f %9.1f %9.1f %9.1f %9.3f\n",
                 row.op.c_str(), FormatBytes(row.size).c_str(), row.shards, row.workers, row.gbps,
                 row.tcp_gbps, row.tcp_gbps > 0 ? row.gbps / row.tcp_gbps : 0.0, row.p50, row.p99,
                 row.tcp_p50, row.memcpy_gbps);
  }
}

absl::Status RunConfig(const Options& options, const std::string& binary, int shards,
                       int workers, std::vector<Row>* rows) {
  // ASP: a push is applied as it arrives and a pull never waits for other
  // workers, so the figures measure the transport and the shard's apply
  // path, not the consistency model.
  std::vector<std::string> flags = {"--sync=asp", "--job=bench", "--optimizer=sgd", "--lr=0.001",
                                    "--shutdown_grace_ms=500"};
  if (options.transport == "ucx") flags.push_back("--ucx");
  if (options.transport == "tcp") flags.push_back("--tcp");
  auto cluster = ServerCluster::Start(binary, shards, workers, flags);
  if (!cluster.ok()) return cluster.status();
  for (size_t size : options.sizes) {
    if (options.max_point_bytes != 0 &&
        static_cast<uint64_t>(size) * workers > options.max_point_bytes) {
      std::fprintf(stderr, "skipped size=%s shards=%d workers=%d (--max_point_bytes)\n",
                   FormatBytes(size).c_str(), shards, workers);
      continue;
    }
    auto connected = ConnectWorkers(options, **cluster, size, workers);
    if (!connected.ok()) return connected.status();
    const int iterations = IterationsFor(options, size, workers);
    // Raw TCP references, measured once per point and pattern, next to the
    // transport's figures they divide.
    std::map<TcpPattern, std::pair<Measurement, int>> tcp;
    for (Op op : options.ops) {
      auto ours = MeasureHarrier(*connected, op, size, iterations);
      if (!ours.ok()) {
        return absl::Status(ours.status().code(),
                            absl::StrCat(OpName(op), " size=", size, " shards=", shards,
                                         " workers=", workers, ": ", ours.status().message()));
      }
      const TcpPattern pattern = op == Op::kPushPull ? TcpPattern::kEcho : TcpPattern::kOneWay;
      if (tcp.count(pattern) == 0 && options.skip_tcp) {
        tcp[pattern] = {Measurement(), 0};
      } else if (tcp.count(pattern) == 0) {
        int connections = 0;
        auto reference =
            MeasureTcp(options, pattern, size, shards, workers, iterations, &connections);
        if (!reference.ok()) return reference.status();
        tcp[pattern] = {std::move(*reference), connections};
      }
      Measurement reference = tcp[pattern].first;  // Percentile sorts; keep the original
      PrintLine(options.transport.c_str(), options.staging_buffers, OpName(op), size, shards,
                workers, iterations, *ours, reference, tcp[pattern].second, rows);
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunTransportBench(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseSubcommandFlags(
          argc, argv, kUsage,
          {"sizes", "shards", "workers", "ops", "transport", "quick", "bytes_per_point",
           "min_iterations", "max_iterations", "max_point_bytes", "chunk_bytes", "grpc_connections",
           "server_binary", "skip_tcp", "staging_buffers"},
          ParseArgs, &options)) {
    return *exit_code;
  }
  auto binary = PrepareServerBench("transport", options.server_binary);
  if (!binary.ok()) return 2;

  const auto started = BenchClock::now();
  std::vector<Row> rows;
  absl::Status status;
  if (!options.skip_tcp &&
      std::find(options.sizes.begin(), options.sizes.end(), 4 * kKiB) != options.sizes.end()) {
    status = MeasurePingPong(&rows);
  }
  for (int shards : options.shards) {
    for (int workers : options.workers) {
      if (!status.ok()) break;
      status = RunConfig(options, *binary, shards, workers, &rows);
    }
  }
  PrintTable(rows);
  if (!status.ok()) {
    std::fprintf(stderr, "harrier-bench transport: %s\n", status.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "transport: %zu points in %.1f s\n", rows.size(),
               std::chrono::duration<double>(BenchClock::now() - started).count());
  return 0;
}

}  // namespace harrier::bench
