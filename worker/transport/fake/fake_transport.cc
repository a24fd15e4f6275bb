#include "worker/transport/fake/fake_transport.h"

#include <memory>
#include <utility>

#include "common/crc32c.h"

namespace harrier {
namespace {

TransportTraits FakeTraits(TransportTraits traits) {
  traits.name = "fake";
  return traits;
}

FakeShardTransport::Call Recorded(FakeShardTransport::CallKind kind,
                                  const std::vector<OutgoingChunk>& chunks, absl::Time deadline) {
  FakeShardTransport::Call call;
  call.kind = kind;
  call.deadline = deadline;
  for (const OutgoingChunk& chunk : chunks) {
    call.chunks.push_back(WireHeader(chunk));
    call.payloads.emplace_back(chunk.payload());
  }
  return call;
}

}  // namespace

FakeShardTransport::FakeShardTransport() : FakeShardTransport(TransportTraits{}) {}

FakeShardTransport::FakeShardTransport(TransportTraits traits, std::shared_ptr<TimerThread> timer)
    : ShardTransport(FakeTraits(std::move(traits))),
      responder_(&FakeShardTransport::DefaultResponse),
      timer_(timer != nullptr ? std::move(timer)
                              : std::make_shared<TimerThread>("fake-transport")) {}

void FakeShardTransport::Later(absl::Time when, std::function<void()> run) {
  timer_->At(when, [life = life_, run = std::move(run)] {
    absl::MutexLock lock(&life->mutex);
    if (life->alive) run();
  });
}

FakeShardTransport::~FakeShardTransport() {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& entry : held_) ids.push_back(entry.first);
  }
  for (uint64_t id : ids) {
    EndHeld(id, absl::DeadlineExceededError("fake: transport destroyed while held"), false);
  }
  absl::MutexLock lock(&life_->mutex);  // waits for a closure running now
  life_->alive = false;
}

void FakeShardTransport::StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                                   CallCanceller& canceller, CallDone done) {
  // Refused before recording: recording copies the payload. A fake whose
  // traits say it sends from device memory fakes the device with host memory.
  if (!SendsFromDeviceMemory()) {
    if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) {
      return done(refused);
    }
  }
  Handle(Recorded(CallKind::kPush, chunks, deadline), nullptr, nullptr, canceller,
         std::move(done));
}

void FakeShardTransport::StartPull(const proto::PullRequest& request,
                                   const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                                   absl::Time deadline, CallCanceller& canceller, CallDone done) {
  Call call = Recorded(CallKind::kPull, {}, deadline);
  call.pull = request;
  Handle(std::move(call), choose, &sink, canceller, std::move(done));
}

void FakeShardTransport::StartPushPull(const std::vector<OutgoingChunk>& chunks,
                                       const ReplyLandingChooser* choose,
                                       const LandedChunkSink& sink, absl::Time deadline,
                                       CallCanceller& canceller, CallDone done) {
  if (!SendsFromDeviceMemory()) {
    if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) {
      return done(refused);
    }
  }
  Handle(Recorded(CallKind::kPushPull, chunks, deadline), choose, &sink, canceller,
         std::move(done));
}

void FakeShardTransport::Handle(Call call, const ReplyLandingChooser* choose,
                                const LandedChunkSink* sink, CallCanceller& canceller,
                                CallDone done) {
  call.started = absl::Now();
  auto pending = std::make_shared<Pending>();
  pending->choose = choose;
  pending->sink = sink;
  pending->canceller = &canceller;
  pending->done = std::move(done);
  enum { kFail, kAnswer, kHold } action = kAnswer;
  absl::Status failure;
  bool honour = true;
  {
    absl::MutexLock lock(&mutex_);
    call.id = calls_.size();
    calls_.push_back(call);
    pending->call = std::move(call);
    if (fail_remaining_ > 0) {
      --fail_remaining_;
      failure = fail_status_;
      action = kFail;
    } else if (blocking_ || (hold_if_ && hold_if_(pending->call))) {
      action = kHold;
      honour = honour_cancel_;
      held_[pending->call.id] = pending;
    }
  }
  if (action == kFail) return pending->done(failure);
  if (action == kAnswer) return Answer(*pending);
  // Held: the completion is stored until the test, the deadline or the
  // canceller ends it.
  const uint64_t id = pending->call.id;
  const absl::Time give_up = honour ? pending->call.deadline : absl::Now() + absl::Minutes(1);
  if (!canceller.Register(pending.get(), [this, id, honour] {
        if (!honour) return;  // a stuck backend
        // Under the canceller's lock: the call completes on the timer.
        Later(absl::InfinitePast(), [this, id] {
          EndHeld(id, absl::CancelledError("fake: cancelled"), true);
        });
      })) {
    EndHeld(id, absl::CancelledError("fake: cancelled before it started"), false);
    return;
  }
  Later(give_up, [this, id] {
    EndHeld(id, absl::DeadlineExceededError("fake: deadline passed while held"), false);
  });
}

