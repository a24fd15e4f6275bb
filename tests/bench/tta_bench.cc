#include "tests/bench/tta_bench.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/bench/netem/emulated_network.h"
#include "tests/bench/netem/host_process.h"
#include "tests/bench/server_cluster.h"

namespace harrier::bench {
namespace {

constexpr const char* kUsage =
    "usage: harrier-bench tta [flags]\n"
    "Time to accuracy on an emulated network: every shard and every harrier-worker\n"
    "runs in a network namespace of its own behind its own tc-tbf link of\n"
    "--link_gbps (upload and download), joined through a bridge namespace\n"
    "(//tests/bench/netem, per-host model; no latency is added). The workers train\n"
    "the Fashion-MNIST MLP 784-256-256-10 under BSP, batch 64 each; rank 0\n"
    "evaluates the test set every --eval_every steps. For each codec and\n"
    "technique set one JSON line: the training wall time to the first evaluation\n"
    "at or above --target (evaluation time excluded), accuracy, steps and bytes.\n"
    "Needs root (ip netns, tc); says why in one line and exits 1 otherwise.\n"
    "  --codecs=none,fp16,topk,topk_pull10,qsgd8,powersgd2,efsign\n"
    "                           none; fp16; topk = topk:ratio=0.01 (error feedback\n"
    "                           built in) with dense pulls; topk_pull10 = the same\n"
    "                           push, pulls topk:ratio=0.1; qsgd8 =\n"
    "                           qsgd:levels=127,bucket=512 (8-bit codes: sign + 7-bit\n"
    "                           level); powersgd2 = powersgd:rank=2; efsign. Each with\n"
    "                           the server settings of docs/experiments.md\n"
    "  --techniques=none        comm scheduler sets, e.g. none,all ('none': the\n"
    "                           trainer's own path; others are passed to\n"
    "                           harrier-worker --techniques)\n"
    "  --link_gbps=1            rate of every host's link (0: unshaped)\n"
    "  --workers=4              harrier-worker processes, one namespace each\n"
    "  --shards=2               harrier-server shards, one namespace each\n"
    "  --target=0.85            test accuracy to reach\n"
    "  --max_epochs=5           a run that has not reached the target by then ends\n"
    "  --eval_every=20          steps between rank 0's evaluations\n"
    "  --train_examples=0       train on the first N examples only (0: all 60000;\n"
    "                           for smoke tests)\n"
    "  --stop_at_target=true    end a run at its first evaluation at the target\n"
    "                           (false: run all --max_epochs)\n"
    "  --run_timeout_s=900      deadline of one run\n"
    "  --server_binary=PATH     harrier-server (default: from runfiles)\n"
    "  --worker_binary=PATH     harrier-worker (default: from runfiles)\n"
    "  --help\n";

// One --codecs entry: what the workers push and pull, and the server
// settings that train well with it (docs/experiments.md, chosen per codec
// from a few 5-epoch runs each).
struct CodecSetting {
  const char* name;
  const char* codec;
  const char* pull_codec;
  std::vector<std::string> server_flags;
};

const std::vector<CodecSetting>& CodecSettings() {
  static const auto* settings = new std::vector<CodecSetting>{
      {"none", "none", "none", {"--optimizer=nesterov", "--lr=0.05", "--momentum=0.9"}},
      {"fp16", "fp16", "none", {"--optimizer=nesterov", "--lr=0.05", "--momentum=0.9"}},
      // Pulls: dense for topk, since on this machine the top-k 10 % pulls
      // cost more extra steps than they saved time per step (README.md,
      // "tta"); topk_pull10 is the other choice, measured beside it.
      {"topk", "topk:ratio=0.01", "none",
       {"--optimizer=nesterov", "--lr=0.08", "--momentum=0.9"}},
      {"topk_pull10", "topk:ratio=0.01", "topk:ratio=0.1",
       {"--optimizer=nesterov", "--lr=0.08", "--momentum=0.9"}},
      {"qsgd8", "qsgd:levels=127,bucket=512", "none",
       {"--optimizer=nesterov", "--lr=0.05", "--momentum=0.9"}},
      {"powersgd2", "powersgd:rank=2", "none",
       {"--optimizer=nesterov", "--lr=0.05", "--momentum=0.9"}},
      // EF-signSGD sends (|p|_1/d) sign(p), much smaller than g: plain SGD
      // with a large lr, as in Karimireddy et al.
      {"efsign", "efsign", "none", {"--optimizer=sgd", "--lr=0.7"}},
  };
  return *settings;
}

const CodecSetting* FindCodec(absl::string_view name) {
  for (const CodecSetting& setting : CodecSettings()) {
    if (name == setting.name) return &setting;
  }
  return nullptr;
}

struct Options {
  std::vector<const CodecSetting*> codecs;
  std::vector<std::string> techniques = {"none"};
  double link_gbps = 1;
  int workers = 4;
  int shards = 2;
  double target = 0.85;
  int max_epochs = 5;
  int eval_every = 20;
  int train_examples = 0;  // 0: all 60000
  bool stop_at_target = true;
  double run_timeout_s = 900;
  std::string server_binary;
  std::string worker_binary;
};

std::string ParseArgs(int argc, char** argv, Options* options, bool* help) {
  for (const char* name :
       {"none", "fp16", "topk", "topk_pull10", "qsgd8", "powersgd2", "efsign"}) {
    options->codecs.push_back(FindCodec(name));
  }
  for (int i = 0; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return "";
    }
    const size_t equals = arg.find('=');
    if (!absl::StartsWith(arg, "--") || equals == absl::string_view::npos) {
      return absl::StrCat("unknown argument '", arg, "' (flags are --name=value; see --help)");
    }
    const absl::string_view name = arg.substr(2, equals - 2);
    const absl::string_view value = arg.substr(equals + 1);
    if (name == "codecs") {
      options->codecs.clear();
      for (absl::string_view codec : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
        const CodecSetting* setting = FindCodec(codec);
        if (setting == nullptr) {
          std::vector<std::string> known;
          for (const CodecSetting& s : CodecSettings()) known.push_back(s.name);
          return absl::StrCat("--codecs: unknown codec '", codec, "' (",
                              absl::StrJoin(known, ", "), ")");
        }
        options->codecs.push_back(setting);
      }
      if (options->codecs.empty()) return "--codecs: empty list";
    } else if (name == "techniques") {
      options->techniques = absl::StrSplit(value, ',', absl::SkipWhitespace());
      if (options->techniques.empty()) return "--techniques: empty list";
    } else if (name == "link_gbps" || name == "target" || name == "run_timeout_s") {
      double number = 0;
      if (!absl::SimpleAtod(value, &number) || !(number >= 0)) {
        return absl::StrCat("bad --", name, "='", value, "'");
      }
      if (name == "link_gbps") options->link_gbps = number;
      if (name == "target") {
        if (!(number > 0 && number <= 1)) return "--target must be in (0, 1]";
        options->target = number;
      }
      if (name == "run_timeout_s") {
        if (!(number > 0)) return "--run_timeout_s must be > 0";
        options->run_timeout_s = number;
      }
    } else if (name == "train_examples") {
      if (!absl::SimpleAtoi(value, &options->train_examples) || options->train_examples < 0) {
        return absl::StrCat("bad --train_examples='", value, "'");
      }
    } else if (name == "workers" || name == "shards" || name == "max_epochs" ||
               name == "eval_every") {
      int number = 0;
      if (!absl::SimpleAtoi(value, &number) || number < 1) {
        return absl::StrCat("bad --", name, "='", value, "' (a positive integer)");
      }
      if (name == "workers") options->workers = number;
      if (name == "shards") options->shards = number;
      if (name == "max_epochs") options->max_epochs = number;
      if (name == "eval_every") options->eval_every = number;
    } else if (name == "stop_at_target") {
      if (value != "true" && value != "false") return "--stop_at_target must be true or false";
      options->stop_at_target = value == "true";
    } else if (name == "server_binary") {
      options->server_binary = std::string(value);
    } else if (name == "worker_binary") {
      options->worker_binary = std::string(value);
    } else {
      return absl::StrCat("unknown flag --", name, " (see --help)");
    }
  }
  return "";
}

absl::StatusOr<std::string> FindWorkerBinary(const std::string& flag_value) {
  if (!flag_value.empty()) {
    if (access(flag_value.c_str(), X_OK) == 0) return flag_value;
    return absl::NotFoundError(
        absl::StrCat("--worker_binary=", flag_value, " is not an executable file"));
  }
  // harrier-worker sits beside harrier-server in every layout
  // FindServerBinary knows (runfiles, bazel-bin).
  auto server = FindServerBinary("");
  if (!server.ok()) return server.status();
  const std::string root = server->substr(0, server->rfind("/server/"));
  const std::string worker = absl::StrCat(root, "/worker/harrier-worker");
  if (access(worker.c_str(), X_OK) == 0) return worker;
  return absl::NotFoundError(absl::StrCat("harrier-worker not found at ", worker,
                                          "; build //worker:harrier-worker or pass "
                                          "--worker_binary=PATH"));
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

std::string Tail(const std::string& path, size_t max_chars) {
  std::string text = ReadFile(path);
  if (text.size() > max_chars) text = text.substr(text.size() - max_chars);
  return text;
}

using netem::HostProcess;

struct EvalPoint {
  int64_t step = 0;
  double accuracy = 0;
  double wall_s = 0;
};

// Rank 0's `eval step=N accuracy=A wall_s=W` lines (worker/trainer.cc),
// complete lines only.
std::vector<EvalPoint> ParseEvalLines(const std::string& log) {
  std::vector<EvalPoint> points;
  size_t start = 0;
  while (true) {
    const size_t end = log.find('\n', start);
    if (end == std::string::npos) break;
    const absl::string_view line(log.data() + start, end - start);
    start = end + 1;
    if (!absl::StartsWith(line, "eval step=")) continue;
    EvalPoint point;
    bool ok = true;
    for (absl::string_view field : absl::StrSplit(line.substr(5), ' ')) {
      const size_t eq = field.find('=');
      if (eq == absl::string_view::npos) continue;
      const absl::string_view key = field.substr(0, eq);
      const absl::string_view value = field.substr(eq + 1);
      if (key == "step") ok &= absl::SimpleAtoi(value, &point.step);
      if (key == "accuracy") ok &= absl::SimpleAtod(value, &point.accuracy);
      if (key == "wall_s") ok &= absl::SimpleAtod(value, &point.wall_s);
    }
    if (ok) points.push_back(point);
  }
  return points;
}

// A numeric field of a flat JSON line, or nullopt.
std::optional<double> JsonNumber(absl::string_view line, absl::string_view key) {
  const std::string quoted = absl::StrCat("\"", key, "\":");
  const size_t at = line.find(quoted);
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = line.substr(at + quoted.size());
  rest = rest.substr(0, rest.find_first_of(",}"));
  double value = 0;
  if (!absl::SimpleAtod(rest, &value)) return std::nullopt;
  return value;
}

struct RunResult {
  double time_to_target_s = -1;
  double final_accuracy = -1;
  int64_t steps = 0;
  double wall_s = 0;
  double bytes_up_per_step = -1;  // -1: rank 0's metrics had no complete line
  double bytes_down_per_step = -1;
};

// Rank 0's per-step traffic from the last complete line of its
// --metrics_out (cumulative bytes_pushed / bytes_pulled at that step).
void ReadTraffic(const std::string& metrics_path, RunResult* result) {
  const std::string text = ReadFile(metrics_path);
  const size_t end = text.rfind('\n');
  if (end == std::string::npos) return;
  const size_t begin = text.rfind('\n', end - 1);
  const absl::string_view line =
      absl::string_view(text).substr(begin == std::string::npos ? 0 : begin + 1,
                                     end - (begin == std::string::npos ? 0 : begin + 1));
  const auto step = JsonNumber(line, "step");
  const auto pushed = JsonNumber(line, "bytes_pushed");
  const auto pulled = JsonNumber(line, "bytes_pulled");
  if (!step || !pushed || !pulled || *step <= 0) return;
  result->bytes_up_per_step = *pushed / *step;
  result->bytes_down_per_step = *pulled / *step;
}

class TtaRunner {
 public:
  TtaRunner(const Options& options, const EmulatedNetwork& network, std::string server_binary,
            std::string worker_binary, std::string dir)
      : options_(options),
        network_(network),
        server_binary_(std::move(server_binary)),
        worker_binary_(std::move(worker_binary)),
        dir_(std::move(dir)) {}

  // Hosts 0..shards-1 run the shards, the next `workers` hosts the workers.
  absl::StatusOr<RunResult> Run(const CodecSetting& codec, const std::string& techniques,
                                int run_index) {
    const std::string tag = absl::StrCat(dir_, "/run", run_index);
    std::vector<std::unique_ptr<HostProcess>> shards;
    std::vector<std::string> addresses;
    for (int shard = 0; shard < options_.shards; ++shard) {
      const std::string port_file = absl::StrCat(tag, "_shard", shard, ".port");
      std::remove(port_file.c_str());
      std::vector<std::string> args = {server_binary_,
                                       "--host=" + network_.host_address(shard),
                                       "--port=0",
                                       "--port_file=" + port_file,
                                       absl::StrCat("--shard=", shard),
                                       absl::StrCat("--num_shards=", options_.shards),
                                       absl::StrCat("--num_workers=", options_.workers),
                                       "--sync=bsp",
                                       // Stopped by the bench once its run is measured.
                                       "--exit_when_done=false"};
      args.insert(args.end(), codec.server_flags.begin(), codec.server_flags.end());
      const std::string log = absl::StrCat(tag, "_shard", shard, ".log");
      auto process = HostProcess::Start(absl::StrCat("harrier-server shard ", shard),
                                        network_.host_namespace_path(shard), args, "/dev/null",
                                        log);
      if (!process.ok()) return process.status();
      shards.push_back(std::move(*process));
      auto port = WaitForPort(port_file, *shards.back(), log, absl::Seconds(20));
      if (!port.ok()) return port.status();
      addresses.push_back(absl::StrCat(network_.host_address(shard), ":", *port));
    }

    std::vector<std::unique_ptr<HostProcess>> workers;
    const std::string rank0_err = absl::StrCat(tag, "_worker0.log");
    const std::string rank0_out = absl::StrCat(tag, "_worker0.out");
    const std::string metrics = absl::StrCat(tag, "_worker0.jsonl");
    const absl::Time start = absl::Now();
    for (int rank = 0; rank < options_.workers; ++rank) {
      std::vector<std::string> args = {
          worker_binary_,
          "--servers=" + absl::StrJoin(addresses, ","),
          absl::StrCat("--rank=", rank),
          absl::StrCat("--num_workers=", options_.workers),
          absl::StrCat("--epochs=", options_.max_epochs),
          absl::StrCat("--codec=", codec.codec),
          absl::StrCat("--pull_codec=", codec.pull_codec),
          absl::StrCat("--eval_every=", options_.eval_every),
          absl::StrCat("--target_accuracy=", options_.target),
          "--log_every=100",
          "--rpc_timeout_s=120"};
      if (techniques != "none") args.push_back("--techniques=" + techniques);
      if (options_.train_examples > 0) {
        args.push_back(absl::StrCat("--train_examples=", options_.train_examples));
      }
      if (rank == 0) args.push_back("--metrics_out=" + metrics);
      auto process = HostProcess::Start(
          absl::StrCat("harrier-worker rank ", rank),
          network_.host_namespace_path(options_.shards + rank), args,
          rank == 0 ? rank0_out : "/dev/null",
          rank == 0 ? rank0_err : absl::StrCat(tag, "_worker", rank, ".log"));
      if (!process.ok()) return process.status();
      workers.push_back(std::move(*process));
    }

    // Until every worker has ended, or rank 0 has evaluated at the target
    // (with --stop_at_target), or the run's deadline.
    RunResult result;
    const absl::Time deadline = start + absl::Seconds(options_.run_timeout_s);
    std::vector<EvalPoint> points;
    while (true) {
      points = ParseEvalLines(ReadFile(rank0_err));
      for (const EvalPoint& point : points) {
        if (point.accuracy >= options_.target) {
          result.time_to_target_s = point.wall_s;
          break;
        }
      }
      if (options_.stop_at_target && result.time_to_target_s >= 0) break;
      int ended = 0;
      for (int rank = 0; rank < options_.workers; ++rank) {
        const auto code = workers[rank]->Poll();
        if (!code.has_value()) continue;
        if (*code != 0) {
          return absl::InternalError(absl::StrCat(
              "harrier-worker rank ", rank, " exited with status ", *code, ": ",
              Tail(absl::StrCat(tag, "_worker", rank, ".log"), 600)));
        }
        ++ended;
      }
      if (ended == options_.workers) break;
      for (int shard = 0; shard < options_.shards; ++shard) {
        if (auto code = shards[shard]->Poll(); code.has_value()) {
          return absl::InternalError(
              absl::StrCat("harrier-server shard ", shard, " exited with status ", *code,
                           " during training: ", Tail(absl::StrCat(tag, "_shard", shard, ".log"),
                                                      600)));
        }
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "run did not end within --run_timeout_s=", options_.run_timeout_s, "; rank 0: ",
            Tail(rank0_err, 400)));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    result.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
    for (auto& worker : workers) worker->Stop();
    for (auto& shard : shards) shard->Stop();
    if (!points.empty()) {
      result.final_accuracy = points.back().accuracy;
      result.steps = points.back().step;
    }
    ReadTraffic(metrics, &result);
    if (!options_.stop_at_target) {
      // The worker's own line must agree with what the eval lines say.
      const std::string out = ReadFile(rank0_out);
      const size_t at = out.find("time_to_accuracy_s=");
      double reported = 0;
      if (at == std::string::npos ||
          !absl::SimpleAtod(out.substr(at + 19, out.find('\n', at) - at - 19), &reported) ||
          std::fabs(reported - result.time_to_target_s) > 0.002) {
        return absl::InternalError(absl::StrCat(
            "rank 0's time_to_accuracy_s line disagrees with its eval lines (",
            result.time_to_target_s, "): ", out));
      }
    }
    return result;
  }

 private:
  static absl::StatusOr<int> WaitForPort(const std::string& port_file, HostProcess& process,
                                         const std::string& log, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::ifstream file(port_file);
      int port = 0;
      if (file >> port && port > 0) return port;
      if (auto code = process.Poll(); code.has_value()) {
        return absl::InternalError(absl::StrCat("harrier-server exited with status ", *code,
                                                " before serving: ", Tail(log, 600)));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("harrier-server did not write ", port_file, " within ",
                     absl::FormatDuration(timeout)));
  }

  const Options& options_;
  const EmulatedNetwork& network_;
  const std::string server_binary_;
  const std::string worker_binary_;
  const std::string dir_;
};

// Flat JSON of numbers and strings only (unknown: -1).
std::string JsonDouble(double value) {
  if (!std::isfinite(value)) return "-1";
  return absl::StrFormat("%.4f", value);
}

}  // namespace

int RunTtaBench(int argc, char** argv) {
  Options options;
  bool help = false;
  if (const std::string error = ParseArgs(argc, argv, &options, &help); !error.empty()) {
    std::fprintf(stderr, "harrier-bench tta: %s\n", error.c_str());
    return 2;
  }
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto server_binary = PrepareServerBench("tta", options.server_binary);
  if (!server_binary.ok()) return 1;
  auto worker_binary = FindWorkerBinary(options.worker_binary);
  if (!worker_binary.ok()) {
    std::fprintf(stderr, "harrier-bench tta: %s\n",
                 std::string(worker_binary.status().message()).c_str());
    return 1;
  }

  EmulatedNetworkOptions network_options;
  network_options.prefix = "htta";
  network_options.num_hosts = options.shards + options.workers;
  network_options.rate_gbps = options.link_gbps;
  network_options.model = LinkModel::kPerHost;
  auto network = EmulatedNetwork::Create(network_options);
  if (!network.ok()) {
    std::fprintf(stderr, "harrier-bench tta: cannot build the emulated network: %s\n",
                 std::string(network.status().message()).c_str());
    return 1;
  }
  // The rate one raw TCP stream reaches from a worker's host to shard 0's,
  // through both links and the bridge, as the training traffic goes:
  // about half a second of traffic at the set rate.
  const int64_t probe_bytes =
      options.link_gbps > 0
          ? std::max<int64_t>(8 << 20, static_cast<int64_t>(options.link_gbps * 0.5e9 / 8))
          : int64_t{256} << 20;
  auto measured = (*network)->MeasureTcpGbps(options.shards, 0, probe_bytes);
  if (!measured.ok()) {
    std::fprintf(stderr, "harrier-bench tta: measuring the link failed: %s\n",
                 std::string(measured.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "tta: %d hosts, links of %.3g Gbit/s, one TCP stream measured %.3f Gbit/s\n",
               network_options.num_hosts, options.link_gbps, *measured);

  std::string dir = "/tmp/harrier-tta-XXXXXX";
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
    dir = absl::StrCat(tmp, "/harrier-tta-XXXXXX");
  }
  if (mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "harrier-bench tta: cannot create a temporary directory %s\n",
                 dir.c_str());
    return 1;
  }
  std::fprintf(stderr, "tta: logs in %s\n", dir.c_str());

  TtaRunner runner(options, **network, *server_binary, *worker_binary, dir);
  int failures = 0;
  int run_index = 0;
  for (const std::string& techniques : options.techniques) {
    std::optional<double> dense_time;
    for (const CodecSetting* codec : options.codecs) {
      std::fprintf(stderr, "tta: codec %s (push %s, pull %s), techniques %s\n", codec->name,
                   codec->codec, codec->pull_codec, techniques.c_str());
      auto result = runner.Run(*codec, techniques, run_index++);
      if (!result.ok()) {
        std::fprintf(stderr, "harrier-bench tta: codec %s techniques %s: %s\n", codec->name,
                     techniques.c_str(), std::string(result.status().message()).c_str());
        ++failures;
        continue;
      }
      const bool reached = result->time_to_target_s >= 0;
      if (std::string(codec->name) == "none" && reached) dense_time = result->time_to_target_s;
      std::string speedup = "-1";
      if (dense_time.has_value() && reached && result->time_to_target_s > 0) {
        speedup = JsonDouble(*dense_time / result->time_to_target_s);
      }
      std::printf(
          "{\"bench\":\"tta\",\"codec\":\"%s\",\"codec_spec\":\"%s\",\"pull_codec\":\"%s\","
          "\"techniques\":\"%s\",\"link_gbps\":%s,\"link_measured_gbps\":%s,\"workers\":%d,"
          "\"shards\":%d,\"target_accuracy\":%s,\"time_to_target_s\":%s,"
          "\"speedup_vs_none\":%s,\"final_accuracy\":%s,\"steps\":%lld,\"eval_every\":%d,"
          "\"wall_s\":%s,\"bytes_up_per_step\":%.0f,\"bytes_down_per_step\":%.0f}\n",
          codec->name, codec->codec, codec->pull_codec, techniques.c_str(),
          JsonDouble(options.link_gbps).c_str(), JsonDouble(*measured).c_str(), options.workers,
          options.shards, JsonDouble(options.target).c_str(),
          JsonDouble(result->time_to_target_s).c_str(), speedup.c_str(),
          JsonDouble(result->final_accuracy).c_str(), static_cast<long long>(result->steps),
          options.eval_every, JsonDouble(result->wall_s).c_str(), result->bytes_up_per_step,
          result->bytes_down_per_step);
      std::fflush(stdout);
      std::fprintf(stderr,
                   "tta: %-14s %-8s time to %.2f: %8.2f s  final %.4f  %lld steps  job %.1f s  "
                   "up %.0f B/step  down %.0f B/step\n",
                   codec->name, techniques.c_str(), options.target, result->time_to_target_s,
                   result->final_accuracy, static_cast<long long>(result->steps), result->wall_s,
                   result->bytes_up_per_step, result->bytes_down_per_step);
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace harrier::bench
