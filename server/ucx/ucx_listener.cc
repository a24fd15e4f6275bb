#include "server/ucx/ucx_listener.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <sys/random.h>

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_security.h"
#include "common/request_limits.h"
#include "spdlog/spdlog.h"

namespace harrier {

using transport::Frame;
using transport::Op;

namespace {

// Largest AM data accepted: a chunk is at most 32 MiB (ClientOptions'
// upper bound), so anything bigger is refused before it is received.
constexpr size_t kMaxPayloadBytes = 64u << 20;

// Clients size their calls by the framing's bound; the service enforces it.
static_assert(ShardService::kMaxChunksPerCall == transport::kMaxChunksPerCall,
              "the shard refuses calls the framing lets clients send");

// Bytes of an eager message's data, or of a rendezvous one once received.
struct Arrival {
  Frame frame;
  std::string body;
  transport::PayloadBuffer data;
};

// The store reads a gradient as floats and the codecs' decoders read
// 64-bit words, both through plain pointers (no aligned vector loads):
// 8 bytes is what they need. UCX's eager buffers are at 16 (tcp) or 8
// (posix, sysv) here.
constexpr uintptr_t kPayloadAlignment = alignof(uint64_t);

// Once per process: whether eager pushes are read in place, which depends on
// the transport's receive buffers (their alignment) rather than on the call.
void LogEagerPathOnce(bool in_place, const void* data) {
  static std::atomic<int> logged{0};
  if (logged.exchange(1) != 0) return;
  spdlog::info("ucx eager push payloads {} (first at address mod {} = {})",
               in_place ? "read in place from UCX's receive buffer" : "copied out of UCX's",
               kPayloadAlignment, reinterpret_cast<uintptr_t>(data) % kPayloadAlignment);
}

transport::PayloadBuffer Copy(const void* data, size_t length) {
  auto buffer = transport::PayloadBuffer::Allocate(length);
  if (length > 0) std::memcpy(buffer.data(), data, length);
  return buffer;
}

// Calls whose store work is at most this many payload bytes run it on the
// progress thread when it does not wait (ShardService's
// work_on_caller_thread: the push, and pulls that are ready): saves the
// hand-off to a pool and back, most of a small call's round trip. Larger
// ones go to the pools so the progress thread keeps moving other clients'
// bytes (a 256 KiB SGD step is ~20 us; a 64 MiB one ~10 ms). The same bound
// as the service's own for inline pulls.
constexpr uint64_t kInlineWorkBytes = 256u << 10;

// How long a push or push-pull may take to deliver all its frames when the
// client gave no timeout; one with a timeout gets it plus kSweepGrace.
// Past that the call is refused and its reserved bytes are given back:
// a client that dies over shared memory (no failure detection) or stalls
// part-way must not hold them until the shard stops.
constexpr std::chrono::seconds kIncompleteCallLimit{120};
constexpr std::chrono::seconds kSweepGrace{1};
constexpr std::chrono::milliseconds kSweepInterval{1000};

// A UCX connection's name in the service's BufferBudget (gRPC's are peer
// addresses, so the two never collide).
std::string BudgetKey(uint64_t connection_id) { return absl::StrCat("ucx:", connection_id); }

}  // namespace

struct UcxListener::Peer {
  UcxListener* server = nullptr;
  uint64_t id = 0;
  ucp_ep_h ep = nullptr;
};

// The chunk frames of one push / push-pull received so far.
struct UcxListener::Pending {
  Op op = Op::kPush;
  uint32_t count = 0;
  uint32_t arrived = 0;
  int64_t timeout_ms = -1;
  // The first frame's arrival: the call's latency counts receiving it all.
  ShardService::Clock::time_point received = ShardService::Clock::now();
  std::vector<proto::TensorChunk> chunks;  // headers (payload field unused)
  std::vector<transport::PayloadBuffer> payloads;
  std::vector<bool> seen;
  absl::Status error;  // the first bad frame's; replied once all arrived
};

// One request the service is answering; also its reply sink.
struct UcxListener::Request final : ShardService::ReplySink {
  UcxListener* server = nullptr;
  uint64_t connection = 0;
  uint64_t id = 0;
  Cancellation cancellation;
  std::shared_ptr<Pending> pushed;  // a push's chunks, read in place by the store
  // Pool thread, one chunk at a time: between Allocate and Send.
  transport::PayloadBuffer payload;
  std::shared_ptr<const ParamBuffer> borrowed;  // instead of `payload`
  uint32_t sent = 0;

