// The "tcp" ShardTransport against a scripted shard in the test: a
// listening socket on loopback whose connections speak stream.h's framing
// as each case says. Checks what goes on the wire (headers, checksums,
// payload bytes), where replies land, and how calls end: deadline, cancel,
// a closed or malformed connection, a refused hello, a destroyed transport.
#include "worker/transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/crc32c.h"
#include "common/transport/framing.h"
#include "common/transport/stream.h"
#include "proto/harrier.pb.h"
#include "tests/require_ok.h"
#include "tests/slowdown.h"
#include "worker/transport/timer_thread.h"

namespace harrier {
namespace {

using transport::Frame;
using transport::Op;

constexpr char kPeer[] = "shard-7";
// How long the scripted shard and the test wait for anything before they
// give up: far above what any step takes, so only a hang reaches it.
constexpr absl::Duration kPatience = absl::Seconds(20);

struct Message {
  Frame frame;
  std::string body;
  std::string payload;
};

// The shard's end of one accepted connection.
class ServerConnection {
 public:
  explicit ServerConnection(int fd) : fd_(fd) {}

  // The next message; nullopt once the client closed the connection (or
  // kPatience passed).
  std::optional<Message> Read() {
    Message message;
    std::string header;
    if (!transport::ReadHeader(fd_, transport::kMaxStreamHeaderBytes, absl::Now() + kPatience,
                               &message.frame, &header)
             .ok()) {
      return std::nullopt;
    }
    message.body = header.substr(transport::kFrameBytes);
    message.payload.resize(message.frame.payload_bytes);
    if (!transport::ReadFully(fd_, message.payload.data(), message.payload.size(),
                              absl::Now() + kPatience)
             .ok()) {
      return std::nullopt;
    }
    return message;
  }

  // The next message's frame, leaving its payload unread.
  std::optional<Frame> ReadFrameOnly() {
    Frame frame;
    std::string header;
    if (!transport::ReadHeader(fd_, transport::kMaxStreamHeaderBytes, absl::Now() + kPatience,
                               &frame, &header)
             .ok()) {
      return std::nullopt;
    }
    return frame;
  }

  void Write(absl::string_view header, absl::string_view payload = {}) {
    struct iovec parts[2] = {{const_cast<char*>(header.data()), header.size()},
                             {const_cast<char*>(payload.data()), payload.size()}};
    (void)transport::WriteFully(fd_, parts, 2, absl::Now() + kPatience);
  }
  void SendStatus(uint64_t request_id, uint32_t count, const absl::Status& status) {
    Frame frame;
    frame.op = Op::kStatus;
    frame.request_id = request_id;
    frame.count = count;
    frame.arg = static_cast<int64_t>(status.code());
    Write(transport::EncodeStreamHeader(frame, status.message()));
  }
  // `checksum` in the header: the payload's own unless `wrong_checksum`.
  void SendChunk(uint64_t request_id, uint32_t index, const std::string& key,
                 absl::string_view payload, bool wrong_checksum = false) {
    proto::TensorChunk header;
    header.set_key(key);
    header.set_checksum(Crc32c(payload.data(), payload.size()) ^ (wrong_checksum ? 1u : 0u));
    Frame frame;
    frame.op = Op::kReplyChunk;
    frame.request_id = request_id;
    frame.index = index;
    frame.payload_bytes = payload.size();
    Write(transport::EncodeStreamHeader(frame, header.SerializeAsString()), payload);
  }

 private:
  const int fd_;
};

// A shard on 127.0.0.1: answers each hello with `hello_answer` (recording
// its secret), then runs `serve` on the connection (numbered from 0 in the
// order the hellos arrive) until it returns, and closes it.
class ScriptedServer {
 public:
  using Serve = std::function<void(ServerConnection& connection, int number)>;

