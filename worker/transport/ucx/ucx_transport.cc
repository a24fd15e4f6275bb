#include "worker/transport/ucx/ucx_transport.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/transport/framing.h"
#include "spdlog/spdlog.h"

namespace harrier {

using transport::Frame;
using transport::Op;

// One shard connection. `ep` is touched on the progress thread only.
struct UcxPeer {
  UcxClientContext* context = nullptr;
  uint64_t id = 0;
  std::string name;
  ucp_ep_h ep = nullptr;
  std::atomic<bool> detects_failure{true};  // false: poll peer_alive instead
  std::function<bool()> peer_alive;
  std::atomic<bool> failed{false};
  absl::Mutex mutex;
  absl::Status failure ABSL_GUARDED_BY(mutex);
};

// One request in flight: the progress thread fills it in; whichever thread
// sees it end (the progress thread, or the timer thread at its deadline or
// cancel) ends and completes it (UcxClientContext::Check).
struct UcxCall {
  std::shared_ptr<UcxPeer> peer;
  uint64_t request_id = 0;
  const LandedChunkSink* sink = nullptr;  // null: nothing to read (a push, a hello)
  CallCanceller* canceller = nullptr;
  bool registered = false;  // with the canceller
  CallDone done;

  absl::Mutex mutex;
  bool have_status ABSL_GUARDED_BY(mutex) = false;
  absl::Status status ABSL_GUARDED_BY(mutex);    // the shard's
  uint32_t expected ABSL_GUARDED_BY(mutex) = 0;  // reply chunks the status announced
  uint32_t received ABSL_GUARDED_BY(mutex) = 0;
  struct Reply {
    proto::TensorChunk header;
    transport::PayloadBuffer payload;
    // Landed: the payload is at `landed` instead (in `landed_memory`).
    const char* landed = nullptr;
    size_t landed_bytes = 0;
    MemoryKind landed_memory = MemoryKind::kHost;
  };
  std::vector<Reply> replies ABSL_GUARDED_BY(mutex);  // by index
  // Picks each reply's landing; cleared when the call ends, so a reply that
  // comes later never touches the caller's buffers (or chooser).
  const ReplyLandingChooser* choose ABSL_GUARDED_BY(mutex) = nullptr;
  // Rendezvous receives into landing buffers not yet complete: the call
  // does not complete while UCX may still write into them.
  int landings_in_flight ABSL_GUARDED_BY(mutex) = 0;
  // Transport-level: peer lost, send failed.
  absl::Status failure ABSL_GUARDED_BY(mutex);
  bool cancelled ABSL_GUARDED_BY(mutex) = false;
  bool expired ABSL_GUARDED_BY(mutex) = false;  // its deadline passed
  int sends_in_flight ABSL_GUARDED_BY(mutex) = 0;

  // kRunning -> kDraining (ended: its result is decided; UCX may still
  // read its payloads) -> kDone (completed, or about to be).
  enum class Stage { kRunning, kDraining, kDone };
  Stage stage ABSL_GUARDED_BY(mutex) = Stage::kRunning;
  absl::Status result ABSL_GUARDED_BY(mutex);
  bool answered ABSL_GUARDED_BY(mutex) = false;

  bool Complete() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    return have_status && received >= expected;
  }
  bool Ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    return Complete() || cancelled || expired || !failure.ok();
  }
  // UCX no longer reads the payloads nor writes into the landing buffers.
  bool SendsDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    return sends_in_flight == 0 && landings_in_flight == 0;
  }
};

namespace {

// How long a call that ended (answered, cancelled, expired or failed) waits
// (on the timer, no thread held) for UCX to finish reading its payloads
// before it force-closes the peer's endpoint, which completes the outstanding sends with an error. Sends to a
// live shard end in milliseconds; this bounds the wait on one that stopped
// reading (killed, stuck) without ever completing while UCX reads the
// caller's bytes.
constexpr absl::Duration kSendDrainGrace = absl::Seconds(2);

uint64_t RandomConnectionId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device() ^ (++counter << 48);
}

int64_t TimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
}

void Fail(UcxCall& call, const absl::Status& status) {
  absl::MutexLock lock(&call.mutex);
  if (call.failure.ok()) call.failure = status;
}

