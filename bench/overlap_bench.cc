#include "bench/overlap_bench.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/flags.h"
#include "bench/netem/emulated_network.h"
#include "bench/netem/host_process.h"
#include "bench/shared_flags.h"
#include "common/json.h"
#include "worker/workload/replay_models.h"

ABSL_FLAG(std::string, links_gbps, "1,10,25", "overlap: link rates in Gbit/s (0 = unshaped)");
ABSL_FLAG(std::string, compute_scale, "1",
          "overlap: scale of the modelled compute, or 'balanced' (compute_ms = the PS comm_ms)");
ABSL_FLAG(int, steps, 5, "overlap: timed steps per run");
ABSL_FLAG(int, warmup_steps, 1, "overlap: untimed steps per run");
ABSL_FLAG(int64_t, fusion_bytes, 0, "overlap: passed to the workers (0 = technique default)");
ABSL_FLAG(int64_t, partition_bytes, 0, "overlap: passed to the workers (0 = technique default)");
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "overlap: passed to the workers (0 = technique default)");
ABSL_FLAG(std::string, forward_order_tail, "auto",
          "overlap: passed to the workers (--forward_order_tail): a fraction in [0, 1], "
          "'auto': 1 - backward time / the PS cost model's comm time, the share of a step's "
          "pushes that cannot go out during backward, or 'measure': the workers time their "
          "step 1 and agree the tail themselves");
ABSL_FLAG(int64_t, bucket_bytes, 25 << 20, "overlap: all-reduce bucket (harrier-allreduce-replay)");
ABSL_FLAG(std::string, allreduce_binary, "",
          "overlap: harrier-allreduce-replay (default: runfiles, then the bazel-bin layout)");

