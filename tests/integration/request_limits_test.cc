// The size limits on what a client sends (common/request_limits.h), through
// the real harrier-server: a string or list over its limit is refused
// before the shard keeps anything of it, with a status that names the
// field, its size and the limit; the shard keeps serving well-behaved
// workers; and strings the shard logs are cut short.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

namespace harrier {
namespace {

// The limits as docs/binaries.md states them; each refusal must name its own.
constexpr size_t kTensorNameLimit = 1024;
constexpr size_t kShapeRankLimit = 32;
constexpr size_t kJobLimit = 256;
constexpr size_t kWorkerNameLimit = 256;
constexpr size_t kBarrierNameLimit = 256;
constexpr size_t kPendingBarrierLimit = 256;
constexpr size_t kCodecSpecLimit = 256;
constexpr size_t kChunksPerCallLimit = 256;
constexpr size_t kCredentialLimit = 64;
constexpr size_t kTransportNameLimit = 64;
constexpr size_t kShutdownReasonLimit = 1024;

constexpr size_t kHostile = 16u << 20;  // 16 MiB, as a hostile client sends

std::string LimitText(size_t limit) { return absl::StrCat("limit of ", limit); }

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   MakeChannelArguments());
}

void SetDeadline(grpc::ClientContext* context, std::chrono::milliseconds timeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

constexpr std::chrono::milliseconds kCallTimeout{20000};

// `status` is the refusal `code` naming `limit`, and does not echo the
// oversized string whole.
void RequireRefused(const grpc::Status& status, grpc::StatusCode code, const std::string& limit) {
  INFO("status " << status.error_code() << ": " << status.error_message().substr(0, 400));
  REQUIRE(status.error_code() == code);
  REQUIRE(status.error_message().find(limit) != std::string::npos);
  REQUIRE(status.error_message().size() < 4096);
}

std::vector<std::unique_ptr<testing::ServerProcess>> Start(int num_workers,
                                                           std::vector<std::string> flags = {}) {
  flags.push_back("--sync=asp");
  flags.push_back("--lr=1");
  auto servers = testing::StartCluster(1, num_workers, flags);
  INFO(servers.status().ToString());
  REQUIRE(servers.ok());
  return std::move(*servers);
}

// A well-behaved worker of rank 0 in a 2-worker ASP job (--lr=1) registers
// a tensor, pushes and pulls it: a push of ones moves it by -1/2.
void RequireServesWorker(const std::vector<std::string>& servers, const std::string& name) {
  ClientOptions options;
  options.servers = servers;
  options.rank = 0;
  options.rpc_timeout = absl::Seconds(20);
  options.retry_timeout = absl::ZeroDuration();
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterTensor(name, {4}).ok());
  REQUIRE((*client)->Push(name, std::vector<float>(4, 1.0f)).ok());
  (*client)->Clock();
  std::vector<float> values(4);
  REQUIRE((*client)->Pull(name, absl::MakeSpan(values)).ok());
  REQUIRE(values == std::vector<float>(4, -0.5f));
}

proto::InitRequest InitOf(testing::Sessions& sessions, const std::string& key,
                          const std::vector<uint64_t>& shape, uint64_t elements) {
  proto::InitRequest request;
  request.set_rank(1);
  sessions.Attach(&request);
  request.set_key(key);
  for (uint64_t dim : shape) request.add_shape(dim);
  request.set_num_elements(elements);
  request.set_dtype(proto::DTYPE_FLOAT32);
  request.mutable_initial_values()->assign(elements * sizeof(float), '\0');
  request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
  return request;
}

grpc::Status Init(proto::ParameterService::Stub& stub, const proto::InitRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallTimeout);
  proto::InitResponse response;
  return stub.Init(&context, request, &response);
}

// Rank 1's dense push of ones for clock 0.
proto::TensorChunk PushOf(testing::Sessions& sessions, const std::string& key, size_t n) {
  std::vector<float> gradient(n, 1.0f);
  proto::TensorChunk chunk;
  chunk.set_rank(1);
  sessions.Attach(&chunk);
  chunk.set_key(key);
  chunk.set_num_elements(n);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(reinterpret_cast<const char*>(gradient.data()),
                                  n * sizeof(float));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

grpc::Status Push(proto::ParameterService::Stub& stub, const proto::TensorChunk& chunk) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallTimeout);
  proto::PushResponse response;
  auto writer = stub.Push(&context, &response);
  writer->Write(chunk);
  writer->WritesDone();
  return writer->Finish();
}