void Deliver(UcxCall& call, uint32_t index, proto::TensorChunk header,
             transport::PayloadBuffer payload) {
  absl::MutexLock lock(&call.mutex);
  if (index >= call.replies.size()) call.replies.resize(index + 1);
  call.replies[index] = {std::move(header), std::move(payload)};
  ++call.received;
}

void DeliverLandedLocked(UcxCall& call, uint32_t index, proto::TensorChunk header,
                         const ReplyLanding& landing, size_t bytes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(call.mutex) {
  if (index >= call.replies.size()) call.replies.resize(index + 1);
  UcxCall::Reply& reply = call.replies[index];
  reply.header = std::move(header);
  reply.landed = static_cast<const char*>(landing.data);
  reply.landed_bytes = bytes;
  reply.landed_memory = landing.memory;
  ++call.received;
}

}  // namespace

absl::StatusOr<UcxDeviceMemory> ParseUcxDeviceMemory(absl::string_view value) {
  if (value.empty() || value == "auto") return UcxDeviceMemory::kAuto;
  if (value == "off") return UcxDeviceMemory::kOff;
  if (value == "on") return UcxDeviceMemory::kOn;
  return absl::InvalidArgumentError(absl::StrCat(
      kUcxDeviceMemoryEnv, "='", value, "' is not one of auto, off, on"));
}

absl::StatusOr<std::shared_ptr<UcxClientContext>> UcxClientContext::Create(
    const std::string& name) {
  const char* value = std::getenv(kUcxDeviceMemoryEnv);
  auto mode = ParseUcxDeviceMemory(value == nullptr ? "" : value);
  if (!mode.ok()) return mode.status();
  return Create(name, *mode);
}

absl::StatusOr<std::shared_ptr<UcxClientContext>> UcxClientContext::Create(
    const std::string& name, UcxDeviceMemory device_memory) {
  std::shared_ptr<UcxClientContext> context(new UcxClientContext());
  auto worker = transport::UcxWorker::Start(
      name, {{transport::kReplyAmId, &UcxClientContext::OnReply, context.get(),
              /*persistent_data=*/true}});
  if (!worker.ok()) return worker.status();
  context->worker_ = std::move(*worker);
  const bool cuda = context->worker_->SupportsMemoryType(UCS_MEMORY_TYPE_CUDA);
  if (device_memory == UcxDeviceMemory::kOn && !cuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        kUcxDeviceMemoryEnv, "=on, but this UCX cannot send from CUDA memory (ucx_info -d lists "
        "no cuda_copy/cuda_ipc; UCX must be built with CUDA)"));
  }
  context->sends_from_device_memory_ = cuda && device_memory != UcxDeviceMemory::kOff;
  context->timer_ = std::make_unique<TimerThread>("ucx-calls");
  if (cuda && device_memory == UcxDeviceMemory::kOff) {
    spdlog::info("ucx: {}=off, device memory is staged through the host", kUcxDeviceMemoryEnv);
  }
  return context;
}

UcxClientContext::~UcxClientContext() {
  // First: the calls' timers (all ended by now) must not outlive the worker.
  timer_.reset();
  if (!worker_) return;
  worker_->Post([this] {
    absl::MutexLock lock(&mutex_);
    for (auto& peer : peers_) {
      if (peer->ep != nullptr) worker_->CloseEndpoint(peer->ep);
      peer->ep = nullptr;
    }
  });
  worker_->Stop();
}

absl::StatusOr<std::unique_ptr<UcxShardTransport>> UcxClientContext::Connect(
    std::shared_ptr<UcxClientContext> context, const std::string& peer_name,
    const transport::PeerAddress& address, absl::Time deadline, std::function<bool()> peer_alive,
    UcxAddressProvider address_provider) {
  auto peer = context->ConnectPeer(peer_name, address, deadline, peer_alive);
  if (!peer.ok()) return peer.status();
  return std::make_unique<UcxShardTransport>(std::move(context), std::move(*peer), peer_name,
                                             std::move(peer_alive), std::move(address_provider));
}

