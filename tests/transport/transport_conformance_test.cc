// One conformance suite for every ShardTransport backend. The backend is
// chosen by the environment (see BUILD): HARRIER_TEST_TRANSPORT=grpc|ucx|tcp,
// and for UCX, UCX_TLS (inherited by the harrier-server children, which run
// with --ucx). Every case must give the same answers over every backend.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <thread>

#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "common/transport/framing.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "tests/require_ok.h"
#include "tests/transport/raw_ucx_client.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"

namespace harrier {
namespace {

std::string Transport() {
  const char* value = std::getenv("HARRIER_TEST_TRANSPORT");
  return value == nullptr ? "grpc" : value;
}

std::vector<std::string> ServerFlags(std::vector<std::string> flags) {
  if (Transport() == "ucx") flags.push_back("--ucx");
  if (Transport() == "tcp") flags.push_back("--tcp");
  return flags;
}

ClientOptions Options(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers) {
  ClientOptions options;
  options.servers = testing::Addresses(servers);
  options.transport = Transport();
  options.rpc_timeout = absl::Seconds(30);
  options.heartbeat_interval = absl::ZeroDuration();
  return options;
}

// Both forms of each call: blocking, which a transport may run on the
// calling thread (CallerWaitsScope), and async with Wait(), which completes
// on the transport's own threads.
struct Calls {
  bool async;
  absl::Status Pull(Client& client, const std::string& name, std::vector<float>& out) const {
    if (!async) return client.Pull(name, absl::MakeSpan(out));
    return client.Wait(client.PullAsync(name, absl::MakeSpan(out)));
  }
  absl::Status Push(Client& client, const std::string& name, const std::vector<float>& grad) const {
    if (!async) return client.Push(name, grad);
    return client.Wait(client.PushAsync(name, grad));
  }
  absl::Status PushPull(Client& client, const std::string& name, const std::vector<float>& grad,
                        std::vector<float>& out) const {
    if (!async) return client.PushPull(name, grad, absl::MakeSpan(out));
    return client.Wait(client.PushPullAsync(name, grad, absl::MakeSpan(out)));
  }
};

TEST_CASE("push, pull and push-pull round trip exactly") {
  INFO("transport " << Transport());
  const Calls calls{GENERATE(false, true)};
  INFO((calls.async ? "async calls" : "blocking calls"));
  // Staging buffers: pushes sent from the caller's buffer with no send
  // copy, pulls checked while copied.
  TensorOptions options;
  options.staging_buffers = GENERATE(false, true);
  INFO((options.staging_buffers ? "staging buffers" : "caller's buffers"));
  auto servers = testing::StartCluster(1, 1, ServerFlags({"--optimizer=sgd", "--lr=1"}));
  REQUIRE(servers.ok());
  auto client = Client::Create(Options(*servers));
  REQUIRE_OK(client.status());
  // 1.5M elements: two chunks of up to 4 MiB, sent by rendezvous over UCX.
  // Over gRPC 1000 elements go inline with their header; 12289 (three 16 KiB
  // blocks of the send copy and 4 bytes) and the larger ones are copied into
  // a send buffer, their checksum taken during the copy (with staging
  // buffers they are sent from where they are).
  const std::vector<size_t> sizes = {1, 1000, 12289, 1500000};
  for (size_t n : sizes) {
    INFO("elements " << n);
    const std::string name = "t" + std::to_string(n);
    std::vector<float> init(n), grad(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      init[i] = static_cast<float>(i % 101);
      grad[i] = static_cast<float>(i % 7);
    }
    REQUIRE_OK((*client)->RegisterTensor(name, {static_cast<int64_t>(n)}, init, options));
    REQUIRE_OK(calls.Pull(**client, name, out));
    REQUIRE(out == init);
  }
  for (size_t n : sizes) {
    INFO("elements " << n);
    const std::string name = "t" + std::to_string(n);
    std::vector<float> grad(n), out(n);
    for (size_t i = 0; i < n; ++i) grad[i] = static_cast<float>(i % 7);
    REQUIRE_OK(calls.Push(**client, name, grad));
  }
  (*client)->Clock();
  for (size_t n : sizes) {
    INFO("elements " << n);
    const std::string name = "t" + std::to_string(n);
    std::vector<float> grad(n), out(n);
    REQUIRE_OK(calls.Pull(**client, name, out));
    for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == static_cast<float>(i % 101) - (i % 7));
    // Push-pull: a second step, answered with the parameters after it.
    for (size_t i = 0; i < n; ++i) grad[i] = 1.0f;
    REQUIRE_OK(calls.PushPull(**client, name, grad, out));
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(out[i] == static_cast<float>(i % 101) - (i % 7) - 1.0f);
    }
  }
  // Staging buffers take their replies in place where the transport reads
  // into memory it is given (tcp, UCX); gRPC hands over its own buffers.
  const ClientStats stats = (*client)->stats();
  if (!options.staging_buffers || Transport() == "grpc") {
    CHECK(stats.bytes_landed_in_staging == 0);
  } else if (Transport() == "tcp") {
    CHECK(stats.bytes_landed_in_staging == stats.bytes_pulled);
  } else {
    CHECK(stats.bytes_landed_in_staging > 0);
  }
}

