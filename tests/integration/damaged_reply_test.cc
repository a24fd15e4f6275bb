// A pull reply damaged on the wire between harrier-server and the client:
// a proxy flips one bit deep inside a large pull's payload. Over gRPC and
// over the tcp data path (where the client takes the payload's CRC as the
// bytes arrive, and may receive them straight into the caller's staging
// buffer), the pull fails with DATA_LOSS instead of handing back damaged
// parameters, and the next pull is exact. The same for a sparse table's
// rows.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "testing/server_process.h"
#include "tests/integration/fault_proxy.h"
#include "tests/slowdown.h"
#include "worker/client.h"

namespace harrier {
namespace {

// 8 MiB, so the flipped byte lies in a payload several chunks (1 MiB each)
// and many reads (at most 256 KiB each over tcp) in.
constexpr size_t kElements = size_t{2} << 20;
constexpr size_t kChunkBytes = size_t{1} << 20;
// Where on its connection the shard's reply byte is flipped: past the
// hello and registration replies, inside the pull's payload.
constexpr int64_t kFlipAt = (int64_t{5} << 20) + 333;

// One shard with a FaultProxy in front of the port the data travels on:
// the gRPC port, or the tcp data path (which the shard then hands out as
// its address); and the options of a client whose data passes the proxy.
struct ProxiedShard {
  std::unique_ptr<testing::FaultProxy> proxy;
  std::unique_ptr<testing::ServerProcess> server;
  ClientOptions options;
};

ProxiedShard StartProxiedShard(const std::string& transport, uint64_t seed) {
  ProxiedShard shard;
  const int proxied_port = testing::FreePort();
  auto proxy = testing::FaultProxy::Start(proxied_port, seed);
  REQUIRE(proxy.ok());
  shard.proxy = std::move(*proxy);
  std::vector<std::string> flags = {"--shard=0", "--num_shards=1", "--num_workers=1", "--sync=asp",
                                    "--lr=1"};
  if (transport == "tcp") {
    flags.push_back(absl::StrCat("--tcp_port=", proxied_port));
    flags.push_back("--tcp_advertise=" + shard.proxy->address());
  } else {
    flags.push_back(absl::StrCat("--port=", proxied_port));
  }
  auto server = testing::ServerProcess::Start(flags);
  REQUIRE(server.ok());
  shard.server = std::move(*server);
  shard.options.servers = {transport == "tcp" ? shard.server->address() : shard.proxy->address()};
  shard.options.transport = transport;
  shard.options.rpc_timeout = absl::Seconds(20 * testing::SlowdownFactor());
  shard.options.retry_timeout = absl::Seconds(20 * testing::SlowdownFactor());
  return shard;
}

TEST_CASE("a pull reply damaged on the wire fails the pull with DATA_LOSS; the next is exact") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  const bool staging = GENERATE(false, true);
  INFO("transport " << transport << ", staging buffers " << staging);

  ProxiedShard shard = StartProxiedShard(transport, /*seed=*/20261207);
  testing::FaultProxy* proxy = shard.proxy.get();
  ClientOptions options = shard.options;
  options.chunk_bytes = kChunkBytes;
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  std::vector<float> initial(kElements);
  for (size_t i = 0; i < kElements; ++i) initial[i] = static_cast<float>(i % 1000) * 0.5f;
  TensorOptions tensor;
  tensor.staging_buffers = staging;
  REQUIRE((*client)->RegisterTensor("w", {static_cast<int64_t>(kElements)}, initial, tensor).ok());

  // Each connection's stream counts from its start: the first large pull on
  // a fresh data connection meets the flip.
  proxy->SetFlipReplyByte(kFlipAt);
  std::vector<float> out(kElements, -1.0f);
  absl::Status damaged = (*client)->Pull("w", absl::MakeSpan(out));
  proxy->SetFlipReplyByte(-1);
  CHECK(proxy->reply_flips() >= 1);
  CHECK(absl::IsDataLoss(damaged));
  CHECK_THAT(std::string(damaged.message()), Catch::Contains("checksum mismatch"));

  std::fill(out.begin(), out.end(), -1.0f);
  REQUIRE((*client)->Pull("w", absl::MakeSpan(out)).ok());
  CHECK(out == initial);
}

TEST_CASE("a sparse table's rows damaged on the wire fail the pull with DATA_LOSS") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  INFO("transport " << transport);
  ProxiedShard shard = StartProxiedShard(transport, /*seed=*/20261208);
  testing::FaultProxy* proxy = shard.proxy.get();

  // 40000 rows of 64 floats: a reply of about 10 MB, so the flipped byte
  // lies inside the rows.
  constexpr int64_t kRows = 40000;
  constexpr int64_t kDim = 64;
  SparseTableOptions table;
  table.dim = kDim;
  table.seed = 7;
  table.init_scale = 1.0f;
  std::vector<int64_t> ids(kRows);
  for (int64_t i = 0; i < kRows; ++i) ids[i] = i * 7919;

  auto client = Client::Create(shard.options);
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterSparseTable("emb", table).ok());

  // A first pull, whole, is what the rows are; the flip then lands in the
  // second pull's rows, about 10 MB further on the same connection.
  std::vector<float> expected(kRows * kDim, 0.0f);
  REQUIRE((*client)->PullRows("emb", ids, absl::MakeSpan(expected)).ok());
  proxy->SetFlipReplyByte((int64_t{15} << 20) + 333);
  std::vector<float> out(kRows * kDim, -1.0f);
  absl::Status damaged = (*client)->PullRows("emb", ids, absl::MakeSpan(out));
  proxy->SetFlipReplyByte(-1);
  CHECK(proxy->reply_flips() >= 1);
  CHECK(absl::IsDataLoss(damaged));
  CHECK_THAT(std::string(damaged.message()), Catch::Contains("checksum mismatch"));

  std::fill(out.begin(), out.end(), -1.0f);
  REQUIRE((*client)->PullRows("emb", ids, absl::MakeSpan(out)).ok());
  CHECK(out == expected);
}

}  // namespace
}  // namespace harrier
