#include "testing/server_process.h"

#include <signal.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace harrier::testing {

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "harrier", "/", relative);
  }
  return relative;
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::string& binary, const std::vector<std::string>& args,
    const std::string& output_path) {
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    if (!output_path.empty()) {
      const int fd = open(output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0) _exit(126);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess());
  child->pid_ = pid;
  return child;
}

ChildProcess::~ChildProcess() {
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void ChildProcess::Signal(int signal_number) {
  if (!reaped_) kill(pid_, signal_number);
}

int ChildProcess::WaitForExit(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!reaped_) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& flags, const std::string& output_path) {
  static std::atomic<int> counter{0};
  const std::string port_file =
      absl::StrCat(TempDir(), "/server-", getpid(), "-", counter++, ".port");
  std::remove(port_file.c_str());
  std::vector<std::string> args = flags;
  bool has_port = false;
  bool has_host = false;
  for (const auto& flag : flags) {
    has_port |= flag.rfind("--port=", 0) == 0;
    has_host |= flag.rfind("--host=", 0) == 0;
  }
  if (!has_host) args.push_back("--host=127.0.0.1");
  if (!has_port) args.push_back("--port=0");
  args.push_back(absl::StrCat("--port_file=", port_file));
  auto child = ChildProcess::Start(RunfilePath("server/harrier-server"), args, output_path);
  if (!child.ok()) return child.status();
  auto server = std::unique_ptr<ServerProcess>(new ServerProcess());
  server->process_ = std::move(*child);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream file(port_file);
    int port = 0;
    if (file >> port && port > 0) {
      server->port_ = port;
      return server;
    }
    if (server->process_->WaitForExit(0) >= 0) {
      return absl::InternalError("harrier-server exited before serving");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError("harrier-server did not write its port file");
}

namespace {

// The lowest port the kernel hands out to outgoing connections and bind(0):
// a test port below it cannot be taken by another test's client between
// FreePort() and the bind that uses it.
int EphemeralLow() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (range >> low >> high && low > 12000) return low;
  return 32768;
}

bool CanListen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);  // servers may listen on 0.0.0.0
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     listen(fd, 1) == 0;
  close(fd);
  return bound;
}

}  // namespace

int FreePort() {
  // Picked at random below the ephemeral range, so neither a concurrent
  // test's outgoing connection nor its bind(0) lands on it; two tests
  // picking the same port at once is then a one-in-ten-thousand chance
  // per pair, where a port from bind(0) was soon reused by some connect().
  static std::atomic<uint64_t> sequence{0};
  const int low = 10000, high = EphemeralLow();
  uint64_t state = static_cast<uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull ^
                   static_cast<uint64_t>(
                       std::chrono::steady_clock::now().time_since_epoch().count()) ^
                   (sequence.fetch_add(1) << 32);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    state += 0x9E3779B97F4A7C15ull;  // splitmix64
    uint64_t mixed = (state ^ (state >> 30)) * 0xBF58476D1CE4E5B9ull;
    mixed = (mixed ^ (mixed >> 27)) * 0x94D049BB133111EBull;
    mixed ^= mixed >> 31;
    const int port = low + static_cast<int>(mixed % static_cast<uint64_t>(high - low));
    if (CanListen(port)) return port;
  }
  return 0;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    if (send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}

double MetricValue(int metrics_port, const std::string& name) {
  std::istringstream body(HttpGet(metrics_port, "/metrics"));
  std::string line;
  while (std::getline(body, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    if (line[name.size()] != '{' && line[name.size()] != ' ') continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

std::string ServerProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartCluster(
    int num_shards, int num_workers, const std::vector<std::string>& extra_flags) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (int shard = 0; shard < num_shards; ++shard) {
    std::vector<std::string> flags = {absl::StrCat("--shard=", shard),
                                      absl::StrCat("--num_shards=", num_shards),
                                      absl::StrCat("--num_workers=", num_workers)};
    flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
    auto server = ServerProcess::Start(flags);
    if (!server.ok()) return server.status();
    servers.push_back(std::move(*server));
  }
  return servers;
}

std::vector<std::string> Addresses(const std::vector<std::unique_ptr<ServerProcess>>& servers) {
  std::vector<std::string> addresses;
  for (const auto& server : servers) addresses.push_back(server->address());
  return addresses;
}

}  // namespace harrier::testing
