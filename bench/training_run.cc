#include "bench/training_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/netem/host_process.h"
#include "bench/server_cluster.h"
#include "common/codec/survey_codecs.h"
#include "common/json.h"

namespace harrier::bench {

const std::vector<CodecSetting>& CodecSettings() {
  // The training settings are the survey table's (common/codec/
  // survey_codecs.h), so tta and the convergence grid train a codec alike.
  const auto trained = [](const char* survey_name) {
    return FindSurveyCodec(survey_name)->server_flags;
  };
  static const auto* settings = new std::vector<CodecSetting>{
      {"none", "none", "none", trained("none")},
      {"fp16", "fp16", "none", trained("fp16")},
      // Pulls: dense for topk, since on this machine the top-k 10 % pulls
      // cost more extra steps than they saved time per step (README.md,
      // "tta"); topk_pull10 is the other choice, measured beside it.
      {"topk", "topk:ratio=0.01", "none", trained("topk")},
      {"topk_pull10", "topk:ratio=0.01", "topk:ratio=0.1", trained("topk")},
      {"qsgd8", "qsgd:levels=127,bucket=512", "none", trained("qsgd8")},
      {"powersgd2", "powersgd:rank=2", "none", trained("powersgd2")},
      {"efsign", "efsign", "none", trained("efsign")},
  };
  return *settings;
}

const CodecSetting* FindCodec(absl::string_view name) {
  for (const CodecSetting& setting : CodecSettings()) {
    if (name == setting.name) return &setting;
  }
  return nullptr;
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

std::optional<double> JsonNumber(absl::string_view line, absl::string_view key) {
  const Json json = ParseJson(line);
  if (!json.is_object()) return std::nullopt;
  const auto it = json.find(std::string(key));
  if (it == json.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

namespace {

// The complete lines of `text` (a line still being written has no '\n').
std::vector<absl::string_view> CompleteLines(const std::string& text) {
  std::vector<absl::string_view> lines;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) break;
    lines.emplace_back(text.data() + start, end - start);
    start = end + 1;
  }
  return lines;
}

absl::StatusOr<int> WaitForPort(const std::string& port_file, netem::HostProcess& process,
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
  return absl::DeadlineExceededError(absl::StrCat("harrier-server did not write ", port_file,
                                                  " within ", absl::FormatDuration(timeout)));
}

}  // namespace

std::vector<EvalPoint> ParseEvalLines(const std::string& log) {
  std::vector<EvalPoint> points;
  for (const absl::string_view line : CompleteLines(log)) {
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
      if (key == "loss") ok &= absl::SimpleAtod(value, &point.loss);
    }
    if (ok) points.push_back(point);
  }
  return points;
}

std::vector<TrafficPoint> ReadTraffic(const std::string& metrics_path) {
  std::vector<TrafficPoint> points;
  const std::string text = ReadFile(metrics_path);
  for (const absl::string_view line : CompleteLines(text)) {
    const auto step = JsonNumber(line, "step");
    const auto pushed = JsonNumber(line, "bytes_pushed");
    const auto pulled = JsonNumber(line, "bytes_pulled");
    if (!step || !pushed || !pulled) continue;
    points.push_back({static_cast<int64_t>(*step), *pushed, *pulled});
  }
  return points;
}

absl::StatusOr<std::string> FindWorkerBinary(const std::string& flag_value) {
  if (!flag_value.empty()) {
    if (access(flag_value.c_str(), X_OK) == 0) return flag_value;
    return absl::NotFoundError(
        absl::StrCat("--worker_binary=", flag_value, " is not an executable file"));
  }
  auto server = FindServerBinary("");
  if (!server.ok()) return server.status();
  const std::string root = server->substr(0, server->rfind("/server/"));
  const std::string worker = absl::StrCat(root, "/worker/harrier-worker");
  if (access(worker.c_str(), X_OK) == 0) return worker;
  return absl::NotFoundError(absl::StrCat("harrier-worker not found at ", worker,
                                          "; build //worker:harrier-worker or pass "
                                          "--worker_binary=PATH"));
}

absl::StatusOr<double> MeasureWorkerLinkGbps(const EmulatedNetwork& network, int shards,
                                             double link_gbps) {
  const int64_t probe_bytes =
      link_gbps > 0 ? std::max<int64_t>(8 << 20, static_cast<int64_t>(link_gbps * 0.5e9 / 8))
                    : int64_t{256} << 20;
  return network.MeasureTcpGbps(shards, 0, probe_bytes);
}

absl::StatusOr<TrainingOutcome> TrainingRunner::Run(const TrainingJob& job,
                                                    const std::string& tag) const {
  using netem::HostProcess;
  std::vector<std::unique_ptr<HostProcess>> shards;
  std::vector<std::string> addresses;
  for (int shard = 0; shard < job.shards; ++shard) {
    const std::string port_file = absl::StrCat(tag, "_shard", shard, ".port");
    std::remove(port_file.c_str());
    std::vector<std::string> args = {
        server_binary_, "--host=" + network_.host_address(shard), "--port=0",
        "--port_file=" + port_file, absl::StrCat("--shard=", shard),
        absl::StrCat("--num_shards=", job.shards), absl::StrCat("--num_workers=", job.workers),
        // Stopped by the bench once its run is measured.
        "--exit_when_done=false"};
    args.insert(args.end(), job.server_flags.begin(), job.server_flags.end());
    const std::string log = absl::StrCat(tag, "_shard", shard, ".log");
    auto process = HostProcess::Start(absl::StrCat("harrier-server shard ", shard),
                                      network_.host_namespace_path(shard), args, "/dev/null", log);
    if (!process.ok()) return process.status();
    shards.push_back(std::move(*process));
    auto port = WaitForPort(port_file, *shards.back(), log, absl::Seconds(20));
    if (!port.ok()) return port.status();
    addresses.push_back(absl::StrCat(network_.host_address(shard), ":", *port));
  }

  TrainingOutcome outcome;
  std::vector<std::unique_ptr<HostProcess>> workers;
  const std::string rank0_err = absl::StrCat(tag, "_worker0.log");
  outcome.rank0_stdout = absl::StrCat(tag, "_worker0.out");
  outcome.metrics_path = absl::StrCat(tag, "_worker0.jsonl");
  const absl::Time start = absl::Now();
  for (int rank = 0; rank < job.workers; ++rank) {
    std::vector<std::string> args = {worker_binary_, "--servers=" + absl::StrJoin(addresses, ","),
                                     absl::StrCat("--rank=", rank),
                                     absl::StrCat("--num_workers=", job.workers)};
    args.insert(args.end(), job.worker_flags.begin(), job.worker_flags.end());
    if (rank == 0) args.push_back("--metrics_out=" + outcome.metrics_path);
    auto process = HostProcess::Start(
        absl::StrCat("harrier-worker rank ", rank), network_.host_namespace_path(job.shards + rank),
        args, rank == 0 ? outcome.rank0_stdout : "/dev/null",
        rank == 0 ? rank0_err : absl::StrCat(tag, "_worker", rank, ".log"));
    if (!process.ok()) return process.status();
    workers.push_back(std::move(*process));
  }

  // Until every worker has ended, or rank 0 has evaluated at the target
  // (with stop_at_target), or the run's deadline.
  const absl::Time deadline = start + absl::Seconds(job.timeout_s);
  bool all_ended = false;
  while (true) {
    // Stopped at the target, the job's result is what rank 0 had printed
    // by then.
    outcome.evals = ParseEvalLines(ReadFile(rank0_err));
    if (job.stop_at_target &&
        std::any_of(outcome.evals.begin(), outcome.evals.end(),
                    [&](const EvalPoint& point) { return point.accuracy >= job.target; })) {
      break;
    }
    int ended = 0;
    for (int rank = 0; rank < job.workers; ++rank) {
      const auto code = workers[rank]->Poll();
      if (!code.has_value()) continue;
      if (*code != 0) {
        return absl::InternalError(
            absl::StrCat("harrier-worker rank ", rank, " exited with status ", *code, ": ",
                         Tail(absl::StrCat(tag, "_worker", rank, ".log"), 600)));
      }
      ++ended;
    }
    if (ended == job.workers) {
      all_ended = true;
      break;
    }
    for (int shard = 0; shard < job.shards; ++shard) {
      if (auto code = shards[shard]->Poll(); code.has_value()) {
        return absl::InternalError(absl::StrCat(
            "harrier-server shard ", shard, " exited with status ", *code,
            " during training: ", Tail(absl::StrCat(tag, "_shard", shard, ".log"), 600)));
      }
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("run did not end within --run_timeout_s=", job.timeout_s,
                       "; rank 0: ", Tail(rank0_err, 400)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  outcome.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  for (auto& shard : shards) outcome.shard_cpu_s.push_back(shard->CpuSeconds());
  for (auto& worker : workers) {
    worker->Stop();
    outcome.worker_cpu_s.push_back(worker->CpuSeconds());  // reaped: its whole CPU
  }
  for (auto& shard : shards) shard->Stop();
  // Rank 0 may have printed its last line after the parse above.
  if (all_ended) outcome.evals = ParseEvalLines(ReadFile(rank0_err));
  return outcome;
}

}  // namespace harrier::bench
