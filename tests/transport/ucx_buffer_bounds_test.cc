// --max_connection_bytes over UCX, through the real harrier-server: the
// frames of unfinished requests of one connection are bounded together as
// they arrive (before any chunk is validated); the request whose frame
// passes the bound is refused whole and changes nothing, the other is
// applied, and a completed request gives its bytes back.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <memory>
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

constexpr size_t kChunkElements = (1u << 20) / sizeof(float);  // 1 MiB chunks
constexpr uint32_t kChunks = 3;

struct Frame {
  transport::Frame frame;
  std::string header;
  std::string payload;
};

// Chunk `index` of rank 1's push of `value` to `key`, as frame `index` of
// a request of kChunks frames.
Frame PushFrame(testing::Sessions& sessions, const std::string& key, uint32_t index,
                float value) {
  Frame out;
  std::vector<float> gradient(kChunkElements, value);
  out.payload.assign(reinterpret_cast<const char*>(gradient.data()),
                     gradient.size() * sizeof(float));
  proto::TensorChunk chunk;
  chunk.set_rank(1);
  sessions.Attach(&chunk);
  chunk.set_key(key);
  chunk.set_chunk(index);
  chunk.set_num_elements(kChunkElements);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.set_checksum(Crc32c(out.payload.data(), out.payload.size()));
  out.header = chunk.SerializeAsString();
  out.frame.op = transport::Op::kPush;
  out.frame.index = index;
  out.frame.count = kChunks;
  out.frame.payload_bytes = out.payload.size();
  out.frame.arg = 20000;
  return out;
}

// One shard (3 MiB per call, 4 MiB per connection) and rank 0's client,
// which registers and reads the tensors.
struct BoundedShard {
  std::vector<std::unique_ptr<testing::ServerProcess>> servers;
  std::unique_ptr<Client> client;
  std::string address() const { return servers[0]->address(); }
};

BoundedShard StartBoundedShard() {
  BoundedShard shard;
  auto servers = testing::StartCluster(
      1, 2, {"--ucx", "--sync=asp", "--lr=1", "--max_request_bytes=3145728",
             "--max_connection_bytes=4194304"});
  REQUIRE(servers.ok());
  shard.servers = std::move(*servers);
  ClientOptions options;
  options.servers = {shard.address()};
  options.rank = 0;
  options.chunk_bytes = kChunkElements * sizeof(float);
  options.rpc_timeout = absl::Seconds(20);
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  shard.client = std::move(*client);
  return shard;
}

