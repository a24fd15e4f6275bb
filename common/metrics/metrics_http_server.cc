#include "common/metrics/metrics_http_server.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <civetweb.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace harrier {
namespace {

constexpr char kMetricsPath[] = "/metrics";
constexpr char kHealthPath[] = "/healthz";
// Sent for HEAD /metrics (the text format's own name); prometheus-cpp's GET
// handler says "text/plain; charset=utf-8", which scrapers read alike.
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Writes a whole response from civetweb's begin_request callback and
// returns its status, which tells civetweb the request is answered.
int Reply(mg_connection* conn, int status, const std::string& body, bool head_only,
          const char* allow = nullptr) {
  mg_response_header_start(conn, status);
  mg_response_header_add(conn, "Content-Type", "text/plain", -1);
  const std::string length = std::to_string(body.size());
  mg_response_header_add(conn, "Content-Length", length.c_str(), -1);
  if (allow != nullptr) mg_response_header_add(conn, "Allow", allow, -1);
  mg_response_header_send(conn);
  if (!head_only) mg_write(conn, body.data(), body.size());
  return status;
}

// civetweb's begin_request callback: runs on a request thread before any
// handler. It answers everything but GET /metrics, which it leaves to the
// Exposer's handler (0: "not answered here"). Exact paths only: civetweb
// would otherwise hand /metricsx to the /metrics handler.
int Route(mg_connection* conn) {
  const mg_request_info* request = mg_get_request_info(conn);
  const std::string path = request->local_uri != nullptr ? request->local_uri : "";
  const std::string method = request->request_method != nullptr ? request->request_method : "";
  const bool head_only = method == "HEAD";
  if (path != kMetricsPath && path != kHealthPath) {
    return Reply(conn, 404, "not found\n", head_only);
  }
  if (method != "GET" && !head_only) {
    return Reply(conn, 405, "method not allowed\n", false, "GET, HEAD");
  }
  if (path == kHealthPath) return Reply(conn, 200, "ok\n", head_only);
  if (head_only) {
    // The length of a scrape is only known by rendering it; HEAD is for
    // checking that the endpoint is there.
    mg_response_header_start(conn, 200);
    mg_response_header_add(conn, "Content-Type", kMetricsContentType, -1);
    mg_response_header_send(conn);
    return 200;
  }
  return 0;
}

// The same for every server (a constant, not configuration); civetweb
// copies it at start, this only spares relying on that.
const CivetCallbacks& RouteCallbacks() {
  static const CivetCallbacks* const callbacks = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = &Route;
    return c;
  }();
  return *callbacks;
}

// Why `address`:`port` cannot be bound, from the kernel: civetweb reports
// only that starting failed.
std::string BindError(const std::string& address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  std::string why = "civetweb could not start";
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) why = std::strerror(errno);
  ::close(fd);
  return why;
}

// civetweb's accept thread polls its listening socket in 2 s steps and
// looks at the stop flag only between polls, so stopping would take up to
// 2 s. A connection to the socket ends the poll at once.
void WakeAcceptLoop(const std::string& address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) == 1) {
    ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a));  // in progress is enough
  }
  ::close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry) {
  if (registry == nullptr) return absl::InvalidArgumentError("metrics registry is null");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is out of range"));
  }
  // civetweb takes numeric addresses; resolve names here so that an unknown
  // host is INVALID_ARGUMENT, not a failure to bind.
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* addresses = nullptr;
  const int rc =
      ::getaddrinfo(host.empty() ? "0.0.0.0" : host.c_str(), nullptr, &hints, &addresses);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve metrics host '", host,
                                                   "' to an IPv4 address: ", ::gai_strerror(rc)));
  }
  char numeric[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addresses->ai_addr)->sin_addr, numeric,
              sizeof(numeric));
  ::freeaddrinfo(addresses);
  const std::string address = numeric;

  const std::vector<std::string> options = {
      "listening_ports", absl::StrCat(address, ":", port),
      // A scrape and a probe at once; each is answered in microseconds.
      "num_threads", "2",
      // Prometheus' default scrape timeout is 10 s; a request head arrives
      // in one packet, so a client slower than this is stuck or hostile.
      "request_timeout_ms", "5000", "enable_keep_alive", "no"};
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(options, &RouteCallbacks());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", address, ":", port,
                                               ": ", BindError(address, port), " (", e.what(),
                                               ")"));
  } catch (...) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", address, ":", port,
                                               ": ", BindError(address, port)));
  }
  std::vector<int> ports;
  try {
    exposer->RegisterCollectable(registry->collectable(), kMetricsPath);
    ports = exposer->GetListeningPorts();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("metrics endpoint on ", address, ":", port, ": ", e.what()));
  }
  if (ports.empty() || ports[0] <= 0) {
    return absl::InternalError(
        absl::StrCat("metrics endpoint on ", address, ":", port, " reports no listening port"));
  }
  const std::string wake_address = address == "0.0.0.0" ? "127.0.0.1" : address;
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(exposer), wake_address, ports[0]));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<prometheus::Exposer> exposer,
                                     std::string wake_address, int port)
    : wake_address_(std::move(wake_address)), port_(port), exposer_(std::move(exposer)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  absl::MutexLock lock(&mutex_);
  if (exposer_ == nullptr) return;
  std::atomic<bool> stopped{false};
  std::thread waker;
  try {
    waker = std::thread([this, &stopped] {
      while (!stopped.load()) {
        WakeAcceptLoop(wake_address_, port_);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  } catch (const std::exception&) {
    // No thread: stopping still works, in up to 2 s.
  }
  exposer_.reset();
  stopped.store(true);
  if (waker.joinable()) waker.join();
}

}  // namespace harrier
