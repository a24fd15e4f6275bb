#include "server/tcp/tcp_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "common/request_limits.h"
#include "common/transport/stream.h"
#include "spdlog/spdlog.h"

namespace harrier {

using transport::Frame;
using transport::Op;

namespace {

// A chunk is at most 32 MiB (ClientOptions' upper bound): a frame that
// announces more is refused before anything is read for it.
constexpr uint64_t kMaxPayloadBytes = uint64_t{64} << 20;

// As the UCX listener's: calls with at most this many payload bytes run
// their store work on the connection's thread when it does not wait.
constexpr uint64_t kInlineWorkBytes = 256u << 10;

// How long the rest of a message may take once its first bytes arrived,
// and how long a push's later chunk frames may take when the client gave
// no timeout (one with a timeout gets it plus kGrace).
constexpr absl::Duration kMessageLimit = absl::Seconds(120);
constexpr absl::Duration kGrace = absl::Seconds(1);

static_assert(ShardService::kMaxChunksPerCall == transport::kMaxChunksPerCall,
              "the shard refuses calls the framing lets clients send");

absl::Time LimitFor(int64_t timeout_ms, absl::Time start) {
  return timeout_ms >= 0 ? start + absl::Milliseconds(timeout_ms) + kGrace : start + kMessageLimit;
}

// Reads and drops `bytes` bytes: a refused push's payload, so that the
// stream stays in step without keeping them.
absl::Status Discard(int fd, uint64_t bytes, absl::Time deadline) {
  char scratch[64 << 10];
  while (bytes > 0) {
    const size_t step = static_cast<size_t>(std::min<uint64_t>(bytes, sizeof(scratch)));
    if (auto status = transport::ReadFully(fd, scratch, step, deadline); !status.ok()) {
      return status;
    }
    bytes -= step;
  }
  return absl::OkStatus();
}

}  // namespace

struct TcpListener::Connection {
  uint64_t id = 0;
  int fd = -1;
  std::string peer;        // "ip:port", for logs
  std::string budget_key;  // the connection's name in the BufferBudget
  uint64_t client_id = 0;  // the connection id the client's hello named

  absl::Mutex write_mutex;
  bool broken ABSL_GUARDED_BY(write_mutex) = false;

  ~Connection() {
    if (fd >= 0) close(fd);
  }

  // Writes one whole message. A write that fails or takes longer than
  // kWriteTimeout leaves the stream mid-message: the connection is shut
  // down, which ends its thread and its calls.
  absl::Status Write(struct iovec* parts, size_t count) {
    absl::MutexLock lock(&write_mutex);
    if (broken) return absl::UnavailableError("the client's connection is closed");
    absl::Status status = transport::WriteFully(fd, parts, count, absl::Now() + kWriteTimeout);
    if (!status.ok()) {
      broken = true;
      shutdown(fd, SHUT_RDWR);
      return absl::UnavailableError(
          absl::StrCat("writing to the client ", peer, " failed: ", status.message()));
    }
    return absl::OkStatus();
  }

  absl::Status WriteHeader(const std::string& header) {
    std::string message = transport::PrefixStreamHeader(header);
    struct iovec part = {message.data(), message.size()};
    return Write(&part, 1);
  }

  absl::Status SendStatus(uint64_t request, uint32_t count, const absl::Status& status) {
    return WriteHeader(transport::EncodeStatus(client_id, request, count, status));
  }

  // Stops both directions; the serving thread's read then ends.
  void Shutdown() { shutdown(fd, SHUT_RDWR); }
};

// The chunk frames of one push / push-pull received so far.
struct TcpListener::PendingPush {
  Op op = Op::kPush;
  uint32_t count = 0;
  uint32_t arrived = 0;
  int64_t timeout_ms = -1;
  ShardService::Clock::time_point received = ShardService::Clock::now();
  absl::Time started = absl::Now();
  uint64_t sent = 0;      // payload bytes so far (--max_request_bytes)
  uint64_t reserved = 0;  // of them, reserved in the BufferBudget
  std::vector<proto::TensorChunk> chunks;
  std::vector<transport::PayloadBuffer> payloads;
  std::vector<bool> seen;
  absl::Status error;  // the first bad frame's; answered once all arrived
};

// One request the service is answering; also its reply sink.
struct TcpListener::Request final : ShardService::ReplySink {
  std::shared_ptr<Connection> connection;
  uint64_t id = 0;
  Cancellation cancellation;
  std::shared_ptr<PendingPush> pushed;  // a push's payloads, read in place by the store
  // Pool thread, one chunk at a time: between Allocate and Send.
  transport::PayloadBuffer payload;
  std::shared_ptr<const ParamBuffer> borrowed;  // instead of `payload`
  uint32_t sent = 0;

