// The tcp data path's listener in a real harrier-server, spoken to by a raw
// socket client: only a hello with the secret GetTransportAddress issued
// over the authenticated gRPC channel is served, hostile framing closes the
// connection before anything large is held, a push whose frames stop
// coming is refused at its deadline, and unfinished pushes of one
// connection are bounded together by --max_connection_bytes.
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "common/transport/framing.h"
#include "common/transport/stream.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

namespace harrier {
namespace {

using transport::Frame;
using transport::Op;

constexpr const char* kToken = "tcp-job-token";

std::string TokenFile() {
  const std::string path = testing::TempDir() + "/tcp-token";
  std::ofstream(path, std::ios::trunc) << kToken << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   MakeChannelArguments());
}

// The shard's tcp address ("127.0.0.1:port") and a fresh hello secret.
transport::PeerAddress TcpAddress(const std::string& grpc_address) {
  auto stub = proto::ParameterService::NewStub(Channel(grpc_address));
  grpc::ClientContext context;
  context.AddMetadata("harrier-job-token", kToken);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::TransportAddressRequest request;
  request.set_transport("tcp");
  proto::TransportAddressResponse response;
  const grpc::Status status = stub->GetTransportAddress(&context, request, &response);
  INFO(status.error_message());
  REQUIRE(status.ok());
  // The test shards listen on 127.0.0.1; one bound to every interface
  // leaves the host out (":port").
  REQUIRE(absl::StartsWith(response.address(), "127.0.0.1:"));
  CHECK_FALSE(response.hello_secret().empty());
  return {response.address(), response.hello_secret()};
}

struct RawConnection {
  int fd = -1;
  ~RawConnection() {
    if (fd >= 0) close(fd);
  }
  void Send(const Frame& frame, const std::string& body, const std::string& payload = "") {
    std::string message = transport::EncodeStreamHeader(frame, body);
    message += payload;
    struct iovec part = {message.data(), message.size()};
    REQUIRE(transport::WriteFully(fd, &part, 1, absl::Now() + absl::Seconds(10)).ok());
  }
  // The next reply's status (skipping reply chunks), or the read's error.
  absl::StatusOr<std::pair<Frame, absl::Status>> NextStatus(absl::Duration timeout) {
    for (;;) {
      Frame frame;
      std::string header;
      absl::Status read = transport::ReadHeader(fd, transport::kMaxStreamHeaderBytes,
                                                absl::Now() + timeout, &frame, &header);
      if (!read.ok()) return read;
      std::string payload(frame.payload_bytes, '\0');
      if (auto s = transport::ReadFully(fd, payload.data(), payload.size(), absl::Now() + timeout);
          !s.ok()) {
        return s;
      }
      if (frame.op != Op::kStatus) continue;
      absl::string_view body(header);
      body.remove_prefix(transport::kFrameBytes);
      return std::make_pair(frame, transport::DecodeStatus(frame, body));
    }
  }
  // True once the shard has closed the connection.
  bool Closed(absl::Duration timeout) {
    char byte;
    return absl::IsUnavailable(transport::ReadFully(fd, &byte, 1, absl::Now() + timeout));
  }
};

std::unique_ptr<RawConnection> Connect(const std::string& address) {
  auto fd = transport::ConnectStream(address, absl::Now() + absl::Seconds(10));
  INFO(fd.status().ToString());
  REQUIRE(fd.ok());
  auto connection = std::make_unique<RawConnection>();
  connection->fd = *fd;
  return connection;
}

absl::Status Hello(RawConnection& connection, const std::string& secret) {
  Frame hello;
  hello.op = Op::kHello;
  hello.connection_id = 7;
  hello.request_id = 1;
  connection.Send(hello, secret);
  auto reply = connection.NextStatus(absl::Seconds(10));
  if (!reply.ok()) return reply.status();
  return reply->second;
}

// A dense push chunk of `n` floats of `value` for `rank`'s session.
std::pair<std::string, std::string> PushChunk(testing::Sessions& sessions, uint32_t rank,
                                              const std::string& key, size_t n, float value) {
  std::vector<float> gradient(n, value);
  std::string payload(reinterpret_cast<const char*>(gradient.data()), n * sizeof(float));
  proto::TensorChunk chunk;
  chunk.set_rank(rank);
  sessions.Attach(&chunk);
  chunk.set_key(key);
  chunk.set_num_elements(n);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.set_checksum(Crc32c(payload.data(), payload.size()));
  return {transport::EncodeChunkHeader(chunk), payload};
}

// Compared here, not by Catch: a failed comparison of a million floats
// would print them all.
bool AllEqual(const std::vector<float>& values, float expected) {
  for (float v : values) {
    if (v != expected) return false;
  }
  return true;
}

Frame ChunkFrame(uint64_t request, uint32_t index, uint32_t count, size_t payload_bytes,
                 int64_t timeout_ms = 10000) {
  Frame frame;
  frame.op = Op::kPush;
  frame.connection_id = 7;
  frame.request_id = request;
  frame.index = index;
  frame.count = count;
  frame.payload_bytes = payload_bytes;
  frame.arg = timeout_ms;
  return frame;
}

// The congestion control of the established TCP sockets on local port
// `port`, from ss(8): the first word of each socket's info line.
std::vector<std::string> ServerSideCongestionControls(int port) {
  const std::string command =
      absl::StrCat("ss -tinH state established '( sport = :", port, " )' 2>/dev/null");
  std::vector<std::string> found;
  FILE* ss = popen(command.c_str(), "r");
  REQUIRE(ss != nullptr);
  char line[4096];
  while (std::fgets(line, sizeof(line), ss) != nullptr) {
    // Info lines are indented; the socket lines are not.
    if (line[0] != ' ' && line[0] != '\t') continue;
    std::string info(line);
    const size_t start = info.find_first_not_of(" \t");
    const size_t end = info.find(' ', start);
    found.push_back(info.substr(start, end - start));
  }
  pclose(ss);
  return found;
}

TEST_CASE("the shard sets --tcp_congestion on its tcp connections") {
  auto servers = testing::StartCluster(
      1, 1, {"--tcp_congestion=no-such-cc,reno", "--auth_token_file=" + TokenFile()});
  REQUIRE(servers.ok());
  const transport::PeerAddress address = TcpAddress((*servers)[0]->address());
  int port = 0;
  REQUIRE(absl::SimpleAtoi(address.address.substr(address.address.rfind(':') + 1), &port));
  auto connection = Connect(address.address);
  REQUIRE(Hello(*connection, address.hello_secret).ok());
  const std::vector<std::string> found = ServerSideCongestionControls(port);
  if (found.empty()) {
    WARN("SKIPPED: ss(8) printed no sockets");
    return;
  }
  CHECK(found == std::vector<std::string>{"reno"});
}

TEST_CASE("--tcp_advertise: the shard hands out that address; a malformed one is refused") {
  {
    auto servers = testing::StartCluster(
        1, 1, {"--tcp_advertise=127.0.0.1:9", "--auth_token_file=" + TokenFile()});
    REQUIRE(servers.ok());
    CHECK(TcpAddress((*servers)[0]->address()).address == "127.0.0.1:9");
  }
  for (const std::string& bad : std::vector<std::string>{"127.0.0.1", "127.0.0.1:0", "host:65536",
                                                         "host:x", std::string(300, 'h') + ":9"}) {
    INFO("--tcp_advertise=" << bad);
    const std::string output = testing::TempDir() + "/tcp-advertise.log";
    auto child =
        testing::ChildProcess::Start(testing::RunfilePath("server/harrier-server"),
                                     {"--shard=0", "--num_shards=1", "--num_workers=1",
                                      "--host=127.0.0.1", "--port=0", "--tcp_advertise=" + bad},
                                     output);
    REQUIRE(child.ok());
    REQUIRE((*child)->WaitForExit(10000) > 0);
    std::ifstream file(output);
    std::string line, said;
    while (std::getline(file, line)) {
      if (absl::StartsWith(line, "harrier-server: --tcp_advertise")) said = line;
    }
    CHECK_FALSE(said.empty());
  }
}

TEST_CASE("a shard with a token serves tcp hellos only with the secret it issued") {
  auto servers = testing::StartCluster(
      1, 1, {"--tcp", "--auth_token_file=" + TokenFile(), "--sync=asp", "--lr=1"});
  REQUIRE(servers.ok());
  const std::string grpc_address = (*servers)[0]->address();
  const transport::PeerAddress address = TcpAddress(grpc_address);

  SECTION("the client library over tcp, with the token") {
    ClientOptions options;
    options.servers = {grpc_address};
    options.transport = "tcp";
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
    auto first = Connect(address.address);
    REQUIRE(Hello(*first, address.hello_secret).ok());
    auto second = Connect(address.address);
    CHECK(absl::IsPermissionDenied(Hello(*second, address.hello_secret)));
    CHECK(second->Closed(absl::Seconds(10)));
  }
  for (const std::string& secret : {std::string(), std::string("0123456789abcdef")}) {
    SECTION("a hello without the issued secret is refused and closed: '" + secret + "'") {
      auto connection = Connect(address.address);
      CHECK(absl::IsPermissionDenied(Hello(*connection, secret)));
      CHECK(connection->Closed(absl::Seconds(10)));
    }
  }
  SECTION("a request before the hello closes the connection") {
    auto connection = Connect(address.address);
    Frame pull;
    pull.op = Op::kPull;
    pull.request_id = 1;
    connection->Send(pull, "");
    CHECK(connection->Closed(absl::Seconds(10)));
  }
  SECTION("a first message larger than a hello closes the connection unread") {
    auto connection = Connect(address.address);
    Frame hello;
    hello.op = Op::kHello;
    connection->Send(hello, std::string(transport::kMaxHeaderBodyBytes + 1, 'x'));
    CHECK(connection->Closed(absl::Seconds(10)));
  }
}

TEST_CASE("hostile tcp framing is refused before the shard holds its bytes") {
  auto servers =
      testing::StartCluster(1, 2,
                            {"--tcp", "--auth_token_file=" + TokenFile(), "--sync=asp", "--lr=1",
                             "--max_request_bytes=5242880", "--max_connection_bytes=6291456"});
  REQUIRE(servers.ok());
  const std::string grpc_address = (*servers)[0]->address();
  const size_t n = (4u << 20) / sizeof(float);  // 4 MiB: under --max_request_bytes
  ClientOptions options;
  options.servers = {grpc_address};
  options.transport = "tcp";
  options.auth_token = kToken;
  options.rank = 0;
  options.heartbeat_interval = absl::ZeroDuration();
  options.chunk_bytes = 4u << 20;
  auto client = Client::Create(options);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  for (const char* key : {"a", "b"}) {
    REQUIRE((*client)->RegisterTensor(key, {static_cast<int64_t>(n)}).ok());
  }
  REQUIRE((*client)->RegisterTensor("c", {16}).ok());
  testing::Sessions sessions(Channel(grpc_address), "harrier", kToken);
  SECTION("a payload over the shard's bound closes the connection") {
    const transport::PeerAddress address = TcpAddress(grpc_address);
    auto fresh = Connect(address.address);
    REQUIRE(Hello(*fresh, address.hello_secret).ok());
    fresh->Send(ChunkFrame(5, 0, 1, uint64_t{1} << 40), "");
    auto reply = fresh->NextStatus(absl::Seconds(10));
    REQUIRE(reply.ok());
    CHECK(reply->first.request_id == 5);
    CHECK(absl::IsInvalidArgument(reply->second));
    CHECK(fresh->Closed(absl::Seconds(10)));
  }
  SECTION("a header length of 1 GiB closes the connection") {
    const transport::PeerAddress address = TcpAddress(grpc_address);
    auto fresh = Connect(address.address);
    REQUIRE(Hello(*fresh, address.hello_secret).ok());
    const uint32_t huge = 1u << 30;
    struct iovec part = {const_cast<uint32_t*>(&huge), sizeof(huge)};
    REQUIRE(transport::WriteFully(fresh->fd, &part, 1, absl::Now() + absl::Seconds(5)).ok());
    CHECK(fresh->Closed(absl::Seconds(10)));
  }
  SECTION(
      "a push whose frames stop coming is refused at its deadline, and the connection "
      "serves on") {
    const transport::PeerAddress address = TcpAddress(grpc_address);
    auto fresh = Connect(address.address);
    REQUIRE(Hello(*fresh, address.hello_secret).ok());
    auto [header, payload] = PushChunk(sessions, 1, "a", n, 2.0f);
    fresh->Send(ChunkFrame(9, 0, 2, payload.size(), /*timeout_ms=*/300), header, payload);
    auto expired = fresh->NextStatus(absl::Seconds(20));
    REQUIRE(expired.ok());
    CHECK(expired->first.request_id == 9);
    INFO(expired->second.ToString());
    CHECK(absl::IsDeadlineExceeded(expired->second));
    // Its bytes were given back: a whole 4 MiB push goes through.
    fresh->Send(ChunkFrame(10, 0, 1, payload.size()), header, payload);
    auto applied = fresh->NextStatus(absl::Seconds(20));
    REQUIRE(applied.ok());
    CHECK(applied->first.request_id == 10);
    INFO(applied->second.ToString());
    CHECK(applied->second.ok());
    std::vector<float> a(n);
    REQUIRE((*client)->Pull("a", absl::MakeSpan(a)).ok());
    CHECK(AllEqual(a, -1.0f));  // one push of 2 over 2 workers, once
  }
  SECTION("unfinished pushes of one connection are bounded by --max_connection_bytes") {
    const transport::PeerAddress address = TcpAddress(grpc_address);
    auto fresh = Connect(address.address);
    REQUIRE(Hello(*fresh, address.hello_secret).ok());
    auto [a_header, a_payload] = PushChunk(sessions, 1, "a", n, 2.0f);
    auto [b_header, b_payload] = PushChunk(sessions, 1, "b", n, 2.0f);
    auto [c_header, c_payload] = PushChunk(sessions, 1, "c", 16, 2.0f);
    // Two calls of two chunks each, interleaved: 4 MiB + 4 MiB held at once.
    fresh->Send(ChunkFrame(20, 0, 2, a_payload.size()), a_header, a_payload);
    fresh->Send(ChunkFrame(21, 0, 2, b_payload.size()), b_header, b_payload);
    fresh->Send(ChunkFrame(20, 1, 2, c_payload.size()), c_header, c_payload);
    fresh->Send(ChunkFrame(21, 1, 2, c_payload.size()), c_header, c_payload);
    std::map<uint64_t, absl::Status> statuses;
    for (int i = 0; i < 2; ++i) {
      auto reply = fresh->NextStatus(absl::Seconds(20));
      REQUIRE(reply.ok());
      statuses[reply->first.request_id] = reply->second;
    }
    INFO(statuses[20].ToString() << " / " << statuses[21].ToString());
    CHECK(statuses[20].ok());
    CHECK(absl::IsResourceExhausted(statuses[21]));
    CHECK(statuses[21].message().find("--max_connection_bytes") != absl::string_view::npos);
    std::vector<float> a(n), b(n);
    REQUIRE((*client)->Pull("a", absl::MakeSpan(a)).ok());
    REQUIRE((*client)->Pull("b", absl::MakeSpan(b)).ok());
    CHECK(AllEqual(a, -1.0f));
    CHECK(AllEqual(b, 0.0f));  // refused whole
  }
}

}  // namespace
}  // namespace harrier
