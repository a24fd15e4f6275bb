#include "bench/tcp_baseline.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"

namespace harrier::bench {
namespace {

constexpr int kSocketTimeoutSeconds = 30;

// Owns a socket descriptor.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&&) = delete;
  Socket(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

absl::Status ErrnoError(const char* what) {
  const int error = errno;
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return absl::DeadlineExceededError(
        absl::StrCat("loopback TCP ", what, ": no progress in ", kSocketTimeoutSeconds, " s"));
  }
  return absl::UnavailableError(absl::StrCat("loopback TCP ", what, ": ", std::strerror(error)));
}

void Configure(int fd) {
  timeval timeout{kSocketTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  // gRPC sets TCP_NODELAY too; without it small messages would wait for
  // Nagle's algorithm and the baseline would be unfairly slow.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::Status SendAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("send");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Header and payload leave in one call so a small message is one segment.
absl::Status SendMessage(int fd, const char* data, size_t size) {
  uint64_t header = size;
  iovec parts[2] = {{&header, sizeof(header)}, {const_cast<char*>(data), size}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = 2;
  const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
  if (n < 0) return ErrnoError("sendmsg");
  size_t sent = static_cast<size_t>(n);
  if (sent < sizeof(header)) {
    if (auto status = SendAll(fd, reinterpret_cast<const char*>(&header) + sent,
                              sizeof(header) - sent);
        !status.ok()) {
      return status;
    }
    sent = sizeof(header);
  }
  sent -= sizeof(header);
  return SendAll(fd, data + sent, size - sent);
}

// Reads exactly `size` bytes. *eof (if given) is set when the peer closed
// before the first byte, which ends a receiver cleanly.
absl::Status ReceiveAll(int fd, char* data, size_t size, bool* eof = nullptr) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = recv(fd, data + done, size - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("recv");
    }
    if (n == 0) {
      if (done == 0 && eof != nullptr) {
        *eof = true;
        return absl::OkStatus();
      }
      return absl::UnavailableError("loopback TCP: peer closed mid-message");
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Serves one connection until the sender closes it.
absl::Status Receive(int listen_fd, const TcpPoint& point) {
  Socket connection(accept(listen_fd, nullptr, nullptr));
  if (connection.fd() < 0) return ErrnoError("accept");
  Configure(connection.fd());
  std::vector<char> buffer(point.message_bytes);
  while (true) {
    uint64_t header = 0;
    bool eof = false;
    if (auto status = ReceiveAll(connection.fd(), reinterpret_cast<char*>(&header),
                                 sizeof(header), &eof);
        !status.ok() || eof) {
      return status;
    }
    if (header != point.message_bytes) {
      return absl::DataLossError(absl::StrCat("loopback TCP: message of ", header,
                                              " bytes, expected ", point.message_bytes));
    }
    if (auto status = ReceiveAll(connection.fd(), buffer.data(), buffer.size()); !status.ok()) {
      return status;
    }
    const absl::Status reply = point.pattern == TcpPattern::kEcho
                                   ? SendAll(connection.fd(), buffer.data(), buffer.size())
                                   : SendAll(connection.fd(), "k", 1);
    if (!reply.ok()) return reply;
  }
}

struct SenderResult {
  absl::Status status;
  BenchClock::time_point end;
  std::vector<double> round_trip_us;
};

void Send(int port, const TcpPoint& point, StartGate& gate, SenderResult& result) {
  Socket socket_fd(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (socket_fd.fd() < 0) {
    result.status = ErrnoError("socket");
  } else if (Configure(socket_fd.fd()),
             connect(socket_fd.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    result.status = ErrnoError("connect");
  }
  if (!result.status.ok()) {
    gate.Abort();
    return;
  }
  // Pre-faulted buffers: page faults belong to neither side of the ratio.
  std::vector<char> message(point.message_bytes, 'x');
  std::vector<char> reply(point.pattern == TcpPattern::kEcho ? point.message_bytes : 1);
  auto one_message = [&]() -> absl::Status {
    if (auto status = SendMessage(socket_fd.fd(), message.data(), message.size()); !status.ok()) {
      return status;
    }
    return ReceiveAll(socket_fd.fd(), reply.data(), reply.size());
  };
  for (int i = 0; i < point.warmup; ++i) {
    if (result.status = one_message(); !result.status.ok()) {
      gate.Abort();
      return;
    }
  }
  if (!gate.ArriveAndWait()) {
    result.status = absl::AbortedError("another connection failed");
    return;
  }
  result.round_trip_us.reserve(point.iterations);
  for (int i = 0; i < point.iterations; ++i) {
    const auto start = BenchClock::now();
    if (result.status = one_message(); !result.status.ok()) return;
    result.round_trip_us.push_back(MicrosSince(start));
  }
  result.end = BenchClock::now();
  shutdown(socket_fd.fd(), SHUT_WR);  // the receiver sees EOF and returns
}

}  // namespace

absl::StatusOr<TcpResult> MeasureLoopbackTcp(const TcpPoint& point) {
  if (point.connections < 1 || point.iterations < 1 || point.message_bytes == 0) {
    return absl::InvalidArgumentError("TCP point needs connections, iterations and bytes > 0");
  }
  Socket listener(socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd() < 0) return ErrnoError("socket");
  Configure(listener.fd());  // SO_RCVTIMEO also bounds accept()
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(listener.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener.fd(), point.connections) != 0 ||
      getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return ErrnoError("listen");
  }
  const int port = ntohs(address.sin_port);

  std::vector<absl::Status> receiver_status(point.connections);
  std::vector<std::thread> receivers;
  for (int c = 0; c < point.connections; ++c) {
    receivers.emplace_back(
        [&, c] { receiver_status[c] = Receive(listener.fd(), point); });
  }
  StartGate gate(point.connections);
  std::vector<SenderResult> results(point.connections);
  std::vector<std::thread> senders;
  for (int c = 0; c < point.connections; ++c) {
    senders.emplace_back([&, c] { Send(port, point, gate, results[c]); });
  }
  const auto start = gate.WaitAllThenOpen();
  for (auto& sender : senders) sender.join();
  // Wakes receivers still blocked in accept() because a sender never
  // connected; the others are past accept and unaffected.
  shutdown(listener.fd(), SHUT_RDWR);
  for (auto& receiver : receivers) receiver.join();

  TcpResult result;
  auto end = start;
  for (SenderResult& sender : results) {
    if (!sender.status.ok() && !absl::IsAborted(sender.status)) return sender.status;
  }
  for (SenderResult& sender : results) {
    if (!sender.status.ok()) return sender.status;
    end = std::max(end, sender.end);
    result.round_trip_us.insert(result.round_trip_us.end(), sender.round_trip_us.begin(),
                                sender.round_trip_us.end());
  }
  for (const absl::Status& status : receiver_status) {
    if (!status.ok()) return status;
  }
  result.seconds = std::chrono::duration<double>(end - start).count();
  const uint64_t per_message =
      point.pattern == TcpPattern::kEcho ? 2 * point.message_bytes : point.message_bytes;
  result.payload_bytes =
      per_message * static_cast<uint64_t>(point.iterations) * point.connections;
  return result;
}

}  // namespace harrier::bench