TEST_CASE("a staging push-pull from and into one buffer is exact, its replies copied in") {
  INFO("transport " << Transport());
  TensorOptions options;
  options.staging_buffers = true;
  auto servers = testing::StartCluster(1, 1, ServerFlags({"--optimizer=sgd", "--lr=1"}));
  REQUIRE(servers.ok());
  auto client = Client::Create(Options(*servers));
  REQUIRE_OK(client.status());
  constexpr size_t n = 1500000;
  std::vector<float> init(n), buffer(n);
  for (size_t i = 0; i < n; ++i) init[i] = static_cast<float>(i % 101);
  REQUIRE_OK((*client)->RegisterTensor("t", {static_cast<int64_t>(n)}, init, options));
  for (size_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(i % 7);
  const uint64_t landed_before = (*client)->stats().bytes_landed_in_staging;
  REQUIRE_OK((*client)->PushPull("t", buffer, absl::MakeSpan(buffer)));
  for (size_t i = 0; i < n; ++i) REQUIRE(buffer[i] == static_cast<float>(i % 101) - (i % 7));
  CHECK((*client)->stats().bytes_landed_in_staging == landed_before);
}

TEST_CASE("the comm scheduler's tensors, fused and not, take their pulls in place") {
  INFO("transport " << Transport());
  auto servers = testing::StartCluster(1, 1, ServerFlags({"--optimizer=sgd", "--lr=1"}));
  REQUIRE(servers.ok());
  auto client = Client::Create(Options(*servers));
  REQUIRE_OK(client.status());
  // A large tensor of its own and two small ones fused into a bucket.
  const std::vector<size_t> sizes = {1500000, 100, 300};
  std::vector<std::vector<float>> parameters(sizes.size()), gradients(sizes.size());
  std::vector<ScheduledTensor> tensors;
  for (size_t t = 0; t < sizes.size(); ++t) {
    parameters[t].resize(sizes[t]);
    gradients[t].resize(sizes[t]);
    for (size_t i = 0; i < sizes[t]; ++i) {
      parameters[t][i] = static_cast<float>((i + t) % 101);
      gradients[t][i] = static_cast<float>((i + 2 * t) % 7);
    }
    ScheduledTensor tensor;
    tensor.name = "s" + std::to_string(t);
    tensor.shape = {static_cast<int64_t>(sizes[t])};
    tensor.parameters = absl::MakeSpan(parameters[t]);
    tensors.push_back(tensor);
  }
  CommSchedulerOptions options;
  options.fusion_bytes = 64 << 10;
  auto scheduler = CommScheduler::Create(**client, tensors, options);
  REQUIRE_OK(scheduler.status());
  for (size_t t = 0; t < sizes.size(); ++t) REQUIRE_OK((*scheduler)->WaitParameters(t));
  for (size_t t = sizes.size(); t-- > 0;) {
    REQUIRE_OK((*scheduler)->GradientReady(t, gradients[t]));
  }
  REQUIRE_OK((*scheduler)->EndBackward());
  REQUIRE_OK((*scheduler)->Drain());
  for (size_t t = 0; t < sizes.size(); ++t) {
    REQUIRE_OK((*scheduler)->WaitParameters(t));
    INFO("tensor " << t);
    for (size_t i = 0; i < sizes[t]; ++i) {
      REQUIRE(parameters[t][i] ==
              static_cast<float>((i + t) % 101) - static_cast<float>((i + 2 * t) % 7));
    }
  }
  const ClientStats stats = (*client)->stats();
  if (Transport() == "grpc") {
    CHECK(stats.bytes_landed_in_staging == 0);
  } else if (Transport() == "tcp") {
    CHECK(stats.bytes_landed_in_staging == stats.bytes_pulled);
  } else {
    CHECK(stats.bytes_landed_in_staging > 0);
  }
}

// Worker r's gradient at iteration t; the average over 3 workers is an
// exact integer, so SGD with lr = 1 stays exact in fp32.
float Gradient(int rank, int t, size_t i) {
  return static_cast<float>((rank + 1) * (1 + (i + t) % 7));
}
float Initial(size_t i) { return static_cast<float>(i % 11); }
float Expected(int t, size_t i) {
  float value = Initial(i);
  for (int k = 0; k < t; ++k) value -= 2.0f * (1 + (i + k) % 7);
  return value;
}

TEST_CASE("BSP: 2 shards, 3 workers are exact") {
  INFO("transport " << Transport());
  constexpr int kWorkers = 3;
  constexpr int kIterations = 6;
  auto servers =
      testing::StartCluster(2, kWorkers, ServerFlags({"--optimizer=sgd", "--lr=1", "--sync=bsp"}));
  REQUIRE(servers.ok());
  const std::vector<std::pair<std::string, size_t>> tensors = {
      {"scalar", 1}, {"small", 1000}, {"big", 1500000}};
  std::vector<std::string> failures(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto fail = [&](const std::string& what) { failures[w] = what; };
      auto client = Client::Create(Options(*servers));
      if (!client.ok()) return fail(client.status().ToString());
      const int rank = (*client)->rank();
      std::vector<std::vector<float>> params(tensors.size()), grads(tensors.size());
      for (size_t k = 0; k < tensors.size(); ++k) {
        std::vector<float> init(tensors[k].second);
        for (size_t i = 0; i < init.size(); ++i) init[i] = Initial(i);
        auto status = (*client)->RegisterTensor(
            tensors[k].first, {static_cast<int64_t>(tensors[k].second)}, init);
        if (!status.ok()) return fail(status.ToString());
        params[k].resize(tensors[k].second);
        grads[k].resize(tensors[k].second);
      }
      // Odd iterations use PushPull, even ones Pull then Push.
      for (int k = 0; k < static_cast<int>(tensors.size()); ++k) {
        if (auto s = (*client)->Pull(tensors[k].first, absl::MakeSpan(params[k])); !s.ok()) {
          return fail(s.ToString());
        }
      }
      for (int t = 0; t < kIterations; ++t) {
        for (size_t k = 0; k < tensors.size(); ++k) {
          for (size_t i = 0; i < params[k].size(); ++i) {
            if (params[k][i] != Expected(t, i)) {
              return fail("clock " + std::to_string(t) + " " + tensors[k].first + "[" +
                          std::to_string(i) + "] = " + std::to_string(params[k][i]));
            }
            grads[k][i] = Gradient(rank, t, i);
          }
        }
        std::vector<Client::Handle> handles;
        for (size_t k = 0; k < tensors.size(); ++k) {
          handles.push_back(t % 2 == 1 ? (*client)->PushPullAsync(tensors[k].first, grads[k],
                                                                  absl::MakeSpan(params[k]))
                                       : (*client)->PushAsync(tensors[k].first, grads[k]));
        }
        for (auto handle : handles) {
          if (auto s = (*client)->Wait(handle); !s.ok()) return fail(s.ToString());
        }
        (*client)->Clock();
        if (t % 2 == 0) {
          handles.clear();
          for (size_t k = 0; k < tensors.size(); ++k) {
            handles.push_back((*client)->PullAsync(tensors[k].first, absl::MakeSpan(params[k])));
          }
          for (auto handle : handles) {
            if (auto s = (*client)->Wait(handle); !s.ok()) return fail(s.ToString());
          }
        }
      }
      for (size_t k = 0; k < tensors.size(); ++k) {
        for (size_t i = 0; i < params[k].size(); ++i) {
          if (params[k][i] != Expected(kIterations, i)) return fail("final values wrong");
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int w = 0; w < kWorkers; ++w) {
    INFO("worker " << w << ": " << failures[w]);
    CHECK(failures[w].empty());
  }
}

// --- Bad input, below the client library. ---

constexpr size_t kElements = 8;

// The raw pushes come from rank 1 with a valid session (the client is rank
// 0), so what is refused is their content, not their identity.
testing::Sessions* raw_sessions = nullptr;

proto::TensorChunk MakePush(const std::string& key, size_t n, float value) {
  std::vector<float> gradient(n, value);
  proto::TensorChunk chunk;
  chunk.set_rank(1);
  if (raw_sessions != nullptr) raw_sessions->Attach(&chunk);
  chunk.set_key(key);
  chunk.set_num_elements(kElements);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(reinterpret_cast<const char*>(gradient.data()),
                                  n * sizeof(float));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

// Sends one push of raw messages straight to a shard.
class RawShard {
 public:
  virtual ~RawShard() = default;
  // `header`: the chunk's serialized fields without payload (or garbage).
  virtual absl::Status Push(const std::string& header, const std::string& payload) = 0;
  absl::Status Push(const proto::TensorChunk& chunk) {
    return Push(transport::EncodeChunkHeader(chunk), chunk.payload());
  }
};

// gRPC: a generic stub writes the bytes as they are, so even a message that
// does not parse reaches the shard.
class GrpcRawShard : public RawShard {
 public:
  explicit GrpcRawShard(const std::string& address)
      : channel_(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                           MakeChannelArguments())) {}

  using RawShard::Push;
  absl::Status Push(const std::string& header, const std::string& payload) override {
    std::string message = header;
    proto::TensorChunk chunk;
    if (chunk.ParseFromString(header)) {
      chunk.set_payload(payload);
      message = chunk.SerializeAsString();
    }
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue queue;
    void* tag = nullptr;
    bool ok = false;
    auto call = stub.PrepareCall(&context, "/harrier.proto.ParameterService/Push", &queue);
    call->StartCall(reinterpret_cast<void*>(1));
    queue.Next(&tag, &ok);
    grpc::Slice slice(message);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    queue.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    queue.Next(&tag, &ok);
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(4));
    queue.Next(&tag, &ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    queue.Next(&tag, &ok);
    queue.Shutdown();
    while (queue.Next(&tag, &ok)) {
    }
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
};

class UcxRawShard : public RawShard {
 public:
  explicit UcxRawShard(std::unique_ptr<testing::RawUcxClient> client)
      : client_(std::move(client)) {}
  using RawShard::Push;
  absl::Status Push(const std::string& header, const std::string& payload) override {
    return PushDeclaring(header, payload, payload.size());
  }
  absl::Status PushDeclaring(const std::string& header, const std::string& payload,
                             uint64_t declared) {
    transport::Frame frame;
    frame.op = transport::Op::kPush;
    frame.count = 1;
    frame.payload_bytes = declared;
    frame.arg = 10000;
    return client_->Call(frame, header, payload);
  }
  testing::RawUcxClient& client() { return *client_; }

 private:
  std::unique_ptr<testing::RawUcxClient> client_;
};

void RequireRefused(const absl::Status& status, absl::StatusCode code, const std::string& needle) {
  INFO("status: " << status.ToString());
  REQUIRE(status.code() == code);
  REQUIRE(status.message().find(needle) != absl::string_view::npos);
}

TEST_CASE("bad input gets the same status codes and changes nothing") {
  INFO("transport " << Transport());
  // Two workers, ASP: the client's own push below applies at once, scaled
  // by 1/2; rank 1 is the raw peer's.
  auto servers =
      testing::StartCluster(1, 2, ServerFlags({"--optimizer=sgd", "--lr=1", "--sync=asp"}));
  REQUIRE(servers.ok());
  testing::Sessions sessions(grpc::CreateChannel((*servers)[0]->address(),
                                                 grpc::InsecureChannelCredentials()));
  raw_sessions = &sessions;
  struct Reset {
    ~Reset() { raw_sessions = nullptr; }
  } reset;
  auto client = Client::Create(Options(*servers));
  REQUIRE_OK(client.status());
  std::vector<float> init(kElements), before(kElements), after(kElements);
  for (size_t i = 0; i < kElements; ++i) init[i] = static_cast<float>(i);
  REQUIRE_OK((*client)->RegisterTensor("w", {kElements}, init));
  REQUIRE_OK((*client)->Pull("w", absl::MakeSpan(before)));

  std::unique_ptr<RawShard> raw;
  UcxRawShard* ucx = nullptr;
  if (Transport() == "ucx") {
    auto connected = testing::RawUcxClient::Connect((*servers)[0]->address());
    REQUIRE_OK(connected.status());
    auto shard = std::make_unique<UcxRawShard>(std::move(*connected));
    ucx = shard.get();
    raw = std::move(shard);
  } else {
    raw = std::make_unique<GrpcRawShard>((*servers)[0]->address());
  }

  SECTION("malformed header") {
    // Bytes that are not a TensorChunk.
    auto status = raw->Push(std::string("\xff\xff\xff\xff\x0f", 5), std::string(32, '\0'));
    // Both backends parse the message themselves (gRPC's Push is a raw
    // method), so both refuse it rather than end the stream early.
    RequireRefused(status, absl::StatusCode::kInvalidArgument, "malformed");
  }
  SECTION("payload length disagrees with the header") {
    auto chunk = MakePush("w", kElements - 1, 1.0f);
    RequireRefused(raw->Push(chunk), absl::StatusCode::kInvalidArgument, "payload");
    if (ucx != nullptr) {
      // The frame announces more bytes than the AM data carries.
      auto good = MakePush("w", kElements, 1.0f);
      RequireRefused(ucx->PushDeclaring(transport::EncodeChunkHeader(good), good.payload(),
                                        good.payload().size() + 4),
                     absl::StatusCode::kInvalidArgument, "payload length");
    }
  }
  SECTION("unknown key") {
    RequireRefused(raw->Push(MakePush("nope", kElements, 1.0f)), absl::StatusCode::kNotFound,
                   "'nope'");
    std::vector<float> values(kElements);
    auto status = (*client)->Pull("nope", absl::MakeSpan(values));
    REQUIRE(!status.ok());
  }
  SECTION("a dead raw peer leaves the shard serving") {
    if (ucx != nullptr) ucx->client().Abandon();
    raw.reset();
  }

  // Nothing changed, and the shard still serves over the same transport.
  REQUIRE_OK((*client)->Pull("w", absl::MakeSpan(after)));
  REQUIRE(after == before);
  std::vector<float> ones(kElements, 1.0f);
  REQUIRE_OK((*client)->Push("w", ones));
  (*client)->Clock();
  REQUIRE_OK((*client)->Pull("w", absl::MakeSpan(after)));
  for (size_t i = 0; i < kElements; ++i) REQUIRE(after[i] == before[i] - 0.5f);
}

TEST_CASE("a dead shard fails calls with UNAVAILABLE instead of hanging") {
  INFO("transport " << Transport());
  auto servers = testing::StartCluster(1, 1, ServerFlags({}));
  REQUIRE(servers.ok());
  auto options = Options(*servers);
  options.rpc_timeout = absl::Seconds(20);
  options.retry_timeout = absl::ZeroDuration();  // no retries: see the first error
  auto client = Client::Create(options);
  REQUIRE_OK(client.status());
  std::vector<float> values(1000, 1.0f);
  REQUIRE_OK((*client)->RegisterTensor("w", {1000}, values));
  (*servers)[0]->process().Signal(SIGKILL);
  REQUIRE((*servers)[0]->process().WaitForExit(5000) >= 0);
  const absl::Time start = absl::Now();
  auto status = (*client)->Pull("w", absl::MakeSpan(values));
  INFO(status.ToString());
  REQUIRE(status.code() == absl::StatusCode::kUnavailable);
  const absl::Duration took = absl::Now() - start;
  INFO("took " << absl::FormatDuration(took));
  REQUIRE(took < absl::Seconds(30));  // bounded (a busy machine may be slow), not a hang
}

}  // namespace
}  // namespace harrier
