// What `harrier-bench tta` and `harrier-bench convergence` share: one
// training job of harrier-server shards and harrier-worker processes, each in
// its own namespace of an emulated network (//bench/netem), and the
// reading of what rank 0 leaves behind (its eval lines, its --metrics_out).

#ifndef HARRIER_BENCH_TRAINING_RUN_H_
#define HARRIER_BENCH_TRAINING_RUN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/netem/emulated_network.h"

namespace harrier::bench {

// One --codecs entry of `harrier-bench tta`: what the workers push and
// pull, and the server settings that train well with it
// (docs/experiments.md, chosen per codec from a few 5-epoch runs each).
struct CodecSetting {
  const char* name;
  const char* codec;
  const char* pull_codec;
  std::vector<std::string> server_flags;
};

// tta's codecs, in its default order.
const std::vector<CodecSetting>& CodecSettings();
// nullptr when `name` is not one of them.
const CodecSetting* FindCodec(absl::string_view name);

// The whole file ("" when it cannot be read), and its last max_chars.
std::string ReadFile(const std::string& path);
std::string Tail(const std::string& path, size_t max_chars);

// A numeric field of a flat JSON line, or nullopt.
std::optional<double> JsonNumber(absl::string_view line, absl::string_view key);

// One of rank 0's `eval step=N accuracy=A wall_s=W [loss=L]` lines
// (worker/trainer.cc). loss is -1 where the worker does not print it.
struct EvalPoint {
  int64_t step = 0;
  double accuracy = 0;
  double wall_s = 0;
  double loss = -1;
};
// Every complete eval line of a worker's stderr, in order.
std::vector<EvalPoint> ParseEvalLines(const std::string& log);

// Rank 0's cumulative traffic at a step: one complete line of its
// --metrics_out.
struct TrafficPoint {
  int64_t step = 0;
  double bytes_pushed = 0;
  double bytes_pulled = 0;
};
// Every complete line of a --metrics_out file that has the three fields.
std::vector<TrafficPoint> ReadTraffic(const std::string& metrics_path);

// harrier-worker: the flag's value if given, else beside harrier-server in
// every layout FindServerBinary knows (runfiles, bazel-bin).
absl::StatusOr<std::string> FindWorkerBinary(const std::string& flag_value);

// The rate one raw TCP stream reaches from the first worker's host (host
// `shards`) to shard 0's, through both links and the bridge, as the
// training traffic goes: about half a second of traffic at the set rate.
absl::StatusOr<double> MeasureWorkerLinkGbps(const EmulatedNetwork& network, int shards,
                                             double link_gbps);

// One training job. Hosts 0..shards-1 of the network run the shards, the
// next `workers` hosts the workers.
struct TrainingJob {
  int shards = 2;
  int workers = 4;
  // Beyond --host/--port/--port_file/--shard/--num_shards/--num_workers
  // (and --exit_when_done=false: the bench stops them): --sync=...,
  // optimizer settings.
  std::vector<std::string> server_flags;
  // Beyond --servers/--rank/--num_workers (and rank 0's --metrics_out):
  // every worker gets these.
  std::vector<std::string> worker_flags;
  // With stop_at_target, the job is stopped at rank 0's first eval line at
  // or above `target`; otherwise it runs until every worker has ended.
  double target = 1;
  bool stop_at_target = false;
  double timeout_s = 900;
};

struct TrainingOutcome {
  std::vector<EvalPoint> evals;  // rank 0's, once the job has ended
  double wall_s = 0;             // from starting the workers to the job's end
  std::string rank0_stdout;      // path of rank 0's stdout
  std::string metrics_path;      // rank 0's --metrics_out
  // CPU seconds (user + system) of each worker over its whole life, and of
  // each shard from its start to the job's end; -1 where unknown.
  std::vector<double> worker_cpu_s;
  std::vector<double> shard_cpu_s;
};

class TrainingRunner {
 public:
  TrainingRunner(const EmulatedNetwork& network, std::string server_binary,
                 std::string worker_binary)
      : network_(network),
        server_binary_(std::move(server_binary)),
        worker_binary_(std::move(worker_binary)) {}

  // Starts the shards (waiting for each to serve), then the workers, and
  // waits for the end (see TrainingJob). Logs go to `tag`_shardN.log,
  // `tag`_workerN.log (rank 0: also .out and .jsonl). A process that exits
  // non-zero, or the deadline, fails the run with the process's log quoted;
  // every process is stopped before it returns.
  absl::StatusOr<TrainingOutcome> Run(const TrainingJob& job, const std::string& tag) const;

 private:
  const EmulatedNetwork& network_;
  const std::string server_binary_;
  const std::string worker_binary_;
};

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_TRAINING_RUN_H_
