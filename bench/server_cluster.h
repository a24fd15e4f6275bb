// Real harrier-server processes on 127.0.0.1 for benchmarks. Unlike the
// test helper in tests/integration, this does not assume Bazel test
// runfiles: the caller names the binary (see FindServerBinary).

#ifndef HARRIER_BENCH_SERVER_CLUSTER_H_
#define HARRIER_BENCH_SERVER_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace harrier::bench {

// The harrier-server binary to start: `flag_value` if not empty, else the
// first executable of $RUNFILES_DIR/harrier/server/harrier-server,
// $TEST_SRCDIR/harrier/server/harrier-server,
// <this binary>.runfiles/harrier/server/harrier-server and
// <this binary's dir>/../../server/harrier-server (the bazel-bin layout).
// NOT_FOUND names every path tried.
absl::StatusOr<std::string> FindServerBinary(const std::string& flag_value);

// What every subcommand that starts servers does first: finds the binary
// (FindServerBinary) and tunes malloc as the servers do, without which every
// multi-megabyte buffer is unmapped and faulted in again. On error it prints
// "harrier-bench <subcommand>: <why>" to stderr and returns the status.
absl::StatusOr<std::string> PrepareServerBench(const char* subcommand,
                                               const std::string& flag_value);

// `num_shards` servers of one job, shard 0 first, each on an ephemeral
// port of 127.0.0.1 with its stderr in a log file of a private temporary
// directory. The destructor stops them (SIGTERM, then SIGKILL after a
// grace period) and removes the logs; a server also dies with the bench
// process (PR_SET_PDEATHSIG), so an interrupted run leaves nothing behind.
// Not thread-safe; create and destroy on one thread.
class ServerCluster {
 public:
  // `extra_flags` go to every shard; --host, --port, --port_file, --shard,
  // --num_shards and --num_workers are set here.
  static absl::StatusOr<std::unique_ptr<ServerCluster>> Start(
      const std::string& binary, int num_shards, int num_workers,
      const std::vector<std::string>& extra_flags);
  ~ServerCluster();
  ServerCluster(const ServerCluster&) = delete;
  ServerCluster& operator=(const ServerCluster&) = delete;

  // host:port of every shard, shard 0 first.
  const std::vector<std::string>& addresses() const { return addresses_; }
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  ServerCluster() = default;
  absl::Status StartShard(const std::string& binary, int shard, int num_shards, int num_workers,
                          const std::vector<std::string>& extra_flags);
  void StopAll();

  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<std::string> addresses_;
  std::vector<std::string> files_;
};

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_SERVER_CLUSTER_H_
