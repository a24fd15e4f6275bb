// Who may speak for a rank, through real harrier-server processes: every
// call that names a rank must carry the session Register handed out for
// it (server/README.md, "Sessions"). Each case here passed on main before
// sessions existed only by doing the damage it now checks is refused.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

namespace harrier {
namespace {

using std::chrono::milliseconds;
constexpr size_t kElements = 4;

ClientOptions Options(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers,
                      int rank) {
  ClientOptions options;
  options.servers = testing::Addresses(servers);
  options.rank = rank;
  options.rpc_timeout = absl::Seconds(10);
  options.retry_timeout = absl::ZeroDuration();
  options.heartbeat_interval = absl::Milliseconds(100);
  return options;
}

std::unique_ptr<Client> Connect(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers,
                                int rank) {
  auto client = Client::Create(Options(servers, rank));
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterTensor("w", {kElements}).ok());
  return std::move(*client);
}

// Raw calls to one shard, with whatever identity the test gives them.
class RawShard {
 public:
  explicit RawShard(const std::string& address)
      : channel_(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                           MakeChannelArguments())),
        stub_(proto::ParameterService::NewStub(channel_)) {}

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

  grpc::Status Push(const proto::TensorChunk& chunk, proto::PushResponse* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PushResponse ignored;
    auto writer = stub_->Push(&context, response != nullptr ? response : &ignored);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }
  grpc::Status Heartbeat(const proto::HeartbeatRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::HeartbeatResponse response;
    return stub_->Heartbeat(&context, request, &response);
  }
  grpc::Status Init(const proto::InitRequest& request, bool* created = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::InitResponse response;
    const grpc::Status status = stub_->Init(&context, request, &response);
    if (created != nullptr) *created = response.created();
    return status;
  }
  grpc::Status Leave(const proto::LeaveRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::LeaveResponse response;
    return stub_->Leave(&context, request, &response);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::ParameterService::Stub> stub_;
};

proto::TensorChunk Gradient(uint32_t rank, int64_t clock, float value,
                            const proto::Session& session, const std::string& job = "harrier") {
  std::vector<float> values(kElements, value);
  proto::TensorChunk chunk;
  chunk.set_job(job);
  chunk.set_rank(rank);
  *chunk.mutable_session() = session;
  chunk.set_key("w");
  chunk.set_clock(clock);
  chunk.set_num_elements(kElements);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(reinterpret_cast<const char*>(values.data()),
                                  values.size() * sizeof(float));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

// `session` null: the request carries none at all (not even an empty one).
proto::InitRequest Creation(uint32_t rank, const std::string& key, const proto::Session* session) {
  std::vector<float> values(kElements, 7.0f);
  proto::InitRequest request;
  request.set_job("harrier");
  request.set_rank(rank);
  if (session != nullptr) *request.mutable_session() = *session;
  request.set_key(key);
  request.add_shape(kElements);
  request.set_num_elements(kElements);
  request.set_dtype(proto::DTYPE_FLOAT32);
  request.mutable_initial_values()->assign(reinterpret_cast<const char*>(values.data()),
                                           values.size() * sizeof(float));
  request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
  return request;
}

proto::Session Forged(const proto::Session& real) {
  proto::Session forged = real;
  forged.mutable_credential()->assign(32, '\x5a');
  if (forged.epoch() == 0) forged.set_epoch(1);
  return forged;
}

void RequireDenied(const grpc::Status& status, const std::string& needle) {
  INFO(status.error_code() << " " << status.error_message());
  REQUIRE(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(status.error_message().find(needle) != std::string::npos);
}

std::vector<float> Pulled(Client& client) {
  std::vector<float> values(kElements);
  REQUIRE(client.Pull("w", absl::MakeSpan(values)).ok());
  return values;
}

TEST_CASE("identity: a forged Leave of another rank is refused, and that rank can still push") {
  auto servers = testing::StartCluster(1, 2, {"--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  auto victim = Connect(*servers, 1);
  RawShard shard((*servers)[0]->address());
  proto::LeaveRequest leave;
  leave.set_job("harrier");
  leave.set_rank(1);
  leave.set_clock(0);
  RequireDenied(shard.Leave(leave), "rank 1: no session credential (register first)");
  // A made-up credential at the victim's epoch.
  leave.mutable_session()->set_epoch(victim->session_epoch());
  leave.mutable_session()->set_credential(std::string(32, 'x'));
  RequireDenied(shard.Leave(leave), "rank 1: bad session credential");
  REQUIRE(victim->Push("w", std::vector<float>(kElements, 1.0f)).ok());
}

TEST_CASE("identity: a forged Heartbeat for an absent rank is refused, and nothing aborts later") {
  auto servers = testing::StartCluster(
      1, 2, {"--sync=asp", "--lr=1", "--heartbeat_timeout_ms=1000", "--on_worker_loss=fail"});
  REQUIRE(servers.ok());
  auto worker = Connect(*servers, 0);
  RawShard shard((*servers)[0]->address());
  proto::HeartbeatRequest heartbeat;
  heartbeat.set_job("harrier");
  heartbeat.set_rank(1);  // nobody registered it
  RequireDenied(shard.Heartbeat(heartbeat), "rank 1: no session credential (register first)");
  *heartbeat.mutable_session() = Forged(proto::Session());
  RequireDenied(shard.Heartbeat(heartbeat), "rank 1: bad session credential");
  // Had it counted, rank 1 would be lost 1 s later and every call ABORTED
  // (--on_worker_loss=fail).
  std::this_thread::sleep_for(milliseconds(2000));
  for (int step = 0; step < 3; ++step) {
    const absl::Status status = worker->Push("w", std::vector<float>(kElements, 1.0f));
    INFO(status.ToString());
    REQUIRE(status.ok());
    worker->Clock();
  }
}

TEST_CASE("identity: a push from a rank that never registered is refused and changes nothing") {
  auto servers = testing::StartCluster(1, 2, {"--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  auto worker = Connect(*servers, 0);
  const std::vector<float> before = Pulled(*worker);
  RawShard shard((*servers)[0]->address());
  RequireDenied(shard.Push(Gradient(1, 0, 100.0f, proto::Session())),
                "rank 1: no session credential (register first)");
  RequireDenied(shard.Push(Gradient(1, 0, 100.0f, Forged(proto::Session()))),
                "rank 1: bad session credential");
  REQUIRE(Pulled(*worker) == before);
  // The worker's own pushes still apply: the parameters were not frozen.
  REQUIRE(worker->Push("w", std::vector<float>(kElements, 1.0f)).ok());
  worker->Clock();
  REQUIRE(Pulled(*worker) != before);
}

TEST_CASE("identity: an Init without a session is refused and creates nothing") {
  auto servers = testing::StartCluster(1, 2, {"--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  RawShard shard((*servers)[0]->address());
  bool created = true;
  RequireDenied(shard.Init(Creation(1, "fresh", nullptr), &created),
                "init 'fresh': rank 1: no session credential (register first)");
  REQUIRE_FALSE(created);
  const proto::Session forged = Forged(proto::Session());
  RequireDenied(shard.Init(Creation(1, "fresh", &forged), &created),
                "rank 1: bad session credential");
  // Registered, the same Init creates the tensor: the refused ones had not.
  testing::Sessions control(shard.channel());
  const proto::Session session = control.For(1);
  REQUIRE_FALSE(session.credential().empty());
  REQUIRE(shard.Init(Creation(1, "fresh", &session), &created).ok());
  REQUIRE(created);
  REQUIRE(shard.Init(Creation(1, "fresh", &session), &created).ok());
  REQUIRE_FALSE(created);
}

TEST_CASE("identity: a message of another job is refused, naming both jobs") {
  auto servers = testing::StartCluster(1, 1, {"--job=alpha"});
  REQUIRE(servers.ok());
  auto wrong = Client::Create(Options(*servers, -1));  // job "harrier"
  INFO(wrong.status().ToString());
  REQUIRE(absl::IsFailedPrecondition(wrong.status()));
  REQUIRE(wrong.status().message().find("'harrier'") != absl::string_view::npos);
  REQUIRE(wrong.status().message().find("'alpha'") != absl::string_view::npos);

  ClientOptions options = Options(*servers, -1);
  options.job = "alpha";
  auto right = Client::Create(options);
  INFO(right.status().ToString());
  REQUIRE(right.ok());
  REQUIRE((*right)->RegisterTensor("w", {kElements}).ok());
  // A chunk of another job with a session that would verify for it.
  RawShard shard((*servers)[0]->address());
  const grpc::Status other = shard.Push(Gradient(0, 0, 1.0f, proto::Session(), "beta"));
  INFO(other.error_message());
  REQUIRE(other.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  REQUIRE(other.error_message().find("'beta'") != std::string::npos);
  REQUIRE(other.error_message().find("'alpha'") != std::string::npos);
}

TEST_CASE("identity: a Register flood cannot keep the ranks from the real workers") {
  auto servers = testing::StartCluster(1, 2, {"--sync=asp", "--heartbeat_timeout_ms=2000"});
  REQUIRE(servers.ok());
  RawShard shard((*servers)[0]->address());
  testing::Sessions flood(shard.channel());
  int granted = 0, refused = 0;
  const auto flood_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) {
    proto::RegisterResponse response;
    const grpc::Status status = flood.Register(-1, &response);
    if (status.ok()) ++granted;
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
  }
  const auto flood_took = std::chrono::steady_clock::now() - flood_start;
  INFO("flood took " << std::chrono::duration_cast<milliseconds>(flood_took).count() << " ms");
  REQUIRE(granted + refused == 1000);
  // Within --heartbeat_timeout_ms the two ranks stay handed out; a flood
  // slower than that (a loaded machine) sees them reclaimed and gets them
  // again, which is the rule too.
  if (flood_took < milliseconds(2000)) REQUIRE(granted == 2);
  REQUIRE(granted >= 2);
  // The flood never uses its sessions: once --heartbeat_timeout_ms has
  // passed, the real workers get both ranks.
  std::vector<std::unique_ptr<Client>> workers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  absl::Status last;
  while (workers.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    auto client = Client::Create(Options(*servers, -1));
    if (client.ok()) {
      workers.push_back(std::move(*client));
    } else {
      last = client.status();
      REQUIRE(absl::IsResourceExhausted(last));
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  INFO(last.ToString());
  REQUIRE(workers.size() == 2);
  REQUIRE(workers[0]->rank() != workers[1]->rank());
  REQUIRE(workers[0]->RegisterTensor("w", {kElements}).ok());
  REQUIRE(workers[0]->Push("w", std::vector<float>(kElements, 1.0f)).ok());
}

TEST_CASE("identity: a re-registered rank gets a new epoch, and the old one is refused everywhere") {
  auto servers = testing::StartCluster(2, 1, {"--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  RawShard shard0((*servers)[0]->address());
  RawShard shard1((*servers)[1]->address());
  testing::Sessions control(shard0.channel());
  proto::RegisterResponse first;
  REQUIRE(control.Register(0, &first).ok());
  proto::HeartbeatRequest heartbeat;
  heartbeat.set_job("harrier");
  heartbeat.set_rank(0);
  *heartbeat.mutable_session() = first.session();
  REQUIRE(shard0.Heartbeat(heartbeat).ok());
  REQUIRE(shard1.Heartbeat(heartbeat).ok());

  // Another process asking for the live rank is refused...
  proto::RegisterResponse second;
  const grpc::Status taken = control.Register(0, &second);
  INFO(taken.error_message());
  REQUIRE(taken.error_code() == grpc::StatusCode::ALREADY_EXISTS);
  REQUIRE(taken.error_message().find("rank 0 is held by a live session") != std::string::npos);
  // ...the holder re-registering with its session gets a new epoch.
  REQUIRE(control.Register(0, &second, &first.session()).ok());
  REQUIRE(second.rank() == 0);
  REQUIRE(second.session().epoch() > first.session().epoch());

  // Shard 0 refuses the old epoch at once; shard 1 from the first call
  // carrying the new one (a worker's first heartbeat round, right after
  // Register).
  RequireDenied(shard0.Heartbeat(heartbeat), "was replaced by epoch");
  proto::HeartbeatRequest renewed = heartbeat;
  *renewed.mutable_session() = second.session();
  REQUIRE(shard0.Heartbeat(renewed).ok());
  REQUIRE(shard1.Heartbeat(renewed).ok());
  RequireDenied(shard1.Heartbeat(heartbeat), absl::StrCat("session epoch ", first.session().epoch(),
                                                          " was replaced by epoch ",
                                                          second.session().epoch()));
  proto::LeaveRequest leave;
  leave.set_job("harrier");
  leave.set_rank(0);
  *leave.mutable_session() = first.session();
  RequireDenied(shard1.Leave(leave), "was replaced by epoch");
}

TEST_CASE("identity: a shard restarted from its checkpoint still refuses a replaced epoch") {
  const std::string dir = testing::TempDir() + "/sessions-restart";
  std::filesystem::remove_all(dir);
  // No periodic checkpoint: the test writes the one the restart reads.
  const std::vector<std::string> flags = {"--shard=0",
                                          "--num_shards=1",
                                          "--num_workers=1",
                                          "--sync=asp",
                                          "--lr=1",
                                          absl::StrCat("--port=", testing::FreePort()),
                                          "--checkpoint_dir=" + dir,
                                          "--resume",
                                          "--checkpoint_every_s=0"};
  auto server = testing::ServerProcess::Start(flags);
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  const std::string address = (*server)->address();
  RawShard shard(address);
  testing::Sessions control(shard.channel());
  proto::RegisterResponse first, second;
  REQUIRE(control.Register(0, &first).ok());
  const proto::Session epoch_a = first.session();
  bool created = false;
  REQUIRE(shard.Init(Creation(0, "w", &epoch_a), &created).ok());
  REQUIRE(created);
  REQUIRE(shard.Push(Gradient(0, 0, 1.0f, epoch_a)).ok());
  // The worker re-registers (epoch B); its old process keeps epoch A.
  REQUIRE(control.Register(0, &second, &epoch_a).ok());
  const proto::Session epoch_b = second.session();
  REQUIRE(epoch_b.epoch() > epoch_a.epoch());
  REQUIRE(shard.Push(Gradient(0, 1, 1.0f, epoch_b)).ok());
  const std::string replaced = absl::StrCat("rank 0: session epoch ", epoch_a.epoch(),
                                            " was replaced by epoch ", epoch_b.epoch());
  RequireDenied(shard.Push(Gradient(0, 2, 1.0f, epoch_a)), replaced);

  {
    auto admin = proto::AdminService::NewStub(shard.channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::CheckpointResponse written;
    const grpc::Status status = admin->Checkpoint(&context, proto::CheckpointRequest(), &written);
    INFO(status.error_message());
    REQUIRE(status.ok());
  }
  (*server)->process().Signal(SIGKILL);
  REQUIRE((*server)->process().WaitForExit(5000) >= 0);
  server = testing::ServerProcess::Start(flags);
  INFO(server.status().ToString());
  REQUIRE(server.ok());

  // After the restart, as before it: epoch A is refused (on every call that
  // names the rank), epoch B goes on where it was.
  RawShard restarted(address);
  RequireDenied(restarted.Push(Gradient(0, 2, 1.0f, epoch_a)), replaced);
  proto::HeartbeatRequest heartbeat;
  heartbeat.set_job("harrier");
  heartbeat.set_rank(0);
  *heartbeat.mutable_session() = epoch_a;
  RequireDenied(restarted.Heartbeat(heartbeat), replaced);
  RequireDenied(restarted.Init(Creation(0, "v", &epoch_a), &created), replaced);
  proto::PushResponse applied;
  const grpc::Status pushed = restarted.Push(Gradient(0, 2, 1.0f, epoch_b), &applied);
  INFO(pushed.error_message());
  REQUIRE(pushed.ok());
  REQUIRE(applied.chunks_accepted() == 1);
  REQUIRE(applied.chunks_duplicate() == 0);
  *heartbeat.mutable_session() = epoch_b;
  REQUIRE(restarted.Heartbeat(heartbeat).ok());
}

TEST_CASE("identity: a worker's rank is free again once it exits, not while it runs") {
  auto servers = testing::StartCluster(1, 1, {"--sync=asp"});
  REQUIRE(servers.ok());
  auto first = Connect(*servers, 0);
  const uint64_t first_epoch = first->session_epoch();
  REQUIRE(first_epoch > 0);
  auto duplicate = Client::Create(Options(*servers, 0));
  INFO(duplicate.status().ToString());
  REQUIRE(absl::IsAlreadyExists(duplicate.status()));
  first.reset();  // gives its session back
  auto restarted = Client::Create(Options(*servers, 0));
  INFO(restarted.status().ToString());
  REQUIRE(restarted.ok());
  REQUIRE((*restarted)->session_epoch() > first_epoch);
}

TEST_CASE("identity: under --on_worker_loss=continue a barrier completes once a worker left") {
  auto servers = testing::StartCluster(1, 3, {"--sync=asp", "--on_worker_loss=continue"});
  REQUIRE(servers.ok());
  auto a = Connect(*servers, 0);
  auto b = Connect(*servers, 1);
  auto c = Connect(*servers, 2);
  REQUIRE(c->Leave().ok());
  auto first = std::async(std::launch::async, [&] { return a->Barrier("end"); });
  auto second = std::async(std::launch::async, [&] { return b->Barrier("end"); });
  REQUIRE(first.wait_for(std::chrono::seconds(8)) == std::future_status::ready);
  REQUIRE(second.wait_for(std::chrono::seconds(8)) == std::future_status::ready);
  const absl::Status status = first.get();
  INFO(status.ToString());
  REQUIRE(status.ok());
  REQUIRE(second.get().ok());
}

TEST_CASE("identity: under --on_worker_loss=continue a barrier completes once a worker is lost") {
  auto servers = testing::StartCluster(
      1, 3, {"--sync=asp", "--on_worker_loss=continue", "--heartbeat_timeout_ms=500"});
  REQUIRE(servers.ok());
  auto a = Connect(*servers, 0);
  auto b = Connect(*servers, 1);
  auto c = Connect(*servers, 2);
  auto first = std::async(std::launch::async, [&] { return a->Barrier("end"); });
  auto second = std::async(std::launch::async, [&] { return b->Barrier("end"); });
  std::this_thread::sleep_for(milliseconds(200));
  REQUIRE(first.wait_for(milliseconds(0)) == std::future_status::timeout);
  c.reset();  // stops heartbeating: lost 500 ms later
  REQUIRE(first.wait_for(std::chrono::seconds(8)) == std::future_status::ready);
  REQUIRE(second.wait_for(std::chrono::seconds(8)) == std::future_status::ready);
  const absl::Status status = first.get();
  INFO(status.ToString());
  REQUIRE(status.ok());
  REQUIRE(second.get().ok());
}

}  // namespace
}  // namespace harrier
