// ChunkCodec over codec backends: device tensors' chunks are encoded, staged
// and decoded by the device backend (a counting fake on host memory), host
// tensors' by the host one; PowerSGD factors a chunk on the layer's own
// matrix shape and leaves 1-D tensors dense; a device tensor without a
// device backend is refused before anything is registered.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/codec/codec.h"
#include "common/crc32c.h"
#include "common/partitioner.h"
#include "tests/worker/counting_backends.h"
#include "tests/worker/fake_cluster.h"
#include "worker/chunk_codec.h"
#include "worker/client.h"
#include "worker/fake_control_client.h"
#include "worker/tensor_table.h"
#include "worker/transport/fake/fake_transport.h"

namespace harrier {
namespace {

TensorInfo Plan(const std::string& name, const std::vector<int64_t>& shape, size_t chunk_elements,
                MemoryKind memory) {
  HashPartitioner partitioner(1);
  TensorInfo info = TensorTable(partitioner, chunk_elements).Plan(name, shape);
  info.memory = memory;
  return info;
}

std::vector<float> Wave(size_t n, float phase) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = std::sin(0.37f * static_cast<float>(i) + phase);
  return values;
}

PayloadHeader Header(absl::string_view payload) {
  auto header = PeekPayloadHeader(payload);
  REQUIRE(header.ok());
  return *header;
}

proto::TensorChunk Reply(const std::string& name, uint32_t chunk, size_t n,
                         const std::string& payload, uint32_t codec,
                         const std::string& codec_params) {
  proto::TensorChunk reply;
  reply.set_key(name);
  reply.set_chunk(chunk);
  reply.set_num_elements(n);
  reply.set_codec(codec);
  reply.set_codec_params(codec_params);
  reply.set_checksum(Crc32c(payload.data(), payload.size()));
  return reply;
}

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

TEST_CASE("PowerSGD factors a [256,784] weight as 256 x 784, host and device alike") {
  for (MemoryKind memory : {MemoryKind::kHost, MemoryKind::kDevice}) {
    auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
    auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
    auto codec = ChunkCodec::Create("powersgd:rank=2", "none", 0, host, device);
    REQUIRE(codec.ok());
    const size_t n = 256 * 784;
    REQUIRE((*codec)->AddTensor(Plan("w", {256, 784}, n, memory)).ok());
    std::vector<float> gradient = Wave(n, 0.5f);
    device->AddDeviceRange(gradient.data(), n);
    OutgoingChunk chunk;
    REQUIRE((*codec)->EncodePush({"w", 0}, gradient, 0, 0, &chunk).ok());
    const PayloadHeader header = Header(chunk.payload());
    CHECK(header.codec == CodecId::kPowerSgd);
    CHECK(header.param0 == 2);    // rank
    CHECK(header.param1 == 256);  // m: the layer's rows, not the near-square 448
    CHECK(chunk.header.codec_params() == "powersgd:rank=2,cols=0");  // the user's spec on the wire
    const BackendCounts& used = memory == MemoryKind::kDevice ? device->counts() : host->counts();
    const BackendCounts& idle = memory == MemoryKind::kDevice ? host->counts() : device->counts();
    CHECK(used.encodes == 1);
    CHECK(idle.total() == 0);
  }
}

TEST_CASE("PowerSGD leaves a 1-D tensor of 8192 floats dense; a chunk cutting rows uncompressed") {
  auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
  auto codec = ChunkCodec::Create("powersgd:rank=2", "none", 0, nullptr, device);
  REQUIRE(codec.ok());
  REQUIRE((*codec)->AddTensor(Plan("bias", {8192}, 8192, MemoryKind::kHost)).ok());
  const std::vector<float> bias = Wave(8192, 1.0f);
  OutgoingChunk dense;
  REQUIRE((*codec)->EncodePush({"bias", 0}, bias, 0, 0, &dense).ok());
  CHECK(dense.header.codec() == 0);
  CHECK(dense.is_borrowed);
  CHECK(dense.payload().size() == 8192 * sizeof(float));

  // 1000-element chunks of 784-element rows: chunk 0 holds no whole rows.
  REQUIRE((*codec)->AddTensor(Plan("w", {256, 784}, 1000, MemoryKind::kHost)).ok());
  const std::vector<float> w = Wave(256 * 784, 2.0f);
  OutgoingChunk cut;
  REQUIRE((*codec)->EncodePush({"w", 0}, absl::MakeConstSpan(w.data(), 1000), 0, 0, &cut).ok());
  CHECK(cut.header.codec() == static_cast<uint32_t>(CodecId::kPowerSgd));
  CHECK(Header(cut.payload()).param0 == 0);  // the codec's uncompressed form
  CHECK(cut.payload().size() == kCodecHeaderBytes + 1000 * sizeof(float));

  // 784 * 2-element chunks hold whole rows: factored 2 x 784 ... which
  // PowerSGD does not shrink at rank 2 (r (m + n) >= d), so 4 rows.
  REQUIRE((*codec)->AddTensor(Plan("w4", {256, 784}, 4 * 784, MemoryKind::kHost)).ok());
  OutgoingChunk rows;
  REQUIRE((*codec)
              ->EncodePush({"w4", 1}, absl::MakeConstSpan(w.data() + 4 * 784, 4 * 784), 0, 0, &rows)
              .ok());
  CHECK(Header(rows.payload()).param0 == 2);
  CHECK(Header(rows.payload()).param1 == 4);
}

TEST_CASE("a device tensor needs a device backend; nothing is added without one") {
  auto codec = ChunkCodec::Create("topk:ratio=0.01", "none", 0);
  REQUIRE(codec.ok());
  CHECK_FALSE((*codec)->Supports(MemoryKind::kDevice));
  CHECK(absl::IsFailedPrecondition(
      (*codec)->AddTensor(Plan("w", {64, 64}, 4096, MemoryKind::kDevice))));
  std::vector<float> gradient(4096, 1.0f);
  OutgoingChunk chunk;
  CHECK(absl::IsNotFound((*codec)->EncodePush({"w", 0}, gradient, 0, 0, &chunk)));

  ClientOptions options;
  options.servers = {"fake:0"};
  options.heartbeat_interval = absl::ZeroDuration();
  FakeCluster cluster = MakeFakeCluster(options);
  const absl::Status status = cluster.client->RegisterTensor("w", {64, 64}, {}, MemoryKind::kDevice);
  CHECK(absl::IsFailedPrecondition(status));
  CHECK(status.message().find("device_backend") != absl::string_view::npos);
  CHECK(cluster.control->requests().inits.empty());  // not registered on any shard
  CHECK(absl::IsNotFound(cluster.client->Push("w", gradient)));
}

TEST_CASE("dense device chunks: borrowed when the transport sends from device, else staged") {
  auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
  auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
  auto codec = ChunkCodec::Create("topk:ratio=0.01", "none", 1 << 20, host, device);
  REQUIRE(codec.ok());
  REQUIRE((*codec)->AddTensor(Plan("b", {64}, 64, MemoryKind::kDevice)).ok());
  std::vector<float> bias = Wave(64, 3.0f);
  device->AddDeviceRange(bias.data(), bias.size());

  OutgoingChunk borrowed;
  REQUIRE((*codec)->EncodePush({"b", 0}, bias, 0, 0, &borrowed, /*transport_sends_from_device=*/true)
              .ok());
  CHECK(borrowed.is_borrowed);
  CHECK(borrowed.borrowed_memory == MemoryKind::kDevice);
  CHECK(borrowed.payload().data() == reinterpret_cast<const char*>(bias.data()));
  CHECK_FALSE(borrowed.checksum_pending);
  CHECK(borrowed.header.checksum() == Crc32c(bias.data(), 64 * sizeof(float)));
  CHECK(device->counts().crc32c == 1);
  CHECK((*codec)->staged_bytes() == 0);

  OutgoingChunk staged;
  REQUIRE((*codec)->EncodePush({"b", 0}, bias, 0, 0, &staged).ok());
  CHECK_FALSE(staged.is_borrowed);
  CHECK(staged.borrowed_memory == MemoryKind::kHost);
  CHECK(staged.payload() == Bytes(bias));
  CHECK_FALSE(staged.checksum_pending);
  CHECK(staged.header.checksum() == Crc32c(bias.data(), 64 * sizeof(float)));
  CHECK(device->counts().copy_to_host == 1);
  CHECK((*codec)->staged_bytes() == 64 * sizeof(float));

  // A host pointer where device memory is due fails (the fake device's
  // check), and the error names the chunk.
  std::vector<float> host_copy = bias;
  OutgoingChunk wrong;
  const absl::Status status = (*codec)->EncodePush({"b", 0}, host_copy, 0, 0, &wrong);
  CHECK(absl::IsInternal(status));
  CHECK(status.message().find("'b' chunk 0") != absl::string_view::npos);
  CHECK(host->counts().total() == 0);
}

TEST_CASE("pull replies into a device tensor: dense by the backend, compressed into its mirror") {
  auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
  auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
  const std::string spec = "topk:ratio=0.25";
  auto codec = ChunkCodec::Create("none", spec, 0, host, device);
  REQUIRE(codec.ok());
  const size_t n = 8;
  REQUIRE((*codec)->AddTensor(Plan("w", {2, 4}, n, MemoryKind::kDevice)).ok());
  std::vector<float> out(n, -1.0f);
  device->AddDeviceRange(out.data(), n);
  HashPartitioner partitioner(1);
  const TensorInfo info = Plan("w", {2, 4}, n, MemoryKind::kDevice);
  const auto& spans = info.groups[0].spans;

  // A compressed reply before the first dense one: DATA_LOSS, out untouched.
  auto encoder = CreateCodec(*CodecSpec::Parse(spec));
  REQUIRE(encoder.ok());
  std::string delta;
  REQUIRE((*encoder)->Encode({0, 0, 5, 0, 0, 0, 0, -7}, {}, &delta).ok());
  proto::TensorChunk compressed = Reply("w", 0, n, delta, static_cast<uint32_t>(CodecId::kTopK), spec);
  CHECK(absl::IsDataLoss((*codec)->DecodePull("w", spans, compressed, PayloadView(delta), out.data())));
  CHECK(out == std::vector<float>(n, -1.0f));

  const std::vector<float> dense = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string dense_bytes = Bytes(dense);
  proto::TensorChunk first = Reply("w", 0, n, dense_bytes, 0, "");
  first.set_view_version(3);
  REQUIRE((*codec)->DecodePull("w", spans, first, PayloadView(dense_bytes), out.data()).ok());
  CHECK(out == dense);
  CHECK(device->counts().set_dense == 1);
  CHECK((*codec)->ViewVersion({"w", 0}) == 3);

  compressed.set_view_version(4);
  compressed.set_pull_view_version(3);
  REQUIRE((*codec)->DecodePull("w", spans, compressed, PayloadView(delta), out.data()).ok());
  CHECK(out == std::vector<float>({1, 2, 8, 4, 5, 6, 7, 1}));
  CHECK(device->counts().add_compressed == 1);

  // A corrupt compressed payload (valid checksum): DATA_LOSS, out and the
  // mirror untouched.
  std::string corrupt = delta.substr(0, delta.size() - 3);
  proto::TensorChunk bad = Reply("w", 0, n, corrupt, static_cast<uint32_t>(CodecId::kTopK), spec);
  bad.set_pull_view_version(4);
  const std::vector<float> before = out;
  CHECK(absl::IsDataLoss((*codec)->DecodePull("w", spans, bad, PayloadView(corrupt), out.data())));
  CHECK(out == before);
  CHECK((*codec)->ViewVersion({"w", 0}) == 4);
  CHECK(host->counts().total() == 0);

  // Without a pull codec a dense reply reaches device memory through
  // CopyFromHost.
  auto plain = ChunkCodec::Create("none", "none", 0, host, device);
  REQUIRE(plain.ok());
  REQUIRE((*plain)->AddTensor(Plan("w", {2, 4}, n, MemoryKind::kDevice)).ok());
  REQUIRE((*plain)->DecodePull("w", spans, first, PayloadView(dense_bytes), out.data()).ok());
  CHECK(out == dense);
  CHECK(device->counts().copy_from_host == 1);
  CHECK(host->counts().total() == 0);
}

// A fake shard whose transport sends from device memory (UCX with CUDA).
class DeviceSendingTransport : public FakeShardTransport {
 public:
  DeviceSendingTransport() : FakeShardTransport(TransportTraits{"fake", true, false}) {}

