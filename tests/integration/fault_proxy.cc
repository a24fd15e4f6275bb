#include "tests/integration/fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace harrier::testing {
namespace {

constexpr int kHandshakeReads = 2;

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(int target_port, uint64_t seed) {
  std::unique_ptr<FaultProxy> proxy(new FaultProxy());
  proxy->target_port_ = target_port;
  proxy->seed_ = seed;
  proxy->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (proxy->listen_fd_ < 0) return absl::InternalError("fault proxy: socket() failed");
  const int one = 1;
  ::setsockopt(proxy->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  if (::bind(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(proxy->listen_fd_, 64) != 0 ||
      ::getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    return absl::InternalError(absl::StrCat("fault proxy: cannot listen: ", std::strerror(errno)));
  }
  proxy->port_ = ntohs(addr.sin_port);
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

FaultProxy::~FaultProxy() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mutex_);
    pumps.swap(pumps_);
  }
  for (std::thread& pump : pumps) pump.join();  // each sees stop_ within 20 ms
}

std::string FaultProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

void FaultProxy::SetCutProbability(double reply, double request) {
  reply_cut_ = reply;
  request_cut_ = request;
}

void FaultProxy::SetDropReplies(bool drop) { drop_replies_ = drop; }

void FaultProxy::SetFlipReplyByte(int64_t offset) { flip_reply_byte_ = offset; }

void FaultProxy::AcceptLoop() {
  uint64_t index = 0;
  while (!stop_) {
    pollfd listening{listen_fd_, POLLIN, 0};
    if (::poll(&listening, 1, 20) <= 0) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ++connections_;
    const int upstream = ConnectLoopback(target_port_);
    if (upstream < 0) {  // the shard is down: the client sees a closed connection
      ::close(client);
      continue;
    }
    absl::MutexLock lock(&mutex_);
    pumps_.emplace_back([this, client, upstream, seed = seed_ + 7919 * ++index] {
      Pump(client, upstream, seed);
    });
  }
}

void FaultProxy::Pump(int client, int upstream, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<char> buffer(64 << 10);
  pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
  // A connection's first reads each way (gRPC's HTTP/2 preface and
  // settings) pass untouched: a connection cut while it is being set up
  // counts as a failed connect, and gRPC backs off reconnecting (1 s and
  // growing), which would slow the tests without testing anything.
  int handshake_reads[2] = {kHandshakeReads, kHandshakeReads};
  int64_t reply_offset = 0;  // bytes the shard sent on this connection so far
  while (!stop_) {
    fds[0].revents = fds[1].revents = 0;
    if (::poll(fds, 2, 20) <= 0) continue;
    bool open = true;
    if (fds[0].revents != 0) {  // the client's request bytes
      const ssize_t n = ::read(client, buffer.data(), buffer.size());
      if (n <= 0) {
        open = false;
      } else if (handshake_reads[0] > 0) {
        --handshake_reads[0];
        open = WriteAll(upstream, buffer.data(), static_cast<size_t>(n));
      } else if (uniform(random) < request_cut_) {
        const size_t prefix = static_cast<size_t>(random() % static_cast<uint64_t>(n));
        WriteAll(upstream, buffer.data(), prefix);
        ++request_cuts_;
        open = false;
      } else {
        open = WriteAll(upstream, buffer.data(), static_cast<size_t>(n));
      }
    }
    if (open && fds[1].revents != 0) {  // the shard's reply bytes
      const ssize_t n = ::read(upstream, buffer.data(), buffer.size());
      const int64_t flip_at = flip_reply_byte_;
      if (n > 0 && flip_at >= reply_offset && flip_at < reply_offset + n) {
        buffer[static_cast<size_t>(flip_at - reply_offset)] ^= 1;
        ++reply_flips_;
      }
      if (n > 0) reply_offset += n;
      if (n <= 0) {
        open = false;
      } else if (drop_replies_) {
        // Read and forgotten.
      } else if (handshake_reads[1] > 0) {
        --handshake_reads[1];
        open = WriteAll(client, buffer.data(), static_cast<size_t>(n));
      } else if (uniform(random) < reply_cut_) {
        ++reply_cuts_;
        open = false;
      } else {
        open = WriteAll(client, buffer.data(), static_cast<size_t>(n));
      }
    }
    if (!open) break;
  }
  ::shutdown(client, SHUT_RDWR);
  ::shutdown(upstream, SHUT_RDWR);
  ::close(client);
  ::close(upstream);
}

}  // namespace harrier::testing