  char* Allocate(size_t bytes) override {
    payload = transport::PayloadBuffer::Allocate(bytes);
    return payload.data();
  }
  void Borrow(std::shared_ptr<const ParamBuffer> version) override {
    borrowed = std::move(version);  // written to the socket from where it is
  }
  absl::Status Send(const proto::TensorChunk& header, uint32_t index, bool) override {
    const char* data = payload.data();
    size_t bytes = payload.size;
    if (borrowed) {
      data = reinterpret_cast<const char*>(borrowed->data());
      bytes = borrowed->bytes();
    }
    Frame frame;
    frame.op = Op::kReplyChunk;
    frame.connection_id = connection->client_id;
    frame.request_id = id;
    frame.index = index;
    frame.payload_bytes = bytes;
    std::string message =
        transport::EncodeStreamHeader(frame, transport::EncodeChunkHeader(header));
    struct iovec parts[2] = {{message.data(), message.size()}, {const_cast<char*>(data), bytes}};
    absl::Status status = connection->Write(parts, 2);
    // Written (or failed): the bytes are no longer needed.
    borrowed.reset();
    payload = {};
    if (status.ok()) sent = index + 1;
    return status;
  }
};

TcpListener::TcpListener(const TcpListenerOptions& options)
    : options_(options), hello_secrets_(options.require_hello_secret) {}

TcpListener::~TcpListener() { Close(); }

absl::Status TcpListener::Start(ShardService* service) {
  if (!options_.advertise.empty()) {
    if (auto status = CheckAdvertisedAddress(options_.advertise); !status.ok()) return status;
  }
  service_ = service;
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* found = nullptr;
  const std::string port = std::to_string(options_.port);
  const std::string where = absl::StrCat(options_.host, ":", options_.port);
  if (const int error = getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &found);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", where, " (tcp): ", gai_strerror(error)));
  }
  absl::Status failure = absl::UnavailableError(absl::StrCat("no address for ", where));
  for (struct addrinfo* it = found; it != nullptr && listen_fd_ < 0; it = it->ai_next) {
    const int fd = socket(it->ai_family, it->ai_socktype | SOCK_CLOEXEC, it->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, it->ai_addr, it->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      failure = absl::UnavailableError(
          absl::StrCat("cannot listen on ", where, " (tcp): ", std::strerror(errno)));
      close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) return failure;
  struct sockaddr_storage bound = {};
  socklen_t length = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<struct sockaddr*>(&bound), &length);
  bound_port_ = bound.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&bound)->sin6_port)
                    : ntohs(reinterpret_cast<struct sockaddr_in*>(&bound)->sin_port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  spdlog::info(
      "tcp data path listening on {}:{}{}", options_.host, bound_port_,
      options_.advertise.empty() ? "" : absl::StrCat(", told to clients as ", options_.advertise));
  return absl::OkStatus();
}

absl::Status CheckAdvertisedAddress(absl::string_view address) {
  constexpr size_t kMaxAddressBytes = 255;
  if (address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an address of ", address.size(), " bytes (at most ", kMaxAddressBytes, ")"));
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not host:port or :port with a port in 1-65535"));
  }
  return absl::OkStatus();
}

std::string TcpListener::address() const {
  if (!options_.advertise.empty()) return options_.advertise;
  const bool wildcard = options_.host.empty() || options_.host == "0.0.0.0" ||
                        options_.host == "::" || options_.host == "[::]";
  return absl::StrCat(wildcard ? "" : options_.host, ":", bound_port_);
}

int TcpListener::connections() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(connections_.size());
}

