// The gRPC transport copies a pushed host payload into a send buffer of
// its own, except for a tensor registered with staging buffers, whose
// payload is lent to gRPC as it is (TensorOptions::staging_buffers). Both
// send the same bytes, so only the transport's counters tell them apart;
// the values after the pushes show that each arrived whole.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/require_ok.h"
#include "testing/server_process.h"
#include "worker/client.h"
#include "worker/transport/grpc/grpc_transport.h"

namespace harrier {
namespace {

struct Moved {
  int64_t copied = 0;
  int64_t lent = 0;
};

// What the process's gRPC transports copied and lent during `push`.
template <typename Push>
Moved CountedPush(Push push) {
  const GrpcSendCounters before = GrpcSendCountersNow();
  push();
  const GrpcSendCounters after = GrpcSendCountersNow();
  return {after.copied_bytes - before.copied_bytes, after.lent_bytes - before.lent_bytes};
}

TEST_CASE("grpc pushes: a caller's buffer is copied, staging buffers are lent") {
  auto servers = testing::StartCluster(2, 1, {"--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.transport = "grpc";
  options.rpc_timeout = absl::Seconds(30);
  options.heartbeat_interval = absl::ZeroDuration();
  options.chunk_bytes = 1u << 20;
  auto client = Client::Create(options);
  REQUIRE_OK(client.status());

  // 6 MB in six 1 MiB chunks over both shards, and one 12 KiB chunk that
  // travels inside its header's slice (counted neither way).
  const size_t n = 1500000;
  const int64_t bytes = static_cast<int64_t>(n * sizeof(float));
  std::vector<float> init(n), grad(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    init[i] = static_cast<float>(i % 101);
    grad[i] = static_cast<float>(i % 7);
  }
  TensorOptions staging;
  staging.staging_buffers = true;
  REQUIRE_OK((*client)->RegisterTensor("plain", {static_cast<int64_t>(n)}, init));
  REQUIRE_OK((*client)->RegisterTensor("staged", {static_cast<int64_t>(n)}, init, staging));
  const std::vector<float> small_grad(3000, 1.0f);
  REQUIRE_OK((*client)->RegisterTensor("small", {3000}, {}, staging));

  absl::Status status;
  const Moved plain = CountedPush([&] { status = (*client)->Push("plain", grad); });
  REQUIRE_OK(status);
  CHECK(plain.copied == bytes);
  CHECK(plain.lent == 0);

  const Moved staged = CountedPush([&] { status = (*client)->Push("staged", grad); });
  REQUIRE_OK(status);
  CHECK(staged.copied == 0);
  CHECK(staged.lent == bytes);

  const Moved small = CountedPush([&] { status = (*client)->Push("small", small_grad); });
  REQUIRE_OK(status);
  CHECK(small.copied == 0);
  CHECK(small.lent == 0);

  (*client)->Clock();
  for (const char* name : {"plain", "staged"}) {
    INFO(name);
    REQUIRE_OK((*client)->Pull(name, absl::MakeSpan(out)));
    for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == init[i] - grad[i]);
  }
  std::vector<float> small_out(3000);
  REQUIRE_OK((*client)->Pull("small", absl::MakeSpan(small_out)));
  CHECK(small_out == std::vector<float>(3000, -1.0f));
}

}  // namespace
}  // namespace harrier