// The status of a pull, and how many reply chunks came before it.
grpc::Status Pull(proto::ParameterService::Stub& stub, const proto::PullRequest& request,
                  int* replies = nullptr) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallTimeout);
  auto reader = stub.Pull(&context, request);
  proto::TensorChunk reply;
  int count = 0;
  while (reader->Read(&reply)) ++count;
  if (replies != nullptr) *replies = count;
  return reader->Finish();
}

proto::PullRequest PullOf(testing::Sessions& sessions, const std::string& key, size_t chunks,
                          const std::string& codec = "") {
  proto::PullRequest request;
  request.set_rank(1);
  sessions.Attach(&request);
  for (size_t i = 0; i < chunks; ++i) {
    proto::ChunkRef* ref = request.add_chunks();
    ref->set_key(key);
    ref->set_chunk(static_cast<uint32_t>(i));
    ref->set_num_elements(4);
    ref->set_codec_params(codec);
  }
  return request;
}

// A valid top-k spec of exactly `bytes` bytes ("topk:ratio=0.0100...0").
std::string TopkSpec(size_t bytes) {
  std::string spec = "topk:ratio=0.01";
  spec.resize(bytes, '0');
  return spec;
}

TEST_CASE("Init: tensor names, shape rank and dimensions are bounded") {
  auto servers = Start(2, {"--max_param_bytes=1048576"});
  auto channel = Channel(servers[0]->address());
  auto stub = proto::ParameterService::NewStub(channel);
  testing::Sessions sessions(channel);

  // Rank over the limit: a hostile 4,194,304-dimension shape of ones for
  // one element, and one dimension too many.
  RequireRefused(Init(*stub, InitOf(sessions, "wide", std::vector<uint64_t>(4u << 20, 1), 1)),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kShapeRankLimit));
  RequireRefused(
      Init(*stub, InitOf(sessions, "wide", std::vector<uint64_t>(kShapeRankLimit + 1, 1), 1)),
      grpc::StatusCode::INVALID_ARGUMENT, LimitText(kShapeRankLimit));
  // A dimension of 0, and a shape whose product overflows 64 bits.
  RequireRefused(Init(*stub, InitOf(sessions, "empty", {4, 0}, 0)),
                 grpc::StatusCode::INVALID_ARGUMENT, "dimension 1 is 0");
  RequireRefused(
      Init(*stub, InitOf(sessions, "huge", {uint64_t{1} << 32, uint64_t{1} << 32, 4}, 1)),
      grpc::StatusCode::INVALID_ARGUMENT, "shape");
  // Names over the limit, by one byte and by 16 MiB.
  RequireRefused(Init(*stub, InitOf(sessions, std::string(kTensorNameLimit + 1, 'k'), {4}, 4)),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kTensorNameLimit));
  RequireRefused(Init(*stub, InitOf(sessions, std::string(kHostile, 'k'), {4}, 4)),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kTensorNameLimit));
  // At the limits: accepted.
  const grpc::Status at_limits = Init(*stub, InitOf(sessions, std::string(kTensorNameLimit, 'k'),
                                                    std::vector<uint64_t>(kShapeRankLimit, 1), 1));
  INFO(at_limits.error_message());
  REQUIRE(at_limits.ok());

  RequireServesWorker(testing::Addresses(servers), "w");
}

TEST_CASE("Pull: chunks per call are bounded as a push's are, and so are the names it carries") {
  auto servers = Start(2);
  auto channel = Channel(servers[0]->address());
  auto stub = proto::ParameterService::NewStub(channel);
  testing::Sessions sessions(channel);
  // "w": as many chunks of 4 elements as a call may name.
  for (uint32_t chunk = 0; chunk < kChunksPerCallLimit; ++chunk) {
    proto::InitRequest init = InitOf(sessions, "w", {4 * kChunksPerCallLimit}, 4);
    init.set_chunk(chunk);
    REQUIRE(Init(*stub, init).ok());
  }

  RequireRefused(Pull(*stub, PullOf(sessions, "w", kChunksPerCallLimit + 1)),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, LimitText(kChunksPerCallLimit));
  int replies = 0;
  const grpc::Status at_limit = Pull(*stub, PullOf(sessions, "w", kChunksPerCallLimit), &replies);
  INFO(at_limit.error_message());
  REQUIRE(at_limit.ok());
  REQUIRE(replies == static_cast<int>(kChunksPerCallLimit));
  // One chunk named twice: refused whole, nothing sent.
  proto::PullRequest twice = PullOf(sessions, "w", 3);
  twice.mutable_chunks(2)->set_chunk(0);
  replies = 0;
  RequireRefused(Pull(*stub, twice, &replies), grpc::StatusCode::INVALID_ARGUMENT,
                 "chunk 0 of 'w' is named twice in one call");
  REQUIRE(replies == 0);
  RequireRefused(Pull(*stub, PullOf(sessions, std::string(kTensorNameLimit + 1, 'k'), 1)),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kTensorNameLimit));

  RequireServesWorker(testing::Addresses(servers), "v");
}

