// Transport security through real harrier-server processes: TLS, mutual
// TLS and the job token, with certificates made by openssl for this run.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "common/grpc_security.h"
#include "proto/harrier.grpc.pb.h"
#include "server/session.h"
#include "testing/health_watch.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr size_t kElements = 16;
constexpr const char* kToken = "s3cret-job-token";

// A CA, a server certificate for 127.0.0.1 and localhost, a client
// certificate of that CA, and a client certificate of another CA; made once
// per test binary in its scratch directory.
struct Certificates {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string other_ca, other_cert, other_key;
};

const Certificates& Certs() {
  static const Certificates* certs = [] {
    auto* c = new Certificates();
    c->dir = testing::TempDir() + "/certs";
    const std::string script = absl::StrCat(R"(set -e
mkdir -p ')", c->dir, R"('
cd ')", c->dir, R"('
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
ca() { key "$1.key"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign; }
leaf() {  # name ca ext
  key "$1.key"; openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
ca test-ca
ca other-ca
leaf server test-ca 'subjectAltName=IP:127.0.0.1,DNS:localhost'
leaf client test-ca 'extendedKeyUsage=clientAuth'
leaf stranger other-ca 'extendedKeyUsage=clientAuth'
)");
    const std::string script_path = c->dir + ".sh";
    std::ofstream(script_path) << script;
    if (std::system(("sh '" + script_path + "' >'" + c->dir + ".log' 2>&1").c_str()) != 0) {
      FAIL("openssl could not make the test certificates; see " << c->dir << ".log");
    }
    c->ca = c->dir + "/test-ca.pem";
    c->server_cert = c->dir + "/server.pem";
    c->server_key = c->dir + "/server.key";
    c->client_cert = c->dir + "/client.pem";
    c->client_key = c->dir + "/client.key";
    c->other_ca = c->dir + "/other-ca.pem";
    c->other_cert = c->dir + "/stranger.pem";
    c->other_key = c->dir + "/stranger.key";
    return c;
  }();
  return *certs;
}

std::string WriteFile(const std::string& name, const std::string& contents, mode_t mode) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc) << contents;
  chmod(path.c_str(), mode);
  return path;
}

std::vector<std::string> TlsServerFlags(bool mutual) {
  std::vector<std::string> flags = {"--tls_cert=" + Certs().server_cert,
                                    "--tls_key=" + Certs().server_key};
  if (mutual) flags.push_back("--tls_ca=" + Certs().ca);
  return flags;
}

ClientOptions BaseOptions(const std::vector<std::unique_ptr<testing::ServerProcess>>& servers) {
  ClientOptions options;
  options.servers = testing::Addresses(servers);
  options.connect_timeout = absl::Seconds(5);
  options.rpc_timeout = absl::Seconds(10);
  options.retry_timeout = absl::ZeroDuration();
  options.heartbeat_interval = absl::ZeroDuration();
  return options;
}

// Registers a tensor, pushes a gradient of ones and checks the pulled values
// (ASP, one worker, sgd lr 1: w = initial - 1).
void RequirePushPullWorks(Client& client, const std::string& name) {
  std::vector<float> initial(kElements);
  for (size_t i = 0; i < kElements; ++i) initial[i] = static_cast<float>(i);
  REQUIRE(client.RegisterTensor(name, {static_cast<int64_t>(kElements)}, initial).ok());
  std::vector<float> gradient(kElements, 1.0f);
  REQUIRE(client.Push(name, gradient).ok());
  client.Clock();
  std::vector<float> values(kElements, -100.0f);
  const absl::Status pulled = client.Pull(name, absl::MakeSpan(values));
  INFO(pulled.ToString());
  REQUIRE(pulled.ok());
  for (size_t i = 0; i < kElements; ++i) REQUIRE(values[i] == static_cast<float>(i) - 1.0f);
}

void RequireRefusedWith(const absl::Status& status, const std::string& needle) {
  INFO("status: " << status.ToString());
  REQUIRE_FALSE(status.ok());
  REQUIRE(status.message().find(needle) != std::string::npos);
}

