#include "bench/server_cluster.h"

#include <cstdio>

#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace harrier::bench {
namespace {

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::string SelfPath() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return "";
  return std::string(buffer, static_cast<size_t>(n));
}

std::string TempRoot() {
  for (const char* name : {"TEST_TMPDIR", "TMPDIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return value;
  }
  return "/tmp";
}

// Last lines of a server's log, for the error message when it dies early.
std::string Tail(const std::string& path, size_t max_chars) {
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  std::string text = contents.str();
  if (text.size() > max_chars) text = text.substr(text.size() - max_chars);
  return text;
}

bool Reap(pid_t pid, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const pid_t done = waitpid(pid, nullptr, WNOHANG);
    if (done == pid || done < 0) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

absl::StatusOr<std::string> FindServerBinary(const std::string& flag_value) {
  if (!flag_value.empty()) {
    if (IsExecutable(flag_value)) return flag_value;
    return absl::NotFoundError(
        absl::StrCat("--server_binary=", flag_value, " is not an executable file"));
  }
  std::vector<std::string> candidates;
  for (const char* name : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') {
      candidates.push_back(absl::StrCat(value, "/harrier/server/harrier-server"));
    }
  }
  const std::string self = SelfPath();
  if (!self.empty()) {
    candidates.push_back(absl::StrCat(self, ".runfiles/harrier/server/harrier-server"));
    const std::string dir = self.substr(0, self.rfind('/'));
    candidates.push_back(absl::StrCat(dir, "/../server/harrier-server"));
  }
  for (const std::string& candidate : candidates) {
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("harrier-server not found (tried ",
                                          absl::StrJoin(candidates, ", "),
                                          "); build //server:harrier-server or pass "
                                          "--server_binary=PATH"));
}

absl::StatusOr<std::unique_ptr<ServerCluster>> ServerCluster::Start(
    const std::string& binary, int num_shards, int num_workers,
    const std::vector<std::string>& extra_flags) {
  auto cluster = std::unique_ptr<ServerCluster>(new ServerCluster());
  std::string pattern = absl::StrCat(TempRoot(), "/harrier-bench-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a temporary directory ", pattern));
  }
  cluster->dir_ = pattern;
  for (int shard = 0; shard < num_shards; ++shard) {
    // On failure the cluster's destructor stops the shards already started.
    if (auto status = cluster->StartShard(binary, shard, num_shards, num_workers, extra_flags);
        !status.ok()) {
      return status;
    }
  }
  return cluster;
}

absl::Status ServerCluster::StartShard(const std::string& binary, int shard, int num_shards,
                                       int num_workers,
                                       const std::vector<std::string>& extra_flags) {
  const std::string port_file = absl::StrCat(dir_, "/shard", shard, ".port");
  const std::string log_file = absl::StrCat(dir_, "/shard", shard, ".log");
  files_.push_back(port_file);
  files_.push_back(log_file);
  std::vector<std::string> args = {binary,
                                   "--host=127.0.0.1",
                                   "--port=0",
                                   absl::StrCat("--port_file=", port_file),
                                   absl::StrCat("--shard=", shard),
                                   absl::StrCat("--num_shards=", num_shards),
                                   absl::StrCat("--num_workers=", num_workers),
                                   // The cluster is stopped by its owner, not by the
                                   // end of a client's run.
                                   "--exit_when_done=false"};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  // Opened before fork: between fork and exec a child of a threaded process
  // may only make async-signal-safe calls.
  const int log_fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (log_fd < 0 || null_fd < 0) {
    if (log_fd >= 0) close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return absl::InternalError(absl::StrCat("cannot open ", log_file));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Dies with the bench even if the bench is killed before its
    // destructors run.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(null_fd, STDIN_FILENO);
    dup2(null_fd, STDOUT_FILENO);  // stdout of the bench carries only JSON
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  close(null_fd);
  if (pid < 0) return absl::InternalError("fork failed");
  pids_.push_back(pid);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream file(port_file);
    int port = 0;
    if (file >> port && port > 0) {
      addresses_.push_back(absl::StrCat("127.0.0.1:", port));
      return absl::OkStatus();
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pids_.pop_back();
      return absl::InternalError(absl::StrCat("harrier-server shard ", shard,
                                              " exited before serving (status ", status,
                                              "): ", Tail(log_file, 600)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("harrier-server shard ", shard, " did not write its port file within 20 s"));
}

void ServerCluster::StopAll() {
  for (pid_t pid : pids_) kill(pid, SIGTERM);
  for (pid_t pid : pids_) {
    if (!Reap(pid, 3000)) {
      kill(pid, SIGKILL);
      Reap(pid, 3000);
    }
  }
  pids_.clear();
}

ServerCluster::~ServerCluster() {
  StopAll();
  for (const std::string& file : files_) std::remove(file.c_str());
  if (!dir_.empty()) rmdir(dir_.c_str());
}

absl::StatusOr<std::string> PrepareServerBench(const char* subcommand,
                                               const std::string& flag_value) {
  auto binary = FindServerBinary(flag_value);
  if (!binary.ok()) {
    std::fprintf(stderr, "harrier-bench %s: %s\n", subcommand,
                 std::string(binary.status().message()).c_str());
    return binary;
  }
  TuneMallocForLargeBuffers();
  return binary;
}

}  // namespace harrier::bench