void TcpListener::AcceptLoop() {
  for (;;) {
    struct pollfd waiting[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int ready = poll(waiting, 2, 1000);
    if (stopping_) return;
    ReapServingThreads();
    if (ready <= 0 || (waiting[0].revents & POLLIN) == 0) continue;
    struct sockaddr_storage from = {};
    socklen_t length = sizeof(from);
    const int fd = accept4(listen_fd_, reinterpret_cast<struct sockaddr*>(&from), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    char host[NI_MAXHOST] = "?";
    char port[NI_MAXSERV] = "?";
    getnameinfo(reinterpret_cast<struct sockaddr*>(&from), length, host, sizeof(host), port,
                sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
    transport::TuneStreamSocket(fd);
    transport::SetCongestionControl(fd, options_.congestion_control);
    auto connection = std::make_shared<Connection>();
    connection->fd = fd;
    connection->peer = absl::StrCat(host, ":", port);
    absl::MutexLock lock(&mutex_);
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      spdlog::warn("tcp connection from {} refused: {} connections are open", connection->peer,
                   connections_.size());
      continue;  // the destructor closes it
    }
    connection->id = next_connection_++;
    connection->budget_key = absl::StrCat("tcp:", connection->id);
    connections_[connection->id] = connection;
    ServingThread serving;
    serving.done = std::make_shared<std::atomic<bool>>(false);
    serving.thread = std::thread([this, connection, done = serving.done] {
      Serve(connection);
      done->store(true);
    });
    serving_.push_back(std::move(serving));
  }
}

void TcpListener::ReapServingThreads() {
  std::vector<std::thread> ended;
  {
    absl::MutexLock lock(&mutex_);
    auto first_ended = std::partition(serving_.begin(), serving_.end(),
                                      [](const ServingThread& t) { return !t.done->load(); });
    for (auto it = first_ended; it != serving_.end(); ++it) ended.push_back(std::move(it->thread));
    serving_.erase(first_ended, serving_.end());
  }
  for (std::thread& thread : ended) thread.join();
}

void TcpListener::Close() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::shared_ptr<Request>> open;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& entry : requests_) open.push_back(entry.second);
  }
  for (const auto& request : open) request->cancellation.Cancel();
  open.clear();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mutex_);
    // Answers write through their connections: wait for them first.
    if (!mutex_.AwaitWithTimeout(
            absl::Condition(
                +[](std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<Request>>* requests) {
                  return requests->empty();
                },
                &requests_),
            kDrainTimeout)) {
      spdlog::error("tcp shutdown: {} requests still unanswered after {}", requests_.size(),
                    absl::FormatDuration(kDrainTimeout));
    }
    for (auto& entry : connections_) entry.second->Shutdown();
    for (ServingThread& serving : serving_) threads.push_back(std::move(serving.thread));
    serving_.clear();
  }
  for (std::thread& thread : threads) thread.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

bool TcpListener::Greet(Connection& connection) {
  Frame frame;
  std::string header;
  absl::Status status = transport::ReadHeader(connection.fd, transport::kMaxHelloHeaderBytes,
                                              absl::Now() + kHelloTimeout, &frame, &header);
  if (!status.ok()) {
    spdlog::warn("tcp connection from {} closed before its hello: {}", connection.peer,
                 TruncatedForLog(status.message()));
    return false;
  }
  if (frame.op != Op::kHello || frame.payload_bytes != 0) {
    spdlog::warn("tcp connection from {} closed: its first message is not a hello",
                 connection.peer);
    return false;
  }
  connection.client_id = frame.connection_id;
  const std::string secret = header.substr(transport::kFrameBytes);
  if (hello_secrets_.required() && (secret.empty() || !hello_secrets_.Take(secret))) {
    spdlog::warn("tcp hello from {} refused: missing, wrong or expired hello secret",
                 connection.peer);
    (void)connection.SendStatus(
        frame.request_id, 0,
        absl::PermissionDeniedError("hello refused: missing, wrong or expired hello secret "
                                    "(fetch the address and a secret with GetTransportAddress)"));
    return false;
  }
  if (stopping_) {
    (void)connection.SendStatus(frame.request_id, 0,
                                absl::UnavailableError("shard is shutting down"));
    return false;
  }
  return connection.SendStatus(frame.request_id, 0, absl::OkStatus()).ok();
}

