#ifndef HARRIER_TESTING_SERVER_PROCESS_H_
#define HARRIER_TESTING_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace harrier::testing {

// Path of a file in the test's runfiles, e.g. "server/harrier-server".
std::string RunfilePath(const std::string& relative);

// A scratch directory for this test (Bazel's TEST_TMPDIR, else /tmp).
std::string TempDir();

// A child process started with fork/exec. The destructor kills it with
// SIGKILL if it still runs, so a failing test leaves nothing behind.
class ChildProcess {
 public:
  // `output_path`: the child's stdout and stderr are appended to this file
  // ("" keeps the test's own).
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::string& binary,
                                                             const std::vector<std::string>& args,
                                                             const std::string& output_path = "");
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  void Signal(int signal_number);
  // Exit status (or 128 + signal) once the process ended; waits at most
  // `timeout_ms`, returning -1 if it is still running then.
  int WaitForExit(int timeout_ms);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
};

// A real harrier-server on 127.0.0.1 with an ephemeral port.
class ServerProcess {
 public:
  // `flags` are passed as they are; --port_file is added, and --host
  // (127.0.0.1) and --port (0) unless `flags` set them. address() is on
  // 127.0.0.1 whatever --host says (0.0.0.0 serves it too).
  // `output_path` as for ChildProcess::Start.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::vector<std::string>& flags,
                                                              const std::string& output_path = "");

  int port() const { return port_; }
  std::string address() const;
  ChildProcess& process() { return *process_; }

 private:
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
};

// Starts `num_shards` servers for one job and returns them, shard 0 first.
absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartCluster(
    int num_shards, int num_workers, const std::vector<std::string>& extra_flags);

// A TCP port that was free a moment ago, below the kernel's ephemeral range
// (so no outgoing connection takes it before the caller binds it).
int FreePort();

// The whole HTTP/1.1 response to GET `path` on 127.0.0.1:`port` ("" if none).
std::string HttpGet(int port, const std::string& path);

// The value of a series in the /metrics exposition on `metrics_port`
// (-1: absent).
double MetricValue(int metrics_port, const std::string& name);

std::vector<std::string> Addresses(const std::vector<std::unique_ptr<ServerProcess>>& servers);

}  // namespace harrier::testing

#endif  // HARRIER_TESTING_SERVER_PROCESS_H_
