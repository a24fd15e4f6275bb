#ifndef HARRIER_TESTS_METRICS_HTTP_CLIENT_H_
#define HARRIER_TESTS_METRICS_HTTP_CLIENT_H_

// A tiny HTTP/1.x client for the metrics tests: one request over a fresh
// connection to 127.0.0.1, read until the server closes (the endpoint never
// keeps a connection alive).

#include <string>

namespace harrier {
namespace testing {

struct HttpResult {
  bool ok = false;  // connected, got a status line, and read until EOF within 5 s
  int status = 0;
  std::string headers;  // status line and headers, without the blank line
  std::string body;
};

// A connected socket to 127.0.0.1:port, or -1.
int ConnectLoopback(int port);

// Sends `request` as is and reads the response until the server closes.
HttpResult RawRequest(int port, const std::string& request);

// GET `path` with HTTP/1.1.
HttpResult Get(int port, const std::string& path);

}  // namespace testing
}  // namespace harrier

#endif  // HARRIER_TESTS_METRICS_HTTP_CLIENT_H_