void TcpListener::Serve(const std::shared_ptr<Connection>& connection) {
  PendingPushes pending;
  if (Greet(*connection)) {
    spdlog::info("tcp connection={} from {} opened", connection->id, connection->peer);
    for (;;) {
      absl::Status status = ServeMessage(connection, pending);
      if (!status.ok()) {
        if (!stopping_ && !absl::IsUnavailable(status)) {
          spdlog::warn("tcp connection={} from {} closed: {}", connection->id, connection->peer,
                       TruncatedForLog(status.message()));
        }
        break;
      }
    }
  }
  connection->Shutdown();
  ExpirePending(*connection, pending, /*all=*/true);
  // Cancelled outside the lock: a wake-up may answer its call at once.
  std::vector<std::shared_ptr<Request>> open;
  {
    absl::MutexLock lock(&mutex_);
    for (auto it = requests_.lower_bound({connection->id, 0});
         it != requests_.end() && it->first.first == connection->id; ++it) {
      open.push_back(it->second);
    }
    connections_.erase(connection->id);
  }
  for (const auto& request : open) request->cancellation.Cancel();
}

void TcpListener::ExpirePending(Connection& connection, PendingPushes& pending, bool all) {
  const absl::Time now = absl::Now();
  for (auto it = pending.begin(); it != pending.end();) {
    PendingPush& push = *it->second;
    if (!all && LimitFor(push.timeout_ms, push.started) > now) {
      ++it;
      continue;
    }
    service_->buffer_budget().Release(connection.budget_key, push.reserved);
    if (!all) {
      spdlog::warn("tcp connection={} request={}: {} of {} chunks arrived in time; refused",
                   connection.id, it->first, push.arrived, push.count);
      (void)connection.SendStatus(it->first, 0,
                                  absl::DeadlineExceededError(absl::StrCat(
                                      "only ", push.arrived, " of the call's ", push.count,
                                      " chunks arrived before its deadline; nothing was applied")));
    }
    it = pending.erase(it);
  }
}

absl::Status TcpListener::ServeMessage(const std::shared_ptr<Connection>& connection,
                                       PendingPushes& pending) {
  const int fd = connection->fd;
  // Idle connections may wait for their next message without end; a push
  // whose frames stopped coming only until its limit.
  absl::Time wait_until = absl::InfiniteFuture();
  for (const auto& entry : pending) {
    wait_until = std::min(wait_until, LimitFor(entry.second->timeout_ms, entry.second->started));
  }
  // The first byte alone until then, so that a wait that ends has taken
  // nothing from the stream; the rest of the prefix within the message's
  // own limit.
  char prefix[transport::kStreamPrefixBytes];
  absl::Status status = transport::ReadFully(fd, prefix, 1, wait_until);
  if (absl::IsDeadlineExceeded(status)) {
    ExpirePending(*connection, pending, /*all=*/false);
    return absl::OkStatus();
  }
  if (status.ok()) {
    status = transport::ReadFully(fd, prefix + 1, sizeof(prefix) - 1, absl::Now() + kMessageLimit);
  }
  if (!status.ok()) return status;
  absl::StatusOr<size_t> header_bytes =
      transport::DecodeStreamPrefix(prefix, transport::kMaxStreamHeaderBytes);
  if (!header_bytes.ok()) return header_bytes.status();
  // A header larger than a hello's (a sparse call's row ids) is counted
  // while it is held.
  const uint64_t counted = *header_bytes > transport::kMaxHelloHeaderBytes ? *header_bytes : 0;
  if (counted > 0) {
    if (auto reserved = service_->buffer_budget().Reserve(connection->budget_key, counted);
        !reserved.ok()) {
      return reserved;
    }
  }
  absl::Cleanup release = [this, connection, counted] {
    if (counted > 0) service_->buffer_budget().Release(connection->budget_key, counted);
  };
  std::string header(*header_bytes, '\0');
  const absl::Time message_limit = absl::Now() + kMessageLimit;
  if (auto read = transport::ReadFully(fd, header.data(), header.size(), message_limit);
      !read.ok()) {
    return read;
  }
  Frame frame;
  absl::string_view body;
  if (auto decoded = transport::DecodeHeader(header.data(), header.size(), &frame, &body);
      !decoded.ok()) {
    return decoded;
  }
  if (frame.body_in_data) {
    return absl::InvalidArgumentError("malformed stream message: a body in the data");
  }
  if (frame.payload_bytes > kMaxPayloadBytes) {
    (void)connection->SendStatus(
        frame.request_id, 0,
        absl::InvalidArgumentError(absl::StrCat("a payload of ", frame.payload_bytes,
                                                " bytes exceeds ", kMaxPayloadBytes)));
    return absl::InvalidArgumentError("payload too large");
  }
  switch (frame.op) {
    case Op::kPush:
    case Op::kPushPull:
      return OnChunkFrame(connection, frame, body, pending);
    case Op::kPull: {
      if (frame.payload_bytes != 0) {
        return absl::InvalidArgumentError("malformed stream message: a pull with a payload");
      }
      if (stopping_) {
        return connection->SendStatus(frame.request_id, 0,
                                      absl::UnavailableError("shard is shutting down"));
      }
      proto::PullRequest request;
      if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
        return connection->SendStatus(
            frame.request_id, 0,
            absl::InvalidArgumentError("malformed frame: PullRequest does not parse"));
      }
      Dispatch(connection, frame, frame.arg, nullptr, &request);
      return absl::OkStatus();
    }
    case Op::kCancel: {
      std::shared_ptr<Request> cancelled;
      {
        absl::MutexLock lock(&mutex_);
        auto it = requests_.find({connection->id, frame.request_id});
        if (it != requests_.end()) cancelled = it->second;
      }
      if (cancelled) cancelled->cancellation.Cancel();
      return frame.payload_bytes == 0
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError("malformed stream message: a cancel with a payload");
    }
    default:
      (void)connection->SendStatus(
          frame.request_id, 0,
          absl::InvalidArgumentError(absl::StrCat(
              "malformed frame: op ", static_cast<int>(frame.op), " is not a request")));
      return absl::InvalidArgumentError("not a request");
  }
}

