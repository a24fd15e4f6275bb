// The UCX receive paths move every byte: pushes received eagerly (read in
// place from UCX's receive buffer, or copied out of it) and by rendezvous
// (received straight into the shard's buffer), and the replies back, at
// sizes on both sides of the eager/rendezvous threshold (UCX_RNDV_THRESH is
// pinned to 8 KiB in BUILD) and at 16 MiB. A push refused for a bad
// checksum leaves the parameters exactly as they were, on either path.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/transport/framing.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "tests/transport/raw_ucx_client.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr size_t kMaxBytes = 16u << 20;

// Gradients whose halves (SGD at lr 1 averages over the 2 workers) are exact
// and whose bytes differ everywhere: a misplaced or stale byte shows.
std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> value(-8.0f, 8.0f);
  std::vector<float> g(n);
  for (float& x : g) x = value(random);
  return g;
}

TEST_CASE("UCX pushes and pulls move every byte around the eager/rendezvous threshold") {
  auto servers = testing::StartCluster(1, 2, {"--ucx", "--sync=asp", "--optimizer=sgd", "--lr=1"});
  REQUIRE(servers.ok());
  const std::string address = (*servers)[0]->address();
  ClientOptions options;
  options.servers = {address};
  options.rank = 0;
  options.transport = "ucx";
  options.chunk_bytes = kMaxBytes;  // one chunk per tensor: one frame per size
  options.rpc_timeout = absl::Seconds(30);
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());

  testing::Sessions sessions(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto raw = testing::RawUcxClient::Connect(address);
  INFO(raw.status().ToString());
  REQUIRE(raw.ok());

  // Payload bytes: well below, just below, at and just above 8 KiB (UCX's
  // threshold counts the header too, so a few sizes fall on each side), a
  // multi-fragment rendezvous, and 16 MiB.
  const std::vector<size_t> sizes = {4, 4096, 8000, 8188, 8192, 8196, 8260, 65536, 1u << 20,
                                     kMaxBytes};
  // Every tensor goes through each clock before the client moves on (a
  // tensor's pushes must come clock after clock).
  struct Tensor {
    std::string key;
    size_t n = 0;
    std::vector<float> expected;  // the parameters now
  };
  std::vector<Tensor> tensors;
  for (size_t bytes : sizes) {
    Tensor t{"t" + std::to_string(bytes), bytes / sizeof(float), {}};
    t.expected.assign(t.n, 0.0f);
    REQUIRE((*client)->RegisterTensor(t.key, {static_cast<int64_t>(t.n)}).ok());
    tensors.push_back(std::move(t));
  }
  uint32_t seed = 1;
  // Client push, then pull: params = -g/2 bit for bit.
  for (Tensor& t : tensors) {
    INFO("push, payload bytes " << t.n * sizeof(float));
    const std::vector<float> g = Gradient(t.n, seed++);
    const absl::Status pushed = (*client)->Push(t.key, g);
    INFO(pushed.ToString());
    REQUIRE(pushed.ok());
    for (size_t i = 0; i < t.n; ++i) t.expected[i] -= 0.5f * g[i];
    std::vector<float> pulled(t.n, 99.0f);
    REQUIRE((*client)->Pull(t.key, absl::MakeSpan(pulled)).ok());
    REQUIRE(pulled == t.expected);
  }
  (*client)->Clock();
  // Push-pull: the reply carries the parameters after this push.
  for (Tensor& t : tensors) {
    INFO("push-pull, payload bytes " << t.n * sizeof(float));
    const std::vector<float> g = Gradient(t.n, seed++);
    for (size_t i = 0; i < t.n; ++i) t.expected[i] -= 0.5f * g[i];
    std::vector<float> after(t.n, 99.0f);
    REQUIRE((*client)->PushPull(t.key, g, absl::MakeSpan(after)).ok());
    REQUIRE(after == t.expected);
  }
  (*client)->Clock();
  for (Tensor& t : tensors) {
    const size_t bytes = t.n * sizeof(float);
    INFO("raw push, payload bytes " << bytes);
    // Rank 1 pushes with a checksum off by one: refused, nothing applied.
    const std::vector<float> bad = Gradient(t.n, seed++);
    std::string payload(reinterpret_cast<const char*>(bad.data()), bytes);
    proto::TensorChunk chunk;
    chunk.set_rank(1);
    sessions.Attach(&chunk);
    chunk.set_key(t.key);
    chunk.set_chunk(0);
    chunk.set_num_elements(t.n);
    chunk.set_dtype(proto::DTYPE_FLOAT32);
    chunk.set_checksum(Crc32c(payload.data(), payload.size()) + 1);
    transport::Frame frame;
    frame.op = transport::Op::kPush;
    frame.count = 1;
    frame.payload_bytes = payload.size();
    frame.arg = 20000;
    const absl::Status refused =
        (*raw)->Call(frame, chunk.SerializeAsString(), payload, absl::Seconds(20));
    INFO(refused.ToString());
    REQUIRE(!refused.ok());
    REQUIRE((absl::IsInvalidArgument(refused) || absl::IsDataLoss(refused)));
    std::vector<float> pulled(t.n, 99.0f);
    REQUIRE((*client)->Pull(t.key, absl::MakeSpan(pulled)).ok());
    REQUIRE(pulled == t.expected);

    // The same frame with the right checksum is applied: the refusal was
    // the checksum's, and rank 1's payload arrives intact too.
    chunk.set_checksum(Crc32c(payload.data(), payload.size()));
    const absl::Status applied =
        (*raw)->Call(frame, chunk.SerializeAsString(), payload, absl::Seconds(20));
    INFO(applied.ToString());
    REQUIRE(applied.ok());
    for (size_t i = 0; i < t.n; ++i) t.expected[i] -= 0.5f * bad[i];
    REQUIRE((*client)->Pull(t.key, absl::MakeSpan(pulled)).ok());
    REQUIRE(pulled == t.expected);
  }
}

}  // namespace
}  // namespace harrier