absl::StatusOr<std::shared_ptr<UcxPeer>> UcxClientContext::ConnectPeer(
    const std::string& peer_name, const transport::PeerAddress& peer_address, absl::Time deadline,
    std::function<bool()> peer_alive) {
  const std::string& address = peer_address.address;
  auto peer = std::make_shared<UcxPeer>();
  peer->peer_alive = std::move(peer_alive);
  peer->context = this;
  peer->id = RandomConnectionId();
  peer->name = peer_name;
  {
    absl::MutexLock lock(&mutex_);
    peers_.push_back(peer);  // kept until the context ends: the error handler's arg
  }
  // The endpoint first: the hello says which error mode it got, so the
  // shard's endpoint back matches it (UCX refuses a pair that differs,
  // e.g. a worker with UCX_TLS=tcp and a shard that picked shared memory).
  auto opened = std::make_shared<absl::Notification>();
  worker_->Post([this, peer, address, opened] {
    bool detects_failure = false;
    auto ep = worker_->Connect(address, &UcxClientContext::OnPeerError, peer.get(),
                               &detects_failure);
    if (ep.ok()) {
      peer->ep = *ep;
      peer->detects_failure = detects_failure;
    } else {
      absl::MutexLock lock(&peer->mutex);
      peer->failure = absl::UnavailableError(
          absl::StrCat("cannot open a UCX endpoint: ", ep.status().message()));
      peer->failed = true;
    }
    opened->Notify();
  });
  if (!opened->WaitForNotificationWithDeadline(deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("UCX connect to ", peer_name, ": the endpoint was not opened in time"));
  }
  // Hello: our worker address, so the shard can open an endpoint back.
  Frame frame;
  frame.op = Op::kHello;
  frame.connection_id = peer->id;
  frame.count = static_cast<uint32_t>(peer->detects_failure ? transport::HelloErrorMode::kPeer
                                                            : transport::HelloErrorMode::kNone);
  frame.request_id = NextRequestId();
  frame.payload_bytes = worker_->address().size();
  frame.arg = TimeoutMs(deadline);
  std::vector<Message> messages;
  // The secret rides in the hello's body, so the frame format is unchanged
  // and a shard that asks for none ignores it.
  messages.push_back({transport::EncodeHeader(frame, peer_address.hello_secret),
                      worker_->address().data(),
                      worker_->address().size()});
  CallCanceller canceller;
  absl::Status status = RunBlocking(
      [&](CallDone done) {
        Execute(peer, frame.request_id, std::move(messages), nullptr, nullptr, deadline,
                canceller, std::move(done));
      },
      deadline);
  if (!status.ok()) {
    status = absl::Status(status.code(),
                          absl::StrCat("UCX connect to ", peer_name, ": ", status.message()));
    // Close the endpoint we opened (if any): nobody will use this peer.
    UcxPeer* raw_peer = peer.get();
    worker_->Post([this, raw_peer, status] { FailPeer(raw_peer, status); });
    return status;
  }
  return peer;
}

std::shared_ptr<UcxCall> UcxClientContext::FindCall(uint64_t request_id) {
  absl::MutexLock lock(&mutex_);
  auto it = calls_.find(request_id);
  return it == calls_.end() ? nullptr : it->second;
}

