// A shard's data path that moves to a second backend once the shard
// withdraws the first (FallbackShardTransport, what "auto" wraps tcp in):
// calls go to the first until it is withdrawn, then every call, from any
// thread, to one second backend made once; data_path() says which.
#include "worker/transport/fallback_transport.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "worker/transport/fake/fake_transport.h"

namespace harrier {
namespace {

// A fake that names its path (the fake's own traits always say "fake").
class NamedFake : public FakeShardTransport {
 public:
  explicit NamedFake(std::string path) : path_(std::move(path)) {}
  std::string data_path() const override { return path_; }

 private:
  const std::string path_;
};

std::unique_ptr<NamedFake> Fake(const std::string& path) {
  return std::make_unique<NamedFake>(path);
}

std::vector<OutgoingChunk> OneChunk() {
  OutgoingChunk chunk;
  chunk.header.set_key("w");
  chunk.owned = std::string(16, '\0');
  chunk.header.set_num_elements(4);
  return {chunk};
}

// Free of Catch2's assertions, which are not thread-safe: called from
// several threads at once.
absl::Status PushThrough(ShardTransport& transport) {
  CallCanceller canceller;
  absl::Notification done;
  absl::Status result;
  transport.StartPush(OneChunk(), absl::Now() + absl::Seconds(10), canceller,
                      [&](absl::Status status) {
                        result = std::move(status);
                        done.Notify();
                      });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    return absl::DeadlineExceededError("the push did not complete");
  }
  return result;
}

TEST_CASE("calls take the first backend until the shard withdraws it, then one second backend") {
  auto primary_owned = Fake("tcp");
  NamedFake* primary = primary_owned.get();
  std::atomic<bool> withdrawn{false};
  std::atomic<int> made{0};
  std::atomic<NamedFake*> fallback{nullptr};
  FallbackShardTransport transport(
      "shard 0", std::move(primary_owned), [&] { return withdrawn.load(); },
      [&]() -> std::unique_ptr<ShardTransport> {
        ++made;
        auto second = Fake("grpc");
        fallback = second.get();
        return second;
      });
  CHECK(transport.data_path() == "tcp");

  REQUIRE(PushThrough(transport).ok());
  REQUIRE(PushThrough(transport).ok());
  CHECK(primary->num_calls() == 2);
  CHECK(made == 0);

  withdrawn = true;
  // Many threads at once after the withdrawal: one second backend.
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        if (!PushThrough(transport).ok()) ++failed;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(failed == 0);
  CHECK(made == 1);
  CHECK(primary->num_calls() == 2);
  REQUIRE(fallback.load() != nullptr);
  CHECK(fallback.load()->num_calls() == 20);
  CHECK(transport.data_path() == "grpc");
  // For good: the first backend is not taken back.
  withdrawn = false;
  REQUIRE(PushThrough(transport).ok());
  CHECK(fallback.load()->num_calls() == 21);
}

}  // namespace
}  // namespace harrier
