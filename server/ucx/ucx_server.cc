#include "server/ucx/ucx_server.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace harrier {

using transport::Frame;
using transport::Op;

namespace {

// Largest AM data accepted: a chunk is at most 32 MiB (ClientOptions'
// upper bound), so anything bigger is refused before it is received.
constexpr size_t kMaxPayloadBytes = 64u << 20;

// As the gRPC service: give up a little before the client does, so the
// client receives the shard's DEADLINE_EXCEEDED (naming the slowest worker);
// no deadline means at most an hour.
ShardStore::Clock::time_point DeadlineOf(int64_t timeout_ms) {
  using std::chrono::milliseconds;
  milliseconds remaining = timeout_ms < 0 ? milliseconds(std::chrono::hours(1))
                                          : milliseconds(timeout_ms);
  remaining -= std::min<milliseconds>(milliseconds(200), remaining / 5);
  remaining = std::min<milliseconds>(remaining, std::chrono::hours(1));
  return ShardStore::Clock::now() + remaining;
}

// Bytes of an eager message's data, or of a rendezvous one once received.
struct Arrival {
  Frame frame;
  std::string body;
  transport::PayloadBuffer data;
};

transport::PayloadBuffer Copy(const void* data, size_t length) {
  auto buffer = transport::PayloadBuffer::Allocate(length);
  if (length > 0) std::memcpy(buffer.data(), data, length);
  return buffer;
}

}  // namespace

struct UcxServer::Peer {
  UcxServer* server = nullptr;
  uint64_t id = 0;
  ucp_ep_h ep = nullptr;
};

// The chunk frames of one push / push-pull received so far.
struct UcxServer::Pending {
  Op op = Op::kPush;
  uint32_t count = 0;
  uint32_t arrived = 0;
  int64_t timeout_ms = -1;
  std::vector<proto::TensorChunk> chunks;  // headers (payload field unused)
  std::vector<transport::PayloadBuffer> payloads;
  std::vector<bool> seen;
  absl::Status error;  // the first bad frame's; replied once all arrived
};

absl::StatusOr<std::unique_ptr<UcxServer>> UcxServer::Start(ShardStore* store,
                                                            const UcxServerOptions& options) {
  std::unique_ptr<UcxServer> server(new UcxServer());
  server->store_ = store;
  server->options_ = options;
  server->push_pool_ = std::make_unique<ThreadPool>(std::max(1, options.push_threads));
  server->pull_pool_ = std::make_unique<ThreadPool>(std::max(1, options.pull_threads));
  auto worker = transport::UcxWorker::Start(
      absl::StrCat("harrier-shard-", store->options().shard),
      {{transport::kRequestAmId, &UcxServer::OnRequest, server.get()}});
  if (!worker.ok()) return worker.status();
  server->worker_ = std::move(*worker);
  server->address_ = server->worker_->address();
  return server;
}

UcxServer::~UcxServer() { Shutdown(); }

void UcxServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    for (auto& entry : cancels_) entry.second->Cancel();
  }
  push_pool_.reset();
  pull_pool_.reset();
  if (!worker_) return;  // Start() failed
  worker_->Post([this] {
    for (auto& entry : peers_) worker_->CloseEndpoint(entry.second->ep);
    peers_.clear();
    pending_.clear();
  });
  // Not reset: callbacks still running on the progress thread use worker_.
  worker_->Stop();
}

