// The flags that more than one of harrier-bench's subcommands takes (see
// flags.h). The string flags whose help says "subcommand's default" are
// empty unless given; each subcommand reads them with FlagOr, its own
// default and its own syntax (its --help).

#ifndef HARRIER_BENCH_SHARED_FLAGS_H_
#define HARRIER_BENCH_SHARED_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"

// Empty unless given: each subcommand has its own default and syntax.
ABSL_DECLARE_FLAG(std::string, sizes);
ABSL_DECLARE_FLAG(std::string, shards);
ABSL_DECLARE_FLAG(std::string, workers);
ABSL_DECLARE_FLAG(std::string, ops);
ABSL_DECLARE_FLAG(std::string, chunk_bytes);
ABSL_DECLARE_FLAG(std::string, models);
ABSL_DECLARE_FLAG(std::string, techniques);
ABSL_DECLARE_FLAG(std::string, codecs);
ABSL_DECLARE_FLAG(std::string, run_timeout_s);

// The same default and meaning in every subcommand that takes them.
ABSL_DECLARE_FLAG(std::string, transport);
ABSL_DECLARE_FLAG(bool, quick);
ABSL_DECLARE_FLAG(std::string, server_binary);
ABSL_DECLARE_FLAG(std::string, worker_binary);
ABSL_DECLARE_FLAG(std::string, server_flags);
ABSL_DECLARE_FLAG(std::string, sync);
ABSL_DECLARE_FLAG(std::string, worker_flags);
ABSL_DECLARE_FLAG(int, eval_every);
ABSL_DECLARE_FLAG(int, train_examples);
ABSL_DECLARE_FLAG(double, min_time);

namespace harrier::bench {

// The flags of the training jobs that tta and convergence run, with the
// defaults both use.
struct JobFlags {
  int workers = 4;
  int shards = 2;
  int eval_every = 20;
  int train_examples = 0;  // 0: all 60000
  double run_timeout_s = 900;
  std::string server_binary;  // empty: from runfiles
  std::string worker_binary;  // empty: from runfiles
};

// Reads --workers, --shards, --eval_every, --train_examples,
// --run_timeout_s, --server_binary and --worker_binary into *job. Returns
// "" or the usage error.
std::string ReadJobFlags(JobFlags* job);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_SHARED_FLAGS_H_