  char* Allocate(size_t bytes) override {
    // The store writes the parameters straight into the buffer UCX sends.
    payload = transport::PayloadBuffer::Allocate(bytes);
    return payload.data();
  }
  void Borrow(std::shared_ptr<const ParamBuffer> version) override {
    borrowed = std::move(version);  // sent from, held until the send completes
  }
  absl::Status Send(const proto::TensorChunk& header, uint32_t index, bool) override {
    if (borrowed) {
      const char* data = reinterpret_cast<const char*>(borrowed->data());
      const size_t bytes = borrowed->bytes();
      server->SendChunk(connection, id, index, header, data, bytes, std::move(borrowed));
    } else {
      auto owned = std::make_shared<transport::PayloadBuffer>(std::move(payload));
      const char* data = owned->data();
      const size_t bytes = owned->size;
      server->SendChunk(connection, id, index, header, data, bytes, std::move(owned));
    }
    sent = index + 1;
    return absl::OkStatus();
  }
};

UcxListener::UcxListener(const UcxListenerOptions& options)
    : shard_(options.shard), hello_secrets_(options.require_hello_secret) {}

absl::Status UcxListener::Start(ShardService* service) {
  service_ = service;
  auto worker = transport::UcxWorker::Start(
      absl::StrCat("harrier-shard-", shard_),
      {{transport::kRequestAmId, &UcxListener::OnRequest, this, /*persistent_data=*/true}});
  if (!worker.ok()) return worker.status();
  worker_ = std::move(*worker);
  worker_->SetPeriodicTask(kSweepInterval, [this] { SweepIncompleteCalls(); });
  address_ = worker_->address();
  return absl::OkStatus();
}

UcxListener::~UcxListener() { Close(); }

void UcxListener::Close() {
  if (stopping_.exchange(true)) return;
  {
    absl::MutexLock lock(&requests_mutex_);
    for (auto& entry : requests_) entry.second->cancellation.Cancel();
    // Answers post replies through worker_: it must outlive them.
    if (!requests_mutex_.AwaitWithTimeout(
            absl::Condition(
                +[](std::map<RequestKey, std::shared_ptr<Request>>* requests) {
                  return requests->empty();
                },
                &requests_),
            kDrainTimeout)) {
      spdlog::error("ucx shutdown: {} requests still unanswered after {}", requests_.size(),
                    absl::FormatDuration(kDrainTimeout));
    }
  }
  if (!worker_) return;  // Start() failed
  worker_->Post([this] {
    for (auto& entry : peers_) worker_->CloseEndpoint(entry.second->ep);
    peers_.clear();
    pending_.clear();
    ForgetRequestBytes(request_bytes_.begin(), request_bytes_.end());
  });
  // Not reset: callbacks still running on the progress thread use worker_.
  worker_->Stop();
}

ucs_status_t UcxListener::OnRequest(void* arg, const void* header, size_t header_length,
                                  void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxListener*>(arg);
  Frame frame;
  absl::string_view body;
  if (auto status = transport::DecodeHeader(header, header_length, &frame, &body); !status.ok()) {
    // Without a frame there is no connection to answer on: drop it (a
    // rendezvous message is dropped by returning UCS_OK).
    spdlog::warn("ucx dropped a request: {}", TruncatedForLog(status.message()));
    return UCS_OK;
  }
  // The call's payloads so far plus this one, counted before it is copied or
  // received: a call over --max_request_bytes is refused without buffering
  // the excess (its later frames are dropped the same way).
  if ((frame.op == Op::kPush || frame.op == Op::kPushPull) &&
      self->peers_.count(frame.connection_id) != 0) {
    RequestBytes& bytes = self->request_bytes_[{frame.connection_id, frame.request_id}];
    bytes.sent += length;
    absl::Status status = self->service_->CheckRequestBytes(bytes.sent);
    if (status.ok()) {
      status = self->service_->buffer_budget().Reserve(BudgetKey(frame.connection_id), length);
    }
    if (!status.ok()) {
      self->OnFrame(frame, std::string(body), {}, status, length);
      return UCS_OK;
    }
    bytes.reserved += length;
  }
  if (frame.body_in_data) return self->OnBodyInData(frame, data, length, param);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    // Eager: UCX's receive buffer is kept (UCS_INPROGRESS) and the store
    // reads the gradient in it, given back to UCX when the request's last
    // reference to it goes. Only when it is aligned for the store's float
    // loads; otherwise (and for data UCX cannot keep) it is copied.
    const bool keep = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0 && length > 0 &&
                      reinterpret_cast<uintptr_t>(data) % kPayloadAlignment == 0;
    LogEagerPathOnce(keep, data);
    if (!keep) {
      self->OnFrame(frame, std::string(body), Copy(data, length), absl::OkStatus(), length);
      return UCS_OK;
    }
    transport::UcxWorker* worker = self->worker_.get();
    auto kept = transport::PayloadBuffer::Borrow(
        static_cast<char*>(data), length,
        std::shared_ptr<void>(data, [worker](void* d) { worker->ReleaseData(d); }));
    self->OnFrame(frame, std::string(body), std::move(kept), absl::OkStatus(), length);
    return UCS_INPROGRESS;
  }
  if (length > kMaxPayloadBytes || frame.payload_bytes != length) {
    // Refuse before receiving; the dropped data completes the sender's send.
    self->OnFrame(frame, std::string(body), {},
                  absl::InvalidArgumentError(
                      absl::StrCat("payload length ", length, " disagrees with the frame's ",
                                   frame.payload_bytes, " or exceeds ", kMaxPayloadBytes)),
                  length);
    return UCS_OK;
  }
  auto arrival = std::make_shared<Arrival>();
  arrival->frame = frame;
  arrival->body = std::string(body);
  arrival->data = transport::PayloadBuffer::Allocate(length);
  const RequestKey key{frame.connection_id, frame.request_id};
  if (auto it = self->request_bytes_.find(key); it != self->request_bytes_.end()) {
    ++it->second.receiving;  // the sweep leaves the call alone meanwhile
  }
  self->worker_->ReceiveData(
      data, arrival->data.data(), length, [self, arrival, length, key](ucs_status_t status) {
        if (auto it = self->request_bytes_.find(key);
            it != self->request_bytes_.end() && it->second.receiving > 0) {
          --it->second.receiving;
        }
        if (status != UCS_OK) {
          arrival->data = {};
          self->OnFrame(arrival->frame, std::move(arrival->body), {},
                        absl::UnavailableError(absl::StrCat("receiving the payload failed: ",
                                                            ucs_status_string(status))),
                        length);
          return;
        }
        self->OnFrame(arrival->frame, std::move(arrival->body), std::move(arrival->data),
                      absl::OkStatus(), length);
      });
  return UCS_OK;
}

