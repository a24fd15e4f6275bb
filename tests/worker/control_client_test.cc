#include "worker/control_client.h"

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "worker/fake_control_client.h"

namespace harrier {
namespace {

TEST_CASE("a shard that does not accept connections is named in the error") {
  // Port 1 on loopback: nothing listens there.
  auto client =
      GrpcControlClient::Connect({"127.0.0.1:1"}, absl::Milliseconds(200), absl::Seconds(1));
  REQUIRE(absl::IsUnavailable(client.status()));
  CHECK(client.status().message().find("shard 0 (127.0.0.1:1)") != absl::string_view::npos);
}

TEST_CASE("the heartbeat loop tells every shard, each interval, until destroyed") {
  FakeControlClient control(3);
  int64_t clock = 7;
  {
    HeartbeatLoop loop(control, absl::Milliseconds(10), [&clock](int) {
      proto::HeartbeatRequest request;
      request.set_clock(clock);
      return request;
    });
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (control.requests().shard_heartbeats.size() < 9 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  const auto beats = control.requests().shard_heartbeats;
  REQUIRE(beats.size() >= 9);
  for (size_t i = 0; i < 9; ++i) {
    CHECK(beats[i].first == static_cast<int>(i % 3));
    CHECK(beats[i].second.clock() == 7);
  }
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(control.requests().shard_heartbeats.size() == beats.size());  // stopped
}

}  // namespace
}  // namespace harrier
