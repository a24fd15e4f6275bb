// MetricsHttpServer over a real loopback socket: /metrics, /healthz, what
// other requests get, start errors, ephemeral ports, stop and restart.

#include "common/metrics/metrics_http_server.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "tests/metrics/http_client.h"

namespace harrier {
namespace {

using SteadyClock = std::chrono::steady_clock;
using testing::Get;
using testing::HttpResult;
using testing::RawRequest;

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

  SECTION("GET /metrics returns the registry's families") {
    HttpResult r = Get(port, "/metrics");
    REQUIRE(r.ok);
    INFO(r.headers << "\n\n" << r.body);
    REQUIRE(r.status == 200);
    REQUIRE(Contains(r.headers, "Content-Type: text/plain"));
    REQUIRE(Contains(r.headers, "Content-Length: " + std::to_string(r.body.size())));
    // Everything the registry holds, in one piece; the Exposer adds its own
    // exposer_* families around it.
    REQUIRE(Contains(r.body, registry.RenderText()));
    REQUIRE(Contains(r.body, "# TYPE harrier_pulls_total counter\n"));
    REQUIRE(Contains(r.body, "harrier_pulls_total{shard=\"0\"} 5\n"));
    REQUIRE(Contains(r.body, "harrier_push_seconds_bucket{le=\"0.1\"} 1\n"));
    // Scrapers may add query parameters.
    HttpResult with_query = Get(port, "/metrics?format=text");
    REQUIRE(with_query.status == 200);
    REQUIRE(Contains(with_query.body, "harrier_pulls_total{shard=\"0\"} 5\n"));
    // Scrapers that accept gzip get it.
    HttpResult gzip =
        RawRequest(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n");
    REQUIRE(gzip.status == 200);
    REQUIRE(Contains(gzip.headers, "Content-Encoding: gzip"));
  }
  SECTION("GET /healthz is ok") {
    HttpResult r = Get(port, "/healthz");
    REQUIRE(r.ok);
    INFO(r.headers);
    REQUIRE(r.status == 200);
    REQUIRE(r.body == "ok\n");
    REQUIRE(Contains(r.headers, "Content-Type: text/plain"));
    REQUIRE(Get(port, "/healthz?verbose=1").body == "ok\n");
    HttpResult head = RawRequest(port, "HEAD /healthz HTTP/1.1\r\n\r\n");
    REQUIRE(head.status == 200);
    REQUIRE(head.body.empty());
  }
  SECTION("other paths, methods and garbage") {
    REQUIRE(Get(port, "/").status == 404);
    REQUIRE(Get(port, "/metricsx").status == 404);
    REQUIRE(Get(port, "/metrics/x").status == 404);
    REQUIRE(Get(port, "/healthzx").status == 404);
    HttpResult post = RawRequest(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    REQUIRE(post.status == 405);
    REQUIRE(Contains(post.headers, "Allow: GET, HEAD"));
    REQUIRE(RawRequest(port, "DELETE /healthz HTTP/1.1\r\n\r\n").status == 405);
    REQUIRE(RawRequest(port, "hello\r\n\r\n").status == 400);
    REQUIRE(RawRequest(port, "GET /metrics SMTP/1.0\r\n\r\n").status == 400);
    HttpResult head = RawRequest(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
    REQUIRE(head.status == 200);
    REQUIRE(head.body.empty());
    // An oversized request head is refused, not buffered without limit.
    HttpResult big = RawRequest(port, "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n");
    REQUIRE(big.status >= 400);
    REQUIRE(big.status < 500);
    // The server still answers afterwards.
    REQUIRE(Get(port, "/healthz").status == 200);
  }
  SECTION("every response closes the connection") {
    // The client reads until EOF; ok means the server closed.
    REQUIRE(Get(port, "/metrics").ok);
    REQUIRE(Get(port, "/healthz").ok);
    REQUIRE(Get(port, "/nothing").ok);
  }
  SECTION("a silent client delays Stop by at most civetweb's poll step") {
    const int idle = testing::ConnectLoopback(port);
    REQUIRE(idle >= 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the server accept it
    const auto start = SteadyClock::now();
    (*server)->Stop();
    REQUIRE(SteadyClock::now() - start < std::chrono::milliseconds(3000));
    ::close(idle);
  }
  SECTION("Stop ends the server promptly and closes the port") {
    REQUIRE(Get(port, "/healthz").status == 200);
    const auto start = SteadyClock::now();
    (*server)->Stop();
    // Without the connection that ends civetweb's accept poll, Stop takes up
    // to 2 s; a prompt one takes milliseconds, and 1.5 s leaves a busy
    // machine room.
    REQUIRE(SteadyClock::now() - start < std::chrono::milliseconds(1500));
    REQUIRE(testing::ConnectLoopback(port) < 0);
    (*server)->Stop();  // idempotent
  }
}

TEST_CASE("start errors are statuses", "[metrics][http]") {
  MetricsRegistry registry;
  auto first = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(first.ok());
  // The same port twice: the second cannot bind, and says why.
  auto second = MetricsHttpServer::Start("127.0.0.1", (*first)->port(), &registry);
  INFO(second.status().ToString());
  REQUIRE(absl::IsUnavailable(second.status()));
  REQUIRE(Contains(std::string(second.status().message()), "in use"));
  REQUIRE(Contains(std::string(second.status().message()),
                   "127.0.0.1:" + std::to_string((*first)->port())));
  // The first one is unaffected.
  REQUIRE(Get((*first)->port(), "/healthz").status == 200);
  REQUIRE(
      absl::IsInvalidArgument(MetricsHttpServer::Start("127.0.0.1", 70000, &registry).status()));
  REQUIRE(absl::IsInvalidArgument(MetricsHttpServer::Start("127.0.0.1", -1, &registry).status()));
  REQUIRE(absl::IsInvalidArgument(MetricsHttpServer::Start("127.0.0.1", 0, nullptr).status()));
  // IPv6 is refused up front (Debian's civetweb is built without it).
  REQUIRE(absl::IsInvalidArgument(MetricsHttpServer::Start("::", 0, &registry).status()));
}

TEST_CASE("ephemeral ports and host names", "[metrics][http]") {
  MetricsRegistry registry;
  registry.AddGauge("up", "Up.").Set(1);
  auto a = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  auto b = MetricsHttpServer::Start("localhost", 0, &registry);
  auto any = MetricsHttpServer::Start("", 0, &registry);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(any.ok());
  REQUIRE((*a)->port() > 0);
  REQUIRE((*b)->port() > 0);
  REQUIRE((*a)->port() != (*b)->port());
  // Two servers may serve one registry; each reports the port it bound.
  REQUIRE(Contains(Get((*a)->port(), "/metrics").body, "up 1\n"));
  REQUIRE(Contains(Get((*b)->port(), "/metrics").body, "up 1\n"));
  REQUIRE(Get((*any)->port(), "/healthz").body == "ok\n");
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
  REQUIRE((*again)->port() == port);
  REQUIRE(Get(port, "/healthz").status == 200);
}

TEST_CASE("a registry destroyed before its server is no longer served", "[metrics][http]") {
  auto registry = std::make_unique<MetricsRegistry>();
  registry->AddGauge("gone", "Gone.").Set(1);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, registry.get());
  REQUIRE(server.ok());
  REQUIRE(Contains(Get((*server)->port(), "/metrics").body, "gone 1\n"));
  registry.reset();
  HttpResult r = Get((*server)->port(), "/metrics");
  REQUIRE(r.status == 200);
  REQUIRE_FALSE(Contains(r.body, "gone"));
  REQUIRE(Get((*server)->port(), "/healthz").body == "ok\n");
}

}  // namespace
}  // namespace harrier