ucs_status_t UcxListener::OnBodyInData(const Frame& frame, void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  absl::StatusOr<size_t> body_bytes = transport::BodyBytesInData(frame, length);
  if (body_bytes.ok() && frame.payload_bytes > kMaxPayloadBytes) {
    body_bytes = absl::InvalidArgumentError(absl::StrCat(
        "payload of ", frame.payload_bytes, " bytes exceeds ", kMaxPayloadBytes));
  }
  if (!body_bytes.ok()) {
    OnFrame(frame, {}, {}, body_bytes.status(), frame.payload_bytes);
    return UCS_OK;
  }
  // A push's data is counted above with its call. A pull's body is held
  // until it is parsed, and counted against the buffer budget meanwhile.
  const bool pull = frame.op == Op::kPull;
  if (pull) {
    if (peers_.count(frame.connection_id) == 0) return UCS_OK;  // dropped
    if (auto status = service_->buffer_budget().Reserve(BudgetKey(frame.connection_id), length);
        !status.ok()) {
      OnFrame(frame, {}, {}, status, frame.payload_bytes);
      return UCS_OK;
    }
  }
  // Body and payload apart; the payload copied into an aligned buffer of
  // its own (the body's length leaves it at any alignment).
  auto split = [this, frame, body_bytes = *body_bytes, length, pull](const char* bytes) {
    std::string body(bytes, body_bytes);
    transport::PayloadBuffer payload = Copy(bytes + body_bytes, length - body_bytes);
    OnFrame(frame, std::move(body), std::move(payload), absl::OkStatus(), length - body_bytes);
    if (pull) service_->buffer_budget().Release(BudgetKey(frame.connection_id), length);
  };
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    split(static_cast<const char*>(data));
    return UCS_OK;
  }
  auto buffer = std::make_shared<transport::PayloadBuffer>(transport::PayloadBuffer::Allocate(length));
  const RequestKey key{frame.connection_id, frame.request_id};
  if (auto it = request_bytes_.find(key); it != request_bytes_.end()) ++it->second.receiving;
  worker_->ReceiveData(
      data, buffer->data(), length,
      [this, frame, buffer, split, key, length, pull](ucs_status_t status) {
        if (auto it = request_bytes_.find(key);
            it != request_bytes_.end() && it->second.receiving > 0) {
          --it->second.receiving;
        }
        if (status != UCS_OK) {
          OnFrame(frame, {}, {},
                  absl::UnavailableError(absl::StrCat("receiving the request's data failed: ",
                                                      ucs_status_string(status))),
                  frame.payload_bytes);
          if (pull) service_->buffer_budget().Release(BudgetKey(frame.connection_id), length);
          return;
        }
        split(buffer->data());
      });
  return UCS_OK;
}

