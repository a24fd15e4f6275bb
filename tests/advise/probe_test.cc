// AdminService.Probe against a real harrier-server with a job token: the
// reply has the size asked for (up to the 8 MiB bound), a payload over 64
// MiB and reply_bytes over 8 MiB are INVALID_ARGUMENT naming the bound, a call
// without the token is refused, and probes change no parameter and no
// byte counter (GetStatus and /metrics). And GetStatus's tensor list, as
// harrier-advise --tensors_from_job reads a running job's model: only when
// asked, every chunk counted once over the shards, the shapes as registered.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/advise/measure.h"
#include "common/grpc_limits.h"
#include "common/grpc_security.h"
#include "proto/harrier.grpc.pb.h"
#include "server/admin_service.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr char kToken[] = "probe-test-token";

std::unique_ptr<grpc::ClientContext> Context(bool with_token) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (with_token) context->AddMetadata(std::string(kJobTokenMetadataKey), kToken);
  return context;
}

struct ProbeResult {
  grpc::Status status;
  size_t reply_size = 0;
  bool reply_zero = true;
};

ProbeResult Probe(proto::AdminService::Stub& stub, size_t payload, uint64_t reply_bytes,
                  bool with_token = true) {
  proto::ProbeRequest request;
  request.mutable_payload()->assign(payload, '\x7f');
  request.set_reply_bytes(reply_bytes);
  proto::ProbeResponse response;
  ProbeResult result;
  result.status = stub.Probe(Context(with_token).get(), request, &response);
  result.reply_size = response.payload().size();
  result.reply_zero = response.payload().find_first_not_of('\0') == std::string::npos;
  return result;
}

proto::StatusResponse Status(proto::AdminService::Stub& stub) {
  proto::StatusResponse status;
  const grpc::Status rpc = stub.GetStatus(Context(true).get(), proto::StatusRequest(), &status);
  INFO(rpc.error_message());
  REQUIRE(rpc.ok());
  return status;
}