absl::Status TcpListener::OnChunkFrame(const std::shared_ptr<Connection>& connection,
                                       const Frame& frame, absl::string_view body,
                                       PendingPushes& pending) {
  const int fd = connection->fd;
  const uint64_t request = frame.request_id;
  if (auto status = ShardService::CheckChunkCount(frame.count); !status.ok()) {
    // Refused before anything is kept; its payload is read and dropped.
    if (auto discard = Discard(fd, frame.payload_bytes, absl::Now() + kMessageLimit);
        !discard.ok()) {
      return discard;
    }
    if (auto it = pending.find(request); it != pending.end()) {
      service_->buffer_budget().Release(connection->budget_key, it->second->reserved);
      pending.erase(it);
    }
    return connection->SendStatus(request, 0, status);
  }
  if (frame.count == 0) {  // an empty push: nothing to wait for
    if (frame.payload_bytes != 0) {
      return absl::InvalidArgumentError("malformed stream message: an empty push with a payload");
    }
    if (stopping_) {
      return connection->SendStatus(request, 0, absl::UnavailableError("shard is shutting down"));
    }
    Dispatch(connection, frame, frame.arg, nullptr, nullptr);
    return absl::OkStatus();
  }
  auto& slot = pending[request];
  if (!slot) {
    slot = std::make_unique<PendingPush>();
    slot->op = frame.op;
    slot->count = frame.count;
    slot->timeout_ms = frame.arg;
    slot->chunks.resize(frame.count);
    slot->payloads.resize(frame.count);
    slot->seen.resize(frame.count);
  }
  PendingPush& push = *slot;
  // The call's payloads so far plus this one, counted before it is read: a
  // call over --max_request_bytes or the buffer budget is refused without
  // keeping the excess.
  push.sent += frame.payload_bytes;
  absl::Status admitted = service_->CheckRequestBytes(push.sent);
  if (admitted.ok() && push.error.ok()) {
    admitted = service_->buffer_budget().Reserve(connection->budget_key, frame.payload_bytes);
    if (admitted.ok()) push.reserved += frame.payload_bytes;
  }
  const absl::Time payload_limit = LimitFor(push.timeout_ms, absl::Now());
  transport::PayloadBuffer payload;
  if (admitted.ok() && push.error.ok()) {
    payload = transport::PayloadBuffer::Allocate(frame.payload_bytes);
    if (auto read = transport::ReadFully(fd, payload.data(), payload.size, payload_limit);
        !read.ok()) {
      return read;
    }
  } else if (auto discard = Discard(fd, frame.payload_bytes, payload_limit); !discard.ok()) {
    return discard;
  }
  // A frame that does not fit the request is answered at once; any other
  // bad chunk once all its frames arrived, so the request leaves nothing
  // behind.
  const bool fits = frame.op == push.op && frame.count == push.count && frame.index < push.count &&
                    !push.seen[frame.index];
  if (!fits) {
    push.error = absl::InvalidArgumentError(absl::StrCat(
        "malformed frame: chunk ", frame.index, " of ", frame.count, " does not fit the request"));
  } else {
    push.seen[frame.index] = true;
    ++push.arrived;
    if (!push.error.ok()) {
      // Already refused: the bytes were dropped.
    } else if (!admitted.ok()) {
      push.error = admitted;
    } else if (!push.chunks[frame.index].ParseFromArray(body.data(),
                                                        static_cast<int>(body.size()))) {
      push.error = absl::InvalidArgumentError("malformed frame: chunk header does not parse");
    } else if (auto limits = CheckChunkLimits("push", push.chunks[frame.index]); !limits.ok()) {
      push.error = limits;
      proto::TensorChunk().Swap(&push.chunks[frame.index]);
    } else {
      push.payloads[frame.index] = std::move(payload);
    }
  }
  if (fits && push.arrived < push.count) return absl::OkStatus();
  std::shared_ptr<PendingPush> done = std::move(slot);
  pending.erase(request);
  // Validated from here on: the store holds the payloads while it applies
  // them, as it does for every transport.
  service_->buffer_budget().Release(connection->budget_key, done->reserved);
  if (!done->error.ok()) return connection->SendStatus(request, 0, done->error);
  if (stopping_) {
    return connection->SendStatus(request, 0, absl::UnavailableError("shard is shutting down"));
  }
  const int64_t timeout_ms = done->timeout_ms;
  Dispatch(connection, frame, timeout_ms, std::move(done), nullptr);
  return absl::OkStatus();
}