void UcxListener::OnFrame(const Frame& frame, std::string body, transport::PayloadBuffer data,
                        absl::Status data_status, size_t data_length) {
  if (frame.op == Op::kHello) {
    OnHello(frame, body, std::string(data.view()));
    return;
  }
  if (peers_.count(frame.connection_id) == 0) {
    spdlog::warn("ucx request from unknown connection={} dropped", frame.connection_id);
    return;
  }
  if (frame.op == Op::kCancel) {
    absl::MutexLock lock(&requests_mutex_);
    auto it = requests_.find({frame.connection_id, frame.request_id});
    if (it != requests_.end()) it->second->cancellation.Cancel();
    return;
  }
  if (stopping_) {
    SendStatus(frame.connection_id, frame.request_id, 0,
               absl::UnavailableError("shard is shutting down"));
    return;
  }
  if (data_status.ok() && frame.payload_bytes != data_length) {
    data_status = absl::InvalidArgumentError(
        absl::StrCat("payload length ", data_length, " disagrees with the frame's ",
                     frame.payload_bytes, " bytes"));
  }
  switch (frame.op) {
    case Op::kPush:
    case Op::kPushPull:
      OnChunk(frame, body, std::move(data), data_status);
      return;
    case Op::kPull: {
      proto::PullRequest request;
      if (data_status.ok() && !request.ParseFromString(body)) {
        data_status = absl::InvalidArgumentError("malformed frame: PullRequest does not parse");
      }
      if (!data_status.ok()) {
        SendStatus(frame.connection_id, frame.request_id, 0, data_status);
        return;
      }
      Dispatch(frame, frame.arg, nullptr, &request);
      return;
    }
    default:
      SendStatus(frame.connection_id, frame.request_id, 0,
                 absl::InvalidArgumentError(absl::StrCat(
                     "malformed frame: op ", static_cast<int>(frame.op), " is not a request")));
  }
}