namespace harrier::bench {

double PsCommMs(double model_bytes, int workers, int shards, double link_gbps) {
  const double busiest = std::max(model_bytes, workers * model_bytes / shards);
  return busiest * 8 / (link_gbps * 1e9) * 1e3;
}

double AllReduceCommMs(double model_bytes, int ranks, double link_gbps) {
  return 2.0 * (ranks - 1) * model_bytes / ranks * 8 / (link_gbps * 1e9) * 1e3;
}

namespace {

using Clock = std::chrono::steady_clock;

// Set by SIGINT/SIGTERM. Signals are process-wide, so this one flag is too;
// the waits below poll it, so an interrupted bench still stops its
// processes and removes its namespaces through the destructors.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void OnStopSignal(int signal_number) { g_stop_signal = signal_number; }

absl::Status Interrupted() {
  return absl::CancelledError(absl::StrCat("interrupted by signal ", g_stop_signal));
}

constexpr const char kUsage[] =
    "usage: harrier-bench overlap [flags]\n"
    "Replays real models' layers under BSP (or --sync) through real harrier-worker and\n"
    "harrier-server processes, each in its own network namespace on an emulated\n"
    "link (tbf), once per technique set; one JSON line per (model, link, techniques).\n"
    "Needs root. Flags:\n"
    "  --models=resnet50,vgg16,bert-base   replay models\n"
    "  --links_gbps=1,10,25                 link rates in Gbit/s (0 = unshaped)\n"
    "  --compute_scale=1|balanced           scale of the modelled compute; balanced =\n"
    "                                       the scale where compute_ms equals the PS comm_ms\n"
    "  --techniques=plain,wfbp,fusion,priority,all,allreduce\n"
    "                                       each item one run ('+' joins techniques);\n"
    "                                       allreduce runs harrier-allreduce-replay instead\n"
    "  --workers=2 --shards=2               hosts: one per worker and one per shard\n"
    "  --steps=5 --warmup_steps=1           timed steps and untimed steps per run\n"
    "  --fusion_bytes=0 --partition_bytes=0 --max_inflight_bytes=0\n"
    "                                       passed to the workers (0 = technique default)\n"
    "  --forward_order_tail=auto            passed to the workers: the share of the push\n"
    "                                       bytes sent last, front first; auto = 1 -\n"
    "                                       backward / the PS cost model's comm time;\n"
    "                                       measure = the workers time step 1 and agree\n"
    "  --bucket_bytes=26214400              all-reduce bucket (harrier-allreduce-replay)\n"
    "  --run_timeout_s=300                  deadline of one run (all its processes)\n"
    "  --server_binary= --worker_binary= --allreduce_binary=\n"
    "                                       default: runfiles, then the bazel-bin layout\n"
    "  --sync=bsp                           the shards' consistency model: bsp, ssp<N>\n"
    "                                       (staleness N, e.g. ssp2) or asp; the exact\n"
    "                                       check of the final parameters is BSP's\n"
    "  --server_flags= --worker_flags=      extra flags, space-separated\n"
    "Exit status: 0 ok, 1 a run failed, 2 bad flags, 3 no network namespaces here.\n";

struct Options {
  std::vector<std::string> models = {"resnet50", "vgg16", "bert-base"};
  std::vector<double> links_gbps = {1, 10, 25};
  std::optional<double> compute_scale = 1.0;  // nullopt = balanced
  std::vector<std::string> techniques = {"plain", "wfbp", "fusion", "priority", "all"};
  int workers = 2;
  int shards = 2;
  int steps = 5;
  int warmup_steps = 1;
  int64_t fusion_bytes = 0;
  int64_t partition_bytes = 0;
  int64_t max_inflight_bytes = 0;
  std::optional<double> forward_order_tail;  // nullopt = auto or measure
  bool measure_forward_order_tail = false;
  int64_t bucket_bytes = 25 << 20;
  int run_timeout_s = 300;
  std::string server_binary;
  std::string worker_binary;
  std::string allreduce_binary;
  std::vector<std::string> server_flags;
  std::vector<std::string> worker_flags;
  // The shards' consistency model as given ("bsp", "ssp2", "asp") and the
  // flags that start it.
  std::string sync = "bsp";
  std::vector<std::string> sync_flags = {"--sync=bsp"};
};

// Returns an error message, or "" when the flags parsed.
std::string ParseArgs(Options* options) {
  options->models = absl::StrSplit(FlagOr(FLAGS_models, "resnet50,vgg16,bert-base"), ',',
                                   absl::SkipEmpty());
  if (options->models.empty()) return "--models is empty";
  options->links_gbps.clear();
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_links_gbps), ',', absl::SkipEmpty())) {
    double gbps = 0;
    if (!absl::SimpleAtod(item, &gbps) || gbps < 0) {
      return absl::StrCat("--links_gbps: '", item, "' is not a rate >= 0");
    }
    options->links_gbps.push_back(gbps);
  }
  if (options->links_gbps.empty()) return "--links_gbps is empty";
  const std::string scale_text = absl::GetFlag(FLAGS_compute_scale);
  double scale = 0;
  if (scale_text == "balanced") {
    options->compute_scale.reset();
  } else if (absl::SimpleAtod(scale_text, &scale) && scale >= 0) {
    options->compute_scale = scale;
  } else {
    return absl::StrCat("--compute_scale=", scale_text, ": want a number >= 0 or 'balanced'");
  }
  options->techniques = absl::StrSplit(
      FlagOr(FLAGS_techniques, "plain,wfbp,fusion,priority,all"), ',', absl::SkipEmpty());
  if (options->techniques.empty()) return "--techniques is empty";
  for (const std::string& error :
       {NumberFlagOr(FLAGS_workers, "workers", 2, 1, &options->workers),
        NumberFlagOr(FLAGS_shards, "shards", 2, 1, &options->shards),
        NumberFlagOr(FLAGS_run_timeout_s, "run_timeout_s", 300, 1, &options->run_timeout_s)}) {
    if (!error.empty()) return error;
  }
  options->steps = absl::GetFlag(FLAGS_steps);
  options->warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  options->fusion_bytes = absl::GetFlag(FLAGS_fusion_bytes);
  options->partition_bytes = absl::GetFlag(FLAGS_partition_bytes);
  options->max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  options->bucket_bytes = absl::GetFlag(FLAGS_bucket_bytes);
  if (const std::string tail = absl::GetFlag(FLAGS_forward_order_tail); tail == "measure") {
    options->measure_forward_order_tail = true;
  } else if (tail != "auto") {
    double fraction = 0;
    if (!absl::SimpleAtod(tail, &fraction) || !(fraction >= 0 && fraction <= 1)) {
      return absl::StrCat("--forward_order_tail=", tail,
                          ": want a fraction in [0, 1], 'auto' or 'measure'");
    }
    options->forward_order_tail = fraction;
  }
  for (const auto& [name, value, min] :
       {std::make_tuple("steps", int64_t{options->steps}, int64_t{1}),
        std::make_tuple("warmup_steps", int64_t{options->warmup_steps}, int64_t{0}),
        std::make_tuple("fusion_bytes", options->fusion_bytes, int64_t{0}),
        std::make_tuple("partition_bytes", options->partition_bytes, int64_t{0}),
        std::make_tuple("max_inflight_bytes", options->max_inflight_bytes, int64_t{0}),
        std::make_tuple("bucket_bytes", options->bucket_bytes, int64_t{1})}) {
    if (value < min) return absl::StrCat("--", name, "=", value, ": want an integer >= ", min);
  }
  options->server_binary = absl::GetFlag(FLAGS_server_binary);
  options->worker_binary = absl::GetFlag(FLAGS_worker_binary);
  options->allreduce_binary = absl::GetFlag(FLAGS_allreduce_binary);
  options->server_flags = absl::StrSplit(absl::GetFlag(FLAGS_server_flags), ' ', absl::SkipEmpty());
  options->worker_flags = absl::StrSplit(absl::GetFlag(FLAGS_worker_flags), ' ', absl::SkipEmpty());
  options->sync = FlagOr(FLAGS_sync, "bsp");
  auto sync_flags = SyncServerFlags(options->sync);
  if (!sync_flags.ok() || absl::StartsWith(options->sync, "local")) {
    // Local SGD needs the workers' own optimizer, which a replay has not.
    return absl::StrCat("--sync=", options->sync,
                        ": want bsp, asp or ssp<N> with a staleness N >= 1 (e.g. ssp2)");
  }
  options->sync_flags = *std::move(sync_flags);
  if (options->workers + options->shards > 250) return "--workers + --shards must be <= 250";
  return "";
}

std::string SelfPath() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

// `relative` is the path under the workspace (e.g. "worker/harrier-worker").
// Tried: the flag, $RUNFILES_DIR and $TEST_SRCDIR, this binary's runfiles,
// and the bazel-bin layout next to bench/harrier-bench.
absl::StatusOr<std::string> FindBinary(const std::string& flag_name,
                                       const std::string& flag_value,
                                       const std::string& relative) {
  if (!flag_value.empty()) {
    if (access(flag_value.c_str(), X_OK) == 0) return flag_value;
    return absl::NotFoundError(
        absl::StrCat("--", flag_name, "=", flag_value, " is not an executable file"));
  }
  std::vector<std::string> candidates;
  for (const char* name : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') {
      candidates.push_back(absl::StrCat(value, "/harrier/", relative));
    }
  }
  const std::string self = SelfPath();
  if (!self.empty()) {
    candidates.push_back(absl::StrCat(self, ".runfiles/harrier/", relative));
    candidates.push_back(absl::StrCat(self.substr(0, self.rfind('/')), "/../", relative));
  }
  for (const std::string& candidate : candidates) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(relative, " not found (tried ",
                                          absl::StrJoin(candidates, ", "), "); build it or pass --",
                                          flag_name, "=PATH"));
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}