void UcxClientContext::Execute(const std::shared_ptr<UcxPeer>& peer, uint64_t request_id,
                               std::vector<Message> messages, const ReplyLandingChooser* choose,
                               const LandedChunkSink* sink, absl::Time deadline,
                               CallCanceller& canceller, CallDone done) {
  if (peer->failed) {
    absl::Status failure;
    {
      absl::MutexLock lock(&peer->mutex);
      failure = peer->failure;
    }
    return done(failure);
  }
  auto call = std::make_shared<UcxCall>();
  call->peer = peer;
  call->request_id = request_id;
  call->sink = sink;
  call->canceller = &canceller;
  call->done = std::move(done);
  {
    absl::MutexLock lock(&call->mutex);
    call->sends_in_flight = static_cast<int>(messages.size());
    call->choose = choose;
  }
  const std::weak_ptr<UcxCall> weak = call;
  // In the table first: a cancel that comes at once ends a call Check can
  // find there (and stop expecting its reply).
  {
    absl::MutexLock lock(&mutex_);
    calls_[request_id] = call;
  }
  worker_->ExpectReplies(1);
  // Under the canceller's lock: the call ends on the timer thread.
  call->registered = true;
  if (!canceller.Register(call.get(), [this, weak] {
    timer_->At(absl::InfinitePast(), [this, weak] {
      auto call = weak.lock();
      if (call == nullptr) return;
      {
        absl::MutexLock lock(&call->mutex);
        call->cancelled = true;
      }
      Check(call);
    });
  })) {
    call->registered = false;
    {
      absl::MutexLock lock(&mutex_);
      calls_.erase(request_id);
    }
    worker_->ExpectReplies(-1);
    return call->done(absl::CancelledError("operation cancelled"));
  }
  if (deadline != absl::InfiniteFuture()) {
    timer_->At(deadline, [this, weak] {
      auto call = weak.lock();
      if (call == nullptr) return;
      {
        absl::MutexLock lock(&call->mutex);
        call->expired = true;
      }
      Check(call);
    });
  }
  // UCX cannot tell us when a shared-memory peer dies: ask its probe.
  if (!peer->detects_failure && peer->peer_alive) WatchPeer(weak);
  worker_->Post([this, call, peer, messages = std::move(messages)]() mutable {
    for (Message& message : messages) {
      if (peer->ep == nullptr) {  // failed meanwhile: these sends never start
        {
          absl::MutexLock lock(&call->mutex);
          --call->sends_in_flight;
          if (call->failure.ok()) {
            absl::MutexLock peer_lock(&peer->mutex);
            call->failure = peer->failure.ok()
                                ? absl::UnavailableError("UCX endpoint not connected")
                                : peer->failure;
          }
        }
        Check(call);
        continue;
      }
      worker_->SendAm(
          peer->ep, transport::kRequestAmId, std::move(message.header), message.data,
          message.bytes,
          [this, call](ucs_status_t status) {
            {
              absl::MutexLock lock(&call->mutex);
              --call->sends_in_flight;
              if (status != UCS_OK && call->failure.ok()) {
                call->failure = absl::UnavailableError(
                    absl::StrCat("UCX send failed: ", ucs_status_string(status)));
              }
            }
            CheckLater(call);
          },
          message.data_memory, std::move(message.data_prefix));
    }
  });
}

void UcxClientContext::WatchPeer(const std::weak_ptr<UcxCall>& weak) {
  timer_->After(absl::Milliseconds(500), [this, weak] {
    auto call = weak.lock();
    if (call == nullptr) return;
    {
      absl::MutexLock lock(&call->mutex);
      if (call->stage != UcxCall::Stage::kRunning) return;
    }
    if (call->peer->peer_alive()) return WatchPeer(weak);
    const absl::Status failure = absl::UnavailableError(
        "shard unreachable (its gRPC channel failed; shared-memory UCX cannot detect a "
        "dead peer itself)");
    UcxPeer* raw_peer = call->peer.get();
    worker_->Post([this, raw_peer, failure] { FailPeer(raw_peer, failure); });
  });
}

