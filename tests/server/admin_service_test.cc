// AdminService in process: the token check comes before any hook; hooks'
// results and errors pass through; and ShardServer's hooks (FillStatus of an
// empty shard, Checkpoint's version and path, Shutdown's request).
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_security.h"
#include "proto/harrier.grpc.pb.h"
#include "server/admin_service.h"
#include "server/session.h"
#include "server/shard_server.h"

namespace harrier {
namespace {

std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context->AddMetadata(std::string(kJobTokenMetadataKey), token);
  return context;
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

struct Served {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<proto::AdminService::Stub> stub;
};

Served Serve(grpc::Service* service) {
  Served served;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  served.server = builder.BuildAndStart();
  REQUIRE(served.server != nullptr);
  served.stub = proto::AdminService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  return served;
}

TEST_CASE("AdminService: the token first, then the hooks' answers") {
  // The hooks run on gRPC's threads, whose synchronisation TSan cannot see
  // (libgrpc is not instrumented): atomics and a mutex, not plain ints.
  std::atomic<int> calls{0};
  absl::Mutex reason_mutex;
  std::string shutdown_reason;
  AdminHooks hooks;
  hooks.status = [&calls] {
    ++calls;
    proto::StatusResponse status;
    status.set_job("j");
    status.set_keys(7);
    return status;
  };
  hooks.checkpoint = [&calls]() -> absl::StatusOr<proto::CheckpointResponse> {
    ++calls;
    return absl::DataLossError("disk full");
  };
  hooks.shutdown = [&calls, &reason_mutex, &shutdown_reason](const std::string& reason) {
    ++calls;
    absl::MutexLock lock(&reason_mutex);
    shutdown_reason = reason;
  };
  AdminServiceImpl service(hooks, AdminAccess{"secret"});
  Served served = Serve(&service);

  for (const std::string token : {"", "wrong"}) {
    proto::StatusResponse status;
    grpc::Status s = served.stub->GetStatus(Context(token).get(), {}, &status);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    proto::CheckpointResponse checkpoint;
    s = served.stub->Checkpoint(Context(token).get(), {}, &checkpoint);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    proto::ShutdownResponse shutdown;
    s = served.stub->Shutdown(Context(token).get(), {}, &shutdown);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  CHECK(calls.load() == 0);

  proto::StatusResponse status;
  REQUIRE(served.stub->GetStatus(Context("secret").get(), {}, &status).ok());
  CHECK(status.job() == "j");
  CHECK(status.keys() == 7);
  proto::CheckpointResponse checkpoint;
  const grpc::Status failed = served.stub->Checkpoint(Context("secret").get(), {}, &checkpoint);
  CHECK(failed.error_code() == grpc::StatusCode::DATA_LOSS);
  CHECK(failed.error_message() == "disk full");
  proto::ShutdownRequest request;
  request.set_reason("maintenance");
  proto::ShutdownResponse shutdown;
  REQUIRE(served.stub->Shutdown(Context("secret").get(), request, &shutdown).ok());
  {
    absl::MutexLock lock(&reason_mutex);
    CHECK(shutdown_reason == "maintenance");
  }
  CHECK(calls.load() == 3);
}

TEST_CASE("IsLoopbackPeer: loopback addresses in gRPC's peer forms, and nothing else") {
  for (const char* peer :
       {"ipv4:127.0.0.1:5000", "ipv4:127.1.2.3:1", "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000",
        "ipv6:[::ffff:127.0.0.1]:5000", "ipv6:%5B::ffff:127.0.0.1%5D:5000", "unix:/tmp/s",
        "unix-abstract:harrier"}) {
    INFO(peer);
    CHECK(IsLoopbackPeer(peer));
  }
  for (const char* peer :
       {"ipv4:192.0.2.2:5000", "ipv4:10.0.0.1:1", "ipv4:128.0.0.1:1", "ipv6:[fd00::2]:5000",
        "ipv6:%5B::ffff:192.0.2.2%5D:5000", "ipv6:[fe80::1%25eth0]:1", "ipv6:::1:5000",
        "ipv4:localhost:1", "", "127.0.0.1:5000", "tcp:127.0.0.1:1"}) {
    INFO(peer);
    CHECK_FALSE(IsLoopbackPeer(peer));
  }
}

TEST_CASE("AdminService: without a token, a peer that is not loopback is refused") {
  // The in-process server is reached over 127.0.0.1, so the refusal of
  // remote peers is checked through real processes (authority_test); here,
  // that loopback callers are served and Probe stays open.
  std::atomic<int> calls{0};
  AdminHooks hooks;
  hooks.status = [&calls] {
    ++calls;
    return proto::StatusResponse();
  };
  AdminServiceImpl service(hooks, AdminAccess{});
  Served served = Serve(&service);
  proto::StatusResponse status;
  CHECK(served.stub->GetStatus(Context("").get(), {}, &status).ok());
  CHECK(calls.load() == 1);
  proto::NewRunResponse new_run;
  CHECK(served.stub->NewRun(Context("").get(), {}, &new_run).error_code() ==
        grpc::StatusCode::UNIMPLEMENTED);
}

TEST_CASE("AdminService: no checkpoint hook is FAILED_PRECONDITION") {
  AdminServiceImpl service(AdminHooks{}, AdminAccess{});
  Served served = Serve(&service);
  proto::CheckpointResponse checkpoint;
  const grpc::Status s = served.stub->Checkpoint(Context("").get(), {}, &checkpoint);
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message().find("--checkpoint_dir") != std::string::npos);
}

std::unique_ptr<proto::AdminService::Stub> StubFor(const ShardServer& server) {
  return proto::AdminService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials()));
}

