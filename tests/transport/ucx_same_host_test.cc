// Without UCX_TLS, a peer on this host is reached over shared memory (error
// mode NONE: no failure detection) and any other over a network transport
// (PEER); a UCX_TLS the user set wins.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/transport/ucx_worker.h"

namespace harrier::transport {
namespace {

void OnError(void*, ucp_ep_h, ucs_status_t) {}

// Connects `from` to `address` on its progress thread; whether the
// endpoint detects peer failure (PEER) or not (NONE, shared memory).
bool DetectsFailure(UcxWorker& from, const std::string& address) {
  absl::Notification done;
  bool detects = false;
  bool connected = false;
  from.Post([&] {
    auto ep = from.Connect(address, &OnError, nullptr, &detects);
    connected = ep.ok();
    if (ep.ok()) from.CloseEndpoint(*ep);
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  REQUIRE(connected);
  return detects;
}

TEST_CASE("a same-host peer gets shared memory unless the user chose UCX_TLS") {
  SECTION("UCX_TLS unset") {
    unsetenv("UCX_TLS");
    auto a = UcxWorker::Start("a", {});
    auto b = UcxWorker::Start("b", {});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    // This host: shared memory, no PEER error handling.
    CHECK_FALSE(DetectsFailure(**a, (*b)->address()));
    // The same address naming another host (the trailer's host id is the
    // 16 bytes before its last 8): a network transport with PEER.
    std::string elsewhere = (*b)->address();
    elsewhere[elsewhere.size() - 9] ^= 0x5a;
    CHECK(DetectsFailure(**a, elsewhere));
  }
  SECTION("UCX_TLS=tcp wins") {
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    auto a = UcxWorker::Start("a", {});
    auto b = UcxWorker::Start("b", {});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(DetectsFailure(**a, (*b)->address()));
    unsetenv("UCX_TLS");
    unsetenv("UCX_NET_DEVICES");
  }
}

}  // namespace
}  // namespace harrier::transport