void UcxListener::OnHello(const Frame& frame, const std::string& secret,
                        const std::string& address) {
  if (stopping_) return;
  // Refused without an endpoint back: a client that never fetched the
  // address over the authenticated gRPC channel learns nothing, and the
  // connection's id stays unknown to the shard, so its later frames are
  // dropped as coming from an unknown connection.
  if (hello_secrets_.required() && (secret.empty() || !hello_secrets_.Take(secret))) {
    spdlog::warn("ucx hello refused connection={}: missing, wrong or expired hello secret",
                 frame.connection_id);
    return;
  }
  auto old = peers_.find(frame.connection_id);
  if (old != peers_.end()) {
    worker_->CloseEndpoint(old->second->ep);
    peers_.erase(old);
  }
  auto peer = std::make_unique<Peer>();
  peer->server = this;
  peer->id = frame.connection_id;
  bool detects_failure = false;
  // The client's endpoint mode, which ours must match whatever this
  // shard's environment would choose.
  transport::UcxWorker::ErrorMode mode = transport::UcxWorker::ErrorMode::kChoose;
  switch (static_cast<transport::HelloErrorMode>(frame.count)) {
    case transport::HelloErrorMode::kNone:
      mode = transport::UcxWorker::ErrorMode::kNone;
      break;
    case transport::HelloErrorMode::kPeer:
      mode = transport::UcxWorker::ErrorMode::kPeer;
      break;
    default:
      break;
  }
  auto ep = worker_->Connect(address, &UcxListener::OnPeerError, peer.get(), &detects_failure,
                             mode);
  if (!ep.ok()) {
    spdlog::warn("ucx cannot connect back to connection={}: {}", frame.connection_id,
                 std::string(ep.status().message()));
    return;
  }
  peer->ep = *ep;
  peers_[frame.connection_id] = std::move(peer);
  // Without failure detection (shared memory) a dead client's endpoint
  // stays until shutdown; its blocked pulls end at their deadline and its
  // half-sent pushes at the sweep (SweepIncompleteCalls).
  spdlog::info("ucx connection={} opened detects_failure={}", frame.connection_id,
               detects_failure);
  SendStatus(frame.connection_id, frame.request_id, 0, absl::OkStatus());
}

void UcxListener::OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  UcxListener* self = peer->server;
  const uint64_t id = peer->id;
  spdlog::info("ucx connection={} closed: {}", id, ucs_status_string(status));
  self->worker_->CloseEndpoint(ep);
  self->CancelConnection(id);
  self->pending_.erase(self->pending_.lower_bound({id, 0}),
                       self->pending_.lower_bound({id + 1, 0}));
  self->ForgetRequestBytes(self->request_bytes_.lower_bound({id, 0}),
                           self->request_bytes_.lower_bound({id + 1, 0}));
  auto it = self->peers_.find(id);
  if (it != self->peers_.end() && it->second.get() == peer) self->peers_.erase(it);
}

void UcxListener::ForgetRequestBytes(std::map<RequestKey, RequestBytes>::iterator first,
                                   std::map<RequestKey, RequestBytes>::iterator last) {
  for (auto it = first; it != last; ++it) {
    service_->buffer_budget().Release(BudgetKey(it->first.first), it->second.reserved);
  }
  request_bytes_.erase(first, last);
}

