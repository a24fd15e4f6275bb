// The tcp data path's stream framing (common/transport/stream.h) on real
// loopback sockets: the prefix and its bounds, and connecting past an
// address that never answers.
#include "common/transport/stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"

namespace harrier::transport {
namespace {

TEST_CASE("a stream message's prefix is its header's length, checked against the bound") {
  Frame frame;
  frame.op = Op::kHello;
  const std::string message = EncodeStreamHeader(frame, "hello body");
  const std::string header = EncodeHeader(frame, "hello body");
  REQUIRE(message.size() == kStreamPrefixBytes + header.size());
  REQUIRE(message == PrefixStreamHeader(header));
  REQUIRE(message.substr(kStreamPrefixBytes) == header);
  auto length = DecodeStreamPrefix(message.data(), kMaxHelloHeaderBytes);
  REQUIRE(length.ok());
  REQUIRE(*length == header.size());
  // One byte over the bound, and a header shorter than a frame: refused.
  CHECK(absl::IsInvalidArgument(DecodeStreamPrefix(message.data(), header.size() - 1).status()));
  const std::string short_prefix = PrefixStreamHeader(std::string(kFrameBytes - 1, 'x'));
  CHECK(absl::IsInvalidArgument(
      DecodeStreamPrefix(short_prefix.data(), kMaxStreamHeaderBytes).status()));
}

TEST_CASE("the congestion control set is the first of the list the kernel allows") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  auto current = [fd] {
    char name[32] = {};
    socklen_t length = sizeof(name);
    REQUIRE(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &length) == 0);
    return std::string(name);
  };
  const std::string kernel_default = current();
  // Nothing asked: the kernel's default stays.
  CHECK(SetCongestionControl(fd, "").empty());
  CHECK(current() == kernel_default);
  // Names the kernel does not have are passed over; reno is always there.
  CHECK(SetCongestionControl(fd, "no-such-cc").empty());
  CHECK(current() == kernel_default);
  CHECK(SetCongestionControl(fd, "no-such-cc, reno") == "reno");
  CHECK(current() == "reno");
  close(fd);
}

// A listening socket on 127.0.0.1 and its address.
struct Listener {
  int fd = -1;
  StreamAddress address;
  explicit Listener(int backlog) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in bound = {};
    bound.sin_family = AF_INET;
    bound.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<struct sockaddr*>(&bound), sizeof(bound)) == 0);
    REQUIRE(listen(fd, backlog) == 0);
    socklen_t length = sizeof(bound);
    REQUIRE(getsockname(fd, reinterpret_cast<struct sockaddr*>(&bound), &length) == 0);
    std::memcpy(&address.address, &bound, sizeof(bound));
    address.length = sizeof(bound);
  }
  ~Listener() { close(fd); }
};

TEST_CASE("connecting goes on to the next address when one never answers") {
  // A backlog of 0 that one connection fills: the kernel drops the SYNs of
  // any further connect to it, which then waits, as to a host that is gone.
  Listener silent(0);
  std::vector<int> fillers;
  for (int i = 0; i < 2; ++i) {
    auto filler = ConnectToAny({silent.address}, "filler", absl::Now() + absl::Milliseconds(300));
    if (filler.ok()) fillers.push_back(*filler);
  }
  REQUIRE_FALSE(fillers.empty());
  auto stuck = ConnectToAny({silent.address}, "silent", absl::Now() + absl::Milliseconds(500));
  if (stuck.ok()) {
    close(*stuck);
    for (int fd : fillers) close(fd);
    WARN("SKIPPED: this kernel completes connects past a full backlog");
    return;
  }
  REQUIRE(absl::IsUnavailable(stuck.status()));

  Listener live(16);
  // The silent address gets half the time (3 s), not all of it: the live
  // one is reached before the deadline.
  auto connected =
      ConnectToAny({silent.address, live.address}, "two addresses", absl::Now() + absl::Seconds(6));
  INFO(connected.status().ToString());
  REQUIRE(connected.ok());
  struct sockaddr_in peer = {};
  socklen_t length = sizeof(peer);
  REQUIRE(getpeername(*connected, reinterpret_cast<struct sockaddr*>(&peer), &length) == 0);
  CHECK(peer.sin_port == reinterpret_cast<struct sockaddr_in*>(&live.address.address)->sin_port);
  close(*connected);
  for (int fd : fillers) close(fd);
}

TEST_CASE("a name is resolved and every address it names is tried") {
  Listener live(16);
  const int port = ntohs(reinterpret_cast<struct sockaddr_in*>(&live.address.address)->sin_port);
  auto connected =
      ConnectStream("127.0.0.1:" + std::to_string(port), absl::Now() + absl::Seconds(5));
  REQUIRE(connected.ok());
  close(*connected);
  CHECK(absl::IsInvalidArgument(ConnectStream("no-port", absl::Now()).status()));
  CHECK(absl::IsInvalidArgument(ConnectStream("127.0.0.1:0", absl::Now()).status()));
}

}  // namespace
}  // namespace harrier::transport
