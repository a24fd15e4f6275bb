#include "bench/netem/host_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cpu_time.h"

namespace harrier::netem {

std::string TailOfFile(const std::string& path, size_t max_chars) {
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  std::string text = contents.str();
  if (text.size() > max_chars) text = "..." + text.substr(text.size() - max_chars);
  return std::string(absl::StripTrailingAsciiWhitespace(text));
}

absl::StatusOr<std::unique_ptr<HostProcess>> HostProcess::Start(const std::string& label,
                                                                const std::string& namespace_path,
                                                                std::vector<std::string> args,
                                                                const std::string& stdout_path,
                                                                const std::string& stderr_path) {
  if (args.empty()) return absl::InvalidArgumentError(absl::StrCat(label, ": no command"));
  auto process = std::unique_ptr<HostProcess>(new HostProcess());
  process->label_ = label;
  process->stdout_path_ = stdout_path;
  process->stderr_path_ = stderr_path;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // Everything the child needs is opened before fork: between fork and exec
  // the child of a threaded process may only make async-signal-safe calls.
  const int ns_fd = open(namespace_path.c_str(), O_RDONLY | O_CLOEXEC);
  const int out_fd = open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err_fd = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto close_all = [&] {
    for (int fd : {ns_fd, out_fd, err_fd, null_fd}) {
      if (fd >= 0) close(fd);
    }
  };
  if (ns_fd < 0 || out_fd < 0 || err_fd < 0 || null_fd < 0) {
    close_all();
    return absl::InternalError(absl::StrCat("cannot open ", namespace_path, " or the logs of ",
                                            label, " (", stdout_path, ", ", stderr_path, ")"));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (setns(ns_fd, CLONE_NEWNET) != 0) _exit(126);
    dup2(null_fd, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close_all();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork failed for ", label));
  process->pid_ = pid;
  return process;
}

HostProcess::~HostProcess() { Stop(); }

double HostProcess::CpuSeconds() const {
  if (exit_code_.has_value()) return cpu_at_exit_;
  if (pid_ <= 0) return -1;
  return ProcessCpuSecondsOf(pid_);
}

std::optional<int> HostProcess::Poll() {
  if (exit_code_.has_value() || pid_ <= 0) return exit_code_;
  struct rusage usage {};
  if (wait4(pid_, &wait_status_, WNOHANG, &usage) == pid_) {
    exit_code_ = WIFEXITED(wait_status_) ? WEXITSTATUS(wait_status_)
                                         : 128 + WTERMSIG(wait_status_);
    cpu_at_exit_ = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                   1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  }
  return exit_code_;
}

bool HostProcess::WaitFor(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Poll().has_value()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return Poll().has_value();
}

void HostProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0 || Poll().has_value()) return;
  kill(pid_, SIGTERM);
  if (WaitFor(grace)) return;
  kill(pid_, SIGKILL);
  WaitFor(absl::Seconds(5));
}

std::string HostProcess::Describe() const {
  if (!exit_code_.has_value()) return absl::StrCat(label_, " is still running");
  const std::string how = WIFEXITED(wait_status_)
                              ? absl::StrCat("exit ", WEXITSTATUS(wait_status_))
                              : absl::StrCat("signal ", WTERMSIG(wait_status_));
  std::string why;
  if (WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 126) why = " (setns failed)";
  if (WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 127) why = " (exec failed)";
  return absl::StrCat(label_, " ended with ", how, why, "; its stderr: ",
                      TailOfFile(stderr_path_));
}

}  // namespace harrier::netem
