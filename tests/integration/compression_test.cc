// Compressed pushes through a real server: the shard decodes and aggregates
// each codec correctly, votes for sign codecs, and refuses hostile payloads
// without changing anything.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <thread>

#include "common/codec/codec.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr size_t kElements = 8192;  // 32 KiB: above the default compress_min_bytes

// A client of `servers` with `options` (their addresses filled in) that has
// registered "w", kElements floats.
std::unique_ptr<Client> ConnectWith(
    const std::vector<std::unique_ptr<testing::ServerProcess>>& servers, ClientOptions options) {
  options.servers = testing::Addresses(servers);
  options.rpc_timeout = absl::Seconds(20);
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterTensor("w", {static_cast<int64_t>(kElements)}).ok());
  return std::move(*client);
}

std::unique_ptr<Client> Connect(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers,
                                int rank, const std::string& codec) {
  ClientOptions options;
  options.rank = rank;
  options.codec = codec;
  return ConnectWith(servers, options);
}

TEST_CASE("top-k push: the shard applies exactly the k largest entries") {
  auto servers = testing::StartCluster(1, 1, {"--lr=1"});
  REQUIRE(servers.ok());
  auto client = Connect(*servers, 0, "topk:ratio=0.01");  // k = round(0.01 * 8192) = 82
  std::vector<float> grad(kElements, 0.5f), w(kElements);
  for (size_t i = 0; i < 82; ++i) grad[i * 100] = 10.0f + static_cast<float>(i);
  REQUIRE(client->Push("w", grad).ok());
  client->Clock();
  REQUIRE(client->Pull("w", absl::MakeSpan(w)).ok());
  for (size_t i = 0; i < kElements; ++i) {
    const float expected = (i % 100 == 0 && i / 100 < 82) ? -(10.0f + i / 100) : 0.0f;
    REQUIRE(w[i] == expected);
  }
  REQUIRE(client->stats().bytes_pushed < kElements * sizeof(float) / 10);
}

TEST_CASE("sign pushes are aggregated by majority vote, never averaged") {
  auto servers = testing::StartCluster(1, 3, {"--lr=1", "--sync=bsp"});
  REQUIRE(servers.ok());
  std::vector<std::thread> threads;
  std::vector<bool> ok(3, false);
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      auto client = Connect(*servers, rank, "sign");
      // Element 0: votes +,+,- -> +1; element 1: -,-,+ -> -1.
      std::vector<float> grad(kElements, 1.0f);
      grad[0] = rank == 2 ? -3.0f : 0.1f;
      grad[1] = rank == 2 ? 5.0f : -0.2f;
      ok[rank] = client->Push("w", grad).ok();
    });
  }
  for (auto& thread : threads) thread.join();
  REQUIRE(ok == std::vector<bool>{true, true, true});
  auto reader = Connect(*servers, 0, "none");
  reader->Clock();
  std::vector<float> w(kElements);
  REQUIRE(reader->Pull("w", absl::MakeSpan(w)).ok());
  REQUIRE(w[0] == -1.0f);  // an average of signs would give -1/3
  REQUIRE(w[1] == 1.0f);
  REQUIRE(w[2] == -1.0f);
}

TEST_CASE("compressed pulls rebuild the parameters exactly over a few pulls") {
  auto servers = testing::StartCluster(2, 1, {"--lr=1", "--sync=asp"});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.pull_codec = "topk:ratio=0.25";
  auto client = ConnectWith(*servers, options);
  std::vector<float> w(kElements), grad(kElements);
  REQUIRE(client->Pull("w", absl::MakeSpan(w)).ok());  // dense: the view starts
  const uint64_t dense_bytes = client->stats().bytes_pulled;
  REQUIRE(dense_bytes == kElements * sizeof(float));
  for (size_t i = 0; i < kElements; ++i) grad[i] = static_cast<float>(i % 13) - 6.0f;
  REQUIRE(client->Push("w", grad).ok());
  // Top 25 % of the difference per pull: four pulls carry all of it.
  for (int pull = 0; pull < 4; ++pull) REQUIRE(client->Pull("w", absl::MakeSpan(w)).ok());
  for (size_t i = 0; i < kElements; ++i) REQUIRE(w[i] == -grad[i]);
  const uint64_t compressed_bytes = client->stats().bytes_pulled - dense_bytes;
  REQUIRE(compressed_bytes < 4 * kElements * sizeof(float) * 6 / 10);
}