void UcxClientContext::Check(const std::shared_ptr<UcxCall>& call) {
  bool send_cancel = false;
  bool ended_now = false;
  {
    absl::MutexLock lock(&call->mutex);
    switch (call->stage) {
      case UcxCall::Stage::kDone:
        return;
      case UcxCall::Stage::kDraining:
        if (!call->SendsDone()) return;
        call->stage = UcxCall::Stage::kDone;
        break;
      case UcxCall::Stage::kRunning: {
        if (!call->Ended()) return;
        call->stage = UcxCall::Stage::kDraining;
        ended_now = true;
        call->choose = nullptr;  // from now on replies land nowhere
        call->answered = call->Complete();
        if (call->answered) {
          call->result = call->status;
        } else if (!call->failure.ok()) {
          call->result = call->failure;
        } else if (call->cancelled) {
          call->result = absl::CancelledError("operation cancelled");
        } else {
          call->result = absl::DeadlineExceededError("no UCX reply before the deadline");
        }
        send_cancel = !call->answered && (absl::IsCancelled(call->result) ||
                                          absl::IsDeadlineExceeded(call->result));
        break;
      }
    }
  }
  if (call->registered) {
    // Ended: no reply is handled any more, nor counted as expected.
    bool erased = false;
    {
      absl::MutexLock lock(&mutex_);
      auto it = calls_.find(call->request_id);
      if (it != calls_.end() && it->second == call) {
        calls_.erase(it);
        erased = true;
      }
    }
    if (erased) worker_->ExpectReplies(-1);
  }
  if (send_cancel) {
    // Best effort: let the shard stop waiting for us.
    Frame frame;
    frame.op = Op::kCancel;
    frame.connection_id = call->peer->id;
    frame.request_id = call->request_id;
    std::shared_ptr<UcxPeer> peer = call->peer;
    worker_->Post([this, peer, header = transport::EncodeHeader(frame, {})]() mutable {
      if (peer->ep == nullptr) return;
      worker_->SendAm(peer->ep, transport::kRequestAmId, std::move(header), nullptr, 0,
                      [](ucs_status_t) {});
    });
  }
  {
    absl::MutexLock lock(&call->mutex);
    if (call->stage == UcxCall::Stage::kDraining) {
      if (!call->SendsDone()) {
        // The payloads belong to the caller: wait (on the timer) until UCX
        // is done reading them; each send that completes checks again.
        if (ended_now) {
          std::weak_ptr<UcxCall> weak = call;
          timer_->After(kSendDrainGrace, [this, weak] {
            if (auto overdue = weak.lock()) DrainOverdue(overdue, false);
          });
        }
        return;
      }
      call->stage = UcxCall::Stage::kDone;
    }
  }
  Complete(call);
}

void UcxClientContext::CheckLater(const std::shared_ptr<UcxCall>& call) {
  worker_->Post([this, call] { Check(call); });
}

void UcxClientContext::DrainOverdue(const std::shared_ptr<UcxCall>& call, bool second) {
  const std::string& peer_name = call->peer->name;
  {
    absl::MutexLock lock(&call->mutex);
    if (call->stage != UcxCall::Stage::kDraining) return;
    if (second) {
      call->stage = UcxCall::Stage::kDone;
      call->result = absl::InternalError(absl::StrCat(
          "UCX still reads ", call->sends_in_flight, " payloads of a call to ", peer_name,
          " after closing its endpoint; the caller's buffers may still be read"));
    } else {
      // The shard stopped reading. Closing the endpoint completes the sends
      // with an error; later calls reconnect (see UcxShardTransport).
      call->result = absl::UnavailableError(
          absl::StrCat("UCX sends to ", peer_name, " did not complete within ",
                       absl::FormatDuration(kSendDrainGrace), "; endpoint closed"));
      call->answered = false;
    }
  }
  if (second) return Complete(call);
  spdlog::warn("ucx peer={} closed: sends stalled", peer_name);
  const absl::Status failure = absl::UnavailableError(
      absl::StrCat("UCX sends to ", peer_name, " did not complete within ",
                   absl::FormatDuration(kSendDrainGrace), "; endpoint closed"));
  UcxPeer* raw_peer = call->peer.get();
  worker_->Post([this, raw_peer, failure] { FailPeer(raw_peer, failure); });
  std::weak_ptr<UcxCall> weak = call;
  timer_->After(kSendDrainGrace, [this, weak] {
    if (auto overdue = weak.lock()) DrainOverdue(overdue, true);
  });
}

void UcxClientContext::Complete(const std::shared_ptr<UcxCall>& call) {
  if (call->registered) call->canceller->Unregister(call.get());
  absl::Status result;
  std::vector<UcxCall::Reply> replies;
  {
    absl::MutexLock lock(&call->mutex);
    result = call->result;
    if (call->answered && result.ok()) replies = std::move(call->replies);
  }
  if (result.ok() && call->sink != nullptr) {
    for (const UcxCall::Reply& reply : replies) {
      const bool landed = reply.landed != nullptr;
      const PayloadView view(landed ? absl::string_view(reply.landed, reply.landed_bytes)
                                    : reply.payload.view());
      result = (*call->sink)(reply.header, view, landed ? reply.landed_memory : MemoryKind::kHost);
      if (!result.ok()) break;
    }
  }
  replies.clear();  // UCX's receive buffers go back before the caller hears
  CallDone done = std::move(call->done);
  done(std::move(result));
}