TEST_CASE("codec spec strings are bounded on pull, push and push-pull") {
  auto servers = Start(2);
  auto channel = Channel(servers[0]->address());
  auto stub = proto::ParameterService::NewStub(channel);
  testing::Sessions sessions(channel);
  REQUIRE(Init(*stub, InitOf(sessions, "w", {4}, 4)).ok());

  // A compressed pull: a valid spec one byte over the limit, and 16 MiB.
  RequireRefused(Pull(*stub, PullOf(sessions, "w", 1, TopkSpec(kCodecSpecLimit + 1))),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kCodecSpecLimit));
  RequireRefused(Pull(*stub, PullOf(sessions, "w", 1, TopkSpec(kHostile))),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kCodecSpecLimit));
  const grpc::Status at_limit = Pull(*stub, PullOf(sessions, "w", 1, TopkSpec(kCodecSpecLimit)));
  INFO(at_limit.error_message());
  REQUIRE(at_limit.ok());

  // A compressed push naming a spec over the limit.
  proto::TensorChunk pushed = PushOf(sessions, "w", 4);
  pushed.set_codec(2);  // top-k's id; refused for its spec before the id is looked at
  pushed.set_codec_params(TopkSpec(kCodecSpecLimit + 1));
  RequireRefused(Push(*stub, pushed), grpc::StatusCode::INVALID_ARGUMENT,
                 LimitText(kCodecSpecLimit));

  // A push-pull whose pull half names a spec over the limit: refused whole.
  {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    auto stream = stub->PushPull(&context);
    proto::TensorChunk chunk = PushOf(sessions, "w", 4);
    chunk.set_pull_codec_params(TopkSpec(kCodecSpecLimit + 1));
    stream->Write(chunk);
    stream->WritesDone();
    proto::TensorChunk reply;
    while (stream->Read(&reply)) {
    }
    RequireRefused(stream->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                   LimitText(kCodecSpecLimit));
  }
  // Nothing of it was applied: rank 1's clock 0 is still to come.
  REQUIRE(Push(*stub, PushOf(sessions, "w", 4)).ok());

  RequireServesWorker(testing::Addresses(servers), "v");
}

