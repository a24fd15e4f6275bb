#ifndef HARRIER_BENCH_NETEM_HOST_PROCESS_H_
#define HARRIER_BENCH_NETEM_HOST_PROCESS_H_

// A process started inside one emulated host's network namespace, for the
// benches that run shards and workers on emulated links (overlap, tta).

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace harrier::netem {

// The last `max_chars` of a file, trailing whitespace stripped ("" if it
// cannot be read): what a failure quotes of a process's log.
std::string TailOfFile(const std::string& path, size_t max_chars = 800);

// It dies with the bench (PR_SET_PDEATHSIG, set before setns and exec,
// which keep it) and the destructor stops it if still running.
class HostProcess {
 public:
  // Forks, joins the network namespace at `namespace_path` (a file under
  // /var/run/netns) and execs args[0] with stdout and stderr to the files.
  static absl::StatusOr<std::unique_ptr<HostProcess>> Start(const std::string& label,
                                                            const std::string& namespace_path,
                                                            std::vector<std::string> args,
                                                            const std::string& stdout_path,
                                                            const std::string& stderr_path);
  ~HostProcess();
  HostProcess(const HostProcess&) = delete;
  HostProcess& operator=(const HostProcess&) = delete;

  // Non-blocking: the exit code once it ended (128 + signal when killed).
  std::optional<int> Poll();
  // SIGTERM, then SIGKILL after `grace`; returns within grace + 5 s.
  void Stop(absl::Duration grace = absl::Seconds(2));
  // "<label> ended with exit N (why); its stderr: ..." once it ended.
  std::string Describe() const;
  // User + system CPU of all its threads so far, in clock ticks (10 ms)
  // while it runs; once it ended and was reaped (Poll, Stop), its whole
  // CPU from the kernel's account (wait4); -1 when it cannot be read.
  double CpuSeconds() const;

  const std::string& label() const { return label_; }
  const std::string& stdout_path() const { return stdout_path_; }
  const std::string& stderr_path() const { return stderr_path_; }

 private:
  HostProcess() = default;
  bool WaitFor(absl::Duration timeout);

  std::string label_;
  std::string stdout_path_;
  std::string stderr_path_;
  pid_t pid_ = -1;
  int wait_status_ = 0;
  std::optional<int> exit_code_;
  double cpu_at_exit_ = -1;
};

}  // namespace harrier::netem

#endif  // HARRIER_BENCH_NETEM_HOST_PROCESS_H_