TEST_CASE("Probe: echo sizes, the 64 MiB and 8 MiB bounds, the token, and no parameter touched") {
  const std::string token_path = testing::TempDir() + "/probe_token";
  {
    std::ofstream token(token_path);
    token << kToken << "\n";
  }
  REQUIRE(chmod(token_path.c_str(), 0600) == 0);
  const int metrics_port = testing::FreePort();
  auto servers = testing::StartCluster(
      1, 1,
      {"--sync=asp", "--lr=1", "--optimizer=sgd", absl::StrCat("--auth_token_file=", token_path),
       absl::StrCat("--metrics_port=", metrics_port)});
  INFO(servers.status().ToString());
  REQUIRE(servers.ok());

  // A tensor with known values: pushed once (lr 1: params = -gradient).
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.rank = 0;
  options.auth_token = kToken;
  options.rpc_timeout = absl::Seconds(20);
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  const size_t n = 1000;
  REQUIRE((*client)->RegisterTensor("w", {static_cast<int64_t>(n)}).ok());
  std::vector<float> gradient(n);
  for (size_t i = 0; i < n; ++i) gradient[i] = 0.25f * static_cast<float>(i % 17);
  REQUIRE((*client)->Push("w", gradient).ok());
  (*client)->Clock();
  std::vector<float> before(n, 99.0f);
  REQUIRE((*client)->Pull("w", absl::MakeSpan(before)).ok());
  REQUIRE(before[3] == -0.75f);

  // Not MakeChannelArguments(): its 64 MiB limits would win over larger
  // ones set after them (the first setting of an argument counts), and a
  // probe at the bound needs the room of its envelope on top.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  args.SetInt("grpc.http2.bdp_probe", 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = proto::AdminService::NewStub(grpc::CreateCustomChannel(
      (*servers)[0]->address(), grpc::InsecureChannelCredentials(), args));
  const proto::StatusResponse status_before = Status(*stub);
  const double metric_in_before =
      testing::MetricValue(metrics_port, "harrier_server_bytes_in_total");
  const double metric_out_before =
      testing::MetricValue(metrics_port, "harrier_server_bytes_out_total");
  REQUIRE(metric_in_before > 0);

  for (const auto& [payload, reply] : std::vector<std::pair<size_t, uint64_t>>{
           {0, 0}, {1, 0}, {0, 1}, {4096, 123457}, {3u << 20, 5u << 20}}) {
    INFO("payload " << payload << " reply " << reply);
    const ProbeResult result = Probe(*stub, payload, reply);
    INFO(result.status.error_message());
    REQUIRE(result.status.ok());
    REQUIRE(result.reply_size == reply);
    REQUIRE(result.reply_zero);
  }
  // At the bound, both ways.
  {
    const ProbeResult up = Probe(*stub, kMaxProbeBytes, 0);
    INFO(up.status.error_message());
    REQUIRE(up.status.ok());
    REQUIRE(up.reply_size == 0);
    const ProbeResult down = Probe(*stub, 0, kMaxProbeReplyBytes);
    INFO(down.status.error_message());
    REQUIRE(down.status.ok());
    REQUIRE(down.reply_size == kMaxProbeReplyBytes);
  }
  // One byte over: refused by the handler, naming the limit.
  {
    const ProbeResult up = Probe(*stub, kMaxProbeBytes + 1, 0);
    REQUIRE(up.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE(up.status.error_message().find("limit of 67108864 bytes (64 MiB)") !=
            std::string::npos);
    const ProbeResult down = Probe(*stub, 0, kMaxProbeReplyBytes + 1);
    REQUIRE(down.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE(down.status.error_message().find("reply_bytes 8388609") != std::string::npos);
    REQUIRE(down.status.error_message().find("limit of 8388608 bytes (8 MiB)") !=
            std::string::npos);
    const ProbeResult huge = Probe(*stub, 0, uint64_t{1} << 40);
    REQUIRE(huge.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  // The token: without it nothing is echoed.
  {
    const ProbeResult refused = Probe(*stub, 10, 10, /*with_token=*/false);
    REQUIRE(refused.status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    REQUIRE(refused.reply_size == 0);
  }

  // Nothing changed: the parameters, the shard's byte counters (GetStatus
  // and /metrics), the tensors it holds.
  std::vector<float> after(n, 99.0f);
  REQUIRE((*client)->Pull("w", absl::MakeSpan(after)).ok());
  REQUIRE(after == before);
  const proto::StatusResponse status_after = Status(*stub);
  // The pull above is the only traffic since: bytes_out grew by its n floats.
  REQUIRE(status_after.bytes_in() == status_before.bytes_in());
  REQUIRE(status_after.bytes_out() == status_before.bytes_out() + n * sizeof(float));
  REQUIRE(status_after.keys() == status_before.keys());
  REQUIRE(status_after.chunks() == status_before.chunks());
  REQUIRE(status_after.param_bytes() == status_before.param_bytes());
  REQUIRE(testing::MetricValue(metrics_port, "harrier_server_bytes_in_total") ==
          metric_in_before);
  REQUIRE(testing::MetricValue(metrics_port, "harrier_server_bytes_out_total") ==
          metric_out_before + n * sizeof(float));
}

TEST_CASE("GetStatus lists the tensors held when asked; ReadJobTensors merges the shards") {
  auto servers = testing::StartCluster(2, 1, {"--sync=asp"});
  INFO(servers.status().ToString());
  REQUIRE(servers.ok());
  advise::LinkOptions link;
  link.servers = testing::Addresses(*servers);
  link.timeout = absl::Seconds(20);

  // Nothing registered yet: said so, naming what to do.
  auto none = advise::ReadJobTensors(link);
  REQUIRE(absl::IsFailedPrecondition(none.status()));
  CHECK(none.status().message().find("start the job's workers first") != std::string::npos);

  ClientOptions options;
  options.servers = link.servers;
  options.rank = 0;
  options.rpc_timeout = absl::Seconds(20);
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  // 2048 x 1024 floats: 8 MiB, two 4 MiB chunks (the client's default).
  REQUIRE((*client)->RegisterTensor("big.weight", {2048, 1024}).ok());
  REQUIRE((*client)->RegisterTensor("small.bias", {1000}).ok());

  uint64_t big_elements = 0, small_elements = 0, big_chunks = 0, small_chunks = 0;
  for (const auto& server : *servers) {
    auto stub = proto::AdminService::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    proto::StatusResponse plain;
    REQUIRE(stub->GetStatus(Context(false).get(), proto::StatusRequest(), &plain).ok());
    CHECK(plain.tensors_size() == 0);  // not asked
    proto::StatusRequest asked;
    asked.set_include_tensors(true);
    proto::StatusResponse listed;
    REQUIRE(stub->GetStatus(Context(false).get(), asked, &listed).ok());
    CHECK(static_cast<uint64_t>(listed.tensors_size()) == listed.keys());
    for (const proto::TensorHeld& held : listed.tensors()) {
      if (held.name() == "big.weight") {
        CHECK(std::vector<uint64_t>(held.shape().begin(), held.shape().end()) ==
              std::vector<uint64_t>{2048, 1024});
        big_elements += held.elements();
        big_chunks += held.chunks();
      } else {
        REQUIRE(held.name() == "small.bias");
        CHECK(held.shape_size() == 1);
        small_elements += held.elements();
        small_chunks += held.chunks();
      }
    }
  }
  CHECK(big_elements == 2048u * 1024u);
  CHECK(big_chunks == 2);
  CHECK(small_elements == 1000);
  CHECK(small_chunks == 1);

  auto tensors = advise::ReadJobTensors(link);
  INFO(tensors.status().ToString());
  REQUIRE(tensors.ok());
  REQUIRE(tensors->size() == 2);
  int64_t total = 0;
  for (const advise::TensorShape& t : *tensors) {
    total += t.num_elements();
    if (t.name == "big.weight") CHECK(t.shape == std::vector<int64_t>{2048, 1024});
    if (t.name == "small.bias") CHECK(t.shape == std::vector<int64_t>{1000});
  }
  CHECK(total == 2048 * 1024 + 1000);

  // A shard that does not answer: the error names it.
  advise::LinkOptions missing = link;
  missing.servers.push_back(absl::StrCat("127.0.0.1:", testing::FreePort()));
  missing.timeout = absl::Seconds(2);
  auto unreachable = advise::ReadJobTensors(missing);
  REQUIRE(!unreachable.ok());
  CHECK(unreachable.status().message().find("shard 2 (127.0.0.1:") != std::string::npos);
}

}  // namespace
}  // namespace harrier