ucs_status_t UcxServer::OnRequest(void* arg, const void* header, size_t header_length,
                                  void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxServer*>(arg);
  Frame frame;
  absl::string_view body;
  if (auto status = transport::DecodeHeader(header, header_length, &frame, &body); !status.ok()) {
    // Without a frame there is no connection to answer on: drop it (a
    // rendezvous message is dropped by returning UCS_OK).
    spdlog::warn("ucx dropped a request: {}", std::string(status.message()));
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    self->OnFrame(frame, std::string(body), Copy(data, length), absl::OkStatus(), length);
    return UCS_OK;
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
  self->worker_->ReceiveData(
      data, arrival->data.data(), length, [self, arrival, length](ucs_status_t status) {
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

void UcxServer::OnFrame(const Frame& frame, std::string body, transport::PayloadBuffer data,
                        absl::Status data_status, size_t data_length) {
  if (frame.op == Op::kHello) {
    OnHello(frame, std::string(data.view()));
    return;
  }
  if (peers_.count(frame.connection_id) == 0) {
    spdlog::warn("ucx request from unknown connection={} dropped", frame.connection_id);
    return;
  }
  if (frame.op == Op::kCancel) {
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    auto it = cancels_.find({frame.connection_id, frame.request_id});
    if (it != cancels_.end()) it->second->Cancel();
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
      std::vector<PullItem> items;
      for (const proto::ChunkRef& ref : request.chunks()) {
        items.push_back({request.rank(), request.clock(), ref, request.job()});
      }
      const auto deadline = DeadlineOf(frame.arg);
      worker_->ExpectReplies(1);  // ends with the request's SendStatus
      pull_pool_->Submit([this, frame, deadline, items = std::move(items)]() mutable {
        RunPull(frame.connection_id, frame.request_id, deadline, std::move(items));
      });
      return;
    }
    default:
      SendStatus(frame.connection_id, frame.request_id, 0,
                 absl::InvalidArgumentError(absl::StrCat(
                     "malformed frame: op ", static_cast<int>(frame.op), " is not a request")));
  }
}

void UcxServer::OnHello(const Frame& frame, const std::string& address) {
  if (stopping_) return;
  auto old = peers_.find(frame.connection_id);
  if (old != peers_.end()) {
    worker_->CloseEndpoint(old->second->ep);
    peers_.erase(old);
  }
  auto peer = std::make_unique<Peer>();
  peer->server = this;
  peer->id = frame.connection_id;
  bool detects_failure = false;
  auto ep = worker_->Connect(address, &UcxServer::OnPeerError, peer.get(), &detects_failure);
  if (!ep.ok()) {
    spdlog::warn("ucx cannot connect back to connection={}: {}", frame.connection_id,
                 std::string(ep.status().message()));
    return;
  }
  peer->ep = *ep;
  peers_[frame.connection_id] = std::move(peer);
  // Without failure detection (shared memory) a dead client's endpoint
  // stays until shutdown; its blocked pulls end at their deadline.
  spdlog::info("ucx connection={} opened detects_failure={}", frame.connection_id,
               detects_failure);
  SendStatus(frame.connection_id, frame.request_id, 0, absl::OkStatus());
}

void UcxServer::OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  UcxServer* self = peer->server;
  const uint64_t id = peer->id;
  spdlog::info("ucx connection={} closed: {}", id, ucs_status_string(status));
  self->worker_->CloseEndpoint(ep);
  {
    std::lock_guard<std::mutex> lock(self->cancel_mutex_);
    for (auto it = self->cancels_.lower_bound({id, 0});
         it != self->cancels_.end() && it->first.first == id; ++it) {
      it->second->Cancel();
    }
  }
  self->pending_.erase(self->pending_.lower_bound({id, 0}),
                       self->pending_.lower_bound({id + 1, 0}));
  auto it = self->peers_.find(id);
  if (it != self->peers_.end() && it->second.get() == peer) self->peers_.erase(it);
}

void UcxServer::OnChunk(const Frame& frame, const std::string& body, transport::PayloadBuffer data,
                        absl::Status frame_status) {
  const uint64_t connection = frame.connection_id;
  const uint64_t request = frame.request_id;
  if (frame.count > transport::kMaxChunksPerCall) {
    SendStatus(connection, request, 0,
               absl::ResourceExhaustedError(absl::StrCat(
                   "more than ", transport::kMaxChunksPerCall, " chunks in one call")));
    return;
  }
  if (frame.count == 0) {  // an empty push: nothing to wait for
    if (!frame_status.ok()) {
      SendStatus(connection, request, 0, frame_status);
      return;
    }
    const bool then_pull = frame.op == Op::kPushPull;
    const auto deadline = DeadlineOf(frame.arg);
    worker_->ExpectReplies(1);
    push_pool_->Submit([this, connection, request, then_pull, deadline] {
      RunPush(connection, request, then_pull, deadline, nullptr);
    });
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
    } else {
      // The payload stays in its receive buffer; the store reads it there.
      pending.payloads[frame.index] = std::move(data);
    }
  }
  if (fits && pending.arrived < pending.count) return;
  std::shared_ptr<Pending> done = std::move(slot);
  pending_.erase({connection, request});
  if (!done->error.ok()) {
    SendStatus(connection, request, 0, done->error);
    return;
  }
  const bool then_pull = done->op == Op::kPushPull;
  const auto deadline = DeadlineOf(done->timeout_ms);
  worker_->ExpectReplies(1);
  push_pool_->Submit([this, connection, request, then_pull, deadline, done] {
    RunPush(connection, request, then_pull, deadline, done);
  });
}

void UcxServer::RunPush(uint64_t connection, uint64_t request, bool then_pull,
                        ShardStore::Clock::time_point deadline, std::shared_ptr<Pending> pushed) {
  static const std::vector<proto::TensorChunk> kNone;
  const std::vector<proto::TensorChunk>& chunks = pushed ? pushed->chunks : kNone;
  absl::Status status;
  if (stopping_) {
    status = absl::UnavailableError("shard is shutting down");
  } else {
    std::vector<ShardStore::PushChunkView> views(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      views[i] = {&chunks[i], pushed->payloads[i].view()};
    }
    status = store_->Push(views);
  }
  if (!status.ok() || !then_pull) {
    SendStatus(connection, request, 0, status);
    worker_->ExpectReplies(-1);
    return;
  }
  std::vector<PullItem> items;
  items.reserve(chunks.size());
  for (const proto::TensorChunk& pushed : chunks) {
    PullItem item;
    item.rank = pushed.rank();
    item.ref = ShardStore::PushPullRef(pushed, &item.clock);
    item.job = pushed.job();
    items.push_back(std::move(item));
  }
  // The pull half may block: it goes to the pull pool so this pool keeps
  // applying other workers' pushes (which are what unblock it).
  pull_pool_->Submit([this, connection, request, deadline, items = std::move(items)]() mutable {
    RunPull(connection, request, deadline, std::move(items));
  });
}

void UcxServer::RunPull(uint64_t connection, uint64_t request,
                        ShardStore::Clock::time_point deadline, std::vector<PullItem> items) {
  auto cancel = TrackCancel(connection, request);
  absl::Status status;
  uint32_t sent = 0;
  for (const PullItem& item : items) {
    if (cancel->cancelled()) {
      status = absl::CancelledError("client went away");
      break;
    }
    proto::TensorChunk out;
    transport::PayloadBuffer payload;
    // The store writes the parameters straight into the buffer UCX sends.
    status = store_->Pull(item.rank, item.clock, item.ref, deadline, cancel.get(), &out,
                          [&payload](size_t bytes) {
                            payload = transport::PayloadBuffer::Allocate(bytes);
                            return payload.data();
                          });
    if (!status.ok()) break;
    out.set_job(item.job);
    SendChunk(connection, request, sent++, out, std::make_shared<transport::PayloadBuffer>(
                                                    std::move(payload)));
  }
  Untrack(connection, request);
  SendStatus(connection, request, sent, status);
  worker_->ExpectReplies(-1);
}

std::shared_ptr<Cancellation> UcxServer::TrackCancel(uint64_t connection, uint64_t request) {
  auto flag = std::make_shared<Cancellation>();
  if (stopping_) flag->Cancel();
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  cancels_[{connection, request}] = flag;
  return flag;
}

void UcxServer::Untrack(uint64_t connection, uint64_t request) {
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  cancels_.erase({connection, request});
}

void UcxServer::SendStatus(uint64_t connection, uint64_t request, uint32_t count,
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

void UcxServer::SendChunk(uint64_t connection, uint64_t request, uint32_t index,
                          const proto::TensorChunk& chunk,
                          std::shared_ptr<transport::PayloadBuffer> payload) {
  Frame frame;
  frame.op = Op::kReplyChunk;
  frame.connection_id = connection;
  frame.request_id = request;
  frame.index = index;
  frame.payload_bytes = payload->size;
  std::string header = transport::EncodeHeader(frame, transport::EncodeChunkHeader(chunk));
  worker_->Post([this, connection, header = std::move(header), payload]() mutable {
    auto it = peers_.find(connection);
    if (it == peers_.end()) return;
    // `payload` rides in the completion so it outlives the send.
    worker_->SendAm(it->second->ep, transport::kReplyAmId, std::move(header), payload->data(),
                    payload->size, [payload](ucs_status_t) {});
  });
}

}  // namespace harrier