void UcxListener::SweepIncompleteCalls() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<RequestKey> expired;
  for (const auto& [key, bytes] : request_bytes_) {
    if (bytes.receiving > 0) continue;
    auto pending = pending_.find(key);
    const int64_t timeout_ms = pending == pending_.end() ? -1 : pending->second->timeout_ms;
    const auto limit = timeout_ms >= 0 ? std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::milliseconds(timeout_ms) + kSweepGrace)
                                       : std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             kIncompleteCallLimit);
    if (now - bytes.started > limit) expired.push_back(key);
  }
  for (const RequestKey& key : expired) {
    auto pending = pending_.find(key);
    if (pending != pending_.end()) {
      spdlog::warn("ucx connection={} request={}: {} of {} chunks arrived in time; refused",
                   key.first, key.second, pending->second->arrived, pending->second->count);
      SendStatus(key.first, key.second, 0,
                 absl::DeadlineExceededError(absl::StrCat(
                     "only ", pending->second->arrived, " of the call's ", pending->second->count,
                     " chunks arrived before its deadline; nothing was applied")));
      pending_.erase(pending);
    }
    ForgetRequestBytes(key);
  }
}

void UcxListener::ForgetRequestBytes(const RequestKey& key) {
  auto it = request_bytes_.find(key);
  if (it != request_bytes_.end()) ForgetRequestBytes(it, std::next(it));
}

void UcxListener::OnChunk(const Frame& frame, const std::string& body, transport::PayloadBuffer data,
                        absl::Status frame_status) {
  const uint64_t connection = frame.connection_id;
  const uint64_t request = frame.request_id;
  if (auto status = ShardService::CheckChunkCount(frame.count); !status.ok()) {
    ForgetRequestBytes({connection, request});
    SendStatus(connection, request, 0, status);
    return;
  }
  if (frame.count == 0) {  // an empty push: nothing to wait for
    ForgetRequestBytes({connection, request});
    if (!frame_status.ok()) {
      SendStatus(connection, request, 0, frame_status);
      return;
    }
    Dispatch(frame, frame.arg, nullptr, nullptr);
    return;
  }
  auto& slot = pending_[{connection, request}];
  if (!slot) {
    slot = std::make_unique<Pending>();
    slot->op = frame.op;
    slot->count = frame.count;
    slot->timeout_ms = frame.arg;
    slot->chunks.resize(frame.count);
    slot->payloads.resize(frame.count);
    slot->seen.resize(frame.count);
  }
  Pending& pending = *slot;
  // A frame that does not fit the request cannot be counted: answer at
  // once. Any other bad chunk is answered once all frames arrived, so the
  // request leaves no state behind.
  const bool fits = frame.op == pending.op && frame.count == pending.count &&
                    frame.index < pending.count && !pending.seen[frame.index];
  if (!fits) {
    pending.error = absl::InvalidArgumentError(absl::StrCat(
        "malformed frame: chunk ", frame.index, " of ", frame.count, " does not fit the request"));
  } else {
    pending.seen[frame.index] = true;
    ++pending.arrived;
    if (!pending.error.ok()) {
      // Already refused: drop the bytes.
    } else if (!frame_status.ok()) {
      pending.error = frame_status;
    } else if (!pending.chunks[frame.index].ParseFromString(body)) {
      pending.error = absl::InvalidArgumentError("malformed frame: chunk header does not parse");
    } else if (auto limits = CheckChunkLimits("push", pending.chunks[frame.index]);
               !limits.ok()) {
      // Not kept (Clear would keep the strings' memory); the request's
      // later frames are dropped as they come.
      pending.error = limits;
      proto::TensorChunk().Swap(&pending.chunks[frame.index]);
    } else {
      // The payload stays in its receive buffer; the store reads it there.
      pending.payloads[frame.index] = std::move(data);
    }
  }
  if (fits && pending.arrived < pending.count) return;
  std::shared_ptr<Pending> done = std::move(slot);
  pending_.erase({connection, request});
  ForgetRequestBytes({connection, request});
  if (!done->error.ok()) {
    SendStatus(connection, request, 0, done->error);
    return;
  }
  const int64_t timeout_ms = done->timeout_ms;
  Dispatch(frame, timeout_ms, std::move(done), nullptr);
}