ucs_status_t UcxClientContext::OnReply(void* arg, const void* header, size_t header_length,
                                       void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxClientContext*>(arg);
  Frame frame;
  absl::string_view body;
  if (auto status = transport::DecodeHeader(header, header_length, &frame, &body); !status.ok()) {
    spdlog::warn("ucx dropped a reply: {}", std::string(status.message()));
    return UCS_OK;
  }
  auto call = self->FindCall(frame.request_id);
  if (call == nullptr) return UCS_OK;  // abandoned (deadline, cancel): dropped
  if (frame.op == Op::kStatus) {
    {
      absl::MutexLock lock(&call->mutex);
      call->have_status = true;
      call->status = transport::DecodeStatus(frame, body);
      call->expected = frame.count;
    }
    self->CheckLater(call);
    return UCS_OK;
  }
  proto::TensorChunk chunk;
  if (frame.op != Op::kReplyChunk || frame.index >= transport::kMaxChunksPerCall ||
      frame.payload_bytes != length || !chunk.ParseFromArray(body.data(), body.size())) {
    Fail(*call, absl::InternalError("malformed UCX reply"));
    self->CheckLater(call);
    return UCS_OK;
  }
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ReplyLanding landing;
  bool receive_into_landing = false;
  bool landed = false;
  {
    // A landing: put the payload where the caller chose, if it fits and
    // this UCX can write that memory (device: rendezvous only, no copy
    // here). Decided under the call's lock, so the call cannot end (and its
    // buffers go away) meanwhile: an eager copy happens under it, and a
    // rendezvous receive is counted before the lock is released.
    absl::MutexLock lock(&call->mutex);
    if (call->choose != nullptr) landing = (*call->choose)(chunk, length);
    const bool fits = landing.data != nullptr && landing.capacity >= length;
    const bool device = landing.memory == MemoryKind::kDevice;
    if (fits && !device && !rendezvous) {
      if (length > 0) std::memcpy(landing.data, data, length);
      DeliverLandedLocked(*call, frame.index, std::move(chunk), landing, length);
      landed = true;
    } else if (fits && rendezvous && (!device || self->sends_from_device_memory_)) {
      ++call->landings_in_flight;
      receive_into_landing = true;
    }
  }
  if (landed) {
    self->CheckLater(call);
    return UCS_OK;
  }
  if (receive_into_landing) {
    // Not under the lock: the completion may run inside ReceiveData.
    const uint32_t index = frame.index;
    auto header = std::make_shared<proto::TensorChunk>(std::move(chunk));
    self->worker_->ReceiveData(
        data, landing.data, length,
        [self, call, header, landing, length, index](ucs_status_t status) {
          {
            absl::MutexLock lock(&call->mutex);
            --call->landings_in_flight;
            if (status != UCS_OK) {
              if (call->failure.ok()) {
                call->failure = absl::UnavailableError(
                    absl::StrCat("UCX receive failed: ", ucs_status_string(status)));
              }
            } else {
              DeliverLandedLocked(*call, index, std::move(*header), landing, length);
            }
          }
          self->CheckLater(call);
        },
        landing.memory == MemoryKind::kDevice ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST);
    return UCS_OK;
  }
  if (!rendezvous) {
    // Kept in UCX's receive buffer (UCS_INPROGRESS) until the sink has read
    // it on the calling thread, when it is aligned for float loads; else
    // copied out.
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0 && length > 0 &&
        reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) == 0) {
      transport::UcxWorker* worker = self->worker_.get();
      Deliver(*call, frame.index, std::move(chunk),
              transport::PayloadBuffer::Borrow(
                  static_cast<char*>(data), length,
                  std::shared_ptr<void>(data, [worker](void* d) { worker->ReleaseData(d); })));
      self->CheckLater(call);
      return UCS_INPROGRESS;
    }
    auto payload = transport::PayloadBuffer::Allocate(length);
    if (length > 0) std::memcpy(payload.data(), data, length);
    Deliver(*call, frame.index, std::move(chunk), std::move(payload));
    self->CheckLater(call);
    return UCS_OK;
  }
  // Rendezvous: UCX writes the payload straight into the reply's buffer.
  struct Pending {
    proto::TensorChunk header;
    transport::PayloadBuffer payload;
  };
  auto reply = std::make_shared<Pending>();
  reply->header = std::move(chunk);
  reply->payload = transport::PayloadBuffer::Allocate(length);
  const uint32_t index = frame.index;
  self->worker_->ReceiveData(data, reply->payload.data(), length,
                             [self, call, reply, index](ucs_status_t status) {
                               if (status != UCS_OK) {
                                 Fail(*call, absl::UnavailableError(absl::StrCat(
                                                 "UCX receive failed: ", ucs_status_string(status))));
                               } else {
                                 Deliver(*call, index, std::move(reply->header),
                                         std::move(reply->payload));
                               }
                               self->CheckLater(call);
                             });
  return UCS_OK;
}

