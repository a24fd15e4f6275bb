// UCX endpoints of a shard with a job token: only a hello carrying the
// one-time secret GetTransportAddress issued over the authenticated gRPC
// channel gets an endpoint; frames of a connection that was refused are
// dropped; the client library's UCX path works with the token.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fstream>

#include "common/transport/framing.h"
#include "testing/server_process.h"
#include "tests/transport/raw_ucx_client.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr const char* kToken = "ucx-job-token";

std::string TokenFile() {
  const std::string path = testing::TempDir() + "/ucx-token";
  std::ofstream(path, std::ios::trunc) << kToken << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

TEST_CASE("a shard with a token accepts UCX hellos only with the secret it issued") {
  auto servers = testing::StartCluster(
      1, 1, {"--ucx", "--auth_token_file=" + TokenFile(), "--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  const std::string address = (*servers)[0]->address();

  SECTION("the client library over UCX, with the token") {
    ClientOptions options;
    options.servers = {address};
    options.transport = "ucx";
    options.auth_token = kToken;
    options.heartbeat_interval = absl::ZeroDuration();
    auto client = Client::Create(options);
    INFO(client.status().ToString());
    REQUIRE(client.ok());
    std::vector<float> initial(64, 2.0f), gradient(64, 0.5f), values(64, 0.0f);
    REQUIRE((*client)->RegisterTensor("w", {64}, initial).ok());
    REQUIRE((*client)->Push("w", gradient).ok());
    (*client)->Clock();
    REQUIRE((*client)->Pull("w", absl::MakeSpan(values)).ok());
    for (float v : values) REQUIRE(v == 1.5f);
  }
  SECTION("the issued secret works once") {
    testing::RawUcxHello hello;
    hello.job_token = kToken;
    auto client = testing::RawUcxClient::Connect(address, hello);
    INFO(client.status().ToString());
    REQUIRE(client.ok());
  }
  SECTION("no address without the token") {
    REQUIRE_FALSE(testing::RawUcxClient::Connect(address).ok());
  }
  for (const std::string& secret : {std::string(), std::string("0123456789abcdef")}) {
    SECTION("a hello without the issued secret gets no endpoint: '" + secret + "'") {
      testing::RawUcxHello hello;
      hello.job_token = kToken;
      hello.replace_secret = true;
      hello.secret = secret;
      hello.timeout = absl::Seconds(2);
      auto client = testing::RawUcxClient::Connect(address, hello);
      REQUIRE(absl::IsDeadlineExceeded(client.status()));
    }
  }
}

}  // namespace
}  // namespace harrier