TEST_CASE("ShardServer: status of an empty shard, a checkpoint, a shutdown request") {
  ShardServerOptions options;
  options.host = "127.0.0.1";
  options.store.shard = 1;
  options.store.num_shards = 2;
  options.store.num_workers = 2;
  options.checkpoint_dir = TempDir() + "/admin_ckpt";
  auto server = ShardServer::Start(options);
  REQUIRE(server.ok());
  auto stub = StubFor(**server);

  proto::StatusResponse status;
  REQUIRE(stub->GetStatus(Context("").get(), {}, &status).ok());
  CHECK(status.job() == "harrier");
  CHECK(status.shard() == 1);
  CHECK(status.num_shards() == 2);
  CHECK(status.num_workers() == 2);
  CHECK(status.sync().mode() == proto::SYNC_BSP);
  CHECK(status.job_state() == "waiting");
  REQUIRE(status.ranks_size() == 2);
  for (const auto& rank : status.ranks()) {
    CHECK(rank.state() == "absent");
    CHECK(rank.next_clock() == -1);
    CHECK(rank.last_heard_ms_ago() == -1);
    CHECK(rank.epoch() == 0);
  }
  CHECK(status.keys() == 0);
  CHECK(status.param_bytes() == 0);
  CHECK(status.checkpoint_age_seconds() == -1);
  CHECK(status.checkpoint_version() == 0);
  CHECK(status.uptime_seconds() >= 0);

  proto::CheckpointResponse checkpoint;
  // Shard 1 holds no run until a worker's call reaches it: nothing to write.
  const grpc::Status no_run = stub->Checkpoint(Context("").get(), {}, &checkpoint);
  CHECK(no_run.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(no_run.error_message().find("no run yet") != std::string::npos);
  CHECK(status.job_id() == 0);
  // The run's first call (a heartbeat with a session of shard 0's run) starts it here.
  {
    const std::string key = DeriveSessionKey("", "harrier");
    proto::HeartbeatRequest heartbeat;
    heartbeat.set_job("harrier");
    heartbeat.set_rank(0);
    heartbeat.set_report_next_clock(true);
    heartbeat.mutable_session()->set_epoch(5);
    heartbeat.mutable_session()->set_job_id(1234);
    heartbeat.mutable_session()->set_credential(MintCredential(key, "harrier", 0, 5, 1234));
    auto parameters = proto::ParameterService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string((*server)->port()), grpc::InsecureChannelCredentials()));
    proto::HeartbeatResponse answer;
    REQUIRE(parameters->Heartbeat(Context("").get(), heartbeat, &answer).ok());
    CHECK(answer.next_clock() == -1);  // no chunk here
    CHECK((*server)->job_id() == 1234);
  }
  REQUIRE(stub->Checkpoint(Context("").get(), {}, &checkpoint).ok());
  CHECK(checkpoint.version() == 1);
  CHECK(checkpoint.path().find("/admin_ckpt/job-1234/shard-1/") != std::string::npos);
  CHECK(std::filesystem::file_size(checkpoint.path()) > 0);
  REQUIRE(stub->GetStatus(Context("").get(), {}, &status).ok());
  CHECK(status.checkpoint_version() == 1);
  CHECK(status.checkpoint_age_seconds() >= 0);
  CHECK(status.checkpoint_age_seconds() < 60);

  CHECK_FALSE((*server)->shutdown_request().has_value());
  proto::ShutdownRequest request;
  request.set_reason("test");
  proto::ShutdownResponse shutdown;
  REQUIRE(stub->Shutdown(Context("").get(), request, &shutdown).ok());
  auto stop = (*server)->shutdown_request();
  REQUIRE(stop.has_value());
  CHECK(stop->reason == "AdminService.Shutdown: test");
  CHECK(stop->exit_code == 0);
}

TEST_CASE("ShardServer without --checkpoint_dir: Checkpoint is FAILED_PRECONDITION") {
  ShardServerOptions options;
  options.host = "127.0.0.1";
  auto server = ShardServer::Start(options);
  REQUIRE(server.ok());
  auto stub = StubFor(**server);
  proto::CheckpointResponse checkpoint;
  const grpc::Status s = stub->Checkpoint(Context("").get(), {}, &checkpoint);
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message() ==
        "shard 0 has no --checkpoint_dir: there is nowhere to write a checkpoint");
}

}  // namespace
}  // namespace harrier