void FakeShardTransport::Answer(const Pending& pending) {
  Responder responder;
  {
    absl::MutexLock lock(&mutex_);
    responder = responder_;
  }
  if (pending.sink == nullptr) return pending.done(responder(pending.call, nullptr));
  const LandedChunkSink& sink = *pending.sink;
  const ReplyLandingChooser* choose = pending.choose;
  const bool device = ReceivesIntoDeviceMemory();
  const ChunkViewSink landing = [&sink, choose, device](const proto::TensorChunk& header,
                                                        const PayloadView& payload) {
    if (choose == nullptr) return sink(header, payload, MemoryKind::kHost);
    const ReplyLanding landing = (*choose)(header, payload.size());
    const bool lands = landing.data != nullptr && landing.capacity >= payload.size() &&
                       (landing.memory == MemoryKind::kHost || device);
    if (!lands) return sink(header, payload, MemoryKind::kHost);
    payload.CopyTo(landing.data);
    return sink(header,
                PayloadView(absl::string_view(static_cast<const char*>(landing.data),
                                              payload.size())),
                landing.memory);
  };
  pending.done(responder(pending.call, &landing));
}

std::shared_ptr<FakeShardTransport::Pending> FakeShardTransport::TakeHeld(uint64_t id) {
  std::shared_ptr<Pending> pending;
  {
    absl::MutexLock lock(&mutex_);
    auto it = held_.find(id);
    if (it == held_.end()) return nullptr;
    pending = std::move(it->second);
    held_.erase(it);
  }
  pending->canceller->Unregister(pending.get());
  return pending;
}

void FakeShardTransport::EndHeld(uint64_t id, absl::Status status, bool cancelled) {
  std::shared_ptr<Pending> pending = TakeHeld(id);
  if (pending == nullptr) return;  // completed already
  if (cancelled) {
    absl::MutexLock lock(&mutex_);
    ++cancelled_;
  }
  pending->done(std::move(status));
}

bool FakeShardTransport::CompleteHeld(uint64_t id) {
  std::shared_ptr<Pending> pending = TakeHeld(id);
  if (pending == nullptr) return false;
  Answer(*pending);
  return true;
}

void FakeShardTransport::SetResponder(Responder responder) {
  absl::MutexLock lock(&mutex_);
  responder_ = std::move(responder);
}

void FakeShardTransport::FailNext(int n, absl::Status status) {
  absl::MutexLock lock(&mutex_);
  fail_remaining_ = n;
  fail_status_ = std::move(status);
}

void FakeShardTransport::SetHoldIf(std::function<bool(const Call& call)> hold) {
  absl::MutexLock lock(&mutex_);
  hold_if_ = std::move(hold);
}

void FakeShardTransport::Block() {
  absl::MutexLock lock(&mutex_);
  blocking_ = true;
}

void FakeShardTransport::Release() {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mutex_);
    blocking_ = false;
    for (const auto& entry : held_) ids.push_back(entry.first);
  }
  // On the timer thread, as a transport completes its calls.
  for (uint64_t id : ids) {
    Later(absl::InfinitePast(), [this, id] { CompleteHeld(id); });
  }
}

void FakeShardTransport::set_honour_cancel(bool honour) {
  absl::MutexLock lock(&mutex_);
  honour_cancel_ = honour;
}

std::vector<FakeShardTransport::Call> FakeShardTransport::calls() const {
  absl::MutexLock lock(&mutex_);
  return calls_;
}

int FakeShardTransport::num_calls() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(calls_.size());
}

int FakeShardTransport::cancelled_calls() const {
  absl::MutexLock lock(&mutex_);
  return cancelled_;
}

int FakeShardTransport::held_calls() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(held_.size());
}

std::vector<FakeShardTransport::Call> FakeShardTransport::held() const {
  absl::MutexLock lock(&mutex_);
  std::vector<Call> held;
  for (const auto& entry : held_) held.push_back(entry.second->call);
  return held;
}

bool FakeShardTransport::AwaitHeld(int n, absl::Duration timeout) const {
  const absl::Time give_up = absl::Now() + timeout;
  while (held_calls() < n) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

absl::Status FakeShardTransport::ReplyDense(const ChunkViewSink& sink,
                                            const proto::TensorChunk& header,
                                            absl::Span<const float> values) {
  proto::TensorChunk reply;
  reply.set_key(header.key());
  reply.set_chunk(header.chunk());
  reply.set_num_elements(values.size());
  reply.set_dtype(proto::DTYPE_FLOAT32);
  const std::string payload(reinterpret_cast<const char*>(values.data()),
                            values.size() * sizeof(float));
  reply.set_checksum(Crc32c(payload.data(), payload.size()));
  return sink(reply, PayloadView(payload));
}

absl::Status FakeShardTransport::DefaultResponse(const Call& call, const ChunkViewSink* sink) {
  if (sink == nullptr) return absl::OkStatus();
  std::vector<proto::TensorChunk> wanted = call.chunks;
  for (const proto::ChunkRef& ref : call.pull.chunks()) {
    proto::TensorChunk header;
    header.set_key(ref.key());
    header.set_chunk(ref.chunk());
    header.set_num_elements(ref.num_elements());
    wanted.push_back(header);
  }
  for (const proto::TensorChunk& header : wanted) {
    std::vector<float> values(header.num_elements());
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<float>(header.chunk() * 1000 + i);
    }
    if (absl::Status status = ReplyDense(*sink, header, values); !status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace harrier