void TcpListener::Dispatch(const std::shared_ptr<Connection>& connection, const Frame& frame,
                           int64_t timeout_ms, std::shared_ptr<PendingPush> pushed,
                           proto::PullRequest* pull) {
  auto request = std::make_shared<Request>();
  request->connection = connection;
  request->id = frame.request_id;
  request->pushed = std::move(pushed);
  ShardService::Call call;
  if (request->pushed) call.received = request->pushed->received;
  if (timeout_ms >= 0) call.client_deadline = call.received + std::chrono::milliseconds(timeout_ms);
  call.cancellation = &request->cancellation;
  {
    absl::MutexLock lock(&mutex_);
    requests_[{connection->id, request->id}] = request;
  }
  auto done = [this, request](const absl::Status& status) { Answer(request, status); };
  if (pull != nullptr) {
    call.work_on_caller_thread = true;  // the service answers inline only what is ready and small
    service_->Pull(call, std::move(*pull), request.get(), std::move(done));
    return;
  }
  std::vector<ShardStore::PushChunkView> views;
  uint64_t pushed_bytes = 0;
  if (request->pushed) {
    const PendingPush& chunks = *request->pushed;
    views.resize(chunks.chunks.size());
    for (size_t i = 0; i < views.size(); ++i) {
      views[i] = {&chunks.chunks[i], chunks.payloads[i].view()};
      pushed_bytes += views[i].payload.size();
    }
  }
  // Large pushes go to the pools, so this connection's next request is
  // read while the store applies this one.
  call.work_on_caller_thread = pushed_bytes <= kInlineWorkBytes;
  if (frame.op == Op::kPushPull) {
    service_->PushPull(call, std::move(views), request.get(), std::move(done));
  } else {
    service_->Push(call, std::move(views), std::move(done));
  }
}

void TcpListener::Answer(const std::shared_ptr<Request>& request, const absl::Status& status) {
  (void)request->connection->SendStatus(request->id, request->sent, status);
  request->pushed.reset();
  absl::MutexLock lock(&mutex_);
  requests_.erase({request->connection->id, request->id});
}

}  // namespace harrier
