// MetricsHttpServer over a real loopback socket, with a small client here.

#include "common/metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

namespace harrier {
namespace {

using SteadyClock = std::chrono::steady_clock;

// A connected socket to 127.0.0.1:port, or -1.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct HttpResult {
  bool ok = false;  // connected and read until EOF within the timeout
  int status = 0;
  std::string headers;
  std::string body;
};

// Sends `request` as is and reads the response until the server closes.
HttpResult RawRequest(int port, const std::string& request) {
  HttpResult result;
  const int fd = Connect(port);
  if (fd < 0) return result;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      ::close(fd);
      return result;
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  const auto deadline = SteadyClock::now() + std::chrono::seconds(5);
  char buffer[4096];
  for (;;) {
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, 100) == 0) {
      if (SteadyClock::now() > deadline) break;
      continue;
    }
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0) break;
    if (n == 0) {
      result.ok = true;
      break;
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t split = response.find("\r\n\r\n");
  if (split == std::string::npos || response.rfind("HTTP/1.1 ", 0) != 0) {
    result.ok = false;
    return result;
  }
  result.status = std::stoi(response.substr(9, 3));
  result.headers = response.substr(0, split);
  result.body = response.substr(split + 4);
  return result;
}

HttpResult Get(int port, const std::string& path) {
  return RawRequest(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST_CASE("scrape over HTTP", "[metrics][http]") {
  MetricsRegistry registry;
  registry.AddCounter("harrier_pulls_total", "Pulls answered.", {{"shard", "0"}}).Increment(5);
  registry.AddHistogram("harrier_push_seconds", "Push latency.", {0.01, 0.1}).Observe(0.05);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  REQUIRE(port > 0);

  SECTION("GET /metrics returns the registry's text") {
    HttpResult r = Get(port, "/metrics");
    REQUIRE(r.ok);
    INFO(r.headers << "\n\n" << r.body);
    REQUIRE(r.status == 200);
    REQUIRE(Contains(r.headers, "Content-Type: text/plain; version=0.0.4"));
    REQUIRE(Contains(r.headers, "Content-Length: " + std::to_string(r.body.size())));
    REQUIRE(r.body == registry.RenderText());
    REQUIRE(Contains(r.body, "# TYPE harrier_pulls_total counter\n"));
    REQUIRE(Contains(r.body, "harrier_pulls_total{shard=\"0\"} 5\n"));
    REQUIRE(Contains(r.body, "harrier_push_seconds_bucket{le=\"0.1\"} 1\n"));
    // Scrapers may add query parameters.
    REQUIRE(Get(port, "/metrics?format=text").status == 200);
  }
  SECTION("GET /healthz is ok") {
    HttpResult r = Get(port, "/healthz");
    REQUIRE(r.ok);
    REQUIRE(r.status == 200);
    REQUIRE(r.body == "ok\n");
  }
  SECTION("other paths, methods and garbage") {
    REQUIRE(Get(port, "/").status == 404);
    REQUIRE(Get(port, "/metricsx").status == 404);
    HttpResult post = RawRequest(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    REQUIRE(post.status == 405);
    REQUIRE(Contains(post.headers, "Allow: GET, HEAD"));
    REQUIRE(RawRequest(port, "hello\r\n\r\n").status == 400);
    REQUIRE(RawRequest(port, "GET /metrics SMTP/1.0\r\n\r\n").status == 400);
    HttpResult head = RawRequest(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
    REQUIRE(head.status == 200);
    REQUIRE(head.body.empty());
    // An oversized request head is refused, not buffered without limit.
    REQUIRE(RawRequest(port, "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n").status ==
            400);
    // The server still answers afterwards.
    REQUIRE(Get(port, "/healthz").status == 200);
  }
  SECTION("a silent client does not block Stop") {
    const int idle = Connect(port);
    REQUIRE(idle >= 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the server accept it
    const auto start = SteadyClock::now();
    (*server)->Stop();
    REQUIRE(SteadyClock::now() - start < std::chrono::milliseconds(500));
    ::close(idle);
  }
  SECTION("Stop ends the server promptly and closes the port") {
    const auto start = SteadyClock::now();
    (*server)->Stop();
    REQUIRE(SteadyClock::now() - start < std::chrono::milliseconds(500));
    REQUIRE(Connect(port) < 0);
    (*server)->Stop();  // idempotent
  }
}

TEST_CASE("start errors", "[metrics][http]") {
  MetricsRegistry registry;
  auto first = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(first.ok());
  // The same port twice: the second cannot bind.
  auto second = MetricsHttpServer::Start("127.0.0.1", (*first)->port(), &registry);
  REQUIRE(absl::IsUnavailable(second.status()));
  REQUIRE(
      absl::IsInvalidArgument(MetricsHttpServer::Start("127.0.0.1", 70000, &registry).status()));
  REQUIRE(absl::IsInvalidArgument(MetricsHttpServer::Start("127.0.0.1", 0, nullptr).status()));
}

TEST_CASE("the server can be restarted on the same port", "[metrics][http]") {
  MetricsRegistry registry;
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  REQUIRE(Get(port, "/healthz").status == 200);
  server->reset();  // destructor stops it
  auto again = MetricsHttpServer::Start("127.0.0.1", port, &registry);
  REQUIRE(again.ok());
  REQUIRE(Get(port, "/healthz").status == 200);
}

}  // namespace
}  // namespace harrier