void UcxClientContext::OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<UcxPeer*>(arg);
  spdlog::warn("ucx peer={} failed: {}", peer->name, ucs_status_string(status));
  peer->context->FailPeer(
      peer, absl::UnavailableError(absl::StrCat("UCX connection lost: ", ucs_status_string(status))));
}

void UcxClientContext::FailPeer(UcxPeer* peer, const absl::Status& failure) {
  {
    absl::MutexLock lock(&peer->mutex);
    if (peer->failure.ok()) peer->failure = failure;
    peer->failed = true;
  }
  if (peer->ep != nullptr) worker_->CloseEndpoint(peer->ep);
  peer->ep = nullptr;
  std::vector<std::shared_ptr<UcxCall>> affected;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& entry : calls_) {
      if (entry.second->peer.get() == peer) affected.push_back(entry.second);
    }
  }
  for (auto& call : affected) {
    Fail(*call, failure);
    CheckLater(call);
  }
}

UcxShardTransport::UcxShardTransport(std::shared_ptr<UcxClientContext> context,
                                     std::shared_ptr<UcxPeer> peer, std::string peer_name,
                                     std::function<bool()> peer_alive,
                                     UcxAddressProvider address_provider)
    : ShardTransport(TransportTraits{"ucx", context->sends_from_device_memory(),
                                     context->sends_from_device_memory()}),
      context_(std::move(context)),
      peer_name_(std::move(peer_name)),
      peer_alive_(std::move(peer_alive)),
      address_provider_(std::move(address_provider)),
      peer_(std::move(peer)) {}

absl::StatusOr<std::shared_ptr<UcxPeer>> UcxShardTransport::CurrentPeer(absl::Time deadline) {
  {
    absl::MutexLock lock(&peer_mutex_);
    if (reconnecting_) {
      // Another call is reconnecting: use its endpoint, or fail as it did.
      const absl::Condition reconnected(
          +[](UcxShardTransport* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->peer_mutex_) {
            return !self->reconnecting_;
          },
          this);
      if (!peer_mutex_.AwaitWithDeadline(reconnected, deadline)) {
        return absl::UnavailableError(
            absl::StrCat("still reconnecting to ", peer_name_, " over UCX"));
      }
      if (!peer_->failed) return peer_;
      if (!last_reconnect_failure_.ok()) return last_reconnect_failure_;
      return peer_;  // Execute() returns its failure
    }
    if (!peer_->failed || !address_provider_) return peer_;
    reconnecting_ = true;
  }
  // Bounded, so a shard that is still down fails the call quickly and the
  // caller's retry loop backs off.
  const absl::Time attempt_deadline = std::min(deadline, absl::Now() + absl::Seconds(5));
  absl::StatusOr<std::shared_ptr<UcxPeer>> fresh;
  auto address = address_provider_(attempt_deadline);
  if (address.ok()) {
    fresh = context_->ConnectPeer(peer_name_, *address, attempt_deadline, peer_alive_);
  } else {
    fresh = address.status();
  }
  absl::MutexLock lock(&peer_mutex_);
  reconnecting_ = false;
  if (!fresh.ok()) {
    last_reconnect_failure_ = absl::UnavailableError(absl::StrCat(
        "UCX connection lost; reconnecting to ", peer_name_, " failed: ", fresh.status().message()));
    return last_reconnect_failure_;
  }
  spdlog::info("ucx reconnected to {}", peer_name_);
  peer_ = std::move(*fresh);
  last_reconnect_failure_ = absl::OkStatus();
  return peer_;
}

