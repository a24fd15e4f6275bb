// Device memory and the shard transports, on a host without CUDA in UCX
// (Debian's UCX 1.13.1): the UCX memory-type query, SendsFromDeviceMemory(),
// HARRIER_UCX_DEVICE_MEMORY, and every transport that sends host memory only
// refusing a chunk marked as device memory before anything is sent, against
// a real harrier-server (gRPC and UCX over tcp on loopback, see BUILD).
//
// The "device" chunks here are host buffers marked kDevice, with a valid
// rank, session and checksum: were the refusal missing, the push would be
// delivered and applied, which the checks on the parameters would see (the
// same chunk marked kHost is applied, as the test shows afterwards).
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "common/transport/ucx_worker.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"
#include "worker/transport/fake/fake_transport.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/ucx/ucx_transport.h"

namespace harrier {
namespace {

constexpr size_t kElements = 8;

// What `ucx_info -d` says about CUDA, the ground truth the query must match
// (so this test holds on a CUDA-enabled UCX too).
bool UcxInfoListsCuda() {
  FILE* pipe = popen("ucx_info -d 2>/dev/null", "r");
  REQUIRE(pipe != nullptr);
  std::string text;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) text.append(buffer, n);
  const int rc = pclose(pipe);
  INFO("ucx_info -d exited " << rc);
  REQUIRE(rc == 0);
  REQUIRE(text.find("Transport: tcp") != std::string::npos);  // it did list transports
  return text.find("cuda_copy") != std::string::npos;
}

TEST_CASE("the UCX memory-type query matches ucx_info: host yes, CUDA not in this UCX") {
  const bool cuda = UcxInfoListsCuda();
  auto worker = transport::UcxWorker::Start("memory-types-test", {});
  INFO(worker.status().ToString());
  REQUIRE(worker.ok());
  CHECK((*worker)->SupportsMemoryType(UCS_MEMORY_TYPE_HOST));
  CHECK((*worker)->SupportsMemoryType(UCS_MEMORY_TYPE_CUDA) == cuda);
  // Debian's UCX 1.13.1 (the build this project uses) has no CUDA transports.
  CHECK_FALSE(cuda);
  CHECK_FALSE((*worker)->SupportsMemoryType(UCS_MEMORY_TYPE_CUDA));
}

TEST_CASE("HARRIER_UCX_DEVICE_MEMORY: auto, off, on, and a bad value") {
  REQUIRE(*ParseUcxDeviceMemory("") == UcxDeviceMemory::kAuto);
  REQUIRE(*ParseUcxDeviceMemory("auto") == UcxDeviceMemory::kAuto);
  REQUIRE(*ParseUcxDeviceMemory("off") == UcxDeviceMemory::kOff);
  REQUIRE(*ParseUcxDeviceMemory("on") == UcxDeviceMemory::kOn);
  auto bad = ParseUcxDeviceMemory("yes");
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(bad.status().message().find("HARRIER_UCX_DEVICE_MEMORY='yes'") != std::string::npos);

  // Through the environment, as a worker reads it.
  REQUIRE(setenv(kUcxDeviceMemoryEnv, "bogus", 1) == 0);
  auto from_env = UcxClientContext::Create("device-memory-env-test");
  REQUIRE(unsetenv(kUcxDeviceMemoryEnv) == 0);
  INFO(from_env.status().ToString());
  REQUIRE(from_env.status().code() == absl::StatusCode::kInvalidArgument);

  auto off = UcxClientContext::Create("device-memory-off-test", UcxDeviceMemory::kOff);
  REQUIRE(off.ok());
  REQUIRE_FALSE((*off)->sends_from_device_memory());
  auto automatic = UcxClientContext::Create("device-memory-auto-test", UcxDeviceMemory::kAuto);
  REQUIRE(automatic.ok());
  REQUIRE_FALSE((*automatic)->sends_from_device_memory());
  // "on" insists on direct sends, which this UCX cannot do.
  auto on = UcxClientContext::Create("device-memory-on-test", UcxDeviceMemory::kOn);
  INFO(on.status().ToString());
  REQUIRE(on.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(on.status().message().find("cannot send from CUDA memory") != std::string::npos);
}

proto::TensorChunk Header(testing::Sessions& sessions, const std::vector<float>& payload) {
  proto::TensorChunk chunk;
  chunk.set_rank(1);
  sessions.Attach(&chunk);
  chunk.set_key("w");
  chunk.set_num_elements(kElements);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.set_checksum(Crc32c(payload.data(), payload.size() * sizeof(float)));
  return chunk;
}

std::vector<OutgoingChunk> Chunks(const proto::TensorChunk& header,
                                  const std::vector<float>& payload, MemoryKind memory) {
  OutgoingChunk chunk;
  chunk.header = header;
  chunk.borrowed = absl::string_view(reinterpret_cast<const char*>(payload.data()),
                                     payload.size() * sizeof(float));
  chunk.is_borrowed = true;
  chunk.borrowed_memory = memory;
  return {chunk};
}

void RequireRefused(const absl::Status& status, const std::string& transport) {
  INFO("status: " << status.ToString());
  REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(status.message().find("the " + transport + " transport cannot send from device memory") !=
          std::string::npos);
  REQUIRE(status.message().find("'w'") != std::string::npos);
}

std::unique_ptr<ShardTransport> UcxTransport(const std::string& address,
                                             std::shared_ptr<UcxClientContext> context) {
  auto stub = proto::ParameterService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext rpc;
  rpc.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::TransportAddressRequest request;
  request.set_transport("ucx");
  proto::TransportAddressResponse response;
  const grpc::Status got = stub->GetTransportAddress(&rpc, request, &response);
  INFO(got.error_message());
  REQUIRE(got.ok());
  transport::PeerAddress peer{response.address(), response.hello_secret()};
  auto connected = UcxClientContext::Connect(std::move(context), "shard 0", peer,
                                             absl::Now() + absl::Seconds(10));
  INFO(connected.status().ToString());
  REQUIRE(connected.ok());
  return std::move(*connected);
}

TEST_CASE("gRPC and UCX refuse a device-memory chunk and change nothing") {
  // Two workers, ASP: rank 1's push applies at once, scaled by 1/2.
  auto server = testing::ServerProcess::Start(
      {"--num_workers=2", "--sync=asp", "--optimizer=sgd", "--lr=1", "--ucx"});
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  const std::string address = (*server)->address();
  ClientOptions options;
  options.servers = {address};
  options.rpc_timeout = absl::Seconds(30);
  options.heartbeat_interval = absl::ZeroDuration();
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  std::vector<float> init(kElements), before(kElements), after(kElements);
  for (size_t i = 0; i < kElements; ++i) init[i] = static_cast<float>(i);
  REQUIRE((*client)->RegisterTensor("w", {kElements}, init).ok());
  REQUIRE((*client)->Pull("w", absl::MakeSpan(before)).ok());
  REQUIRE(before == init);

  testing::Sessions sessions(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const std::vector<float> gradient(kElements, 1.0f);
  proto::TensorChunk header = Header(sessions, gradient);

  std::vector<std::unique_ptr<ShardTransport>> transports;
  transports.push_back(std::make_unique<GrpcShardTransport>(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials())));
  auto context = UcxClientContext::Create("device-memory-test", UcxDeviceMemory::kAuto);
  REQUIRE(context.ok());
  transports.push_back(UcxTransport(address, *context));

  float step = 0.0f;  // what the accepted host pushes subtracted so far
  int64_t clock = 0;  // one per transport: a second push at one clock is a duplicate
  for (auto& transport : transports) {
    header.set_clock(clock++);
    const std::string name = transport->name();
    INFO("transport " << name);
    REQUIRE_FALSE(transport->SendsFromDeviceMemory());
    CallCanceller canceller;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    const auto device = Chunks(header, gradient, MemoryKind::kDevice);
    RequireRefused(PushBlocking(*transport, device, deadline, canceller), name);
    int sink_calls = 0;
    const ChunkViewSink sink = [&](const proto::TensorChunk&, const PayloadView&) {
      ++sink_calls;
      return absl::OkStatus();
    };
    RequireRefused(PushPullBlocking(*transport, device, sink, deadline, canceller), name);
    REQUIRE(sink_calls == 0);
    REQUIRE((*client)->Pull("w", absl::MakeSpan(after)).ok());
    for (size_t i = 0; i < kElements; ++i) REQUIRE(after[i] == before[i] - step);

    // The same chunk from host memory is accepted and applied: the refusal,
    // not the chunk, kept the parameters unchanged.
    const absl::Status pushed =
        PushBlocking(*transport, Chunks(header, gradient, MemoryKind::kHost), deadline, canceller);
    INFO(pushed.ToString());
    REQUIRE(pushed.ok());
    step += 0.5f;
    REQUIRE((*client)->Pull("w", absl::MakeSpan(after)).ok());
    for (size_t i = 0; i < kElements; ++i) REQUIRE(after[i] == before[i] - step);
  }
}

TEST_CASE("the fake transport refuses a device-memory chunk without recording it") {
  FakeShardTransport fake;
  REQUIRE_FALSE(fake.SendsFromDeviceMemory());
  const std::vector<float> gradient(kElements, 1.0f);
  proto::TensorChunk header;
  header.set_key("w");
  CallCanceller canceller;
  RequireRefused(PushBlocking(fake, Chunks(header, gradient, MemoryKind::kDevice),
                              absl::Now() + absl::Seconds(5), canceller),
                 "fake");
  REQUIRE(fake.num_calls() == 0);
  REQUIRE(PushBlocking(fake, Chunks(header, gradient, MemoryKind::kHost),
                       absl::Now() + absl::Seconds(5), canceller)
              .ok());
  REQUIRE(fake.num_calls() == 1);
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

struct Landed {
  std::string key;
  uint32_t chunk = 0;
  const char* at = nullptr;
  size_t bytes = 0;
  MemoryKind memory = MemoryKind::kHost;
  std::vector<float> values;  // read from the view (host memory here)
};

TEST_CASE("a pull with a landing chooser lands replies in the caller's buffers where the transport can") {
  auto server = testing::ServerProcess::Start({"--num_workers=2", "--sync=asp", "--ucx"});
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  const std::string address = (*server)->address();
  ClientOptions options;
  options.servers = {address};
  options.rpc_timeout = absl::Seconds(30);
  options.heartbeat_interval = absl::ZeroDuration();
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  // "big": chunks of 4 MiB and 1.7 MiB (rendezvous over UCX); "small": 4 KB (eager).
  constexpr size_t kChunk = (size_t{4} << 20) / sizeof(float);
  const std::vector<std::pair<std::string, size_t>> tensors = {{"big", 1500000}, {"small", 1000}};
  std::map<std::string, std::vector<float>> init;
  for (const auto& [key, n] : tensors) {
    auto& values = init[key];
    values.resize(n);
    for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>((i * 7 + key.size()) % 1009);
    REQUIRE((*client)->RegisterTensor(key, {static_cast<int64_t>(n)}, values).ok());
  }
  testing::Sessions sessions(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  proto::PullRequest request;
  request.set_rank(1);
  sessions.Attach(&request);
  for (const auto& [key, n] : tensors) {
    for (size_t begin = 0, chunk = 0; begin < n; begin += kChunk, ++chunk) {
      proto::ChunkRef* ref = request.add_chunks();
      ref->set_key(key);
      ref->set_chunk(static_cast<uint32_t>(chunk));
      ref->set_num_elements(std::min(kChunk, n - begin));
    }
  }
  const float kSentinel = -12345.0f;

  // Pulls through `transport` with every reply landing in `dest`
  // (`memory`), except chunk `too_small` (given one byte too few).
  auto pull = [&](ShardTransport& transport, MemoryKind memory, const std::string& too_small_key,
                  std::map<std::string, std::vector<float>>& dest, std::vector<Landed>& landed) {
    for (const auto& [key, n] : tensors) dest[key].assign(n, kSentinel);
    const ReplyLandingChooser choose = [&](const proto::TensorChunk& header, size_t bytes) {
      ReplyLanding landing;
      auto found = dest.find(header.key());
      if (found == dest.end()) return landing;
      const size_t begin = header.chunk() * kChunk;
      landing.data = found->second.data() + begin;
      landing.capacity = (found->second.size() - begin) * sizeof(float);
      if (header.key() == too_small_key) landing.capacity = bytes - 1;
      landing.memory = memory;
      return landing;
    };
    const LandedChunkSink sink = [&](const proto::TensorChunk& header, const PayloadView& payload,
                                     MemoryKind where) {
      Landed entry{header.key(), header.chunk(), payload.first().data(), payload.size(), where};
      entry.values.resize(payload.size() / sizeof(float));
      payload.CopyTo(entry.values.data());
      landed.push_back(std::move(entry));
      return absl::OkStatus();
    };
    CallCanceller canceller;
    return PullBlocking(transport, request, &choose, sink, absl::Now() + absl::Seconds(10),
                        canceller);
  };
  auto check_values = [&](const std::vector<Landed>& landed) {
    REQUIRE(landed.size() == 3);
    for (const Landed& entry : landed) {
      INFO(entry.key << " chunk " << entry.chunk);
      const auto& expected = init.at(entry.key);
      const size_t begin = entry.chunk * kChunk;
      REQUIRE(entry.values.size() == std::min(kChunk, expected.size() - begin));
      REQUIRE(std::equal(entry.values.begin(), entry.values.end(), expected.begin() + begin));
    }
  };
  auto in_place = [](const Landed& entry, std::map<std::string, std::vector<float>>& dest) {
    return entry.at == reinterpret_cast<const char*>(dest[entry.key].data() +
                                                     entry.chunk * kChunk);
  };

  auto context = UcxClientContext::Create("pull-into-test", UcxDeviceMemory::kAuto);
  REQUIRE(context.ok());
  auto ucx = UcxTransport(address, *context);
  REQUIRE_FALSE(ucx->ReceivesIntoDeviceMemory());

  SECTION("UCX: host landings are used, rendezvous and eager alike") {
    std::map<std::string, std::vector<float>> dest;
    std::vector<Landed> landed;
    const absl::Status status = pull(*ucx, MemoryKind::kHost, "", dest, landed);
    INFO(status.ToString());
    REQUIRE(status.ok());
    check_values(landed);
    for (const Landed& entry : landed) {
      INFO(entry.key << " chunk " << entry.chunk);
      CHECK(entry.memory == MemoryKind::kHost);
      CHECK(in_place(entry, dest));
    }
    REQUIRE(dest["big"] == init["big"]);  // the payloads themselves are in the tensor
    REQUIRE(dest["small"] == init["small"]);
  }
  SECTION("UCX: a landing too small is not used") {
    std::map<std::string, std::vector<float>> dest;
    std::vector<Landed> landed;
    REQUIRE(pull(*ucx, MemoryKind::kHost, "big", dest, landed).ok());
    check_values(landed);
    for (const Landed& entry : landed) {
      INFO(entry.key << " chunk " << entry.chunk);
      CHECK(in_place(entry, dest) == (entry.key == "small"));
    }
    REQUIRE(dest["big"] == std::vector<float>(init["big"].size(), kSentinel));
  }
  SECTION("UCX without CUDA and gRPC: device landings are never written, views are host") {
    auto grpc_transport = std::make_unique<GrpcShardTransport>(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), MakeChannelArguments()));
    for (ShardTransport* transport : {static_cast<ShardTransport*>(ucx.get()),
                                      static_cast<ShardTransport*>(grpc_transport.get())}) {
      INFO("transport " << transport->name());
      REQUIRE_FALSE(transport->ReceivesIntoDeviceMemory());
      std::map<std::string, std::vector<float>> dest;
      std::vector<Landed> landed;
      const absl::Status status = pull(*transport, MemoryKind::kDevice, "", dest, landed);
      INFO(status.ToString());
      REQUIRE(status.ok());
      check_values(landed);
      for (const Landed& entry : landed) {
        CHECK(entry.memory == MemoryKind::kHost);
        CHECK_FALSE(in_place(entry, dest));
      }
      for (const auto& [key, n] : tensors) REQUIRE(dest[key] == std::vector<float>(n, kSentinel));
    }
  }
}

}  // namespace
}  // namespace harrier