  explicit ScriptedServer(Serve serve, absl::Status hello_answer = absl::OkStatus())
      : serve_(std::move(serve)), hello_answer_(std::move(hello_answer)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    REQUIRE(bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    REQUIRE(listen(listen_fd_, 16) == 0);
    socklen_t length = sizeof(address);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    address_ = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
    acceptor_ = std::thread([this] { Accept(); });
  }

  ~ScriptedServer() {
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    close(listen_fd_);
    {
      absl::MutexLock lock(&mutex_);
      for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& thread : connections_) thread.join();
  }

  const std::string& address() const { return address_; }
  std::vector<std::string> secrets() const {
    absl::MutexLock lock(&mutex_);
    return secrets_;
  }

 private:
  void Accept() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      absl::MutexLock lock(&mutex_);
      open_fds_.push_back(fd);
      connections_.emplace_back([this, fd] { Run(fd); });
    }
  }

  void Run(int fd) {
    transport::TuneStreamSocket(fd);
    ServerConnection connection(fd);
    std::optional<Message> hello = connection.Read();
    int number = -1;
    if (hello && hello->frame.op == Op::kHello) {
      {
        absl::MutexLock lock(&mutex_);
        number = static_cast<int>(secrets_.size());
        secrets_.push_back(hello->body);
      }
      connection.Write(transport::EncodeStreamHeader(
          [&] {
            Frame frame;
            frame.op = Op::kStatus;
            frame.connection_id = hello->frame.connection_id;
            frame.request_id = hello->frame.request_id;
            frame.arg = static_cast<int64_t>(hello_answer_.code());
            return frame;
          }(),
          hello_answer_.message()));
      if (hello_answer_.ok()) serve_(connection, number);
    }
    absl::MutexLock lock(&mutex_);
    shutdown(fd, SHUT_RDWR);
    close(fd);
    open_fds_.erase(std::find(open_fds_.begin(), open_fds_.end(), fd));
  }

  const Serve serve_;
  const absl::Status hello_answer_;
  int listen_fd_ = -1;
  std::string address_;
  std::thread acceptor_;
  mutable absl::Mutex mutex_;
  std::vector<std::string> secrets_ ABSL_GUARDED_BY(mutex_);
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::thread> connections_ ABSL_GUARDED_BY(mutex_);
};

// Hands out the server's address with secrets "secret-1", "secret-2", ...
struct AddressBook {
  explicit AddressBook(std::string address) : address(std::move(address)) {}
  TcpAddressProvider Provider() {
    return [this](absl::Time) -> absl::StatusOr<transport::PeerAddress> {
      return transport::PeerAddress{address, absl::StrCat("secret-", ++asked)};
    };
  }
  const std::string address;
  std::atomic<int> asked{0};
};

std::unique_ptr<TcpShardTransport> ConnectTo(AddressBook& book,
                                             const std::shared_ptr<TimerThread>& timer) {
  auto transport =
      TcpShardTransport::Connect(kPeer, book.Provider(), timer, absl::Now() + absl::Seconds(10));
  REQUIRE_OK(transport.status());
  return std::move(*transport);
}

struct Completion {
  absl::Notification notified;
  std::atomic<int> calls{0};
  absl::Status status;

  CallDone Done() {
    return [this](absl::Status result) {
      status = std::move(result);
      ++calls;
      notified.Notify();
    };
  }
  bool Wait() { return notified.WaitForNotificationWithTimeout(kPatience); }
};

struct ReceivedChunk {
  proto::TensorChunk header;
  const char* data = nullptr;
  std::string bytes;
  MemoryKind memory = MemoryKind::kHost;
  std::optional<uint32_t> crc;  // the CRC the transport took as the bytes arrived
};

LandedChunkSink Collect(std::vector<ReceivedChunk>& received) {
  return
      [&received](const proto::TensorChunk& header, const PayloadView& payload, MemoryKind memory) {
        ReceivedChunk chunk;
        chunk.header = header;
        chunk.data = payload.first().data();
        chunk.bytes.resize(payload.size());
        payload.CopyTo(chunk.bytes.data());
        chunk.memory = memory;
        chunk.crc = payload.crc32c();
        received.push_back(std::move(chunk));
        return absl::OkStatus();
      };
}

std::string Pattern(size_t bytes, int seed) {
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return data;
}

proto::PullRequest PullOf(const std::string& key) {
  proto::PullRequest request;
  request.set_job("tcp-test");
  request.add_chunks()->set_key(key);
  return request;
}

// Records every request message; answers each push (after its last chunk)
// with OK, and each pull with `reply` (key "reply") and OK.
struct Recorder {
  absl::Mutex mutex;
  std::vector<Message> messages ABSL_GUARDED_BY(mutex);
  std::string reply;