TEST_CASE("--max_connection_bytes bounds the unfinished UCX requests of one connection") {
  // A request is 3 MiB (at --max_request_bytes); the connection may hold
  // 4 MiB. Two requests interleave: A's first two frames (2 MiB), B's first
  // two (4 MiB held), B's third (5 MiB: refused; B is answered once all its
  // frames are in, after giving back its 2 MiB), then A's third (3 MiB).
  BoundedShard shard = StartBoundedShard();
  const std::string address = shard.address();
  Client* client = shard.client.get();
  const int64_t n = kChunks * kChunkElements;
  for (const char* key : {"a", "b"}) REQUIRE(client->RegisterTensor(key, {n}).ok());

  testing::Sessions sessions(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto raw = testing::RawUcxClient::Connect(address);
  INFO(raw.status().ToString());
  REQUIRE(raw.ok());
  std::vector<Frame> a, b;
  for (uint32_t i = 0; i < kChunks; ++i) {
    a.push_back(PushFrame(sessions, "a", i, 2.0f));
    b.push_back(PushFrame(sessions, "b", i, 2.0f));
  }
  for (Frame& f : a) f.frame.request_id = 1001;
  for (Frame& f : b) f.frame.request_id = 1002;
  for (Frame* f : {&a[0], &a[1], &b[0], &b[1], &b[2]}) {
    (*raw)->Send(f->frame, f->header, f->payload);
  }
  const absl::Status refused = (*raw)->Await(1002, absl::Seconds(20));
  // B's answer comes after its bytes were given back; A still holds 2 MiB.
  (*raw)->Send(a[2].frame, a[2].header, a[2].payload);
  const absl::Status applied = (*raw)->Await(1001, absl::Seconds(20));
  INFO("a: " << applied.ToString() << " b: " << refused.ToString());
  REQUIRE(applied.ok());
  REQUIRE(absl::IsResourceExhausted(refused));
  REQUIRE(refused.message().find("--max_connection_bytes") != absl::string_view::npos);

  std::vector<float> a_values(n), b_values(n);
  REQUIRE(client->Pull("a", absl::MakeSpan(a_values)).ok());
  REQUIRE(client->Pull("b", absl::MakeSpan(b_values)).ok());
  REQUIRE(a_values == std::vector<float>(n, -1.0f));  // 2.0 averaged over 2 workers
  REQUIRE(b_values == std::vector<float>(n, 0.0f));   // refused whole

  // Both requests are over: the connection holds nothing, B goes through.
  for (Frame& f : b) f.frame.request_id = 1003;
  for (Frame& f : b) (*raw)->Send(f.frame, f.header, f.payload);
  const absl::Status again = (*raw)->Await(1003, absl::Seconds(20));
  INFO(again.ToString());
  REQUIRE(again.ok());
  REQUIRE(client->Pull("b", absl::MakeSpan(b_values)).ok());
  REQUIRE(b_values == std::vector<float>(n, -1.0f));
}

TEST_CASE("a UCX request body in the data is bounded and counted") {
  // A request may send its body (a sparse call's ids) ahead of its payload
  // in the data. Out-of-bounds bodies are refused; a pull's body counts
  // against --max_connection_bytes (4 MiB here) while it is held.
  BoundedShard shard = StartBoundedShard();
  auto raw = testing::RawUcxClient::Connect(shard.address());
  INFO(raw.status().ToString());
  REQUIRE(raw.ok());
  Frame pull;
  pull.frame.op = transport::Op::kPull;
  pull.frame.body_in_data = true;
  pull.frame.arg = 20000;

  pull.payload = std::string(100, 'x');  // a body small enough for the header
  absl::Status small = (*raw)->Await((*raw)->Send(pull.frame, "", pull.payload), absl::Seconds(20));
  INFO(small.ToString());
  CHECK(absl::IsInvalidArgument(small));

  pull.payload = std::string(5u << 20, 'x');  // over the connection's 4 MiB
  absl::Status large = (*raw)->Await((*raw)->Send(pull.frame, "", pull.payload), absl::Seconds(20));
  INFO(large.ToString());
  CHECK(absl::IsResourceExhausted(large));

  pull.payload = std::string(8192, '\xff');  // in bounds, counted, given back: not a PullRequest
  absl::Status garbled =
      (*raw)->Await((*raw)->Send(pull.frame, "", pull.payload), absl::Seconds(20));
  INFO(garbled.ToString());
  CHECK(absl::IsInvalidArgument(garbled));
  CHECK(garbled.message().find("PullRequest") != absl::string_view::npos);

  // Nothing is left held: a push of 3 MiB on the same connection still
  // fits its 4 MiB.
  const int64_t n = kChunks * kChunkElements;
  REQUIRE(shard.client->RegisterTensor("c", {n}).ok());
  testing::Sessions sessions(
      grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
  std::vector<Frame> c;
  for (uint32_t i = 0; i < kChunks; ++i) c.push_back(PushFrame(sessions, "c", i, 2.0f));
  for (Frame& f : c) f.frame.request_id = 2001;
  for (Frame& f : c) (*raw)->Send(f.frame, f.header, f.payload);
  const absl::Status pushed = (*raw)->Await(2001, absl::Seconds(20));
  INFO(pushed.ToString());
  REQUIRE(pushed.ok());
}

TEST_CASE("a UCX call whose frames stop coming is refused at its deadline and gives its bytes back") {
  // The connection may hold 4 MiB; a call sends 2 of its 3 MiB and stalls
  // (a client that died over shared memory looks the same to the shard).
  BoundedShard shard = StartBoundedShard();
  const std::string address = shard.address();
  Client* client = shard.client.get();
  const int64_t n = kChunks * kChunkElements;
  REQUIRE(client->RegisterTensor("a", {n}).ok());

  testing::Sessions sessions(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto raw = testing::RawUcxClient::Connect(address);
  REQUIRE(raw.ok());
  std::vector<Frame> stalled;
  for (uint32_t i = 0; i < kChunks; ++i) {
    stalled.push_back(PushFrame(sessions, "a", i, 2.0f));
    stalled.back().frame.request_id = 2001;
    stalled.back().frame.arg = 300;  // the call's timeout, ms
  }
  const absl::Time sent = absl::Now();
  (*raw)->Send(stalled[0].frame, stalled[0].header, stalled[0].payload);
  (*raw)->Send(stalled[1].frame, stalled[1].header, stalled[1].payload);
  const absl::Status refused = (*raw)->Await(2001, absl::Seconds(15));
  const absl::Duration took = absl::Now() - sent;
  INFO(refused.ToString() << " after " << took);
  REQUIRE(absl::IsDeadlineExceeded(refused));
  // The shard's answer, not the local wait's: it says what arrived.
  REQUIRE(refused.message().find("only 2 of the call's 3 chunks") != absl::string_view::npos);
  REQUIRE(took < absl::Seconds(10));  // the call's 300 ms, not the 15 s local wait

  // Nothing applied, and the 2 MiB are free again: a whole 3 MiB call on
  // the same connection fits the 4 MiB bound and is applied.
  std::vector<float> values(n);
  REQUIRE(client->Pull("a", absl::MakeSpan(values)).ok());
  REQUIRE(values == std::vector<float>(n, 0.0f));
  std::vector<Frame> whole;
  for (uint32_t i = 0; i < kChunks; ++i) {
    whole.push_back(PushFrame(sessions, "a", i, 2.0f));
    whole.back().frame.request_id = 2002;
  }
  for (Frame& f : whole) (*raw)->Send(f.frame, f.header, f.payload);
  const absl::Status applied = (*raw)->Await(2002, absl::Seconds(20));
  INFO(applied.ToString());
  REQUIRE(applied.ok());
  REQUIRE(client->Pull("a", absl::MakeSpan(values)).ok());
  REQUIRE(values == std::vector<float>(n, -1.0f));
}

}  // namespace
}  // namespace harrier