TEST_CASE("a TLS shard serves a TLS worker end to end") {
  auto servers = testing::StartCluster(1, 1, [] {
    auto flags = TlsServerFlags(false);
    flags.insert(flags.end(), {"--sync=asp", "--lr=1"});
    return flags;
  }());
  REQUIRE(servers.ok());
  ClientOptions options = BaseOptions(*servers);
  options.tls_ca_file = Certs().ca;
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  // The shard also serves the unencrypted tcp data path (on by default);
  // a TLS client at the default transport keeps its data on gRPC.
  REQUIRE((*client)->data_paths() == std::vector<std::string>{"grpc"});
  RequirePushPullWorks(**client, "w");
}

TEST_CASE("a plaintext worker gets one clear error from a TLS shard") {
  auto servers = testing::StartCluster(1, 1, TlsServerFlags(false));
  REQUIRE(servers.ok());
  auto client = Client::Create(BaseOptions(*servers));
  RequireRefusedWith(client.status(), "the shard may require TLS, pass --tls_ca");
}

TEST_CASE("a TLS worker refuses a shard whose certificate is not of its CA") {
  auto servers = testing::StartCluster(1, 1, TlsServerFlags(false));
  REQUIRE(servers.ok());
  ClientOptions options = BaseOptions(*servers);
  options.connect_timeout = absl::Seconds(2);
  options.tls_ca_file = Certs().other_ca;
  auto client = Client::Create(options);
  RequireRefusedWith(client.status(), "cannot connect to shard 0");
}

TEST_CASE("a mutual-TLS shard accepts only client certificates of its CA") {
  auto servers = testing::StartCluster(1, 1, [] {
    auto flags = TlsServerFlags(true);
    flags.insert(flags.end(), {"--sync=asp", "--lr=1"});
    return flags;
  }());
  REQUIRE(servers.ok());
  ClientOptions options = BaseOptions(*servers);
  options.connect_timeout = absl::Seconds(2);
  options.tls_ca_file = Certs().ca;

  SECTION("with a certificate of the CA") {
    options.tls_cert_file = Certs().client_cert;
    options.tls_key_file = Certs().client_key;
    auto client = Client::Create(options);
    INFO(client.status().ToString());
    REQUIRE(client.ok());
    RequirePushPullWorks(**client, "w");
  }
  SECTION("without a certificate") {
    RequireRefusedWith(Client::Create(options).status(), "cannot connect to shard 0");
  }
  SECTION("with a certificate of another CA") {
    options.tls_cert_file = Certs().other_cert;
    options.tls_key_file = Certs().other_key;
    RequireRefusedWith(Client::Create(options).status(), "cannot connect to shard 0");
  }
}