 protected:
  explicit DeviceSendingTransport(TransportTraits traits) : FakeShardTransport(traits) {}
};

TEST_CASE("a Client pushes device tensors through the device backend (fake transport)") {
  auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
  auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
  ClientOptions options;
  options.servers = {"fake:0"};
  options.heartbeat_interval = absl::ZeroDuration();
  options.codec = "powersgd:rank=2";
  options.device_backend = device;
  options.host_backend = host;
  auto control = std::make_unique<FakeControlClient>(1, 1);
  std::vector<std::unique_ptr<ShardTransport>> transports;
  auto transport = std::make_unique<DeviceSendingTransport>();
  DeviceSendingTransport* shard = transport.get();
  transports.push_back(std::move(transport));
  auto client = Client::Create(options, std::move(control), std::move(transports));
  REQUIRE(client.ok());
  std::vector<float> w = Wave(256 * 784, 0.1f), b = Wave(8192, 0.2f);
  device->AddDeviceRange(w.data(), w.size());
  device->AddDeviceRange(b.data(), b.size());
  REQUIRE((*client)->RegisterTensor("w", {256, 784}, w, MemoryKind::kDevice).ok());
  REQUIRE((*client)->RegisterTensor("b", {8192}, b, MemoryKind::kDevice).ok());
  REQUIRE((*client)->Push("w", w).ok());
  REQUIRE((*client)->Push("b", b).ok());
  const auto calls = shard->calls();
  REQUIRE(calls.size() == 2);
  REQUIRE(calls[0].chunks.size() == 1);
  CHECK(calls[0].chunks[0].codec() == static_cast<uint32_t>(CodecId::kPowerSgd));
  CHECK(Header(calls[0].payloads[0]).param1 == 256);
  CHECK(calls[1].chunks[0].codec() == 0);  // the bias, dense, sent from device memory
  CHECK(calls[1].payloads[0] == Bytes(b));
  CHECK(device->counts().encodes == 1);
  CHECK(device->counts().crc32c == 1);
  CHECK(device->counts().copy_to_host == 0);
  CHECK((*client)->stats().bytes_staged == 0);
  CHECK(host->counts().total() == 0);
}

// A fake shard whose transport also receives into device memory (UCX with
// CUDA): pulls and push-pulls land replies where the client says.
class DeviceLandingTransport : public DeviceSendingTransport {
 public:
  DeviceLandingTransport() : DeviceSendingTransport(TransportTraits{"fake", true, true}) {}
};

std::unique_ptr<Client> LandingClient(const std::string& pull_codec,
                                      std::shared_ptr<CountingBackend> device,
                                      std::shared_ptr<CountingBackend> host,
                                      std::unique_ptr<ShardTransport> transport) {
  ClientOptions options;
  options.servers = {"fake:0"};
  options.heartbeat_interval = absl::ZeroDuration();
  options.pull_codec = pull_codec;
  options.device_backend = device;
  options.host_backend = host;
  auto control = std::make_unique<FakeControlClient>(1, 1);
  std::vector<std::unique_ptr<ShardTransport>> transports;
  transports.push_back(std::move(transport));
  auto client = Client::Create(options, std::move(control), std::move(transports));
  REQUIRE(client.ok());
  return std::move(*client);
}

TEST_CASE("dense pull replies land in device memory and reach device tensors there") {
  for (const std::string pull_codec : {"none", "topk:ratio=0.01"}) {
    INFO("pull codec " << pull_codec);
    auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
    auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
    auto owned = std::make_unique<DeviceLandingTransport>();
    DeviceLandingTransport* shard = owned.get();
    auto client = LandingClient(pull_codec, device, host, std::move(owned));
    // 2 chunks of 1 Mi floats (the default 4 MiB chunks) and a small tensor.
    std::vector<float> w(2 << 20, -1.0f), g(w.size(), 0.5f), b(100, -1.0f);
    device->AddDeviceRange(w.data(), w.size());
    device->AddDeviceRange(g.data(), g.size());
    device->AddDeviceRange(b.data(), b.size());
    REQUIRE(client->RegisterTensor("w", {2048, 1024}, {}, MemoryKind::kDevice).ok());
    REQUIRE(client->RegisterTensor("b", {100}, {}, MemoryKind::kDevice).ok());
    // The fake answers element i of chunk c with c * 1000 + i.
    REQUIRE(client->PushPull("w", g, absl::MakeSpan(w)).ok());
    REQUIRE(client->Pull("b", absl::MakeSpan(b)).ok());
    for (size_t i : {size_t{0}, size_t{12345}, (size_t{1} << 20) + 7}) {
      const size_t chunk = i >> 20, within = i & ((1 << 20) - 1);
      CHECK(w[i] == static_cast<float>(chunk * 1000 + within));
    }
    CHECK(b[99] == 99.0f);
    // Every reply landed: nothing staged from the host, checked on the device.
    CHECK(device->counts().copy_from_host == 0);
    CHECK(device->counts().set_dense == 0);
    CHECK(device->counts().new_buffers == 3);  // one per chunk, made once
    CHECK(device->counts().crc32c == 3 + 2);   // 3 landed replies + 2 pushed dense chunks
    CHECK(client->stats().bytes_landed == (w.size() + b.size()) * sizeof(float));
    if (pull_codec == "none") {
      CHECK(device->counts().copy_within == 3);
    } else {
      CHECK(device->counts().set_dense_from == 2);  // the big chunks have mirrors
      CHECK(device->counts().copy_within == 1);     // the small tensor has none
    }
    // Again: the buffers were given back and are reused.
    REQUIRE(client->Pull("w", absl::MakeSpan(w)).ok());
    CHECK(device->counts().new_buffers == 3);
    CHECK(host->counts().total() == 0);

    // A landed reply whose checksum is wrong is refused and writes nothing.
    shard->SetResponder([](const FakeShardTransport::Call& call, const ChunkViewSink* sink) {
      for (const proto::ChunkRef& ref : call.pull.chunks()) {
        std::vector<float> values(ref.num_elements(), 7.0f);
        proto::TensorChunk reply;
        reply.set_key(ref.key());
        reply.set_chunk(ref.chunk());
        reply.set_num_elements(values.size());
        reply.set_dtype(proto::DTYPE_FLOAT32);
        reply.set_checksum(12345);
        const std::string bytes(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float));
        if (auto status = (*sink)(reply, PayloadView(bytes)); !status.ok()) return status;
      }
      return absl::OkStatus();
    });
    const std::vector<float> before = b;
    const absl::Status corrupt = client->Pull("b", absl::MakeSpan(b));
    CHECK(absl::IsDataLoss(corrupt));
    CHECK(b == before);
  }
}

TEST_CASE("without a landing transport, device pull replies are staged from host memory") {
  auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
  auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
  auto client = LandingClient("none", device, host, std::make_unique<DeviceSendingTransport>());
  std::vector<float> b(100, -1.0f);
  device->AddDeviceRange(b.data(), b.size());
  REQUIRE(client->RegisterTensor("b", {100}, {}, MemoryKind::kDevice).ok());
  REQUIRE(client->Pull("b", absl::MakeSpan(b)).ok());
  CHECK(b[99] == 99.0f);
  CHECK(device->counts().copy_from_host == 1);
  CHECK(device->counts().new_buffers == 0);
  CHECK(client->stats().bytes_landed == 0);
}

}  // namespace
}  // namespace harrier