  std::vector<Message> Messages() {
    absl::MutexLock lock(&mutex);
    return messages;
  }
  ScriptedServer::Serve Serve() {
    return [this](ServerConnection& connection, int) {
      while (std::optional<Message> message = connection.Read()) {
        {
          absl::MutexLock lock(&mutex);
          messages.push_back(*message);
        }
        const Frame& frame = message->frame;
        if (frame.op == Op::kPush && (frame.count == 0 || frame.index + 1 == frame.count)) {
          connection.SendStatus(frame.request_id, 0, absl::OkStatus());
        } else if (frame.op == Op::kPull) {
          connection.SendChunk(frame.request_id, 0, "reply", reply);
          connection.SendStatus(frame.request_id, 1, absl::OkStatus());
        }
      }
    };
  }
};

TEST_CASE("a push arrives with its exact headers and bytes, done once") {
  Recorder recorder;
  ScriptedServer server(recorder.Serve());
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  Completion completion;
  {
    auto transport = ConnectTo(book, timer);
    CHECK(transport->name() == "tcp");
    CHECK_FALSE(transport->SendsFromDeviceMemory());
    CHECK_FALSE(transport->ReceivesIntoDeviceMemory());
    CHECK(server.secrets() == std::vector<std::string>{"secret-1", "secret-2"});

    const std::string big = Pattern(3 << 20, 1);
    // After the first two: 40 small chunks the writer sends in one batch,
    // then a large one in a batch of its own, every checksum pending.
    const std::string tail = Pattern((1 << 20) + 3, 7);
    std::vector<std::string> smalls;
    for (int i = 0; i < 40; ++i) smalls.push_back(Pattern(10000 + i, 10 + i));
    const size_t count = 2 + smalls.size() + 1;
    std::vector<OutgoingChunk> chunks(count);
    chunks[0].header.set_key("weights");
    chunks[0].header.set_chunk(0);
    chunks[0].header.set_clock(5);
    chunks[0].borrowed = big;
    chunks[0].is_borrowed = true;
    chunks[0].checksum_pending = true;
    chunks[1].header.set_key("weights");
    chunks[1].header.set_chunk(1);
    chunks[1].header.set_clock(5);
    chunks[1].owned = "a small owned payload";
    chunks[1].header.set_checksum(Crc32c(chunks[1].owned.data(), chunks[1].owned.size()));
    for (size_t i = 2; i < count; ++i) {
      chunks[i].header.set_key("weights");
      chunks[i].header.set_chunk(static_cast<int>(i));
      chunks[i].header.set_clock(5);
      chunks[i].borrowed = i < count - 1 ? absl::string_view(smalls[i - 2]) : tail;
      chunks[i].is_borrowed = true;
      chunks[i].checksum_pending = true;
    }

    CallCanceller canceller;
    transport->StartPush(chunks, absl::Now() + absl::Seconds(10), canceller, completion.Done());
    REQUIRE(completion.Wait());
    REQUIRE_OK(completion.status);

    const std::vector<Message> messages = recorder.Messages();
    REQUIRE(messages.size() == count);
    for (size_t i = 0; i < count; ++i) {
      INFO("chunk " << i);
      const Frame& frame = messages[i].frame;
      CHECK(frame.op == Op::kPush);
      CHECK(frame.index == i);
      CHECK(frame.count == count);
      CHECK(frame.request_id == messages[0].frame.request_id);
      CHECK(frame.payload_bytes == chunks[i].payload().size());
      CHECK(frame.arg > 0);
      CHECK(frame.arg <= 10000);
      CHECK(messages[i].body == WireHeader(chunks[i]).SerializeAsString());
      CHECK(messages[i].payload == chunks[i].payload());
      proto::TensorChunk header;
      REQUIRE(header.ParseFromString(messages[i].body));
      CHECK(header.checksum() == Crc32c(chunks[i].payload().data(), chunks[i].payload().size()));
    }
    proto::TensorChunk first;
    REQUIRE(first.ParseFromString(messages[0].body));
    CHECK(first.checksum() == Crc32c(big.data(), big.size()));
    CHECK(first.key() == "weights");
    CHECK(first.clock() == 5);

    // No chunks: one frame that says so.
    Completion empty;
    transport->StartPush({}, absl::Now() + absl::Seconds(10), canceller, empty.Done());
    REQUIRE(empty.Wait());
    REQUIRE_OK(empty.status);
    const std::vector<Message> after = recorder.Messages();
    REQUIRE(after.size() == count + 1);
    CHECK(after[count].frame.op == Op::kPush);
    CHECK(after[count].frame.count == 0);
    CHECK(after[count].body.empty());
    CHECK(after[count].payload.empty());

    // Device memory is refused before anything is sent.
    std::vector<OutgoingChunk> device(1);
    device[0].header.set_key("on-gpu");
    device[0].borrowed = absl::string_view(big.data(), 16);
    device[0].is_borrowed = true;
    device[0].borrowed_memory = MemoryKind::kDevice;
    Completion refused;
    transport->StartPush(device, absl::Now() + absl::Seconds(10), canceller, refused.Done());
    REQUIRE(refused.Wait());
    CHECK(absl::IsFailedPrecondition(refused.status));
    CHECK(absl::StrContains(refused.status.message(), "tcp"));
    CHECK(recorder.Messages().size() == count + 1);
    CHECK(empty.calls == 1);
    CHECK(refused.calls == 1);
  }
  CHECK(completion.calls == 1);
  CHECK(book.asked == 2);
}

// The congestion control of this process's TCP sockets connected to `port`.
std::vector<std::string> CongestionControlsTo(int port) {
  std::vector<std::string> found;
  for (int fd = 0; fd < 4096; ++fd) {
    struct sockaddr_in peer = {};
    socklen_t length = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0 ||
        peer.sin_family != AF_INET || ntohs(peer.sin_port) != port) {
      continue;
    }
    char name[32] = {};
    socklen_t name_length = sizeof(name);
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &name_length) == 0) {
      found.emplace_back(name);
    }
  }
  return found;
}

