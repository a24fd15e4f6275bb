#include "bench/load_bench.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/bench_util.h"
#include "bench/flags.h"
#include "bench/server_cluster.h"
#include "bench/shared_flags.h"
#include "common/json.h"
#include "common/process.h"
#include "worker/client.h"

ABSL_FLAG(int, clients, 0, "load: concurrent clients (0: 64; 16 with --quick)");
ABSL_FLAG(double, duration_s, 0, "load: seconds each sync mode runs (0: 60; 5 with --quick)");
ABSL_FLAG(double, rpc_timeout_s, 30, "load: ClientOptions::rpc_timeout in seconds");

namespace harrier::bench {
namespace {

constexpr size_t kKiB = size_t{1} << 10;

constexpr const char* kUsage =
    "usage: harrier-bench load [flags]\n"
    "Many concurrent clients (threads, one harrier::Client and rank each) loop\n"
    "pull / push / push-pull / Clock on shared tensors against real\n"
    "harrier-server processes on 127.0.0.1 for a fixed time, pushing integer\n"
    "gradients (rank r pushes r+1) into --optimizer=sgd --lr=1, then Leave.\n"
    "At the end every element of every tensor is compared with its exact\n"
    "expected value. One JSON line per sync mode on stdout, a summary on\n"
    "stderr; exit 1 if any call failed or any element differs.\n"
    "  --clients=64             concurrent clients (servers get --num_workers=N);\n"
    "                           a power of two under asp (its 1/N scale is then exact)\n"
    "  --duration_s=60          seconds each sync mode runs\n"
    "  --shards=2               server shards\n"
    "  --sync=asp,bsp           sync modes, one server cluster and JSON line each\n"
    "  --transport=tcp          tcp, grpc or ucx (servers get --tcp or --ucx; UCX_TLS picks\n"
    "                           UCX's transports)\n"
    "  --sizes=4K,64K,1M        shared tensors, bytes each (K/M/G binary; multiples of 4)\n"
    "  --chunk_bytes=256K       ClientOptions::chunk_bytes: larger tensors are chunked\n"
    "                           round-robin over the shards\n"
    "  --ops=mixed              pullpush (pull every tensor, then push every tensor),\n"
    "                           pushpull (one push-pull per tensor) or mixed (each\n"
    "                           client alternates the two, step by step)\n"
    "  --rpc_timeout_s=30       ClientOptions::rpc_timeout\n"
    "  --quick                  16 clients x 5 s per mode (CI); explicit flags refine it\n"
    "  --server_binary=PATH     harrier-server to start (default: from runfiles)\n"
    "  --help\n";

enum class OpsMode { kMixed, kPullPush, kPushPull };
enum OpKind { kPull = 0, kPush = 1, kPushPull = 2, kNumOpKinds = 3 };
constexpr const char* kOpNames[kNumOpKinds] = {"pull", "push", "pushpull"};

struct Options {
  int clients = 64;
  double duration_s = 60;
  int shards = 2;
  std::vector<std::string> syncs = {"asp", "bsp"};
  std::string transport = "tcp";
  std::vector<size_t> sizes = {4 * kKiB, 64 * kKiB, 1024 * kKiB};
  size_t chunk_bytes = 256 * kKiB;
  OpsMode ops = OpsMode::kMixed;
  double rpc_timeout_s = 30;
  std::string server_binary;
};

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Returns a message for a usage error, "" on success.
std::string ParseArgs(Options* options) {
  // --quick: 16 clients x 5 s; the flags given explicitly refine it.
  if (absl::GetFlag(FLAGS_quick)) {
    options->clients = 16;
    options->duration_s = 5;
  }
  if (const int clients = absl::GetFlag(FLAGS_clients); clients != 0) {
    if (clients < 0) return absl::StrCat("bad --clients='", clients, "'");
    options->clients = clients;
  }
  if (const std::string value = absl::GetFlag(FLAGS_shards); !value.empty()) {
    auto counts = ParseIntList(value);
    if (!counts.ok() || counts->size() != 1) return absl::StrCat("bad --shards='", value, "'");
    options->shards = (*counts)[0];
  }
  if (const double seconds = absl::GetFlag(FLAGS_duration_s); seconds != 0) {
    if (!(seconds > 0)) return absl::StrCat("bad --duration_s='", seconds, "' (seconds > 0)");
    options->duration_s = seconds;
  }
  options->rpc_timeout_s = absl::GetFlag(FLAGS_rpc_timeout_s);
  if (!(options->rpc_timeout_s > 0)) {
    return absl::StrCat("bad --rpc_timeout_s='", options->rpc_timeout_s, "' (seconds > 0)");
  }
  options->syncs.clear();
  for (absl::string_view sync :
       absl::StrSplit(FlagOr(FLAGS_sync, "asp,bsp"), ',', absl::SkipWhitespace())) {
    if (sync != "asp" && sync != "bsp") {
      return absl::StrCat("--sync: unknown mode '", sync, "' (asp or bsp)");
    }
    options->syncs.emplace_back(sync);
  }
  if (options->syncs.empty()) return "--sync: empty list";
  options->transport = absl::GetFlag(FLAGS_transport);
  if (options->transport != "grpc" && options->transport != "ucx" && options->transport != "tcp") {
    return absl::StrCat("--transport: unknown transport '", options->transport,
                        "' (grpc, tcp or ucx)");
  }
  if (const std::string value = absl::GetFlag(FLAGS_sizes); !value.empty()) {
    auto sizes = ParseTensorSizes(value);
    if (!sizes.ok()) return absl::StrCat("--sizes: ", sizes.status().message());
    options->sizes = *sizes;
  }
  if (const std::string value = absl::GetFlag(FLAGS_chunk_bytes); !value.empty()) {
    auto chunk = ParseByteList(value);
    if (!chunk.ok() || chunk->size() != 1) return absl::StrCat("bad --chunk_bytes='", value, "'");
    options->chunk_bytes = (*chunk)[0];
  }
  if (const std::string value = absl::GetFlag(FLAGS_ops); !value.empty()) {
    if (value == "mixed") {
      options->ops = OpsMode::kMixed;
    } else if (value == "pullpush") {
      options->ops = OpsMode::kPullPush;
    } else if (value == "pushpull") {
      options->ops = OpsMode::kPushPull;
    } else {
      return absl::StrCat("--ops: unknown '", value, "' (mixed, pullpush or pushpull)");
    }
  }
  options->server_binary = absl::GetFlag(FLAGS_server_binary);
  for (const std::string& sync : options->syncs) {
    if (sync == "asp" && !IsPowerOfTwo(options->clients)) {
      return absl::StrCat("--clients=", options->clients,
                          " under --sync=asp: the shard scales each push by 1/clients, which "
                          "is exact in float32 only for a power of two");
    }
  }
  return "";
}

// One shared tensor. Every client registers it with the same initial
// values, so whichever registration wins, the start is known.
struct Tensor {
  std::string name;
  std::vector<float> initial;
};

// Small distinct integers: a chunk applied to or read from the wrong offset
// shows, and every value stays far inside float32's exact integer range.
std::vector<Tensor> MakeTensors(const std::vector<size_t>& sizes) {
  std::vector<Tensor> tensors;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor tensor;
    tensor.name = absl::StrCat("load/t", k, "_", FormatBytes(sizes[k]));
    tensor.initial.resize(sizes[k] / sizeof(float));
    for (size_t i = 0; i < tensor.initial.size(); ++i) {
      tensor.initial[i] = static_cast<float>((i * 7 + k * 131) % 1024);
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

// The first failed call of a client, for the report.
struct CallError {
  absl::Status status;
  std::string call;  // "push load/t2_1M at clock 17"
};

// A BSP read that expects `rounds` complete rounds, kept as a hash of its
// values (copies of every late read would take hundreds of MiB).
struct LateRead {
  size_t tensor = 0;
  int64_t rounds = 0;
  uint64_t hash = 0;
};

// FNV-1a over the bytes of the values.
uint64_t HashValues(absl::Span<const float> values) {
  uint64_t hash = 14695981039346656037ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) {
    hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  return hash;
}

// What one client thread did. Written by its thread only; read after join.
struct ClientRun {
  std::unique_ptr<Client> client;
  absl::Status setup;
  std::vector<float> gradient;             // rank + 1 everywhere
  std::vector<std::vector<float>> values;  // per tensor: what the last pull returned
  std::vector<int64_t> pushes;             // per tensor: pushes (and push-pulls) that returned OK
  std::vector<float> latency_us[kNumOpKinds];
  int64_t steps = 0;
  int64_t errors = 0;
  int64_t bad_reads = 0;
  std::vector<CallError> first_errors;  // at most kKeptErrors
  // BSP reads after some client stopped: checked at the end, once the
  // contributors of every round are known.
  std::vector<LateRead> late_reads;
  std::string first_bad_read;
  BenchClock::time_point last_op_end;
};

constexpr size_t kKeptErrors = 3;

// State every client thread of one mode shares.
struct Shared {
  const Options* options = nullptr;
  bool bsp = false;
  std::vector<std::string> servers;
  const std::vector<Tensor>* tensors = nullptr;
  StartGate* start_gate = nullptr;
  StartGate* done_gate = nullptr;  // ASP only: nobody leaves until every client stopped pushing
  BenchClock::time_point setup_deadline;
  BenchClock::time_point done_deadline;
  BenchClock::duration duration{};
  // Set by a client before it leaves: from then on a BSP round may complete
  // with fewer contributors, and reads are checked only at the end.
  std::atomic<bool> someone_stopped{false};
};

void RecordBadRead(ClientRun* run, std::string what) {
  if (run->bad_reads++ == 0) run->first_bad_read = std::move(what);
}

// BSP: a pull of clock t by a rank that has pushed t clocks (and a
// push-pull of clock t, which pulls t + 1) sees exactly that many complete
// rounds. While every client is still running each round is the average of
// all n pushes, sum(r + 1) / n = (n + 1) / 2, so the values are known
// exactly: initial - rounds * (n + 1) / 2 (half-integers, exact in float).
void CheckBspRead(const Tensor& tensor, const std::vector<float>& values, int64_t rounds,
                  int clients, ClientRun* run) {
  const double descent = static_cast<double>(rounds) * (clients + 1) / 2.0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double want = static_cast<double>(tensor.initial[i]) - descent;
    if (static_cast<double>(values[i]) != want) {
      RecordBadRead(run, absl::StrCat(tensor.name, "[", i, "] = ", values[i], " after ", rounds,
                                      " rounds, expected ", want));
      return;
    }
  }
}

// ASP: any interleaving of pushes is legal, but the shard applies a push to
// a chunk and copies a chunk for a pull under the chunk's lock, so within
// one chunk every element has moved by the same whole number of 1/n steps,
// and never upwards (every gradient is positive).
void CheckAspRead(const Tensor& tensor, const std::vector<float>& values, size_t chunk_elements,
                  int clients, ClientRun* run) {
  for (size_t begin = 0; begin < values.size(); begin += chunk_elements) {
    const size_t end = std::min(values.size(), begin + chunk_elements);
    const double descent = static_cast<double>(tensor.initial[begin]) - values[begin];
    const double steps = descent * clients;
    if (descent < 0 || steps != std::floor(steps)) {
      RecordBadRead(run, absl::StrCat(tensor.name, "[", begin, "] moved by ", descent,
                                      ", not a whole number of steps of 1/", clients));
      return;
    }
    for (size_t i = begin; i < end; ++i) {
      if (static_cast<double>(tensor.initial[i]) - values[i] != descent) {
        RecordBadRead(
            run, absl::StrCat(tensor.name, "[", i, "] moved by ",
                              static_cast<double>(tensor.initial[i]) - values[i], " but [", begin,
                              "] of its chunk by ", descent, ": a torn chunk"));
        return;
      }
    }
  }
}

void RecordError(ClientRun* run, absl::Status status, std::string call) {
  ++run->errors;
  if (run->first_errors.size() < kKeptErrors) {
    run->first_errors.push_back({std::move(status), std::move(call)});
  }
}

void RunClient(Shared* shared, int rank, ClientRun* run) {
  const Options& options = *shared->options;
  const std::vector<Tensor>& tensors = *shared->tensors;
  ClientOptions client_options;
  client_options.servers = shared->servers;
  client_options.job = "load";
  client_options.rank = rank;
  client_options.worker_name = absl::StrCat("load-", rank);
  client_options.chunk_bytes = options.chunk_bytes;
  client_options.connect_timeout = absl::Seconds(30);
  client_options.rpc_timeout = absl::Seconds(options.rpc_timeout_s);
  client_options.transport = options.transport;
  auto client = Client::Create(client_options);
  if (!client.ok()) {
    run->setup = client.status();
    shared->start_gate->Abort();
    return;
  }
  run->client = std::move(*client);
  Client& c = *run->client;
  size_t largest = 0;
  for (const Tensor& tensor : tensors) largest = std::max(largest, tensor.initial.size());
  run->gradient.assign(largest, static_cast<float>(rank + 1));
  run->pushes.assign(tensors.size(), 0);
  run->values.resize(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    run->values[k].assign(tensors[k].initial.size(), 0.0f);
    // All clients register at once: first registration wins, the others
    // must agree on the shape.
    const int64_t elements = static_cast<int64_t>(tensors[k].initial.size());
    if (auto status = c.RegisterTensor(tensors[k].name, {elements}, tensors[k].initial);
        !status.ok()) {
      run->setup = absl::Status(
          status.code(),
          absl::StrCat("rank ", rank, " RegisterTensor ", tensors[k].name, ": ", status.message()));
      shared->start_gate->Abort();
      return;
    }
  }
  if (!shared->start_gate->ArriveAndWaitUntil(shared->setup_deadline)) return;
  // Every client leaves the gate within microseconds of its opening.
  const BenchClock::time_point end = BenchClock::now() + shared->duration;

  auto timed = [&](OpKind kind, size_t k, int64_t clock, auto&& call) {
    const auto start = BenchClock::now();
    absl::Status status = call();
    run->last_op_end = BenchClock::now();
    run->latency_us[kind].push_back(static_cast<float>(
        std::chrono::duration<double, std::micro>(run->last_op_end - start).count()));
    if (!status.ok()) {
      RecordError(run, std::move(status),
                  absl::StrCat(kOpNames[kind], " ", tensors[k].name, " at clock ", clock));
      return false;
    }
    return true;
  };
  const size_t chunk_elements = std::max<size_t>(1, options.chunk_bytes / sizeof(float));
  auto check_read = [&](size_t k, int64_t rounds) {
    if (!shared->bsp) {
      CheckAspRead(tensors[k], run->values[k], chunk_elements, options.clients, run);
    } else if (!shared->someone_stopped.load()) {
      // Read after the call returned: a client raises the flag before it
      // leaves, so a read that might include a round completed by a Leave
      // always sees it raised.
      CheckBspRead(tensors[k], run->values[k], rounds, options.clients, run);
    } else {
      run->late_reads.push_back({k, rounds, HashValues(run->values[k])});
    }
  };

  bool failed = false;
  for (int64_t step = 0; !failed && BenchClock::now() < end; ++step) {
    const bool push_pull = options.ops == OpsMode::kPushPull ||
                           (options.ops == OpsMode::kMixed && (rank + step) % 2 == 1);
    const int64_t clock = c.clock();
    for (size_t k = 0; !failed && k < tensors.size(); ++k) {
      const auto gradient = absl::MakeConstSpan(run->gradient.data(), run->values[k].size());
      const auto out = absl::MakeSpan(run->values[k]);
      if (push_pull) {
        failed =
            !timed(kPushPull, k, clock, [&] { return c.PushPull(tensors[k].name, gradient, out); });
        if (failed) break;
        ++run->pushes[k];
        check_read(k, clock + 1);
      } else {
        failed = !timed(kPull, k, clock, [&] { return c.Pull(tensors[k].name, out); });
        if (!failed) check_read(k, clock);
      }
    }
    for (size_t k = 0; !push_pull && !failed && k < tensors.size(); ++k) {
      const auto gradient = absl::MakeConstSpan(run->gradient.data(), run->values[k].size());
      failed = !timed(kPush, k, clock, [&] { return c.Push(tensors[k].name, gradient); });
      if (!failed) ++run->pushes[k];
    }
    if (!failed) {
      c.Clock();
      ++run->steps;
    }
  }
  shared->someone_stopped.store(true);
  // Under ASP each push is scaled by 1 / (ranks not yet left): a rank that
  // left while others still push would change the scale of their pushes.
  // Under BSP a rank leaves when it is done; the rounds it would have
  // joined complete without it (server/consistency.h).
  if (shared->done_gate != nullptr &&
      !shared->done_gate->ArriveAndWaitUntil(shared->done_deadline)) {
    RecordError(run, absl::DeadlineExceededError("other clients did not finish in time"),
                "wait before leave");
  }
  if (auto status = c.Leave(); !status.ok()) RecordError(run, status, "leave");
}

// The exact parameters at the end, for tensor k, from the pushes each rank
// completed. Empty with *why set if they cannot be computed exactly.
//
// ASP: every push of rank r is applied on arrival as w -= (r + 1) / n; with
// n a power of two every such step is a multiple of 1/n, and while
// |w| * n < 2^24 every partial result is exact, so the order of arrival does
// not matter: w = initial - sum_r pushes_r * (r + 1) / n.
//
// BSP: the values after the first `round_limit` rounds (all of them if it
// is larger). Round t is the average of the pushes of the ranks that did more than
// t steps, applied in clock order (consistency.h). Rounds every rank joined
// average to (n + 1) / 2 exactly. The last few rounds, completed by Leave,
// may have fewer contributors c and an inexact quotient sum / c; the shard
// computes fl(sum / c) and then fl(w - quotient) (sgd, lr 1, scale 1, no
// weight decay), in clock order, so those rounds are replayed here with the
// same float32 operations, which gives the same bits.
std::vector<float> ExpectedValues(bool bsp, const Tensor& tensor, size_t k,
                                  const std::vector<ClientRun>& runs, int64_t round_limit,
                                  std::string* why) {
  const int n = static_cast<int>(runs.size());
  double max_initial = 0;
  for (float v : tensor.initial)
    max_initial = std::max(max_initial, std::fabs(static_cast<double>(v)));
  std::vector<float> expected(tensor.initial.size());
  if (!bsp) {
    double descent = 0;
    for (int r = 0; r < n; ++r) descent += static_cast<double>(runs[r].pushes[k]) * (r + 1) / n;
    if ((max_initial + descent) * n >= double{1 << 24}) {
      *why = absl::StrCat(tensor.name, ": descent ", descent,
                          " leaves float32's exact range for steps of 1/", n);
      return {};
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      expected[i] = static_cast<float>(static_cast<double>(tensor.initial[i]) - descent);
    }
    return expected;
  }
  int64_t rounds = 0;
  for (const ClientRun& run : runs) rounds = std::max(rounds, run.pushes[k]);
  rounds = std::min(rounds, round_limit);
  int64_t full_rounds = rounds;
  for (const ClientRun& run : runs) full_rounds = std::min(full_rounds, run.pushes[k]);
  const double full_descent = static_cast<double>(full_rounds) * (n + 1) / 2.0;
  if ((max_initial + full_descent + static_cast<double>(rounds - full_rounds) * n) * 2 >=
      double{1 << 24}) {
    *why = absl::StrCat(tensor.name, ": ", rounds, " rounds leave float32's exact range");
    return {};
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    expected[i] = static_cast<float>(static_cast<double>(tensor.initial[i]) - full_descent);
  }
  for (int64_t t = full_rounds; t < rounds; ++t) {
    int contributors = 0;
    int64_t sum = 0;
    for (int r = 0; r < n; ++r) {
      if (runs[r].pushes[k] > t) {
        ++contributors;
        sum += r + 1;
      }
    }
    const float quotient = static_cast<float>(sum) / static_cast<float>(contributors);
    for (float& w : expected) w = w - quotient;
  }
  return expected;
}

// One sync mode: start the servers, run every client, check every element.
bool RunMode(const Options& options, const std::string& binary, const std::string& sync) {
  const std::vector<Tensor> tensors = MakeTensors(options.sizes);
  // --job: the clients' job (client_options.job), which the shards check.
  std::vector<std::string> flags = {absl::StrCat("--sync=", sync), "--job=load",
                                    "--optimizer=sgd", "--lr=1", "--shutdown_grace_ms=500"};
  if (options.transport == "ucx") flags.push_back("--ucx");
  if (options.transport == "tcp") flags.push_back("--tcp");
  auto cluster = ServerCluster::Start(binary, options.shards, options.clients, flags);
  if (!cluster.ok()) {
    std::fprintf(stderr, "harrier-bench load: sync=%s: %s\n", sync.c_str(),
                 cluster.status().ToString().c_str());
    return false;
  }

  StartGate start_gate(options.clients);
  StartGate done_gate(options.clients);
  Shared shared;
  shared.options = &options;
  shared.bsp = sync == "bsp";
  shared.servers = (*cluster)->addresses();
  shared.tensors = &tensors;
  shared.start_gate = &start_gate;
  shared.done_gate = shared.bsp ? nullptr : &done_gate;
  shared.setup_deadline = BenchClock::now() + std::chrono::seconds(60 + options.clients);
  shared.duration = std::chrono::duration_cast<BenchClock::duration>(
      std::chrono::duration<double>(options.duration_s));
  std::vector<ClientRun> runs(options.clients);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < options.clients; ++rank) {
    threads.emplace_back([&, rank] { RunClient(&shared, rank, &runs[rank]); });
  }
  // A client's last call may start just before the end and take up to
  // rpc_timeout; the done gate allows that and a margin for the set-up.
  shared.done_deadline = shared.setup_deadline + shared.duration +
                         std::chrono::seconds(static_cast<int64_t>(options.rpc_timeout_s) + 30);
  auto opened = start_gate.WaitAllThenOpenUntil(shared.setup_deadline);
  const BenchClock::time_point start = opened.ok() ? *opened : BenchClock::now();
  absl::Status done_status;
  if (opened.ok() && !shared.bsp) {
    auto done = done_gate.WaitAllThenOpenUntil(shared.done_deadline);
    if (!done.ok()) done_status = done.status();
  }
  for (std::thread& thread : threads) thread.join();

  for (int rank = 0; rank < options.clients; ++rank) {
    if (!runs[rank].setup.ok()) {
      std::fprintf(stderr, "harrier-bench load: sync=%s: client %d setup: %s\n", sync.c_str(), rank,
                   runs[rank].setup.ToString().c_str());
      return false;
    }
  }
  if (!opened.ok()) {
    std::fprintf(stderr, "harrier-bench load: sync=%s: %s\n", sync.c_str(),
                 opened.status().ToString().c_str());
    return false;
  }

  // Gather the figures.
  int64_t ops = 0, errors = 0, bad_reads = 0, steps = 0;
  int64_t min_steps = INT64_MAX, max_steps = 0;
  std::vector<double> all_latency, kind_latency[kNumOpKinds];
  auto last = start;
  std::vector<std::string> error_lines;
  std::string first_bad_read;
  for (int rank = 0; rank < options.clients; ++rank) {
    const ClientRun& run = runs[rank];
    for (int kind = 0; kind < kNumOpKinds; ++kind) {
      ops += static_cast<int64_t>(run.latency_us[kind].size());
      kind_latency[kind].insert(kind_latency[kind].end(), run.latency_us[kind].begin(),
                                run.latency_us[kind].end());
    }
    errors += run.errors;
    bad_reads += run.bad_reads;
    if (first_bad_read.empty()) first_bad_read = run.first_bad_read;
    steps += run.steps;
    min_steps = std::min(min_steps, run.steps);
    max_steps = std::max(max_steps, run.steps);
    last = std::max(last, run.last_op_end);
    for (const CallError& error : run.first_errors) {
      error_lines.push_back(
          absl::StrCat("rank ", rank, " ", error.call, ": ", error.status.ToString()));
    }
  }
  if (!done_status.ok()) {
    ++errors;
    error_lines.push_back(absl::StrCat("waiting for clients to stop: ", done_status.ToString()));
  }
  for (int kind = 0; kind < kNumOpKinds; ++kind) {
    all_latency.insert(all_latency.end(), kind_latency[kind].begin(), kind_latency[kind].end());
  }
  const double seconds = std::chrono::duration<double>(last - start).count();

  // Every client has left, so a pull waits for nobody: read each tensor
  // once more and compare every element with its exact expected value.
  bool exact = true;
  int64_t mismatched = 0;
  std::string first_mismatch;
  for (size_t k = 0; k < tensors.size(); ++k) {
    std::string why;
    const std::vector<float> expected =
        ExpectedValues(shared.bsp, tensors[k], k, runs, INT64_MAX, &why);
    std::vector<float> final_values(tensors[k].initial.size());
    const absl::Status pulled = runs[0].client->Pull(tensors[k].name, absl::MakeSpan(final_values));
    if (!pulled.ok()) {
      exact = false;
      ++errors;
      error_lines.push_back(absl::StrCat("final pull ", tensors[k].name, ": ", pulled.ToString()));
      continue;
    }
    if (expected.empty()) {
      exact = false;
      if (first_mismatch.empty()) first_mismatch = why;
      continue;
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      if (final_values[i] != expected[i]) {
        exact = false;
        if (mismatched++ == 0) {
          first_mismatch = absl::StrCat(tensors[k].name, "[", i, "] = ", final_values[i],
                                        ", expected ", expected[i]);
        }
      }
    }
  }

  // BSP reads made after some client stopped, against the values after
  // exactly the rounds each expected (computed once per tensor and count).
  std::map<std::pair<size_t, int64_t>, uint64_t> expected_hash;
  int64_t late_reads = 0;
  for (int rank = 0; rank < options.clients; ++rank) {
    for (const LateRead& read : runs[rank].late_reads) {
      ++late_reads;
      auto [it, inserted] = expected_hash.try_emplace({read.tensor, read.rounds}, 0);
      if (inserted) {
        std::string why;
        it->second = HashValues(
            ExpectedValues(true, tensors[read.tensor], read.tensor, runs, read.rounds, &why));
      }
      if (read.hash != it->second) {
        if (bad_reads++ == 0) {
          first_bad_read = absl::StrCat("rank ", rank, " read ", tensors[read.tensor].name,
                                        " after a client stopped: not the values after ",
                                        read.rounds, " rounds");
        }
      }
    }
  }

  int chunks = 0;
  uint64_t step_bytes = 0;
  for (size_t size : options.sizes) {
    chunks += static_cast<int>((size + options.chunk_bytes - 1) / options.chunk_bytes);
    step_bytes += 2 * size;  // up and down, whichever op carried them
  }
  const double p50 = Percentile(all_latency, 0.50), p99 = Percentile(all_latency, 0.99);
  Json line = {
      {"bench", "load"},
      {"sync", sync},
      {"transport", options.transport},
      {"clients", options.clients},
      {"shards", options.shards},
      {"tensors", tensors.size()},
      {"chunks", chunks},
      {"seconds", RoundTo(seconds, 3)},
      {"ops", ops},
      {"errors", errors},
      {"p50_us", RoundTo(p50, 1)},
      {"p99_us", RoundTo(p99, 1)},
      {"ops_per_s", RoundTo(seconds > 0 ? ops / seconds : 0.0, 1)},
  };
  for (int kind = 0; kind < kNumOpKinds; ++kind) {
    if (kind_latency[kind].empty()) continue;
    const std::string name = kOpNames[kind];
    line[name + "_ops"] = kind_latency[kind].size();
    line[name + "_p50_us"] = RoundTo(Percentile(kind_latency[kind], 0.50), 1);
    line[name + "_p99_us"] = RoundTo(Percentile(kind_latency[kind], 0.99), 1);
  }
  line["steps"] = steps;
  line["min_steps"] = min_steps;
  line["max_steps"] = max_steps;
  line["payload_gbps"] =
      RoundTo(seconds > 0 ? steps * static_cast<double>(step_bytes) / seconds / 1e9 : 0.0, 4);
  line["bad_reads"] = bad_reads;
  line["late_reads"] = late_reads;
  line["mismatched_elements"] = mismatched;
  line["exact_sum"] = exact;
  if (!error_lines.empty()) line["first_error"] = error_lines.front().substr(0, 300);
  std::printf("%s\n", DumpJson(line).c_str());
  std::fflush(stdout);

  for (const std::string& error : error_lines) {
    std::fprintf(stderr, "load: sync=%s error: %s\n", sync.c_str(), error.c_str());
  }
  if (!first_bad_read.empty()) {
    std::fprintf(stderr, "load: sync=%s %lld bad reads, first: %s\n", sync.c_str(),
                 static_cast<long long>(bad_reads), first_bad_read.c_str());
  }
  if (!exact) {
    std::fprintf(stderr, "load: sync=%s %lld elements differ, first: %s\n", sync.c_str(),
                 static_cast<long long>(mismatched), first_mismatch.c_str());
  }
  const bool passed = errors == 0 && bad_reads == 0 && exact;
  std::fprintf(stderr,
               "load: sync=%s clients=%d shards=%d %.1f s: %lld ops (%.0f/s), p50 %.0f us, "
               "p99 %.0f us, steps %lld-%lld per client, %lld errors, %s -> %s\n",
               sync.c_str(), options.clients, options.shards, seconds, static_cast<long long>(ops),
               seconds > 0 ? ops / seconds : 0.0, p50, p99, static_cast<long long>(min_steps),
               static_cast<long long>(max_steps), static_cast<long long>(errors),
               exact ? "exact sum" : "sum NOT exact", passed ? "PASS" : "FAIL");
  return passed;
}

}  // namespace

int RunLoadBench(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseSubcommandFlags(
          argc, argv, kUsage,
          {"clients", "duration_s", "shards", "sync", "transport", "sizes", "chunk_bytes", "ops",
           "rpc_timeout_s", "quick", "server_binary"},
          ParseArgs, &options)) {
    return *exit_code;
  }
  auto binary = PrepareServerBench("load", options.server_binary);
  if (!binary.ok()) return 2;
  bool passed = true;
  for (const std::string& sync : options.syncs) {
    passed = RunMode(options, *binary, sync) && passed;
  }
  return passed ? 0 : 1;
}

}  // namespace harrier::bench