TEST_CASE("one codec setting compresses both directions: pull_codec paired") {
  auto servers = testing::StartCluster(2, 1, {"--lr=1", "--sync=asp"});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.codec = "topk:ratio=0.25";
  options.pull_codec = "paired";
  auto client = ConnectWith(*servers, options);
  // A tensor with a codec of its own pulls with that codec's pair.
  TensorOptions fp16;
  fp16.codec = "fp16";
  REQUIRE(client->RegisterTensor("h", {static_cast<int64_t>(kElements)}, {}, fp16).ok());
  std::vector<float> w(kElements), h(kElements), grad(kElements);
  REQUIRE(client->Pull("w", absl::MakeSpan(w)).ok());  // dense: the view starts
  REQUIRE(client->Pull("h", absl::MakeSpan(h)).ok());
  uint64_t pulled = client->stats().bytes_pulled;
  REQUIRE(pulled == 2 * kElements * sizeof(float));
  // Every element differs, and top-k pushes only a quarter of each chunk a
  // step: push eighths one by one so the shard holds all of -grad.
  for (size_t i = 0; i < kElements; ++i) grad[i] = static_cast<float>(i % 13) - 6.5f;
  for (int eighth = 0; eighth < 8; ++eighth) {
    std::vector<float> part(kElements, 0.0f);
    for (size_t i = eighth * kElements / 8; i < (eighth + 1) * kElements / 8; ++i) {
      part[i] = grad[i];
    }
    REQUIRE(client->Push("w", part).ok());
    REQUIRE(client->Push("h", part).ok());
    client->Clock();  // a push per clock: a second one would be a retry
  }
  // w's pulls are top-k of 25 % (a quarter of the change a pull, 8 bytes an
  // element, a 24-byte header a chunk), and four carry all of it.
  for (int pull = 0; pull < 4; ++pull) {
    REQUIRE(client->Pull("w", absl::MakeSpan(w)).ok());
    const uint64_t now = client->stats().bytes_pulled;
    REQUIRE(now - pulled >= 8 * kElements / 4);
    REQUIRE(now - pulled <= 8 * kElements / 4 + 2 * 24);
    pulled = now;
  }
  for (size_t i = 0; i < kElements; ++i) REQUIRE(w[i] == -grad[i]);
  // h's pulls are fp16, 2 bytes an element: the halves of -grad are exact.
  REQUIRE(client->Pull("h", absl::MakeSpan(h)).ok());
  REQUIRE(client->stats().bytes_pulled - pulled >= 2 * kElements);
  REQUIRE(client->stats().bytes_pulled - pulled <= 2 * kElements + 2 * 24);
  for (size_t i = 0; i < kElements; ++i) REQUIRE(h[i] == -grad[i]);
}

TEST_CASE("hostile compressed payloads are refused and change nothing") {
  // Rank 0 is the client; the hostile pushes come from rank 1 with a valid
  // session, so it is their payloads that are refused. ASP: rank 0's pull
  // does not wait for rank 1.
  auto servers = testing::StartCluster(1, 2, {"--lr=1", "--sync=asp"});
  REQUIRE(servers.ok());
  auto client = Connect(*servers, 0, "none");
  auto channel = grpc::CreateCustomChannel((*servers)[0]->address(),
                                           grpc::InsecureChannelCredentials(),
                                           MakeChannelArguments());
  auto stub = proto::ParameterService::NewStub(channel);
  testing::Sessions sessions(channel);
  auto spec = CodecSpec::Parse("topk:ratio=0.01");
  REQUIRE(spec.ok());
  auto codec = CreateCodec(*spec);
  REQUIRE(codec.ok());
  std::vector<float> grad(kElements, 1.0f);
  std::string payload;
  REQUIRE((*codec)->Encode(grad, CodecContext{}, &payload).ok());

  auto push = [&](const std::string& bytes, const std::string& params) {
    proto::TensorChunk chunk;
    chunk.set_rank(1);
    sessions.Attach(&chunk);
    chunk.set_key("w");
    chunk.set_num_elements(kElements);
    chunk.set_dtype(proto::DTYPE_FLOAT32);
    chunk.set_codec(static_cast<uint32_t>(CodecId::kTopK));
    chunk.set_codec_params(params);
    chunk.set_payload(bytes);
    chunk.set_checksum(Crc32c(bytes.data(), bytes.size()));
    grpc::ClientContext context;
    proto::PushResponse response;
    auto writer = stub->Push(&context, &response);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  };
  std::string truncated = payload.substr(0, payload.size() - 5);
  std::string out_of_range = payload;
  // The first index sits right after the 24-byte header: point it past d.
  const uint32_t huge = kElements + 7;
  std::memcpy(&out_of_range[HeaderBytes()], &huge, sizeof(huge));
  std::string nan_value = payload;
  const float nan = std::nanf("");
  std::memcpy(&nan_value[nan_value.size() - sizeof(float)], &nan, sizeof(nan));

  for (const auto& [name, bytes, params] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"truncated", truncated, "topk:ratio=0.01"},
           {"index out of range", out_of_range, "topk:ratio=0.01"},
           {"NaN value", nan_value, "topk:ratio=0.01"},
           {"unknown codec spec", payload, "zip:level=9"},
           {"spec of another codec", payload, "qsgd"}}) {
    INFO(name);
    auto status = push(bytes, params);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(status.error_message().find("'w'") != std::string::npos);
  }
  std::vector<float> w(kElements, 42.0f);
  REQUIRE(client->Pull("w", absl::MakeSpan(w)).ok());
  for (float value : w) REQUIRE(value == 0.0f);
  // The shard still serves: the untouched payload applies.
  REQUIRE(push(payload, "topk:ratio=0.01").ok());
}

}  // namespace
}  // namespace harrier
