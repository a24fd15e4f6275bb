// Who may stop a shard, change its run or end a rank's part, through real
// harrier-server processes: admin calls without a job token only from the
// shard's own host (or any host with --admin_open), with one only with the
// token; a newer run reaching one shard alone never replaces a run whose
// ranks are live (the operator's harrier-ctl new-run does); a Leave with a
// newer epoch than a live session's does not end it.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_security.h"
#include "proto/harrier.grpc.pb.h"
#include "server/session.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr size_t kElements = 64;
constexpr const char* kToken = "authority-test-token";

// An IPv4 address of this machine that is not loopback (eth0's, say); ""
// when it has none.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* entry = list; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* address = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (inet_ntop(AF_INET, &address->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  freeifaddrs(list);
  return found;
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& token = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context->AddMetadata(std::string(kJobTokenMetadataKey), token);
  return context;
}

std::unique_ptr<proto::AdminService::Stub> Admin(const std::string& address) {
  return proto::AdminService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<proto::ParameterService::Stub> Parameters(const std::string& address) {
  return proto::ParameterService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// harrier-ctl with `args`; its exit status and what it printed.
struct CtlRun {
  int exit_code = -1;
  std::string output;
};

CtlRun RunCtl(const std::vector<std::string>& args, const std::string& name) {
  const std::string output = absl::StrCat(testing::TempDir(), "/ctl-", name, ".out");
  std::remove(output.c_str());
  auto ctl = testing::ChildProcess::Start(testing::RunfilePath("server/harrier-ctl"), args, output);
  REQUIRE(ctl.ok());
  CtlRun run;
  run.exit_code = (*ctl)->WaitForExit(30000);
  run.output = ReadFile(output);
  return run;
}

std::unique_ptr<testing::ServerProcess> StartShard(const std::vector<std::string>& flags) {
  std::vector<std::string> all = {"--shard=0", "--num_shards=1", "--num_workers=1"};
  all.insert(all.end(), flags.begin(), flags.end());
  auto server = testing::ServerProcess::Start(all);
  INFO((server.ok() ? "" : server.status().ToString()));
  REQUIRE(server.ok());
  return std::move(*server);
}

void RequireRefused(const grpc::Status& status, grpc::StatusCode code, const std::string& needle) {
  INFO("status " << status.error_code() << ": " << status.error_message());
  REQUIRE(status.error_code() == code);
  REQUIRE(status.error_message().find(needle) != std::string::npos);
}

std::string WriteTokenFile() {
  const std::string path = testing::TempDir() + "/authority.token";
  std::ofstream(path, std::ios::trunc) << kToken << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

TEST_CASE("without a token, admin calls are served only to callers on the shard's host") {
  const std::string remote_host = NonLoopbackAddress();
  const std::string dir = testing::TempDir() + "/admin_loopback";
  auto shard = StartShard({"--host=0.0.0.0", "--checkpoint_dir=" + dir});
  const std::string local = shard->address();
  if (remote_host.empty()) {
    WARN("this machine has no non-loopback IPv4 address: the refusal of remote peers is not "
         "exercised here");
  } else {
    // Called through eth0's address, the shard sees a peer that is not
    // loopback, as it would a caller on another host.
    const std::string remote = absl::StrCat(remote_host, ":", shard->port());
    auto admin = Admin(remote);
    proto::StatusResponse status;
    RequireRefused(admin->GetStatus(Context().get(), {}, &status),
                   grpc::StatusCode::PERMISSION_DENIED, "--admin_open");
    proto::CheckpointResponse checkpoint;
    RequireRefused(admin->Checkpoint(Context().get(), {}, &checkpoint),
                   grpc::StatusCode::PERMISSION_DENIED, "--admin_open");
    proto::NewRunResponse new_run;
    RequireRefused(admin->NewRun(Context().get(), {}, &new_run),
                   grpc::StatusCode::PERMISSION_DENIED, "--admin_open");
    proto::ShutdownRequest stop;
    stop.set_reason("from afar");
    proto::ShutdownResponse stopped;
    RequireRefused(admin->Shutdown(Context().get(), stop, &stopped),
                   grpc::StatusCode::PERMISSION_DENIED, "--admin_open");
    // Refused means nothing happened: still serving, nothing written.
    REQUIRE(shard->process().WaitForExit(300) == -1);
    REQUIRE(Admin(local)->GetStatus(Context().get(), {}, &status).ok());
    CHECK(status.checkpoint_version() == 0);

    // harrier-ctl says what to do.
    const CtlRun refused = RunCtl({"--servers=" + remote, "status"}, "remote");
    INFO(refused.output);
    CHECK(refused.exit_code == 1);
    CHECK(refused.output.find("PERMISSION_DENIED") != std::string::npos);
    CHECK(refused.output.find("what to do: ") != std::string::npos);
    CHECK(refused.output.find("--servers=127.0.0.1:PORT") != std::string::npos);
  }
  // From the shard's own host, harrier-ctl works as before.
  const CtlRun status = RunCtl({"--servers=" + local, "--json", "status"}, "local");
  INFO(status.output);
  CHECK(status.exit_code == 0);
  CHECK(status.output.find("\"job_state\":") != std::string::npos);
  const CtlRun checkpoint = RunCtl({"--servers=" + local, "checkpoint"}, "local-checkpoint");
  INFO(checkpoint.output);
  CHECK(checkpoint.exit_code == 0);
  CHECK(checkpoint.output.find("shard=0 version=1 ") != std::string::npos);
  const CtlRun shutdown = RunCtl({"--servers=" + local, "shutdown"}, "local-shutdown");
  INFO(shutdown.output);
  CHECK(shutdown.exit_code == 0);
  CHECK(shard->process().WaitForExit(10000) == 0);
}

TEST_CASE("--admin_open serves admin calls to any peer") {
  const std::string remote_host = NonLoopbackAddress();
  if (remote_host.empty()) {
    WARN("this machine has no non-loopback IPv4 address: --admin_open is not exercised here");
    return;
  }
  auto shard = StartShard({"--host=0.0.0.0", "--admin_open=true"});
  auto admin = Admin(absl::StrCat(remote_host, ":", shard->port()));
  proto::StatusResponse status;
  const grpc::Status answered = admin->GetStatus(Context().get(), {}, &status);
  INFO(answered.error_message());
  REQUIRE(answered.ok());
  CHECK(status.job() == "harrier");
  proto::ShutdownRequest stop;
  stop.set_reason("open");
  proto::ShutdownResponse stopped;
  REQUIRE(admin->Shutdown(Context().get(), stop, &stopped).ok());
  CHECK(shard->process().WaitForExit(10000) == 0);
}

TEST_CASE("with a token, Shutdown and Checkpoint need it, from the shard's host or any other") {
  const std::string token_file = WriteTokenFile();
  const std::string dir = testing::TempDir() + "/admin_token";
  auto shard = StartShard(
      {"--host=0.0.0.0", "--auth_token_file=" + token_file, "--checkpoint_dir=" + dir});
  std::vector<std::string> addresses = {shard->address()};
  const std::string remote_host = NonLoopbackAddress();
  if (!remote_host.empty()) addresses.push_back(absl::StrCat(remote_host, ":", shard->port()));
  for (const std::string& address : addresses) {
    INFO("via " << address);
    auto admin = Admin(address);
    for (const std::string token : {"", "wrong"}) {
      proto::CheckpointResponse checkpoint;
      RequireRefused(admin->Checkpoint(Context(token).get(), {}, &checkpoint),
                     grpc::StatusCode::UNAUTHENTICATED, "job token");
      proto::ShutdownResponse stopped;
      RequireRefused(admin->Shutdown(Context(token).get(), {}, &stopped),
                     grpc::StatusCode::UNAUTHENTICATED, "job token");
      proto::NewRunResponse new_run;
      RequireRefused(admin->NewRun(Context(token).get(), {}, &new_run),
                     grpc::StatusCode::UNAUTHENTICATED, "job token");
      proto::StatusResponse status;
      RequireRefused(admin->GetStatus(Context(token).get(), {}, &status),
                     grpc::StatusCode::UNAUTHENTICATED, "job token");
    }
    REQUIRE(shard->process().WaitForExit(200) == -1);
    // With it, from wherever the operator is.
    proto::StatusResponse status;
    REQUIRE(admin->GetStatus(Context(kToken).get(), {}, &status).ok());
    CHECK(status.checkpoint_version() == 0);
  }
  const CtlRun no_token = RunCtl({"--servers=" + shard->address(), "checkpoint"}, "no-token");
  INFO(no_token.output);
  CHECK(no_token.exit_code == 1);
  CHECK(no_token.output.find("UNAUTHENTICATED") != std::string::npos);
  CHECK(no_token.output.find("what to do: the shards have a job token") != std::string::npos);
  auto admin = Admin(addresses.back());
  proto::CheckpointResponse checkpoint;
  REQUIRE(admin->Checkpoint(Context(kToken).get(), {}, &checkpoint).ok());
  CHECK(checkpoint.version() == 1);
  proto::ShutdownResponse stopped;
  REQUIRE(admin->Shutdown(Context(kToken).get(), {}, &stopped).ok());
  CHECK(shard->process().WaitForExit(10000) == 0);
}

// One worker on two shards (BSP, sgd lr 1): each step pushes ones, so after
// step s every parameter is its initial value minus s.
struct Job {
  std::vector<std::unique_ptr<testing::ServerProcess>> servers;
  std::unique_ptr<Client> client;
  int64_t steps = 0;
};

Job StartJob(const std::vector<std::string>& extra_flags = {}) {
  Job job;
  std::vector<std::string> flags = {"--sync=bsp", "--lr=1", "--heartbeat_timeout_ms=20000"};
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  auto servers = testing::StartCluster(2, 1, flags);
  INFO((servers.ok() ? "" : servers.status().ToString()));
  REQUIRE(servers.ok());
  job.servers = std::move(*servers);
  ClientOptions options;
  options.servers = testing::Addresses(job.servers);
  options.connect_timeout = absl::Seconds(5);
  options.rpc_timeout = absl::Seconds(10);
  options.retry_timeout = absl::ZeroDuration();
  options.heartbeat_interval = absl::Milliseconds(200);
  options.chunk_bytes = 64;  // 16 floats: the tensor's 4 chunks spread over both shards
  auto client = Client::Create(options);
  INFO((client.ok() ? "" : client.status().ToString()));
  REQUIRE(client.ok());
  job.client = std::move(*client);
  std::vector<float> initial(kElements);
  for (size_t i = 0; i < kElements; ++i) initial[i] = static_cast<float>(i);
  REQUIRE(job.client->RegisterTensor("w", {static_cast<int64_t>(kElements)}, initial).ok());
  return job;
}

void TrainExactly(Job& job, int steps) {
  for (int i = 0; i < steps; ++i) {
    const std::vector<float> gradient(kElements, 1.0f);
    const absl::Status pushed = job.client->Push("w", gradient);
    INFO("step " << job.steps + 1 << ": " << pushed.ToString());
    REQUIRE(pushed.ok());
    job.client->Clock();
    ++job.steps;
    std::vector<float> values(kElements, -1000.0f);
    const absl::Status pulled = job.client->Pull("w", absl::MakeSpan(values));
    INFO(pulled.ToString());
    REQUIRE(pulled.ok());
    for (size_t e = 0; e < kElements; ++e) {
      REQUIRE(values[e] == static_cast<float>(e) - static_cast<float>(job.steps));
    }
  }
}

proto::StatusResponse StatusOf(const testing::ServerProcess& shard) {
  proto::StatusResponse status;
  const grpc::Status answered = Admin(shard.address())->GetStatus(Context().get(), {}, &status);
  INFO(answered.error_message());
  REQUIRE(answered.ok());
  return status;
}

// A session anyone can make without the token: the job name is public.
proto::Session Minted(uint32_t rank, uint64_t epoch, uint64_t job_id) {
  proto::Session session;
  session.set_epoch(epoch);
  session.set_job_id(job_id);
  session.set_credential(
      MintCredential(DeriveSessionKey("", kDefaultJob), kDefaultJob, rank, epoch, job_id));
  return session;
}

TEST_CASE("a newer run reaching shard 1 alone does not replace the run whose rank is live") {
  Job job = StartJob();
  TrainExactly(job, 3);
  const proto::StatusResponse before = StatusOf(*job.servers[1]);
  REQUIRE(before.job_id() != 0);
  REQUIRE(before.chunks() > 0);  // shard 1 holds part of "w"

  // The next run's session, minted with the public no-token key, as its
  // first call would bring it.
  proto::HeartbeatRequest forged;
  forged.set_job(kDefaultJob);
  forged.set_rank(0);
  *forged.mutable_session() = Minted(0, job.client->session_epoch() + 1, before.job_id() + 1);
  proto::HeartbeatResponse answer;
  RequireRefused(Parameters(job.servers[1]->address())->Heartbeat(Context().get(), forged, &answer),
                 grpc::StatusCode::FAILED_PRECONDITION, "harrier-ctl new-run");
  const proto::StatusResponse after = StatusOf(*job.servers[1]);
  CHECK(after.job_id() == before.job_id());
  CHECK(after.chunks() == before.chunks());
  CHECK(after.param_bytes() == before.param_bytes());
  // Shard 0 decides the runs: a newer one is never taken from a call there.
  RequireRefused(Parameters(job.servers[0]->address())->Heartbeat(Context().get(), forged, &answer),
                 grpc::StatusCode::FAILED_PRECONDITION, "did not start");
  CHECK(StatusOf(*job.servers[0]).job_id() == before.job_id());

  TrainExactly(job, 3);
}

TEST_CASE("a Leave with a higher epoch than the live session's does not end the rank") {
  Job job = StartJob();
  TrainExactly(job, 2);
  const uint64_t epoch = job.client->session_epoch();
  const uint64_t job_id = StatusOf(*job.servers[0]).job_id();
  for (int shard = 1; shard >= 0; --shard) {
    INFO("shard " << shard);
    for (const bool release : {false, true}) {
      proto::LeaveRequest leave;
      leave.set_job(kDefaultJob);
      leave.set_rank(0);
      leave.set_clock(0);
      leave.set_release(release);
      *leave.mutable_session() = Minted(0, epoch + 1, job_id);
      proto::LeaveResponse left;
      RequireRefused(
          Parameters(job.servers[shard]->address())->Leave(Context().get(), leave, &left),
          grpc::StatusCode::PERMISSION_DENIED, "live session");
    }
    const proto::StatusResponse status = StatusOf(*job.servers[shard]);
    REQUIRE(status.ranks_size() == 1);
    for (const proto::RankStatus& rank : status.ranks()) {
      CHECK(rank.epoch() == epoch);
      CHECK(rank.state() == "present");
    }
  }
  // Giving the rank back on shard 0 needs the live session as well, and so
  // does taking it over.
  testing::Sessions sessions(
      grpc::CreateChannel(job.servers[0]->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::RegisterRequest release;
    release.set_job(kDefaultJob);
    release.set_requested_rank(0);
    release.set_release(true);
    *release.mutable_previous_session() = Minted(0, epoch + 1, job_id);
    proto::RegisterResponse response;
    RequireRefused(proto::ControlService::NewStub(grpc::CreateChannel(
                       job.servers[0]->address(), grpc::InsecureChannelCredentials()))
                       ->Register(&context, release, &response),
                   grpc::StatusCode::PERMISSION_DENIED, "live session");
  }
  proto::RegisterResponse taken;
  RequireRefused(sessions.Register(0, &taken), grpc::StatusCode::ALREADY_EXISTS,
                 "held by a live session");

  CHECK(job.client->session_epoch() == epoch);
  TrainExactly(job, 2);
}

TEST_CASE("harrier-ctl new-run ends the running job on every shard and starts the next") {
  Job job = StartJob({"--exit_when_done=false"});
  TrainExactly(job, 1);
  const uint64_t old_id = StatusOf(*job.servers[0]).job_id();
  REQUIRE(StatusOf(*job.servers[1]).job_id() == old_id);

  const CtlRun run = RunCtl(
      {"--servers=" + job.servers[0]->address() + "," + job.servers[1]->address(), "new-run"},
      "new-run");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const uint64_t new_id = StatusOf(*job.servers[0]).job_id();
  CHECK(new_id > old_id);
  CHECK(StatusOf(*job.servers[1]).job_id() == new_id);
  CHECK(run.output.find(absl::StrCat("job id ", old_id, " ended, job id ", new_id, " started")) !=
        std::string::npos);
  CHECK(run.output.find(absl::StrCat("job id ", old_id, " ended, job id ", new_id, " adopted")) !=
        std::string::npos);
  for (const auto& shard : job.servers) CHECK(StatusOf(*shard).chunks() == 0);

  // The old run's worker is told so; a worker of the new run starts afresh.
  const std::vector<float> gradient(kElements, 1.0f);
  const absl::Status stale = job.client->Push("w", gradient);
  INFO(stale.ToString());
  CHECK(stale.message().find("a run that has ended") != std::string::npos);
  job.client.reset();
  Job next;
  next.servers = std::move(job.servers);
  ClientOptions options;
  options.servers = testing::Addresses(next.servers);
  options.connect_timeout = absl::Seconds(5);
  options.rpc_timeout = absl::Seconds(10);
  options.retry_timeout = absl::ZeroDuration();
  options.heartbeat_interval = absl::Milliseconds(200);
  options.chunk_bytes = 64;
  auto client = Client::Create(options);
  INFO((client.ok() ? "" : client.status().ToString()));
  REQUIRE(client.ok());
  next.client = std::move(*client);
  std::vector<float> initial(kElements);
  for (size_t i = 0; i < kElements; ++i) initial[i] = static_cast<float>(i);
  REQUIRE(next.client->RegisterTensor("w", {static_cast<int64_t>(kElements)}, initial).ok());
  TrainExactly(next, 2);
}

}  // namespace
}  // namespace harrier
