#ifndef HARRIER_COMMON_METRICS_METRICS_HTTP_SERVER_H_
#define HARRIER_COMMON_METRICS_METRICS_HTTP_SERVER_H_

// A minimal HTTP/1.1 endpoint for Prometheus scrapes and liveness probes:
//   GET /metrics  -> 200, text/plain; version=0.0.4, the registry's text
//   GET /healthz  -> 200, "ok"
//   other paths   -> 404; other methods -> 405; malformed requests -> 400.
// HEAD is answered like GET without a body. Every response closes the
// connection (no keep-alive), which scrapers handle and which keeps the
// server a single thread with no per-connection state.
//
// One background thread accepts and answers one connection at a time.
// Each connection has a deadline (a few seconds), so a client that sends
// nothing cannot hold the endpoint for longer than that, and Stop() wakes
// the thread at once through a pipe rather than waiting for a poll timeout.
// Scrapes are rare (seconds apart) and renders take microseconds, so
// serving them one after another costs nothing.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace harrier {

class MetricsHttpServer {
 public:
  // Listens on host:port (port 0 picks a free port; host "" or "0.0.0.0"
  // means every IPv4 interface, "::" every IPv6 one) and starts the serving
  // thread. `registry` is not owned and must outlive the server.
  // INVALID_ARGUMENT for an unresolvable host or a port out of range,
  // UNAVAILABLE when the address cannot be bound (e.g. in use).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  const MetricsRegistry* registry);

  // Stops and joins the thread.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the chosen one when started with port 0).
  int port() const { return port_; }

  // Closes the listening socket and joins the thread; a request in progress
  // is abandoned. Idempotent; thread-safe; must not be called from a
  // registry callback (it would wait for itself).
  void Stop();

 private:
  MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                    const MetricsRegistry* registry);

  void Serve();
  void HandleConnection(int fd);
  // The HTTP response for one request head (request line and headers).
  std::string Respond(const std::string& head) const;

  const int listen_fd_;
  const int wake_read_fd_;  // readable once Stop() is called
  const int wake_write_fd_;
  const int port_;
  const MetricsRegistry* const registry_;
  std::mutex stop_mutex_;  // serialises Stop(); guards stopped_
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_METRICS_METRICS_HTTP_SERVER_H_
