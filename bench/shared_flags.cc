#include "bench/shared_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, sizes, "",
          "transport, load: tensor sizes in bytes (K/M/G binary); codec: element counts "
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

ABSL_FLAG(std::string, transport, "grpc",
          "grpc or ucx (servers get --ucx; UCX_TLS picks UCX's transports)");
ABSL_FLAG(bool, quick, false, "a small fast subset (smoke tests); explicit flags override it");
ABSL_FLAG(std::string, server_binary, "", "harrier-server to start (default: from runfiles)");
ABSL_FLAG(std::string, worker_binary, "", "harrier-worker to start (default: from runfiles)");
ABSL_FLAG(std::string, server_flags, "", "extra flags for every shard, space-separated");
ABSL_FLAG(std::string, worker_flags, "", "extra flags for every harrier-worker, space-separated");
ABSL_FLAG(int, eval_every, 20, "steps between rank 0's evaluations");
ABSL_FLAG(int, train_examples, 0, "train on the first N examples only (0: all 60000)");