// Barrier calls of rank 1 under distinct names, all at once; the statuses
// once every call ended.
std::vector<grpc::Status> BarriersAtOnce(proto::ControlService::Stub& stub,
                                         testing::Sessions& sessions, const std::string& prefix,
                                         size_t count, std::chrono::milliseconds timeout) {
  struct Call {
    grpc::ClientContext context;
    proto::BarrierRequest request;
    proto::BarrierResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mutex;
  size_t done = 0;
  for (size_t i = 0; i < count; ++i) {
    auto call = std::make_unique<Call>();
    SetDeadline(&call->context, timeout);
    call->request.set_rank(1);
    sessions.Attach(&call->request);
    call->request.set_name(absl::StrCat(prefix, i));
    Call* raw = call.get();
    calls.push_back(std::move(call));
    stub.async()->Barrier(&raw->context, &raw->request, &raw->response,
                          [raw, &mutex, &done](grpc::Status status) {
                            absl::MutexLock lock(&mutex);
                            raw->status = std::move(status);
                            ++done;
                          });
  }
  absl::MutexLock lock(&mutex);
  auto all_ended = [&done, count]() { return done == count; };
  const bool all = mutex.AwaitWithTimeout(absl::Condition(&all_ended),
                                          absl::FromChrono(timeout + std::chrono::seconds(20)));
  REQUIRE(all);
  std::vector<grpc::Status> statuses;
  for (const auto& call : calls) statuses.push_back(call->status);
  return statuses;
}

TEST_CASE("Barrier: names and pending barriers are bounded; abandoned barriers are dropped") {
  auto servers = Start(2);
  auto channel = Channel(servers[0]->address());
  auto control = proto::ControlService::NewStub(channel);
  testing::Sessions sessions(channel);

  for (size_t bytes : {kBarrierNameLimit + 1, kHostile}) {
    grpc::ClientContext context;
    SetDeadline(&context, std::chrono::seconds(2));
    proto::BarrierRequest request;
    request.set_rank(1);
    sessions.Attach(&request);
    request.set_name(std::string(bytes, 'b'));
    proto::BarrierResponse response;
    RequireRefused(control->Barrier(&context, request, &response),
                   grpc::StatusCode::INVALID_ARGUMENT, LimitText(kBarrierNameLimit));
  }

  // One rank waits at one barrier more than the shard keeps pending: one
  // is refused at once, the others wait until their deadline.
  {
    const auto statuses = BarriersAtOnce(*control, sessions, "pending-", kPendingBarrierLimit + 1,
                                         std::chrono::milliseconds(3000));
    size_t refused = 0, expired = 0;
    for (const grpc::Status& status : statuses) {
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        RequireRefused(status, grpc::StatusCode::RESOURCE_EXHAUSTED,
                       LimitText(kPendingBarrierLimit));
        ++refused;
      } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        ++expired;
      }
    }
    REQUIRE(refused == 1);
    REQUIRE(expired == kPendingBarrierLimit);
  }
  // Abandoned at their deadline, they hold no room: as many new ones wait.
  // The shard drops an abandoned barrier when gRPC tells it of the cancel,
  // which on a busy machine may come a little after the client saw its
  // deadline: a batch that still found some kept is tried again (the
  // earlier batch's barriers are abandoned too by then), up to 10 times.
  {
    bool all_waited = false;
    std::string last_refusal;
    for (int attempt = 0; attempt < 10 && !all_waited; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500 * attempt));
      const auto statuses = BarriersAtOnce(*control, sessions, absl::StrCat("again-", attempt, "-"),
                                           kPendingBarrierLimit, std::chrono::milliseconds(1000));
      all_waited = true;
      for (const grpc::Status& status : statuses) {
        if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) continue;
        all_waited = false;
        last_refusal = status.error_message();
        // Only the bound itself may refuse them.
        REQUIRE(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
      }
    }
    INFO(last_refusal);
    REQUIRE(all_waited);
  }
  // Both workers meet at a barrier (once the last batch's abandoned
  // barriers are dropped: a refusal for room is tried again, as above).
  std::vector<grpc::Status> met(2);
  for (int attempt = 0; attempt < 10; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500 * attempt));
    std::vector<std::thread> ranks;
    for (uint32_t rank : {0u, 1u}) {
      ranks.emplace_back([&, rank, attempt] {
        grpc::ClientContext context;
        SetDeadline(&context, kCallTimeout);
        proto::BarrierRequest request;
        request.set_rank(rank);
        sessions.Attach(&request);
        request.set_name(absl::StrCat("together-", attempt));
        proto::BarrierResponse response;
        met[rank] = control->Barrier(&context, request, &response);
      });
    }
    for (auto& thread : ranks) thread.join();
    if (met[0].error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED &&
        met[1].error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      break;
    }
  }
  INFO(met[0].error_message() << " / " << met[1].error_message());
  REQUIRE(met[0].ok());
  REQUIRE(met[1].ok());
}

