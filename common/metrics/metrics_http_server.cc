#include "common/metrics/metrics_http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace harrier {
namespace {

using SteadyClock = std::chrono::steady_clock;

// How long one connection may take from accept to the last byte written.
// Prometheus' default scrape timeout is 10 s; a request head arrives in one
// packet, so anything slower is a stuck or hostile client.
constexpr auto kConnectionDeadline = std::chrono::seconds(5);
// A request head larger than this is refused: scrapers send a few hundred bytes.
constexpr size_t kMaxRequestHead = 8192;
// After the response: how long and how much to read while the client closes.
constexpr auto kLingerTime = std::chrono::milliseconds(500);
constexpr size_t kMaxLingerBytes = 1 << 20;
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

std::string ErrnoText() { return std::strerror(errno); }

int RemainingMs(SteadyClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

// Waits until `fd` is ready for `events`. False when the deadline passes,
// the wake pipe fires (Stop) or the socket fails.
bool WaitReady(int fd, short events, int wake_fd, SteadyClock::time_point deadline) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int timeout = RemainingMs(deadline);
    const int n = ::poll(fds, 2, timeout);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (fds[1].revents != 0) return false;
    return (fds[0].revents & events) != 0;
  }
}

std::string Response(int code, absl::string_view reason, absl::string_view content_type,
                     const std::string& body, bool head_only,
                     absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                                 "Connection: close\r\n\r\n");
  if (!head_only) out += body;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry) {
  if (registry == nullptr) return absl::InvalidArgumentError("metrics registry is null");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is out of range"));
  }
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &addresses);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve metrics host '", host, "': ", ::gai_strerror(rc)));
  }
  // The first address that binds wins; with an empty host that is the IPv4
  // wildcard, which is what a scraper in the same pod or cluster reaches.
  int listen_fd = -1;
  std::string error;
  for (addrinfo* a = addresses; a != nullptr && listen_fd < 0; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = ErrnoText();
      continue;
    }
    // A restarted server must be able to rebind while old connections sit in TIME_WAIT.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      error = ErrnoText();
      ::close(fd);
      continue;
    }
    listen_fd = fd;
  }
  ::freeaddrinfo(addresses);
  if (listen_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", host, ":", port, ": ", error));
  }
  sockaddr_storage bound;
  socklen_t bound_len = sizeof(bound);
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    const std::string why = ErrnoText();
    ::close(listen_fd);
    return absl::InternalError(absl::StrCat("getsockname on the metrics socket: ", why));
  }
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const std::string why = ErrnoText();
    ::close(listen_fd);
    return absl::InternalError(absl::StrCat("cannot create the metrics wake pipe: ", why));
  }
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(listen_fd, wake[0], wake[1], bound_port, registry));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                                     const MetricsRegistry* registry)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port),
      registry_(registry) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  std::lock_guard<std::mutex> lock(stop_mutex_);
  if (stopped_) return;
  stopped_ = true;
  // The byte stays in the pipe, so every later poll in Serve sees it too.
  const char byte = 1;
  while (::write(wake_write_fd_, &byte, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_fd_);
  ::close(wake_write_fd_);
}

void MetricsHttpServer::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
    const int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // poll on our own descriptors cannot fail short of a bug
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays queued and poll would report it at
        // once again; back off instead of spinning, still waking for Stop.
        pollfd wake = {wake_read_fd_, POLLIN, 0};
        ::poll(&wake, 1, 100);
      }
      continue;  // EAGAIN, ECONNABORTED, EINTR: the client went away
    }
    HandleConnection(fd);
    ::close(fd);
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  const auto deadline = SteadyClock::now() + kConnectionDeadline;
  std::string head;
  char buffer[2048];
  for (;;) {
    const size_t end = head.find("\r\n\r\n");
    if (end != std::string::npos) {
      head.resize(end);
      break;
    }
    if (head.size() > kMaxRequestHead) {
      head.clear();  // answered as malformed below
      break;
    }
    if (!WaitReady(fd, POLLIN, wake_read_fd_, deadline)) return;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // closed or reset before a whole request arrived
    head.append(buffer, static_cast<size_t>(n));
  }
  const std::string response = Respond(head);
  size_t sent = 0;
  while (sent < response.size()) {
    if (!WaitReady(fd, POLLOUT, wake_read_fd_, deadline)) return;
    const ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return;
    sent += static_cast<size_t>(n);
  }
  // Half-close, then read what the client still sends until it closes: a
  // close() with unread input sends a reset, which can destroy the response
  // in the client's buffer (an oversized request is answered before it has
  // all arrived). Bounded in time and bytes, so a client that never closes
  // costs at most kLingerTime.
  ::shutdown(fd, SHUT_WR);
  const auto linger_deadline = std::min(deadline, SteadyClock::now() + kLingerTime);
  size_t drained = 0;
  while (drained < kMaxLingerBytes && WaitReady(fd, POLLIN, wake_read_fd_, linger_deadline)) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
}

std::string MetricsHttpServer::Respond(const std::string& head) const {
  const std::string request_line = head.substr(0, head.find("\r\n"));
  const std::vector<std::string> parts = absl::StrSplit(request_line, ' ');
  if (parts.size() != 3 || parts[1].empty() || parts[1][0] != '/' ||
      parts[2].rfind("HTTP/1.", 0) != 0) {
    return Response(400, "Bad Request", "text/plain", "bad request\n", false);
  }
  const std::string& method = parts[0];
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return Response(405, "Method Not Allowed", "text/plain", "method not allowed\n", false,
                    "Allow: GET, HEAD\r\n");
  }
  // Scrapers may append parameters (?name[]=...); they select nothing here.
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  if (path == "/metrics") {
    return Response(200, "OK", kMetricsContentType, registry_->RenderText(), head_only);
  }
  if (path == "/healthz") return Response(200, "OK", "text/plain", "ok\n", head_only);
  return Response(404, "Not Found", "text/plain", "not found\n", head_only);
}

}  // namespace harrier
