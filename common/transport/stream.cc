#include "common/transport/stream.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"

namespace harrier::transport {
namespace {

// Waits until `fd` is ready for `events` or `deadline` passes.
absl::Status AwaitReady(int fd, short events, absl::Time deadline) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration())
        return absl::DeadlineExceededError("stream deadline passed");
      timeout_ms = static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), int64_t{1} << 30));
    }
    struct pollfd waiting = {fd, events, 0};
    const int ready = poll(&waiting, 1, timeout_ms);
    if (ready > 0) {
      // POLLHUP / POLLERR: the next read or write says what happened.
      return absl::OkStatus();
    }
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

// Reads of at least this many bytes still to come raise the socket's
// receive low-water mark, to at most kLowWaterMaxBytes.
constexpr size_t kLowWaterMinBytes = size_t{64} << 10;
constexpr size_t kLowWaterMaxBytes = size_t{256} << 10;

// A read that takes the CRC asks for at most this much per recv, so that
// the bytes it checks are still in the core's cache (1 MiB of L2 here),
// where the CRC runs at about twice its rate from memory (`harrier-bench
// crc`: crc_gbps against crc_cold_gbps).
constexpr size_t kCrcReadBytes = size_t{256} << 10;

bool Retryable(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

}  // namespace

std::string PrefixStreamHeader(absl::string_view header) {
  std::string message(kStreamPrefixBytes + header.size(), '\0');
  const uint32_t length = static_cast<uint32_t>(header.size());
  std::memcpy(message.data(), &length, sizeof(length));
  std::memcpy(message.data() + kStreamPrefixBytes, header.data(), header.size());
  return message;
}

std::string EncodeStreamHeader(const Frame& frame, absl::string_view body) {
  return PrefixStreamHeader(EncodeHeader(frame, body));
}

absl::StatusOr<size_t> DecodeStreamPrefix(const char prefix[kStreamPrefixBytes],
                                          size_t max_header_bytes) {
  uint32_t length = 0;
  std::memcpy(&length, prefix, sizeof(length));
  if (length < kFrameBytes || length > max_header_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("malformed stream message: a header of ", length,
                                                   " bytes, outside [", kFrameBytes, ", ",
                                                   max_header_bytes, "]"));
  }
  return static_cast<size_t>(length);
}

