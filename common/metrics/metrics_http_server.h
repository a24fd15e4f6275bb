#ifndef HARRIER_COMMON_METRICS_METRICS_HTTP_SERVER_H_
#define HARRIER_COMMON_METRICS_METRICS_HTTP_SERVER_H_

// The HTTP endpoint for Prometheus scrapes and liveness probes, served by
// prometheus-cpp's Exposer (civetweb underneath):
//   GET /metrics  -> 200, text/plain, the registry's families (gzip when
//                    the scraper accepts it); HEAD -> 200 without a body
//   GET /healthz  -> 200, text/plain, "ok\n"; HEAD -> 200 without a body
//   other paths   -> 404; other methods -> 405 (Allow: GET, HEAD);
//   malformed requests -> 400 (civetweb).
// Every response closes the connection (no keep-alive).
//
// Threads: civetweb's (two request threads and an accept thread). Registry
// callbacks run on a request thread. A client that sends nothing is
// dropped after a few seconds.
//
// Exceptions from prometheus-cpp and civetweb (bind failures) stay inside:
// every error comes back as an absl::Status.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace harrier {

class MetricsHttpServer {
 public:
  // Listens on host:port and starts serving. Port 0 picks a free port;
  // host "" or "0.0.0.0" means every IPv4 interface; a name is resolved to
  // its first IPv4 address (Debian's civetweb is built without IPv6).
  // `registry` is not owned; its metrics are served while it lives.
  // INVALID_ARGUMENT for a null registry, an unresolvable or IPv6-only host
  // or a port out of range; UNAVAILABLE when the address cannot be bound
  // (e.g. in use).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  const MetricsRegistry* registry);

  // Stops the server (see Stop).
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the chosen one when started with port 0).
  int port() const { return port_; }

  // Closes the listening socket and joins civetweb's threads; when it
  // returns the port can be bound again. Takes tens of milliseconds, up to
  // about 2 s while a client holds a connection open without finishing its
  // request (civetweb checks for stop between 2 s polls of a connection).
  // Idempotent; thread-safe; must not be called from a registry callback
  // (it would wait for itself).
  void Stop();

 private:
  MetricsHttpServer(std::unique_ptr<prometheus::Exposer> exposer, std::string wake_address,
                    int port);

  const std::string wake_address_;  // numeric IPv4 address a client reaches us on
  const int port_;
  absl::Mutex mutex_;
  std::unique_ptr<prometheus::Exposer> exposer_ ABSL_GUARDED_BY(mutex_);  // null once stopped
};

}  // namespace harrier

#endif  // HARRIER_COMMON_METRICS_METRICS_HTTP_SERVER_H_
