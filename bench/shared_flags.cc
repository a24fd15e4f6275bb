#include "bench/shared_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/flags.h"

ABSL_FLAG(std::string, sizes, "",
          "transport, load, crc: sizes in bytes (K/M/G binary); codec: element counts "
          "(the subcommand's default when empty)");
ABSL_FLAG(std::string, shards, "",
          "server shards: a list in transport, one count elsewhere (the subcommand's default "
          "when empty)");
ABSL_FLAG(std::string, workers, "",
          "workers: a list in transport, one count elsewhere (the subcommand's default when "
          "empty)");
ABSL_FLAG(std::string, ops, "",
          "transport: operations to measure; load: the op mix (the subcommand's default when "
          "empty)");
ABSL_FLAG(std::string, chunk_bytes, "",
          "ClientOptions::chunk_bytes (the subcommand's default when empty)");
ABSL_FLAG(std::string, models, "", "models to run (the subcommand's default when empty)");
ABSL_FLAG(std::string, techniques, "",
          "comm scheduler technique sets, one run each (the subcommand's default when empty)");
ABSL_FLAG(std::string, codecs, "",
          "codec: codec specs separated by ';'; tta, convergence: codec names separated by ',' "
          "(the subcommand's default when empty)");
ABSL_FLAG(std::string, run_timeout_s, "",
          "deadline of one run in seconds (the subcommand's default when empty)");

ABSL_FLAG(std::string, transport, "tcp",
          "tcp (the workers' default data path without TLS), grpc or ucx (servers get --tcp or "
          "--ucx; UCX_TLS picks UCX's transports)");
ABSL_FLAG(bool, quick, false, "a small fast subset (smoke tests); explicit flags override it");
ABSL_FLAG(std::string, server_binary, "", "harrier-server to start (default: from runfiles)");
ABSL_FLAG(std::string, worker_binary, "", "harrier-worker to start (default: from runfiles)");
ABSL_FLAG(std::string, server_flags, "", "extra flags for every shard, space-separated");
ABSL_FLAG(std::string, sync, "",
          "load: sync modes, one server cluster and JSON line each (default asp,bsp); overlap: "
          "the shards' consistency model, bsp (default), ssp<N> (staleness N, e.g. ssp2) or asp");
ABSL_FLAG(std::string, worker_flags, "", "extra flags for every harrier-worker, space-separated");
ABSL_FLAG(int, eval_every, 20, "steps between rank 0's evaluations");
ABSL_FLAG(int, train_examples, 0, "train on the first N examples only (0: all 60000)");

ABSL_FLAG(double, min_time, 0.2, "codec, crc: seconds of repetitions per measurement");

namespace harrier::bench {

std::string ReadJobFlags(JobFlags* job) {
  const JobFlags defaults;
  for (const std::string& error :
       {NumberFlagOr(FLAGS_workers, "workers", defaults.workers, 1, &job->workers),
        NumberFlagOr(FLAGS_shards, "shards", defaults.shards, 1, &job->shards),
        NumberFlagOr(FLAGS_run_timeout_s, "run_timeout_s", defaults.run_timeout_s, 0.0,
                     &job->run_timeout_s)}) {
    if (!error.empty()) return error;
  }
  if (!(job->run_timeout_s > 0)) return "bad --run_timeout_s (seconds > 0)";
  job->eval_every = absl::GetFlag(FLAGS_eval_every);
  if (job->eval_every < 1) return "bad --eval_every (a positive integer)";
  job->train_examples = absl::GetFlag(FLAGS_train_examples);
  if (job->train_examples < 0) {
    return absl::StrCat("bad --train_examples='", job->train_examples, "' (0: all)");
  }
  job->server_binary = absl::GetFlag(FLAGS_server_binary);
  job->worker_binary = absl::GetFlag(FLAGS_worker_binary);
  return "";
}

}  // namespace harrier::bench