absl::Status WriteFully(int fd, struct iovec* parts, size_t count, absl::Time deadline) {
  while (count > 0) {
    if (parts->iov_len == 0) {
      ++parts;
      --count;
      continue;
    }
    struct msghdr message = {};
    message.msg_iov = parts;
    message.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    const ssize_t sent = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (Retryable(errno)) {
        if (errno != EINTR) {
          if (auto status = AwaitReady(fd, POLLOUT, deadline); !status.ok()) return status;
        }
        continue;
      }
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    size_t left = static_cast<size_t>(sent);
    while (count > 0 && left >= parts->iov_len) {
      left -= parts->iov_len;
      ++parts;
      --count;
    }
    if (count > 0 && left > 0) {
      parts->iov_base = static_cast<char*>(parts->iov_base) + left;
      parts->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

namespace {

// ReadFully, and with `crc` set ReadFullyWithCrc32c.
absl::Status ReadInto(int fd, void* data, size_t bytes, absl::Time deadline, uint32_t* crc) {
  char* out = static_cast<char*>(data);
  // While a large payload trickles in, the socket's low-water mark keeps
  // poll from waking for every few segments: on a 1 Gbit/s link a 4 MiB
  // payload would otherwise cost hundreds of wake-ups and recv calls. Put
  // back to 1 before returning, so that the next message's few header
  // bytes wake the reader.
  bool raised = false;
  absl::Status status;
  while (bytes > 0) {
    const size_t want = crc != nullptr ? std::min(bytes, kCrcReadBytes) : bytes;
    const ssize_t got = recv(fd, out, want, 0);
    if (got > 0) {
      if (crc != nullptr) *crc = Crc32cExtend(*crc, out, static_cast<size_t>(got));
      out += got;
      bytes -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) {
      status = absl::UnavailableError("the peer closed the connection");
      break;
    }
    if (!Retryable(errno)) {
      status = absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
      break;
    }
    if (errno == EINTR) continue;
    if (bytes >= kLowWaterMinBytes) {
      // The kernel caps the mark at half the receive buffer, so a wake-up
      // always comes.
      const int mark = static_cast<int>(std::min(bytes, kLowWaterMaxBytes));
      setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof(mark));
      raised = true;
    } else if (raised) {
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
      raised = false;
    }
    status = AwaitReady(fd, POLLIN, deadline);
    if (!status.ok()) break;
  }
  if (raised) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
  }
  return status;
}

}  // namespace

absl::Status ReadFully(int fd, void* data, size_t bytes, absl::Time deadline) {
  return ReadInto(fd, data, bytes, deadline, nullptr);
}

absl::Status ReadFullyWithCrc32c(int fd, void* data, size_t bytes, absl::Time deadline,
                                 uint32_t* crc) {
  *crc = 0;
  return ReadInto(fd, data, bytes, deadline, crc);
}

absl::Status ReadHeader(int fd, size_t max_header_bytes, absl::Time deadline, Frame* frame,
                        std::string* header) {
  char prefix[kStreamPrefixBytes];
  if (auto status = ReadFully(fd, prefix, sizeof(prefix), deadline); !status.ok()) return status;
  absl::StatusOr<size_t> length = DecodeStreamPrefix(prefix, max_header_bytes);
  if (!length.ok()) return length.status();
  header->resize(*length);
  if (auto status = ReadFully(fd, header->data(), header->size(), deadline); !status.ok()) {
    return status;
  }
  absl::string_view body;
  if (auto status = DecodeHeader(header->data(), header->size(), frame, &body); !status.ok()) {
    return status;
  }
  if (frame->body_in_data) {
    return absl::InvalidArgumentError("malformed stream message: a body in the data");
  }
  return absl::OkStatus();
}

std::string SetCongestionControl(int fd, absl::string_view preference) {
  for (absl::string_view name : absl::StrSplit(preference, ',', absl::SkipWhitespace())) {
    const std::string wanted(absl::StripAsciiWhitespace(name));
    // EPERM: not in tcp_allowed_congestion_control for an unprivileged
    // process; ENOENT: not built into this kernel. Either way, the next.
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, wanted.data(),
                   static_cast<socklen_t>(wanted.size())) == 0) {
      return wanted;
    }
  }
  return "";
}

void TuneStreamSocket(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::StatusOr<int> ConnectToAny(const std::vector<StreamAddress>& addresses,
                                 const std::string& name, absl::Time deadline) {
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", name));
  for (size_t index = 0; index < addresses.size(); ++index) {
    const StreamAddress& candidate = addresses[index];
    // Each address gets an equal share of the time left, so one that drops
    // the connect silently (an IPv6 route to nowhere, a full backlog)
    // leaves time for the next; the last gets all that is left.
    const int64_t remaining = static_cast<int64_t>(addresses.size() - index);
    const absl::Time attempt_deadline =
        std::min(deadline, absl::Now() + (deadline - absl::Now()) / remaining);
    const auto* address = reinterpret_cast<const struct sockaddr*>(&candidate.address);
    const int fd = socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
      continue;
    }
    int result = connect(fd, address, candidate.length);
    if (result < 0 && errno == EINPROGRESS) {
      absl::Status ready = AwaitReady(fd, POLLOUT, attempt_deadline);
      if (!ready.ok()) {
        last = absl::UnavailableError(absl::StrCat("connecting to ", name, ": ", ready.message()));
        close(fd);
        continue;
      }
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error == 0) {
        result = 0;
      } else {
        errno = error;
      }
    }
    if (result == 0) {
      TuneStreamSocket(fd);
      return fd;
    }
    last = absl::UnavailableError(absl::StrCat("connecting to ", name, ": ", std::strerror(errno)));
    close(fd);
  }
  return last;
}

absl::StatusOr<int> ConnectStream(const std::string& address, absl::Time deadline) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("not host:port: '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int error = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", address, ": ", gai_strerror(error)));
  }
  std::vector<StreamAddress> addresses;
  for (struct addrinfo* it = found; it != nullptr; it = it->ai_next) {
    if (it->ai_addrlen > sizeof(StreamAddress::address)) continue;
    StreamAddress candidate;
    std::memcpy(&candidate.address, it->ai_addr, it->ai_addrlen);
    candidate.length = it->ai_addrlen;
    addresses.push_back(candidate);
  }
  freeaddrinfo(found);
  return ConnectToAny(addresses, address, deadline);
}

}  // namespace harrier::transport