uint64_t FileBytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  return file ? static_cast<uint64_t>(file.tellg()) : 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST_CASE("Register: worker_name and job are bounded, and a logged worker_name is cut short") {
  const std::string log = absl::StrCat(testing::TempDir(), "/request-limits-register.log");
  std::remove(log.c_str());
  auto server = testing::ServerProcess::Start(
      {"--shard=0", "--num_shards=1", "--num_workers=2", "--sync=asp", "--lr=1"}, log);
  REQUIRE(server.ok());
  auto control = proto::ControlService::NewStub(Channel((*server)->address()));
  auto register_as = [&](int rank, const std::string& job, const std::string& worker_name) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    proto::RegisterRequest request;
    request.set_job(job);
    request.set_requested_rank(rank);
    request.set_worker_name(worker_name);
    proto::RegisterResponse response;
    return control->Register(&context, request, &response);
  };

  const uint64_t before = FileBytes(log);
  for (int i = 0; i < 3; ++i) {
    RequireRefused(register_as(1, "harrier", std::string(kHostile, 'n')),
                   grpc::StatusCode::INVALID_ARGUMENT, LimitText(kWorkerNameLimit));
  }
  RequireRefused(register_as(1, std::string(kJobLimit + 1, 'j'), "worker"),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kJobLimit));
  // 48 MiB of names sent; the log took none of them.
  REQUIRE(FileBytes(log) < before + (64u << 10));

  // A name at the limit is accepted and logged cut short with its length.
  const std::string name = "name-at-the-limit-" + std::string(kWorkerNameLimit - 18, 'x');
  REQUIRE(name.size() == kWorkerNameLimit);
  const grpc::Status accepted = register_as(1, "harrier", name);
  INFO(accepted.error_message());
  REQUIRE(accepted.ok());
  std::string line;
  for (int i = 0; i < 500 && line.empty(); ++i) {
    std::istringstream text(ReadFile(log));
    for (std::string each; std::getline(text, each);) {
      if (each.find("event=register") != std::string::npos &&
          each.find("rank=1") != std::string::npos) {
        line = each;
      }
    }
    if (line.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  INFO(line);
  REQUIRE(!line.empty());
  REQUIRE(line.find("name-at-the-limit-") != std::string::npos);
  REQUIRE(line.find(absl::StrCat("...(", kWorkerNameLimit, " bytes)")) != std::string::npos);
  REQUIRE(line.find(std::string(200, 'x')) == std::string::npos);

  RequireServesWorker({(*server)->address()}, "w");
}

TEST_CASE(
    "heartbeats, leaves, push keys, sessions, transport names and shutdown reasons are "
    "bounded") {
  auto servers = Start(2, {"--max_chunks=16"});
  auto channel = Channel(servers[0]->address());
  auto stub = proto::ParameterService::NewStub(channel);
  auto control = proto::ControlService::NewStub(channel);
  auto admin = proto::AdminService::NewStub(channel);
  testing::Sessions sessions(channel);
  REQUIRE(Init(*stub, InitOf(sessions, "w", {4}, 4)).ok());

  // Heartbeats: a chunk name over the limit, more chunks than the shard may
  // hold (--max_chunks), and a job name over the limit.
  auto heartbeat = [&](const proto::HeartbeatRequest& request, bool to_control) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    proto::HeartbeatResponse response;
    return to_control ? control->Heartbeat(&context, request, &response)
                      : stub->Heartbeat(&context, request, &response);
  };
  proto::HeartbeatRequest request;
  request.set_rank(1);
  sessions.Attach(&request);
  {
    proto::HeartbeatRequest named = request;
    named.add_pushed()->set_key(std::string(kTensorNameLimit + 1, 'k'));
    RequireRefused(heartbeat(named, false), grpc::StatusCode::INVALID_ARGUMENT,
                   LimitText(kTensorNameLimit));
  }
  {
    proto::HeartbeatRequest many = request;
    for (int i = 0; i < 17; ++i) many.add_pushed()->set_key("w");
    RequireRefused(heartbeat(many, false), grpc::StatusCode::INVALID_ARGUMENT, LimitText(16));
  }
  for (bool to_control : {false, true}) {
    proto::HeartbeatRequest job = request;
    job.set_job(std::string(kJobLimit + 1, 'j'));
    RequireRefused(heartbeat(job, to_control), grpc::StatusCode::INVALID_ARGUMENT,
                   LimitText(kJobLimit));
  }
  REQUIRE(heartbeat(request, false).ok());

  // Leave naming a job over the limit.
  {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    proto::LeaveRequest leave;
    leave.set_rank(1);
    sessions.Attach(&leave);
    leave.set_job(std::string(kJobLimit + 1, 'j'));
    proto::LeaveResponse response;
    RequireRefused(stub->Leave(&context, leave, &response), grpc::StatusCode::INVALID_ARGUMENT,
                   LimitText(kJobLimit));
  }
  // A push of a chunk whose key is over the limit.
  RequireRefused(Push(*stub, PushOf(sessions, std::string(kTensorNameLimit + 1, 'k'), 4)),
                 grpc::StatusCode::INVALID_ARGUMENT, LimitText(kTensorNameLimit));
  // A session credential over the limit (a real one is 32 bytes).
  {
    proto::PullRequest pull = PullOf(sessions, "w", 1);
    pull.mutable_session()->set_credential(std::string(kCredentialLimit + 1, 'c'));
    RequireRefused(Pull(*stub, pull), grpc::StatusCode::INVALID_ARGUMENT,
                   LimitText(kCredentialLimit));
  }
  // A transport name over the limit.
  {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    proto::TransportAddressRequest address;
    address.set_transport(std::string(kTransportNameLimit + 1, 't'));
    proto::TransportAddressResponse response;
    RequireRefused(stub->GetTransportAddress(&context, address, &response),
                   grpc::StatusCode::INVALID_ARGUMENT, LimitText(kTransportNameLimit));
  }
  // A shutdown reason over the limit: refused, and the shard keeps serving.
  {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    proto::ShutdownRequest shutdown;
    shutdown.set_reason(std::string(kShutdownReasonLimit + 1, 'r'));
    proto::ShutdownResponse response;
    RequireRefused(admin->Shutdown(&context, shutdown, &response),
                   grpc::StatusCode::INVALID_ARGUMENT, LimitText(kShutdownReasonLimit));
  }

  RequireServesWorker(testing::Addresses(servers), "v");
}

}  // namespace
}  // namespace harrier