TEST_CASE("both connections use the congestion control asked for") {
  Recorder recorder;
  ScriptedServer server(recorder.Serve());
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  int port = 0;
  REQUIRE(absl::SimpleAtoi(server.address().substr(server.address().rfind(':') + 1), &port));
  // reno is built in and allowed to every process; an unknown name is
  // passed over.
  auto transport = TcpShardTransport::Connect(kPeer, book.Provider(), timer,
                                              absl::Now() + absl::Seconds(10), "no-such-cc,reno");
  REQUIRE_OK(transport.status());
  CHECK(CongestionControlsTo(port) == std::vector<std::string>{"reno", "reno"});
}

TEST_CASE("a pull lands in the caller's buffer, or a transport buffer when too small") {
  const std::string small = Pattern(1000, 2);
  // Larger than one read's share (256 KiB), so their CRCs span several.
  const std::string large = Pattern((size_t{1} << 20) + 7, 3);
  const std::string big = Pattern((size_t{3} << 20) + 5, 4);
  ScriptedServer server([&](ServerConnection& connection, int) {
    while (std::optional<Message> message = connection.Read()) {
      if (message->frame.op != Op::kPull) continue;
      connection.SendChunk(message->frame.request_id, 0, "small", small);
      connection.SendChunk(message->frame.request_id, 1, "large", large);
      // A header whose checksum does not match: the transport's CRC is the
      // bytes' own, for the caller to compare.
      connection.SendChunk(message->frame.request_id, 2, "big", big, /*wrong_checksum=*/true);
      connection.SendStatus(message->frame.request_id, 3, absl::OkStatus());
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);

  std::vector<char> small_landing(4096);
  std::vector<char> large_landing(4096);  // too small for its reply
  std::vector<char> big_landing(size_t{4} << 20);
  std::atomic<int> chosen{0};
  const ReplyLandingChooser choose = [&](const proto::TensorChunk& header, size_t bytes) {
    ++chosen;
    std::vector<char>& landing = header.key() == "small"   ? small_landing
                                 : header.key() == "large" ? large_landing
                                                           : big_landing;
    (void)bytes;
    return ReplyLanding{landing.data(), landing.size(), MemoryKind::kHost};
  };
  std::vector<ReceivedChunk> received;
  const LandedChunkSink sink = Collect(received);
  CallCanceller canceller;
  Completion completion;
  transport->StartPull(PullOf("weights"), &choose, sink, absl::Now() + absl::Seconds(10), canceller,
                       completion.Done());
  REQUIRE(completion.Wait());
  REQUIRE_OK(completion.status);
  CHECK(chosen == 3);
  REQUIRE(received.size() == 3);
  CHECK(received[0].header.key() == "small");
  CHECK(received[0].data == small_landing.data());
  CHECK(received[0].bytes == small);
  CHECK(std::string(small_landing.data(), small.size()) == small);
  CHECK(received[0].memory == MemoryKind::kHost);
  CHECK(received[1].header.key() == "large");
  CHECK(received[1].data != large_landing.data());
  CHECK(received[1].bytes == large);
  CHECK(received[1].memory == MemoryKind::kHost);
  CHECK(received[1].header.checksum() == Crc32c(large.data(), large.size()));
  CHECK(received[2].data == big_landing.data());
  CHECK(received[2].bytes == big);
  // Each reply carries the CRC of its bytes as they were read, landed or not.
  CHECK(received[0].crc == Crc32c(small.data(), small.size()));
  CHECK(received[1].crc == Crc32c(large.data(), large.size()));
  CHECK(received[2].crc == Crc32c(big.data(), big.size()));
  CHECK(received[2].crc != received[2].header.checksum());

  // Without a chooser every reply is a host view of a transport buffer.
  received.clear();
  Completion plain;
  transport->StartPull(PullOf("weights"), nullptr, sink, absl::Now() + absl::Seconds(10), canceller,
                       plain.Done());
  REQUIRE(plain.Wait());
  REQUIRE_OK(plain.status);
  REQUIRE(received.size() == 3);
  CHECK(received[0].data != small_landing.data());
  CHECK(received[0].bytes == small);
  CHECK(received[1].bytes == large);
  CHECK(received[2].data != big_landing.data());
  CHECK(received[2].bytes == big);
  CHECK(received[2].crc == Crc32c(big.data(), big.size()));
}

TEST_CASE("a call the shard never answers expires; its late reply is dropped") {
  const std::string late = Pattern(5000, 4);
  const std::string second = Pattern(700, 5);
  ScriptedServer server([&](ServerConnection& connection, int) {
    uint64_t unanswered = 0;
    while (std::optional<Message> message = connection.Read()) {
      if (message->frame.op != Op::kPull) continue;
      if (unanswered == 0) {
        unanswered = message->frame.request_id;
        continue;
      }
      // The first call's reply, long after its deadline, then the second's.
      connection.SendChunk(unanswered, 0, "late", late);
      connection.SendStatus(unanswered, 1, absl::OkStatus());
      connection.SendChunk(message->frame.request_id, 0, "second", second);
      connection.SendStatus(message->frame.request_id, 1, absl::OkStatus());
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);

  std::vector<ReceivedChunk> received;
  const LandedChunkSink sink = Collect(received);
  CallCanceller canceller;
  Completion expired;
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Milliseconds(300);
  transport->StartPull(PullOf("a"), nullptr, sink, start + timeout, canceller, expired.Done());
  REQUIRE(expired.Wait());
  const absl::Duration took = absl::Now() - start;
  CHECK(absl::IsDeadlineExceeded(expired.status));
  CHECK(absl::StrContains(expired.status.message(), kPeer));
  CHECK(took >= timeout - absl::Milliseconds(50));
  CHECK(took <= timeout + absl::Seconds(3) * testing::SlowdownFactor());
  CHECK(received.empty());

  Completion next;
  transport->StartPull(PullOf("b"), nullptr, sink, absl::Now() + absl::Seconds(10), canceller,
                       next.Done());
  REQUIRE(next.Wait());
  REQUIRE_OK(next.status);
  REQUIRE(received.size() == 1);
  CHECK(received[0].header.key() == "second");
  CHECK(received[0].bytes == second);
  CHECK(expired.calls == 1);
  CHECK(book.asked == 2);  // the same connection served both
}

TEST_CASE("CancelAll ends a call with CANCELLED and tells the shard") {
  absl::Notification got_pull;
  absl::Notification got_cancel;
  std::atomic<uint64_t> pull_id{0};
  std::atomic<uint64_t> cancel_id{0};
  ScriptedServer server([&](ServerConnection& connection, int) {
    while (std::optional<Message> message = connection.Read()) {
      if (message->frame.op == Op::kPull && !got_pull.HasBeenNotified()) {
        pull_id = message->frame.request_id;
        got_pull.Notify();
      } else if (message->frame.op == Op::kCancel && !got_cancel.HasBeenNotified()) {
        cancel_id = message->frame.request_id;
        got_cancel.Notify();
      }
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);

  std::vector<ReceivedChunk> received;
  const LandedChunkSink sink = Collect(received);
  CallCanceller canceller;
  Completion completion;
  transport->StartPull(PullOf("a"), nullptr, sink, absl::Now() + absl::Seconds(30), canceller,
                       completion.Done());
  REQUIRE(got_pull.WaitForNotificationWithTimeout(kPatience));
  canceller.CancelAll();
  REQUIRE(completion.Wait());
  CHECK(absl::IsCancelled(completion.status));
  REQUIRE(got_cancel.WaitForNotificationWithTimeout(kPatience));
  CHECK(cancel_id == pull_id);

  // A call started on a cancelled canceller ends at once.
  Completion after;
  transport->StartPull(PullOf("b"), nullptr, sink, absl::Now() + absl::Seconds(30), canceller,
                       after.Done());
  REQUIRE(after.Wait());
  CHECK(absl::IsCancelled(after.status));
  CHECK(completion.calls == 1);
}

TEST_CASE("a closed connection fails its calls; the next call reconnects") {
  std::atomic<bool> closed_once{false};
  ScriptedServer server([&](ServerConnection& connection, int) {
    int pulls = 0;
    while (std::optional<Message> message = connection.Read()) {
      const Frame& frame = message->frame;
      if (frame.op == Op::kPush) {
        connection.SendStatus(frame.request_id, 0, absl::OkStatus());
      } else if (frame.op == Op::kPull) {
        // The first pull connection closes once two calls are in flight.
        if (!closed_once && ++pulls == 2) {
          closed_once = true;
          return;
        }
        if (closed_once) {
          connection.SendChunk(frame.request_id, 0, "fresh", "payload");
          connection.SendStatus(frame.request_id, 1, absl::OkStatus());
        }
      }
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);

  std::vector<ReceivedChunk> ignored;
  const LandedChunkSink ignore = Collect(ignored);
  CallCanceller canceller;
  Completion first;
  Completion second;
  transport->StartPull(PullOf("a"), nullptr, ignore, absl::Now() + absl::Seconds(10), canceller,
                       first.Done());
  transport->StartPull(PullOf("b"), nullptr, ignore, absl::Now() + absl::Seconds(10), canceller,
                       second.Done());
  REQUIRE(first.Wait());
  REQUIRE(second.Wait());
  CHECK(absl::IsUnavailable(first.status));
  CHECK(absl::IsUnavailable(second.status));
  CHECK(absl::StrContains(first.status.message(), kPeer));
  CHECK(ignored.empty());
  CHECK(book.asked == 2);

  std::vector<ReceivedChunk> received;
  const LandedChunkSink sink = Collect(received);
  Completion third;
  transport->StartPull(PullOf("c"), nullptr, sink, absl::Now() + absl::Seconds(10), canceller,
                       third.Done());
  REQUIRE(third.Wait());
  REQUIRE_OK(third.status);
  REQUIRE(received.size() == 1);
  CHECK(received[0].bytes == "payload");
  CHECK(book.asked == 3);
  CHECK(server.secrets() == std::vector<std::string>{"secret-1", "secret-2", "secret-3"});

  // The push connection never failed: it is not reconnected.
  Completion push;
  transport->StartPush({}, absl::Now() + absl::Seconds(10), canceller, push.Done());
  REQUIRE(push.Wait());
  REQUIRE_OK(push.status);
  CHECK(book.asked == 3);
  CHECK(first.calls == 1);
  CHECK(second.calls == 1);
}

TEST_CASE("a refused hello fails Connect") {
  ScriptedServer server([](ServerConnection&, int) {},
                        absl::PermissionDeniedError("wrong hello secret"));
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport =
      TcpShardTransport::Connect(kPeer, book.Provider(), timer, absl::Now() + absl::Seconds(10));
  REQUIRE_FALSE(transport.ok());
  CHECK(absl::IsPermissionDenied(transport.status()));
  CHECK(absl::StrContains(transport.status().message(), kPeer));
  CHECK(absl::StrContains(transport.status().message(), "wrong hello secret"));
}

TEST_CASE("a malformed reply fails the connection's calls, without a huge allocation") {
  std::atomic<int> pull_connections{0};
  ScriptedServer server([&](ServerConnection& connection, int) {
    int number = -1;
    while (std::optional<Message> message = connection.Read()) {
      if (message->frame.op != Op::kPull) continue;
      if (number < 0) number = pull_connections++;
      if (number == 0) {
        // A header length prefix of 1 GiB.
        const uint32_t length = uint32_t{1} << 30;
        std::string bytes(sizeof(length), '\0');
        std::memcpy(bytes.data(), &length, sizeof(length));
        connection.Write(bytes + std::string(64, 'x'));
      } else {
        // A reply chunk announcing a 1 TiB payload.
        proto::TensorChunk header;
        header.set_key("huge");
        Frame frame;
        frame.op = Op::kReplyChunk;
        frame.request_id = message->frame.request_id;
        frame.payload_bytes = uint64_t{1} << 40;
        connection.Write(transport::EncodeStreamHeader(frame, header.SerializeAsString()));
      }
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);

  std::vector<ReceivedChunk> received;
  const LandedChunkSink sink = Collect(received);
  CallCanceller canceller;
  for (int attempt = 0; attempt < 2; ++attempt) {
    INFO("attempt " << attempt);
    Completion completion;
    transport->StartPull(PullOf("a"), nullptr, sink, absl::Now() + absl::Seconds(10), canceller,
                         completion.Done());
    REQUIRE(completion.Wait());
    CHECK(absl::IsUnavailable(completion.status));
    CHECK(absl::StrContains(completion.status.message(), "malformed"));
    CHECK(absl::StrContains(completion.status.message(), kPeer));
  }
  CHECK(received.empty());
  CHECK(book.asked == 3);  // the second attempt reconnected
}

// The caller's memory is the writer's until the write returns: a push
// stuck behind a shard that stopped reading completes only after the grace,
// when the connection is shut down under the write; the next push
// reconnects.
TEST_CASE("a push stuck mid-write completes after its write returns, not at its deadline") {
  absl::Notification release;
  ScriptedServer server([&](ServerConnection& connection, int number) {
    if (number == 0) {
      // The first hello is the push connection's: stop reading mid-push,
      // after its first frame, so the client's write blocks on a full socket.
      connection.ReadFrameOnly();
      release.WaitForNotificationWithTimeout(kPatience);
      return;
    }
    while (std::optional<Message> message = connection.Read()) {
      const Frame& frame = message->frame;
      if (frame.op == Op::kPush) connection.SendStatus(frame.request_id, 0, absl::OkStatus());
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);

  // Far more than loopback's socket buffers hold.
  const std::string big = Pattern(size_t{64} << 20, 6);
  std::vector<OutgoingChunk> chunks(1);
  chunks[0].header.set_key("big");
  chunks[0].borrowed = big;
  chunks[0].is_borrowed = true;
  CallCanceller canceller;
  Completion stuck;
  const absl::Time start = absl::Now();
  transport->StartPush(chunks, start + absl::Milliseconds(200), canceller, stuck.Done());
  REQUIRE(stuck.Wait());
  const absl::Duration took = absl::Now() - start;
  release.Notify();
  CHECK(absl::IsDeadlineExceeded(stuck.status));
  // Not at the deadline: after the grace (2 s) that cut the write short.
  CHECK(took >= absl::Milliseconds(200) + absl::Milliseconds(1500));
  CHECK(took <= absl::Seconds(8) * testing::SlowdownFactor());

  Completion next;
  transport->StartPush({}, absl::Now() + absl::Seconds(10), canceller, next.Done());
  REQUIRE(next.Wait());
  REQUIRE_OK(next.status);
  CHECK(book.asked == 3);
  CHECK(stuck.calls == 1);
}

// Likewise a landing: a cancelled pull whose reply payload the reader is
// receiving into the caller's buffer completes only once that receive has
// returned (the shard stalled halfway; the grace shuts the socket down).
TEST_CASE("a pull cancelled mid-landing completes after the receive returns") {
  const std::string half = Pattern(1 << 19, 7);
  absl::Notification sent_half;
  absl::Notification release;
  ScriptedServer server([&](ServerConnection& connection, int) {
    while (std::optional<Message> message = connection.Read()) {
      if (message->frame.op != Op::kPull) continue;
      proto::TensorChunk header;
      header.set_key("landing");
      Frame frame;
      frame.op = Op::kReplyChunk;
      frame.request_id = message->frame.request_id;
      frame.payload_bytes = 2 * half.size();
      connection.Write(transport::EncodeStreamHeader(frame, header.SerializeAsString()), half);
      sent_half.Notify();
      release.WaitForNotificationWithTimeout(kPatience);
      return;
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);

  std::vector<char> landing(2 * half.size());
  std::atomic<int> chosen{0};
  const ReplyLandingChooser choose = [&](const proto::TensorChunk&, size_t) {
    ++chosen;
    return ReplyLanding{landing.data(), landing.size(), MemoryKind::kHost};
  };
  std::vector<ReceivedChunk> received;
  const LandedChunkSink sink = Collect(received);
  CallCanceller canceller;
  Completion completion;
  transport->StartPull(PullOf("a"), &choose, sink, absl::InfiniteFuture(), canceller,
                       completion.Done());
  REQUIRE(sent_half.WaitForNotificationWithTimeout(kPatience));
  // The reader is in the landing once the chooser ran (it reads after).
  for (int i = 0; i < 2000 && chosen == 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(chosen == 1);
  const absl::Time cancelled_at = absl::Now();
  canceller.CancelAll();
  REQUIRE(completion.Wait());
  const absl::Duration took = absl::Now() - cancelled_at;
  release.Notify();
  CHECK(absl::IsCancelled(completion.status));
  CHECK(took >= absl::Milliseconds(1500));
  CHECK(received.empty());
  CHECK(std::string(landing.data(), half.size()) == half);
  CHECK(completion.calls == 1);
}

TEST_CASE("destroying the transport completes its open calls once") {
  absl::Notification got_pull;
  ScriptedServer server([&](ServerConnection& connection, int) {
    while (std::optional<Message> message = connection.Read()) {
      if (message->frame.op == Op::kPull) got_pull.Notify();
    }
  });
  AddressBook book(server.address());
  auto timer = std::make_shared<TimerThread>("tcp-test");
  auto transport = ConnectTo(book, timer);
  std::vector<ReceivedChunk> received;
  const LandedChunkSink sink = Collect(received);
  CallCanceller canceller;
  Completion completion;
  transport->StartPull(PullOf("a"), nullptr, sink, absl::InfiniteFuture(), canceller,
                       completion.Done());
  REQUIRE(got_pull.WaitForNotificationWithTimeout(kPatience));
  transport.reset();
  REQUIRE(completion.notified.HasBeenNotified());
  CHECK(absl::IsCancelled(completion.status));
  CHECK(completion.calls == 1);
  canceller.CancelAll();  // nothing registered any more
  CHECK(completion.calls == 1);
}

}  // namespace
}  // namespace harrier
