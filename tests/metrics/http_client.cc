#include "tests/metrics/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

namespace harrier {
namespace testing {

int ConnectLoopback(int port) {
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

HttpResult RawRequest(int port, const std::string& request) {
  HttpResult result;
  const int fd = ConnectLoopback(port);
  if (fd < 0) return result;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer (400) before reading it all
    sent += static_cast<size_t>(n);
  }
  std::string response;
  bool eof = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, 100) == 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      eof = n == 0 || !response.empty();  // a reset after a whole answer still counts
      break;
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t split = response.find("\r\n\r\n");
  const size_t space = response.find(' ');
  if (!eof || split == std::string::npos || response.rfind("HTTP/", 0) != 0 ||
      space == std::string::npos || space > split) {
    return result;
  }
  result.ok = true;
  result.status = std::atoi(response.c_str() + space + 1);
  result.headers = response.substr(0, split);
  result.body = response.substr(split + 4);
  return result;
}

HttpResult Get(int port, const std::string& path) {
  return RawRequest(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
}

}  // namespace testing
}  // namespace harrier