UcxShardTransport::~UcxShardTransport() = default;  // the context closes the endpoint

void UcxShardTransport::SendChunks(const std::vector<OutgoingChunk>& chunks, bool then_pull,
                                   const ReplyLandingChooser* choose, const LandedChunkSink* sink,
                                   absl::Time deadline, CallCanceller& canceller, CallDone done) {
  // Before the peer too: a refused call must not even reconnect.
  if (!SendsFromDeviceMemory()) {
    if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) {
      return done(refused);
    }
  }
  auto peer = CurrentPeer(deadline);
  if (!peer.ok()) return done(peer.status());
  Frame frame;
  frame.op = then_pull ? Op::kPushPull : Op::kPush;
  frame.connection_id = (*peer)->id;
  frame.request_id = context_->NextRequestId();
  frame.count = static_cast<uint32_t>(chunks.size());
  frame.arg = TimeoutMs(deadline);
  std::vector<UcxClientContext::Message> messages;
  if (chunks.empty()) messages.push_back({transport::EncodeHeader(frame, {}), nullptr, 0});
  for (size_t i = 0; i < chunks.size(); ++i) {
    const absl::string_view payload = chunks[i].payload();
    frame.index = static_cast<uint32_t>(i);
    frame.payload_bytes = payload.size();
    // The header's payload field is empty (OutgoingChunk promises it), so it
    // serializes as the chunk's fields alone. A pending checksum is taken
    // here: UCX sends from the caller's memory without a copy of its own.
    // Owned payloads (the codec's output) are host memory whatever
    // borrowed_memory says.
    const bool device =
        chunks[i].is_borrowed && chunks[i].borrowed_memory == MemoryKind::kDevice;
    transport::EncodedRequest encoded = transport::EncodeRequest(
        frame, chunks[i].checksum_pending ? WireHeader(chunks[i]).SerializeAsString()
                                          : chunks[i].header.SerializeAsString());
    messages.push_back({std::move(encoded.header), payload.data(), payload.size(),
                        device ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
                        std::move(encoded.data_prefix)});
  }
  context_->Execute(*peer, frame.request_id, std::move(messages), choose, sink, deadline,
                    canceller, std::move(done));
}

void UcxShardTransport::StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                                  CallCanceller& canceller, CallDone done) {
  SendChunks(chunks, false, nullptr, nullptr, deadline, canceller, std::move(done));
}

void UcxShardTransport::StartPushPull(const std::vector<OutgoingChunk>& chunks,
                                      const ReplyLandingChooser* choose,
                                      const LandedChunkSink& sink, absl::Time deadline,
                                      CallCanceller& canceller, CallDone done) {
  SendChunks(chunks, true, choose, &sink, deadline, canceller, std::move(done));
}

void UcxShardTransport::StartPull(const proto::PullRequest& request,
                                  const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                                  absl::Time deadline, CallCanceller& canceller, CallDone done) {
  auto peer = CurrentPeer(deadline);
  if (!peer.ok()) return done(peer.status());
  Frame frame;
  frame.op = Op::kPull;
  frame.connection_id = (*peer)->id;
  frame.request_id = context_->NextRequestId();
  frame.arg = TimeoutMs(deadline);
  std::vector<UcxClientContext::Message> messages;
  transport::EncodedRequest encoded = transport::EncodeRequest(frame, request.SerializeAsString());
  messages.push_back({std::move(encoded.header), nullptr, 0, UCS_MEMORY_TYPE_HOST,
                      std::move(encoded.data_prefix)});
  context_->Execute(*peer, frame.request_id, std::move(messages), choose, &sink, deadline,
                    canceller, std::move(done));
}

}  // namespace harrier