// Raw calls with a chosen token (or none), to see each RPC refused.
class RawShard {
 public:
  explicit RawShard(const std::string& address)
      : channel_(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                           MakeChannelArguments())),
        parameters_(proto::ParameterService::NewStub(channel_)),
        control_(proto::ControlService::NewStub(channel_)),
        sessions_(channel_, "harrier", kToken) {}

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token, int timeout_ms = 5000) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(timeout_ms));
    if (!token.empty()) context->AddMetadata(std::string(kJobTokenMetadataKey), token);
    return context;
  }

  // As rank 1 (the client holds rank 0), with its session when the token
  // is right (a refused call needs none).
  grpc::Status Init(const std::string& token, const std::string& key, bool* created = nullptr) {
    proto::InitRequest request;
    request.set_rank(1);
    if (token == kToken) sessions_.Attach(&request);
    request.set_key(key);
    request.add_shape(kElements);
    request.set_num_elements(kElements);
    request.set_dtype(proto::DTYPE_FLOAT32);
    request.mutable_initial_values()->assign(kElements * sizeof(float), '\0');
    request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
    proto::InitResponse response;
    auto status = parameters_->Init(Context(token).get(), request, &response);
    if (created != nullptr) *created = response.created();
    return status;
  }

  grpc::Status Push(const std::string& token, const std::string& key, int64_t clock,
                    const proto::Session& session = proto::Session(), uint32_t rank = 0) {
    std::vector<float> gradient(kElements, 1000.0f);
    proto::TensorChunk chunk;
    chunk.set_job("harrier");
    *chunk.mutable_session() = session;
    chunk.set_key(key);
    chunk.set_rank(rank);
    chunk.set_clock(clock);
    chunk.set_num_elements(kElements);
    chunk.set_dtype(proto::DTYPE_FLOAT32);
    chunk.mutable_payload()->assign(reinterpret_cast<const char*>(gradient.data()),
                                    kElements * sizeof(float));
    chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
    auto context = Context(token);
    proto::PushResponse response;
    auto writer = parameters_->Push(context.get(), &response);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Pull(const std::string& token, const std::string& key, int64_t clock) {
    proto::PullRequest request;
    request.set_rank(0);
    request.set_clock(clock);
    auto* ref = request.add_chunks();
    ref->set_key(key);
    ref->set_num_elements(kElements);
    auto context = Context(token);
    auto reader = parameters_->Pull(context.get(), request);
    proto::TensorChunk reply;
    while (reader->Read(&reply)) {
    }
    return reader->Finish();
  }

  grpc::Status Barrier(const std::string& token, uint32_t rank, int timeout_ms = 5000) {
    proto::BarrierRequest request;
    request.set_name("b");
    request.set_rank(rank);
    if (token == kToken) sessions_.Attach(&request);  // a refused call needs none
    proto::BarrierResponse response;
    return control_->Barrier(Context(token, timeout_ms).get(), request, &response);
  }

  std::vector<grpc::Status> OtherCalls(const std::string& token) {
    std::vector<grpc::Status> statuses;
    proto::RegisterRequest register_request;
    proto::RegisterResponse register_response;
    statuses.push_back(
        control_->Register(Context(token).get(), register_request, &register_response));
    proto::HeartbeatRequest heartbeat;
    proto::HeartbeatResponse heartbeat_response;
    statuses.push_back(control_->Heartbeat(Context(token).get(), heartbeat, &heartbeat_response));
    statuses.push_back(
        parameters_->Heartbeat(Context(token).get(), heartbeat, &heartbeat_response));
    proto::ShardMapRequest map;
    proto::ShardMapResponse map_response;
    statuses.push_back(control_->GetShardMap(Context(token).get(), map, &map_response));
    proto::LeaveRequest leave;
    proto::LeaveResponse leave_response;
    statuses.push_back(parameters_->Leave(Context(token).get(), leave, &leave_response));
    proto::TransportAddressRequest address;
    proto::TransportAddressResponse address_response;
    statuses.push_back(
        parameters_->GetTransportAddress(Context(token).get(), address, &address_response));
    grpc::ByteBuffer request_bytes, response_bytes;
    {
      auto context = Context(token);
      statuses.push_back(PushPullStatus(context.get()));
    }
    return statuses;
  }

 private:
  grpc::Status PushPullStatus(grpc::ClientContext* context) {
    auto stream = parameters_->PushPull(context);
    stream->WritesDone();
    proto::TensorChunk reply;
    while (stream->Read(&reply)) {
    }
    return stream->Finish();
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::ParameterService::Stub> parameters_;
  std::unique_ptr<proto::ControlService::Stub> control_;
  testing::Sessions sessions_;  // registered with the right token
};

void RequireUnauthenticated(const grpc::Status& status) {
  INFO("status: " << status.error_code() << " " << status.error_message());
  REQUIRE(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  REQUIRE(status.error_message() == "missing or wrong job token (--auth_token_file)");
}

TEST_CASE("the job token is required on every call, and a refused call changes nothing") {
  const std::string token_file = WriteFile("token", std::string(kToken) + "\n", 0600);
  // Two workers so that a barrier entered by a refused rank 1 would let
  // rank 0's barrier through; ASP so that pushes never wait for rank 1.
  auto servers = testing::StartCluster(
      1, 2, {"--auth_token_file=" + token_file, "--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  ClientOptions options = BaseOptions(*servers);
  options.auth_token = kToken;
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  std::vector<float> initial(kElements, 5.0f);
  REQUIRE((*client)->RegisterTensor("w", {static_cast<int64_t>(kElements)}, initial).ok());
  std::vector<float> before(kElements);
  REQUIRE((*client)->Pull("w", absl::MakeSpan(before)).ok());

  RawShard shard((*servers)[0]->address());
  for (const std::string& token : {std::string(), std::string("wrong-token"),
                                   std::string(kToken) + "x", std::string(kToken).substr(1)}) {
    INFO("token '" << token << "'");
    RequireUnauthenticated(shard.Init(token, "fresh"));
    RequireUnauthenticated(shard.Push(token, "w", 0));
    RequireUnauthenticated(shard.Pull(token, "w", 0));
    RequireUnauthenticated(shard.Barrier(token, 1));
    for (const auto& status : shard.OtherCalls(token)) RequireUnauthenticated(status);
  }

  // Nothing changed: the values, the key set, rank 0's clock, the barrier.
  std::vector<float> after(kElements);
  REQUIRE((*client)->Pull("w", absl::MakeSpan(after)).ok());
  REQUIRE(after == before);
  bool created = false;
  REQUIRE(shard.Init(kToken, "fresh", &created).ok());
  REQUIRE(created);
  // Rank 1 (which the refused barriers named) now registers and waits
  // alone: rank 0 never comes.
  REQUIRE(shard.Barrier(kToken, 1, 1000).error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  // With a token, credentials are keyed from it: one minted from the job
  // name alone (what a shard without a token would accept) is refused.
  proto::Session untokened;
  untokened.set_epoch(uint64_t{1} << 62);  // above rank 1's current epoch
  untokened.set_credential(
      MintCredential(DeriveSessionKey("", "harrier"), "harrier", 1, untokened.epoch()));
  const grpc::Status forged = shard.Push(kToken, "w", 0, untokened, 1);
  INFO(forged.error_message());
  REQUIRE(forged.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(forged.error_message().find("rank 1: bad session credential") != std::string::npos);
  std::vector<float> gradient(kElements, 1.0f);
  REQUIRE((*client)->Push("w", gradient).ok());  // clock 0 is still rank 0's next
  (*client)->Clock();
  REQUIRE((*client)->Pull("w", absl::MakeSpan(after)).ok());
  for (size_t i = 0; i < kElements; ++i) REQUIRE(after[i] < before[i]);

  SECTION("a worker with a wrong token is refused at Create") {
    options.auth_token = "wrong-token";
    auto refused = Client::Create(options);
    REQUIRE(absl::IsUnauthenticated(refused.status()));
    RequireRefusedWith(refused.status(), "missing or wrong job token (--auth_token_file)");
  }
}

TEST_CASE("token files: trailing newline stripped; empty or world-readable refused") {
  auto token = ReadJobTokenFile(WriteFile("token-ok", "abc\r\n", 0600));
  REQUIRE(token.ok());
  REQUIRE(*token == "abc");
  RequireRefusedWith(ReadJobTokenFile(WriteFile("token-empty", "\n", 0600)).status(),
                     "the token file is empty");
  RequireRefusedWith(ReadJobTokenFile(WriteFile("token-open", "abc", 0644)).status(),
                     "readable by every user");
  // The server refuses to start with such a file.
  auto server = testing::ServerProcess::Start(
      {"--auth_token_file=" + WriteFile("token-empty2", "", 0600)});
  REQUIRE_FALSE(server.ok());
}

// grpc.health.v1.Health/Check for the whole server: SERVING is the message
// {status: 1}, bytes 08 01. Returns the status and the raw response.
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel, std::string* response) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::ByteBuffer request;  // HealthCheckRequest{service: ""} is empty
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer reply;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &reply,
                 [&done](grpc::Status status) { done.set_value(status); });
  grpc::Status status = done.get_future().get();
  std::vector<grpc::Slice> slices;
  response->clear();
  if (status.ok() && reply.Dump(&slices).ok()) {
    for (const auto& slice : slices) {
      response->append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  return status;
}

TEST_CASE("health probes answer without TLS or token on --health_port, and without a token on "
          "the main port") {
  const std::string token_file = WriteFile("token-health", kToken, 0600);
  const int health_port = testing::FreePort();
  auto flags = TlsServerFlags(true);
  flags.push_back("--auth_token_file=" + token_file);
  flags.push_back(absl::StrCat("--health_port=", health_port));
  auto servers = testing::StartCluster(1, 1, flags);
  REQUIRE(servers.ok());
  const std::string health_address = absl::StrCat("127.0.0.1:", health_port);

  std::string response;
  auto plaintext = grpc::CreateChannel(health_address, grpc::InsecureChannelCredentials());
  const grpc::Status health = HealthCheck(plaintext, &response);
  INFO(health.error_code() << " " << health.error_message());
  REQUIRE(health.ok());
  REQUIRE(response == std::string("\x08\x01", 2));

  // The health port serves nothing else.
  auto stub = proto::ParameterService::NewStub(plaintext);
  grpc::ClientContext context;
  context.AddMetadata(std::string(kJobTokenMetadataKey), kToken);
  proto::TransportAddressRequest request;
  proto::TransportAddressResponse reply;
  REQUIRE(stub->GetTransportAddress(&context, request, &reply).error_code() ==
          grpc::StatusCode::UNIMPLEMENTED);

  // On the main port, over mutual TLS, health needs no token.
  auto credentials = MakeChannelCredentials({Certs().client_cert, Certs().client_key, Certs().ca});
  REQUIRE(credentials.ok());
  auto tls = grpc::CreateChannel((*servers)[0]->address(), *credentials);
  REQUIRE(HealthCheck(tls, &response).ok());
  REQUIRE(response == std::string("\x08\x01", 2));
}

// Opens `count` Watch streams on `channel` and keeps them in `watches`;
// counts those the server answered SERVING and those it refused with
// RESOURCE_EXHAUSTED naming the flag. Any other outcome fails the test.
void OpenWatches(const std::shared_ptr<grpc::Channel>& channel, int count,
                 std::vector<std::unique_ptr<testing::HealthWatch>>& watches, int* served,
                 int* refused) {
  for (int i = 0; i < count; ++i) {
    auto watch = std::make_unique<testing::HealthWatch>(channel);
    uint32_t serving = 0;
    const grpc::Status status = watch->Open(absl::Now() + absl::Seconds(5), &serving);
    INFO("watch " << i << ": " << status.error_code() << " " << status.error_message());
    if (status.ok()) {
      REQUIRE(serving == 1);
      ++*served;
    } else {
      REQUIRE(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
      REQUIRE(status.error_message().find("--max_health_watches") != std::string::npos);
      ++*refused;
    }
    watches.push_back(std::move(watch));
  }
}

TEST_CASE(
    "health Watch streams cannot take the shard's threads: past --max_health_watches they "
    "are refused, and Check and a worker's calls are still served") {
  // The cap must leave threads for the unary calls.
  REQUIRE_FALSE(testing::ServerProcess::Start({"--max_health_watches=0"}).ok());
  REQUIRE_FALSE(
      testing::ServerProcess::Start({"--grpc_max_threads=8", "--max_health_watches=5"}).ok());

  const int health_port = testing::FreePort();
  // Eight threads for the unary calls, and more Watch streams than that
  // from a client with neither token nor certificate.
  auto servers = testing::StartCluster(
      1, 1,
      {"--grpc_max_threads=8", "--max_health_watches=2",
       absl::StrCat("--health_port=", health_port),
       "--auth_token_file=" + WriteFile("token-watch", kToken, 0600), "--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  auto main_port =
      grpc::CreateChannel((*servers)[0]->address(), grpc::InsecureChannelCredentials());
  std::vector<std::unique_ptr<testing::HealthWatch>> watches;
  int served = 0, refused = 0;
  OpenWatches(main_port, 12, watches, &served, &refused);
  REQUIRE(served == 2);
  REQUIRE(refused == 10);

  // The health port has a cap of its own.
  auto health = grpc::CreateChannel(absl::StrCat("127.0.0.1:", health_port),
                                    grpc::InsecureChannelCredentials());
  int health_served = 0, health_refused = 0;
  OpenWatches(health, 40, watches, &health_served, &health_refused);
  REQUIRE(health_served == 2);
  REQUIRE(health_refused == 38);

  // With every Watch the shard admits open: probes and a worker's whole
  // session (Init, Register, push, pull: unary calls and streams) go on.
  std::string response;
  REQUIRE(HealthCheck(main_port, &response).ok());
  REQUIRE(response == std::string("\x08\x01", 2));
  REQUIRE(HealthCheck(health, &response).ok());
  ClientOptions options = BaseOptions(*servers);
  options.auth_token = kToken;
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  RequirePushPullWorks(**client, "beside-watches");

  // A Watch that ends gives its place back.
  watches.front()->Close();
  REQUIRE(testing::OpenAdmittedWatch(main_port, absl::Seconds(10)) != nullptr);
}

}  // namespace
}  // namespace harrier