using netem::HostProcess;

// A private temporary directory for one run's logs, port files and
// rendezvous, removed with its contents at the end.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Make() {
    std::string root = "/tmp";
    for (const char* name : {"TEST_TMPDIR", "TMPDIR"}) {
      const char* value = std::getenv(name);
      if (value != nullptr && *value != '\0') {
        root = value;
        break;
      }
    }
    std::string pattern = absl::StrCat(root, "/harrier-overlap-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot create a temporary directory ", pattern));
    }
    return TempDir(pattern);
  }
  TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ~TempDir() {
    if (path_.empty()) return;
    // Only regular files and one level of folders are made here.
    (void)RunCommand({"rm", "-rf", "--", path_});
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

struct Summary {
  int rank = -1;
  double iter_ms = 0;
  double compute_ms = 0;
  double bytes_pushed = 0;
  double bytes_pulled = 0;
  double bytes_per_iter = 0;
  int steps = 0;
  bool checked = false;
  // The shards' consistency model as the worker saw it (empty for an
  // all-reduce rank and for workers that do not report it).
  std::string sync;
  // Bytes this worker pushed to (pulled from) each shard per step (PS runs).
  std::vector<double> pushed_per_shard;
  std::vector<double> pulled_per_shard;
  // CPU this process spent per timed step, and the timed steps' span on the
  // steady clock (0 where the replay did not report them).
  double cpu_seconds_per_iter = 0;
  int64_t timed_start_ns = 0;
  int64_t timed_end_ns = 0;
  // Each timed step's wall time (empty where the replay did not report it).
  std::vector<double> step_ms;
  // The forward-order tail the worker planned, and its own estimate where
  // the workers measured it (-1: not reported or not measured).
  double forward_order_tail = -1;
  double measured_forward_order_tail = -1;
};

// A process's CPU sampled over time, so that its CPU over a span another
// process reports (the workers' timed steps) can be read afterwards.
class CpuSamples {
 public:
  void Add(Clock::time_point when, double cpu_seconds) {
    if (cpu_seconds >= 0) samples_.emplace_back(when, cpu_seconds);
  }
  // CPU between two steady-clock instants, interpolated linearly between
  // the samples around each; -1 without samples on both sides.
  double Between(int64_t start_ns, int64_t end_ns) const {
    const double start = At(start_ns);
    const double end = At(end_ns);
    return start < 0 || end < 0 ? -1 : std::max(0.0, end - start);
  }

 private:
  double At(int64_t ns) const {
    const Clock::time_point t{std::chrono::nanoseconds(ns)};
    if (samples_.empty() || t < samples_.front().first || t > samples_.back().first) return -1;
    auto after = std::lower_bound(
        samples_.begin(), samples_.end(), t,
        [](const std::pair<Clock::time_point, double>& s, Clock::time_point v) {
          return s.first < v;
        });
    if (after == samples_.begin()) return after->second;
    const auto before = after - 1;
    const double span = std::chrono::duration<double>(after->first - before->first).count();
    const double part = std::chrono::duration<double>(t - before->first).count();
    return span > 0 ? before->second + (after->second - before->second) * part / span
                    : after->second;
  }

  std::vector<std::pair<Clock::time_point, double>> samples_;
};

// What one run gives the JSON line.
struct RunResult {
  std::vector<Summary> summaries;
  // Each shard's CPU over the workers' timed steps (PS runs; -1 unknown).
  std::vector<double> shard_cpu_seconds;
};

absl::StatusOr<Summary> ReadSummary(const HostProcess& process) {
  const std::string out = ReadFile(process.stdout_path());
  const size_t at = out.rfind("replay_summary ");
  if (at == std::string::npos) {
    return absl::InternalError(absl::StrCat(process.label(),
                                            " printed no replay_summary line; its stderr: ",
                                            netem::TailOfFile(process.stderr_path())));
  }
  const std::string text = out.substr(at + std::strlen("replay_summary "));
  const Json json = ParseJson(absl::string_view(text).substr(0, text.find('\n')));
  Summary summary;
  auto number = [&](const char* key, double* value) -> bool {
    auto it = json.is_object() ? json.find(key) : json.end();
    if (it == json.end() || !it->is_number()) return false;
    *value = it->get<double>();
    return true;
  };
  double rank = -1;
  double steps = 0;
  if (!number("rank", &rank) || !number("iter_ms", &summary.iter_ms) ||
      !number("compute_ms", &summary.compute_ms) ||
      !number("bytes_pushed_per_iter", &summary.bytes_pushed) ||
      !number("bytes_pulled_per_iter", &summary.bytes_pulled) ||
      !number("bytes_per_iter", &summary.bytes_per_iter) || !number("steps", &steps)) {
    return absl::InternalError(absl::StrCat(
        process.label(), ": replay_summary lacks a field the overlap bench reads: ", text));
  }
  summary.rank = static_cast<int>(rank);
  summary.steps = static_cast<int>(steps);
  const auto checked = json.find("checked");
  summary.checked = checked != json.end() && checked->is_boolean() && checked->get<bool>();
  const auto sync = json.find("sync");
  if (sync != json.end() && sync->is_string()) summary.sync = sync->get<std::string>();
  for (const auto& [key, into] :
       {std::make_pair("bytes_pushed_per_shard_per_iter", &summary.pushed_per_shard),
        std::make_pair("bytes_pulled_per_shard_per_iter", &summary.pulled_per_shard),
        std::make_pair("step_ms", &summary.step_ms)}) {
    const auto per_shard = json.find(key);
    if (per_shard == json.end() || !per_shard->is_array()) continue;
    for (const Json& bytes : *per_shard) {
      if (bytes.is_number()) into->push_back(bytes.get<double>());
    }
  }
  double start_ns = 0;
  double end_ns = 0;
  number("cpu_seconds_per_iter", &summary.cpu_seconds_per_iter);
  number("forward_order_tail", &summary.forward_order_tail);
  number("measured_forward_order_tail", &summary.measured_forward_order_tail);
  if (number("timed_start_monotonic_ns", &start_ns) && number("timed_end_monotonic_ns", &end_ns)) {
    summary.timed_start_ns = static_cast<int64_t>(start_ns);
    summary.timed_end_ns = static_cast<int64_t>(end_ns);
  }
  return summary;
}

// Waits for every process in `watch` to exit 0, within `deadline`; the first
// failure (or the deadline) is returned with the failed process's log.
// Processes in `keep_alive` (servers) must not exit meanwhile; their CPU is
// sampled into `keep_alive_cpu` (one per process) every 20 ms.
absl::Status WaitAll(std::vector<std::unique_ptr<HostProcess>>& watch,
                     std::vector<std::unique_ptr<HostProcess>>& keep_alive,
                     Clock::time_point deadline, int timeout_s,
                     std::vector<CpuSamples>* keep_alive_cpu = nullptr) {
  std::vector<bool> done(watch.size(), false);
  size_t remaining = watch.size();
  while (remaining > 0) {
    if (g_stop_signal != 0) return Interrupted();
    if (keep_alive_cpu != nullptr) {
      keep_alive_cpu->resize(keep_alive.size());
      for (size_t i = 0; i < keep_alive.size(); ++i) {
        (*keep_alive_cpu)[i].Add(Clock::now(), keep_alive[i]->CpuSeconds());
      }
    }
    for (size_t i = 0; i < watch.size(); ++i) {
      if (done[i]) continue;
      const std::optional<int> code = watch[i]->Poll();
      if (!code.has_value()) continue;
      if (*code != 0) return absl::InternalError(watch[i]->Describe());
      done[i] = true;
      --remaining;
    }
    for (auto& server : keep_alive) {
      if (server->Poll().has_value()) return absl::InternalError(server->Describe());
    }
    if (remaining == 0) break;
    if (Clock::now() >= deadline) {
      for (size_t i = 0; i < watch.size(); ++i) {
        if (!done[i]) {
          return absl::DeadlineExceededError(
              absl::StrCat(watch[i]->label(), " still running after --run_timeout_s=", timeout_s,
                           "; its stderr: ", netem::TailOfFile(watch[i]->stderr_path())));
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::OkStatus();
}

std::string Fmt(double value) { return absl::StrFormat("%.6g", value); }

// A figure of the JSON line: 6 significant digits, as Fmt.
double Significant(double value) { return RoundToSignificant(value, 6); }

struct RunConfig {
  std::string model;
  std::string techniques;
  double compute_scale = 1;
  double forward_order_tail = 0;
};

// One PS run: S servers in the shard hosts, W workers in the worker hosts.
absl::StatusOr<RunResult> RunPs(const Options& options, const EmulatedNetwork& network,
                                           const std::string& server_binary,
                                           const std::string& worker_binary,
                                           const RunConfig& config) {
  auto dir = TempDir::Make();
  if (!dir.ok()) return dir.status();
  const auto deadline = Clock::now() + std::chrono::seconds(options.run_timeout_s);
  const int W = options.workers;
  const int S = options.shards;
  std::vector<std::unique_ptr<HostProcess>> servers;
  std::vector<std::string> addresses;
  for (int shard = 0; shard < S; ++shard) {
    const int host = W + shard;
    const std::string port_file = absl::StrCat(dir->path(), "/shard", shard, ".port");
    std::vector<std::string> args = {
        server_binary, absl::StrCat("--host=", network.host_address(host)), "--port=0",
        absl::StrCat("--port_file=", port_file), absl::StrCat("--shard=", shard),
        absl::StrCat("--num_shards=", S), absl::StrCat("--num_workers=", W), "--optimizer=sgd",
        // The bench stops the shards itself, after every
        // configuration it runs against them.
        "--exit_when_done=false"};
    args.insert(args.end(), options.sync_flags.begin(), options.sync_flags.end());
    // Later flags win: --server_flags may override any of these.
    args.insert(args.end(), options.server_flags.begin(), options.server_flags.end());
    auto server = HostProcess::Start(
        absl::StrCat("harrier-server shard ", shard), network.host_namespace_path(host), args,
        absl::StrCat(dir->path(), "/shard", shard, ".out"),
        absl::StrCat(dir->path(), "/shard", shard, ".err"));
    if (!server.ok()) return server.status();
    servers.push_back(*std::move(server));
    // Shard 0 hosts the control plane; each shard serves once its port file
    // appears.
    const auto port_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(20));
    int port = 0;
    while (true) {
      std::ifstream file(port_file);
      if (file >> port && port > 0) break;
      if (g_stop_signal != 0) return Interrupted();
      if (servers.back()->Poll().has_value()) {
        return absl::InternalError(servers.back()->Describe());
      }
      if (Clock::now() >= port_deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            servers.back()->label(), " wrote no port file within 20 s; its stderr: ",
            netem::TailOfFile(servers.back()->stderr_path())));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    addresses.push_back(absl::StrCat(network.host_address(host), ":", port));
  }
  std::vector<std::unique_ptr<HostProcess>> workers;
  for (int rank = 0; rank < W; ++rank) {
    std::vector<std::string> args = {
        worker_binary, absl::StrCat("--servers=", absl::StrJoin(addresses, ",")),
        absl::StrCat("--num_workers=", W), absl::StrCat("--rank=", rank),
        absl::StrCat("--workload=replay:", config.model),
        absl::StrCat("--techniques=", config.techniques),
        absl::StrCat("--compute_scale=", Fmt(config.compute_scale)),
        // harrier-worker's --max_steps counts the timed steps only; the
        // warm-up runs before them.
        absl::StrCat("--max_steps=", options.steps),
        absl::StrCat("--warmup_steps=", options.warmup_steps),
        absl::StrCat("--fusion_bytes=", options.fusion_bytes),
        absl::StrCat("--partition_bytes=", options.partition_bytes),
        absl::StrCat("--max_inflight_bytes=", options.max_inflight_bytes),
        absl::StrCat("--forward_order_tail=", options.measure_forward_order_tail
                                                  ? std::string("measure")
                                                  : Fmt(config.forward_order_tail))};
    args.insert(args.end(), options.worker_flags.begin(), options.worker_flags.end());
    auto worker = HostProcess::Start(
        absl::StrCat("harrier-worker rank ", rank), network.host_namespace_path(rank), args,
        absl::StrCat(dir->path(), "/worker", rank, ".out"),
        absl::StrCat(dir->path(), "/worker", rank, ".err"));
    if (!worker.ok()) return worker.status();
    workers.push_back(*std::move(worker));
  }
  std::vector<CpuSamples> server_cpu;
  if (auto status = WaitAll(workers, servers, deadline, options.run_timeout_s, &server_cpu);
      !status.ok()) {
    return status;
  }
  RunResult result;
  for (const auto& worker : workers) {
    auto summary = ReadSummary(*worker);
    if (!summary.ok()) return summary.status();
    result.summaries.push_back(*summary);
  }
  // The shards' CPU over the span in which any worker ran timed steps.
  int64_t start_ns = result.summaries.front().timed_start_ns;
  int64_t end_ns = result.summaries.front().timed_end_ns;
  for (const Summary& summary : result.summaries) {
    start_ns = std::min(start_ns, summary.timed_start_ns);
    end_ns = std::max(end_ns, summary.timed_end_ns);
  }
  for (const CpuSamples& samples : server_cpu) {
    result.shard_cpu_seconds.push_back(start_ns > 0 ? samples.Between(start_ns, end_ns) : -1);
  }
  return result;
}

// One all-reduce run: W ranks of harrier-allreduce-replay in the worker
// hosts, no servers.
absl::StatusOr<RunResult> RunAllReduce(const Options& options,
                                                  const EmulatedNetwork& network,
                                                  const std::string& binary,
                                                  const RunConfig& config) {
  auto dir = TempDir::Make();
  if (!dir.ok()) return dir.status();
  const auto deadline = Clock::now() + std::chrono::seconds(options.run_timeout_s);
  const std::string rendezvous = absl::StrCat(dir->path(), "/rendezvous");
  if (mkdir(rendezvous.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("cannot create ", rendezvous));
  }
  std::vector<std::unique_ptr<HostProcess>> ranks;
  for (int rank = 0; rank < options.workers; ++rank) {
    std::vector<std::string> args = {binary,
                                     absl::StrCat("--model=", config.model),
                                     absl::StrCat("--rank=", rank),
                                     absl::StrCat("--world=", options.workers),
                                     absl::StrCat("--rendezvous_dir=", rendezvous),
                                     absl::StrCat("--address=", network.host_address(rank)),
                                     // --steps counts every step run, the warm-up included.
                                     absl::StrCat("--steps=", options.steps + options.warmup_steps),
                                     absl::StrCat("--warmup_steps=", options.warmup_steps),
                                     absl::StrCat("--compute_scale=", Fmt(config.compute_scale)),
                                     absl::StrCat("--bucket_bytes=", options.bucket_bytes)};
    auto process = HostProcess::Start(
        absl::StrCat("harrier-allreduce-replay rank ", rank), network.host_namespace_path(rank),
        args, absl::StrCat(dir->path(), "/rank", rank, ".out"),
        absl::StrCat(dir->path(), "/rank", rank, ".err"));
    if (!process.ok()) return process.status();
    ranks.push_back(*std::move(process));
  }
  std::vector<std::unique_ptr<HostProcess>> none;
  if (auto status = WaitAll(ranks, none, deadline, options.run_timeout_s); !status.ok()) {
    return status;
  }
  RunResult result;
  for (const auto& process : ranks) {
    auto summary = ReadSummary(*process);
    if (!summary.ok()) return summary.status();
    result.summaries.push_back(*summary);
  }
  return result;
}

}  // namespace

int RunOverlapBench(int argc, char** argv) {
  Options options;
  // The flags this subcommand takes (ParseSubcommandFlags refuses others).
  // clang-format off
  const std::initializer_list<absl::string_view> accepted = {
      "models", "links_gbps", "compute_scale", "techniques", "workers", "shards", "steps",
      "warmup_steps", "fusion_bytes", "partition_bytes", "max_inflight_bytes",
      "forward_order_tail", "bucket_bytes", "run_timeout_s", "server_binary", "worker_binary",
      "allreduce_binary", "server_flags", "worker_flags", "sync"};
  // clang-format on
  if (std::optional<int> exit_code =
          ParseSubcommandFlags(argc, argv, kUsage, accepted, ParseArgs, &options)) {
    return *exit_code;
  }
  std::vector<workload::ReplayModelSpec> specs;
  for (const std::string& name : options.models) {
    auto spec = workload::FindReplayModel(name);
    if (!spec.ok()) {
      std::fprintf(stderr, "harrier-bench overlap: %s\n",
                   std::string(spec.status().message()).c_str());
      return 2;
    }
    specs.push_back(*std::move(spec));
  }
  bool any_ps = false;
  bool any_allreduce = false;
  for (const std::string& technique : options.techniques) {
    (technique == "allreduce" ? any_allreduce : any_ps) = true;
  }
  std::string server_binary;
  std::string worker_binary;
  std::string allreduce_binary;
  auto find = [](const char* flag, const std::string& value, const char* relative,
                 std::string* out) {
    auto found = FindBinary(flag, value, relative);
    if (!found.ok()) {
      std::fprintf(stderr, "harrier-bench overlap: %s\n",
                   std::string(found.status().message()).c_str());
      return false;
    }
    *out = *found;
    return true;
  };
  if (any_ps && (!find("server_binary", options.server_binary, "server/harrier-server",
                       &server_binary) ||
                 !find("worker_binary", options.worker_binary, "worker/harrier-worker",
                       &worker_binary))) {
    return 2;
  }
  if (any_allreduce &&
      !find("allreduce_binary", options.allreduce_binary,
            "bench/allreduce/harrier-allreduce-replay", &allreduce_binary)) {
    return 2;
  }

  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  const int W = options.workers;
  const int S = options.shards;
  int failures = 0;
  // The stderr table's header waits for the first row, so that a machine
  // without namespaces gets exactly one line.
  bool header_printed = false;
  for (const workload::ReplayModelSpec& spec : specs) {
    const double model_bytes = static_cast<double>(spec.num_parameters()) * sizeof(float);
    for (const double link : options.links_gbps) {
      EmulatedNetworkOptions net_options;
      net_options.prefix = "hov";
      net_options.num_hosts = W + S;
      net_options.rate_gbps = link;
      net_options.model = LinkModel::kPerHost;
      auto network = EmulatedNetwork::Create(net_options);
      if (absl::IsUnavailable(network.status())) {
        std::fprintf(stderr, "harrier-bench overlap: emulated links unavailable: %s\n",
                     std::string(network.status().message()).c_str());
        return kOverlapUnavailableExit;
      }
      if (!network.ok()) {
        std::fprintf(stderr, "harrier-bench overlap: %s\n",
                     std::string(network.status().message()).c_str());
        return 1;
      }
      // ~0.2 s of the set rate (at least 25 MB), or 250 MB unshaped: long
      // enough that the tbf burst and slow start do not count.
      const int64_t probe_bytes =
          link > 0 ? std::max<int64_t>(25'000'000, static_cast<int64_t>(link * 1e9 / 8 * 0.2))
                   : 250'000'000;
      // Best of 5 (EmulatedNetwork::BestTcpGbps says why): 1 s in all at 1 Gbit/s.
      // The same streams give a raw TCP stream's CPU per GB, the floor the
      // PS and all-reduce figures are read against.
      auto measured = (*network)->BestTcpStream(0, W, probe_bytes, 5);
      if (!measured.ok()) {
        std::fprintf(stderr, "harrier-bench overlap: measuring the link: %s\n",
                     std::string(measured.status().message()).c_str());
        return 1;
      }
      const double gbps = measured->gbps;
      const double tcp_cpu_s_per_gb = measured->cpu_s_per_gb();
      // Balanced: the compute of one step equals the PS cost model's comm
      // time, the point where overlap can at most halve the iteration.
      const double scale = options.compute_scale.has_value()
                               ? *options.compute_scale
                               : PsCommMs(model_bytes, W, S, gbps) / spec.compute_ms();
      // The pushes that do not fit under backward go last, front first.
      double backward_ms = 0;
      for (const workload::ReplayLayer& layer : spec.layers) backward_ms += layer.backward_ms;
      const double forward_order_tail =
          options.forward_order_tail.has_value()
              ? *options.forward_order_tail
              : std::clamp(1.0 - scale * backward_ms / PsCommMs(model_bytes, W, S, gbps), 0.0, 1.0);
      double plain_iter_ms = 0;
      // For the PS-against-all-reduce lines once every technique ran.
      struct Ran {
        std::string techniques;
        double iter_ms = 0;
        double cpu_s_per_gb = 0;
      };
      std::vector<Ran> ran;
      for (const std::string& techniques : options.techniques) {
        if (g_stop_signal != 0) return 128 + g_stop_signal;
        const bool allreduce = techniques == "allreduce";
        RunConfig config{spec.name, techniques, scale, forward_order_tail};
        auto run = allreduce ? RunAllReduce(options, **network, allreduce_binary, config)
                             : RunPs(options, **network, server_binary, worker_binary, config);
        if (!run.ok()) {
          std::fprintf(stderr, "harrier-bench overlap: model=%s link_gbps=%g techniques=%s: %s\n",
                       spec.name.c_str(), link, techniques.c_str(),
                       std::string(run.status().message()).c_str());
          ++failures;
          if (g_stop_signal != 0) return 128 + g_stop_signal;
          continue;
        }
        const std::vector<Summary>* summaries = &run->summaries;
        double iter_ms = 0;
        bool checked = true;
        // Each timed step as the slowest worker saw it, when all report it
        // (PS workers do; an all-reduce rank does not).
        std::vector<double> step_ms(static_cast<size_t>(options.steps), 0.0);
        for (const Summary& summary : *summaries) {
          iter_ms = std::max(iter_ms, summary.iter_ms);
          checked = checked && summary.checked;
          if (summary.step_ms.size() != step_ms.size()) step_ms.clear();
          for (size_t i = 0; i < step_ms.size(); ++i) {
            step_ms[i] = std::max(step_ms[i], summary.step_ms[i]);
          }
        }
        const Summary& first = summaries->front();
        // M from the bytes the run really moved: a PS worker pushes and
        // pulls M each way; an all-reduce rank sends 2(n-1)M/n.
        const double comm_ms =
            allreduce ? std::max(first.bytes_pushed, first.bytes_pulled) * 8 / (gbps * 1e9) * 1e3
                      : PsCommMs(std::max(first.bytes_pushed, first.bytes_pulled), W, S, gbps);
        const double ideal_ms = std::max(first.compute_ms, comm_ms);
        const double samples_per_s = W * spec.batch_size / (iter_ms / 1e3);
        if (techniques == "plain") plain_iter_ms = iter_ms;
        Json line = {
            {"bench", "overlap"},
            {"model", spec.name},
            {"link_gbps", Significant(link)},
            {"link_measured_gbps", Significant(gbps)},
            {"link_model", "per_host"},
            {"compute_scale", Significant(scale)},
            {"balanced", !options.compute_scale.has_value()},
            {"techniques", techniques},
            {"workers", W},
            {"shards", allreduce ? 0 : S},
            {"batch", spec.batch_size},
            {"steps", options.steps},
            {"warmup_steps", options.warmup_steps},
            {"compute_ms", Significant(first.compute_ms)},
            {"comm_ms", Significant(comm_ms)},
            {"iter_ms", Significant(iter_ms)},
            {"ideal_iter_ms", Significant(ideal_ms)},
            {"ideal_over_iter", Significant(ideal_ms / iter_ms)},
        };
        if (!allreduce) {
          // The tail given to the workers (auto: the cost model's), or
          // with measure the one they agreed; each worker's plan and own
          // estimate beside it.
          line["forward_order_tail"] = Significant(
              options.measure_forward_order_tail ? first.forward_order_tail : forward_order_tail);
          line["forward_order_tail_source"] = options.measure_forward_order_tail       ? "measured"
                                              : options.forward_order_tail.has_value() ? "given"
                                                                                       : "auto";
          Json planned = Json::array();
          Json estimates = Json::array();
          for (const Summary& summary : *summaries) {
            planned.push_back(Significant(summary.forward_order_tail));
            estimates.push_back(Significant(summary.measured_forward_order_tail));
          }
          line["forward_order_tail_planned"] = planned;
          if (options.measure_forward_order_tail) line["forward_order_tail_estimates"] = estimates;
        }
        if (!step_ms.empty()) {
          Json steps = Json::array();
          for (double ms : step_ms) steps.push_back(Significant(ms));
          line["step_ms"] = steps;
        }
        // As asked ("ssp2" keeps its staleness), unless the workers saw
        // another mode (a --server_flags override). All-reduce has no shards.
        const std::string sync = first.sync.empty() || absl::StartsWith(options.sync, first.sync)
                                     ? options.sync
                                     : first.sync;
        if (!allreduce) line["sync"] = sync;
        if (plain_iter_ms > 0) line["speedup_vs_plain"] = Significant(plain_iter_ms / iter_ms);
        line["samples_per_s"] = Significant(samples_per_s);
        line["bytes_per_iter"] = static_cast<int64_t>(first.bytes_per_iter);
        line["bytes_pushed_per_iter"] = static_cast<int64_t>(first.bytes_pushed);
        line["bytes_pulled_per_iter"] = static_cast<int64_t>(first.bytes_pulled);
        // How evenly the shards' links are loaded: every worker's bytes to
        // each shard, against the even share nM/k.
        std::vector<double> shard_bytes(allreduce ? 0 : S, 0.0);
        for (const Summary& summary : *summaries) {
          for (size_t s = 0; s < summary.pushed_per_shard.size() && s < shard_bytes.size(); ++s) {
            shard_bytes[s] += summary.pushed_per_shard[s];
          }
        }
        double shard_total = 0;
        for (double bytes : shard_bytes) shard_total += bytes;
        std::string spread = "-";
        if (shard_total > 0) {
          const double even = shard_total / static_cast<double>(shard_bytes.size());
          const auto [low, high] = std::minmax_element(shard_bytes.begin(), shard_bytes.end());
          line["shard_bytes_per_iter_even"] = static_cast<int64_t>(even);
          line["shard_bytes_max_over_even"] = Significant(*high / even);
          line["shard_bytes_min_over_even"] = Significant(*low / even);
          spread = absl::StrFormat("%.3f-%.3f", *low / even, *high / even);
        }
        // CPU per GB moved: each process's CPU over the timed steps against
        // the bytes it sent and received in them. Workers (or all-reduce
        // ranks) report their own; the shards' is sampled by this bench.
        double worker_cpu = 0;
        double worker_bytes = 0;
        for (const Summary& summary : *summaries) {
          worker_cpu += summary.cpu_seconds_per_iter * summary.steps;
          worker_bytes += summary.bytes_per_iter * summary.steps;
        }
        double shard_cpu = 0;
        double shard_bytes_moved = 0;
        bool shards_known = !allreduce && !run->shard_cpu_seconds.empty();
        for (size_t s = 0; shards_known && s < run->shard_cpu_seconds.size(); ++s) {
          if (run->shard_cpu_seconds[s] < 0) shards_known = false;
          shard_cpu += run->shard_cpu_seconds[s];
          for (const Summary& summary : *summaries) {
            const double pushed =
                s < summary.pushed_per_shard.size() ? summary.pushed_per_shard[s] : 0;
            const double pulled =
                s < summary.pulled_per_shard.size() ? summary.pulled_per_shard[s] : 0;
            shard_bytes_moved += (pushed + pulled) * summary.steps;
          }
        }
        double cpu_s_per_gb = 0;
        if (worker_cpu > 0 && worker_bytes > 0) {
          line["cpu_s_per_gb_workers"] = Significant(worker_cpu / (worker_bytes / 1e9));
          double cpu = worker_cpu;
          double bytes = worker_bytes;
          if (shards_known && shard_bytes_moved > 0) {
            line["cpu_s_per_gb_shards"] = Significant(shard_cpu / (shard_bytes_moved / 1e9));
            cpu += shard_cpu;
            bytes += shard_bytes_moved;
          }
          cpu_s_per_gb = cpu / (bytes / 1e9);
          line["cpu_s_per_gb"] = Significant(cpu_s_per_gb);
          // Cores kept busy over the timed steps, by every process of the run.
          line["cpu_s_per_iter"] = Significant(cpu / options.steps);
          line["cores_busy"] = Significant(cpu / options.steps / (iter_ms / 1e3));
        }
        line["tcp_cpu_s_per_gb"] = Significant(tcp_cpu_s_per_gb);
        if (cpu_s_per_gb > 0 && tcp_cpu_s_per_gb > 0) {
          line["cpu_over_tcp"] = Significant(cpu_s_per_gb / tcp_cpu_s_per_gb);
        }
        ran.push_back({techniques, iter_ms, cpu_s_per_gb});
        line["checked"] = checked;
        std::printf("%s\n", DumpJson(line).c_str());
        std::fflush(stdout);
        if (!header_printed) {
          std::fprintf(stderr, "%-10s %6s %8s %-22s %7s %9s %9s %9s %9s %8s %12s %8s\n",
                       "model", "link", "measured", "techniques", "scale", "compute", "comm",
                       "ideal", "iter", "ideal/it", "shard/even", "cpu s/GB");
          header_printed = true;
        }
        std::fprintf(stderr,
                     "%-10s %6g %8.3f %-22s %7.3g %9.1f %9.1f %9.1f %9.1f %8.2f %12s %8.3f\n",
                     spec.name.c_str(), link, gbps, techniques.c_str(), scale, first.compute_ms,
                     comm_ms, ideal_ms, iter_ms, ideal_ms / iter_ms, spread.c_str(), cpu_s_per_gb);
        // The exact check of the final parameters is BSP's: under SSP and
        // ASP the values depend on the order pushes arrive in, so the
        // workers check nothing and that is no failure.
        if (!checked && (allreduce || sync == "bsp")) {
          std::fprintf(stderr, "harrier-bench overlap: %s %s: BSP check not passed\n",
                       spec.name.c_str(), techniques.c_str());
          ++failures;
        } else if (!checked) {
          std::fprintf(stderr,
                       "harrier-bench overlap: %s %s: sync %s: final values not checked (the "
                       "exact check is BSP's)\n",
                       spec.name.c_str(), techniques.c_str(), sync.c_str());
        }
      }
      // Each PS technique set against the all-reduce of the same run.
      const auto allreduce_run = std::find_if(
          ran.begin(), ran.end(), [](const Ran& r) { return r.techniques == "allreduce"; });
      if (allreduce_run != ran.end()) {
        for (const Ran& ps : ran) {
          if (ps.techniques == "allreduce") continue;
          Json line = {{"bench", "overlap_vs_allreduce"},
                       {"model", spec.name},
                       {"link_gbps", Significant(link)},
                       {"workers", W},
                       {"shards", S},
                       {"techniques", ps.techniques},
                       {"iter_ms", Significant(ps.iter_ms)},
                       {"allreduce_iter_ms", Significant(allreduce_run->iter_ms)},
                       {"speedup_vs_allreduce", Significant(allreduce_run->iter_ms / ps.iter_ms)}};
          if (ps.cpu_s_per_gb > 0 && allreduce_run->cpu_s_per_gb > 0) {
            line["cpu_s_per_gb"] = Significant(ps.cpu_s_per_gb);
            line["allreduce_cpu_s_per_gb"] = Significant(allreduce_run->cpu_s_per_gb);
            line["cpu_per_gb_over_allreduce"] =
                Significant(ps.cpu_s_per_gb / allreduce_run->cpu_s_per_gb);
          }
          std::printf("%s\n", DumpJson(line).c_str());
          std::fflush(stdout);
          std::fprintf(stderr,
                       "%-10s %6g %-22s PS %.1f ms, all-reduce %.1f ms: %.2fx; CPU per GB "
                       "%.3g against %.3g s: %.2fx\n",
                       spec.name.c_str(), link, ps.techniques.c_str(), ps.iter_ms,
                       allreduce_run->iter_ms, allreduce_run->iter_ms / ps.iter_ms,
                       ps.cpu_s_per_gb, allreduce_run->cpu_s_per_gb,
                       allreduce_run->cpu_s_per_gb > 0
                           ? ps.cpu_s_per_gb / allreduce_run->cpu_s_per_gb
                           : 0.0);
        }
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace harrier::bench