void UcxListener::Dispatch(const Frame& frame, int64_t timeout_ms, std::shared_ptr<Pending> pushed,
                         proto::PullRequest* pull) {
  auto request = std::make_shared<Request>();
  request->server = this;
  request->connection = frame.connection_id;
  request->id = frame.request_id;
  request->pushed = std::move(pushed);
  ShardService::Call call;
  if (request->pushed) call.received = request->pushed->received;
  if (timeout_ms >= 0) call.client_deadline = call.received + std::chrono::milliseconds(timeout_ms);
  call.cancellation = &request->cancellation;
  {
    absl::MutexLock lock(&requests_mutex_);
    requests_[{request->connection, request->id}] = request;
  }
  worker_->ExpectReplies(1);  // ends with the request's SendStatus
  auto done = [this, request](const absl::Status& status) { Answer(request, status); };
  if (pull != nullptr) {
    // The service answers inline only what is ready and small.
    call.work_on_caller_thread = true;
    service_->Pull(call, std::move(*pull), request.get(), std::move(done));
    return;
  }
  std::vector<ShardStore::PushChunkView> views;
  uint64_t pushed_bytes = 0;
  if (request->pushed) {
    const Pending& chunks = *request->pushed;
    views.resize(chunks.chunks.size());
    for (size_t i = 0; i < views.size(); ++i) {
      views[i] = {&chunks.chunks[i], chunks.payloads[i].view()};
      pushed_bytes += views[i].payload.size();
    }
  }
  // Replies posted from here are queued and sent in the progress loop's
  // next round (UcxWorker::Post), not from inside this UCP callback.
  call.work_on_caller_thread = pushed_bytes <= kInlineWorkBytes;
  if (frame.op == Op::kPushPull) {
    service_->PushPull(call, std::move(views), request.get(), std::move(done));
  } else {
    service_->Push(call, std::move(views), std::move(done));
  }
}

void UcxListener::Answer(const std::shared_ptr<Request>& request, const absl::Status& status) {
  SendStatus(request->connection, request->id, request->sent, status);
  worker_->ExpectReplies(-1);
  absl::MutexLock lock(&requests_mutex_);
  requests_.erase({request->connection, request->id});
}

void UcxListener::CancelConnection(uint64_t connection) {
  absl::MutexLock lock(&requests_mutex_);
  for (auto it = requests_.lower_bound({connection, 0});
       it != requests_.end() && it->first.first == connection; ++it) {
    it->second->cancellation.Cancel();
  }
}

void UcxListener::SendStatus(uint64_t connection, uint64_t request, uint32_t count,
                           const absl::Status& status) {
  std::string header = transport::EncodeStatus(connection, request, count, status);
  auto send = [this, connection, header = std::move(header)]() mutable {
    auto it = peers_.find(connection);
    if (it == peers_.end()) return;  // the peer went away: nobody to tell
    worker_->SendAm(it->second->ep, transport::kReplyAmId, std::move(header), nullptr, 0,
                    [](ucs_status_t) {});
  };
  worker_->Post(std::move(send));
}

void UcxListener::SendChunk(uint64_t connection, uint64_t request, uint32_t index,
                          const proto::TensorChunk& chunk, const char* data, size_t bytes,
                          std::shared_ptr<const void> keep) {
  Frame frame;
  frame.op = Op::kReplyChunk;
  frame.connection_id = connection;
  frame.request_id = request;
  frame.index = index;
  frame.payload_bytes = bytes;
  std::string header = transport::EncodeHeader(frame, transport::EncodeChunkHeader(chunk));
  worker_->Post([this, connection, header = std::move(header), data, bytes, keep]() mutable {
    auto it = peers_.find(connection);
    if (it == peers_.end()) return;
    // `keep` rides in the completion so the bytes outlive the send.
    worker_->SendAm(it->second->ep, transport::kReplyAmId, std::move(header), data, bytes,
                    [keep](ucs_status_t) {});
  });
}

}  // namespace harrier
