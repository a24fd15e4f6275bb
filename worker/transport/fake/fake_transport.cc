#include "worker/transport/fake/fake_transport.h"

#include <memory>
#include <utility>

#include "common/crc32c.h"

namespace harrier {
FakeShardTransport::FakeShardTransport() : responder_(&FakeShardTransport::DefaultResponse) {}

namespace {

FakeShardTransport::Call Recorded(FakeShardTransport::CallKind kind,
                                  const std::vector<OutgoingChunk>& chunks, absl::Time deadline) {
  FakeShardTransport::Call call;
  call.kind = kind;
  call.deadline = deadline;
  for (const OutgoingChunk& chunk : chunks) {
    call.chunks.push_back(chunk.header);
    call.payloads.emplace_back(chunk.payload());
  }
  return call;
}

}  // namespace

absl::Status FakeShardTransport::Push(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                                      CallCanceller& canceller) {
  // Refused before recording: recording copies the payload. A subclass
  // that says it sends from device memory fakes the device with host memory.
  if (!SendsFromDeviceMemory()) {
    if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) return refused;
  }
  return Handle(Recorded(CallKind::kPush, chunks, deadline), nullptr, canceller);
}

absl::Status FakeShardTransport::Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                                      absl::Time deadline, CallCanceller& canceller) {
  Call call = Recorded(CallKind::kPull, {}, deadline);
  call.pull = request;
  return Handle(std::move(call), &sink, canceller);
}

absl::Status FakeShardTransport::PushPull(const std::vector<OutgoingChunk>& chunks,
                                          const ChunkViewSink& sink, absl::Time deadline,
                                          CallCanceller& canceller) {
  if (!SendsFromDeviceMemory()) {
    if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) return refused;
  }
  return Handle(Recorded(CallKind::kPushPull, chunks, deadline), &sink, canceller);
}

ChunkViewSink FakeShardTransport::Landing(const ReplyLandingChooser& choose,
                                          const LandedChunkSink& sink) const {
  const bool device = ReceivesIntoDeviceMemory();
  return [&choose, &sink, device](const proto::TensorChunk& header, const PayloadView& payload) {
    const ReplyLanding landing = choose(header, payload.size());
    const bool lands = landing.data != nullptr && landing.capacity >= payload.size() &&
                       (landing.memory == MemoryKind::kHost || device);
    if (!lands) return sink(header, payload, MemoryKind::kHost);
    payload.CopyTo(landing.data);
    return sink(header,
                PayloadView(absl::string_view(static_cast<const char*>(landing.data),
                                              payload.size())),
                landing.memory);
  };
}

absl::Status FakeShardTransport::PullInto(const proto::PullRequest& request,
                                          const ReplyLandingChooser& choose,
                                          const LandedChunkSink& sink, absl::Time deadline,
                                          CallCanceller& canceller) {
  return Pull(request, Landing(choose, sink), deadline, canceller);
}

absl::Status FakeShardTransport::PushPullInto(const std::vector<OutgoingChunk>& chunks,
                                              const ReplyLandingChooser& choose,
                                              const LandedChunkSink& sink, absl::Time deadline,
                                              CallCanceller& canceller) {
  return PushPull(chunks, Landing(choose, sink), deadline, canceller);
}

absl::Status FakeShardTransport::Handle(Call call, const ChunkViewSink* sink,
                                        CallCanceller& canceller) {
  call.started = absl::Now();
  Responder responder;
  bool hold = false;
  {
    absl::MutexLock lock(&mutex_);
    calls_.push_back(call);
    if (fail_remaining_ > 0) {
      --fail_remaining_;
      return fail_status_;
    }
    responder = responder_;
    hold = blocking_;
  }
  if (hold) {
    if (absl::Status status = Hold(call.deadline, canceller); !status.ok()) return status;
  }
  return responder(call, sink);
}

absl::Status FakeShardTransport::Hold(absl::Time deadline, CallCanceller& canceller) {
  // Set by the canceller's abort, read under mutex_.
  auto cancelled = std::make_shared<bool>(false);
  if (!canceller.Register(cancelled.get(), [this, cancelled] {
        absl::MutexLock lock(&mutex_);
        *cancelled = true;
      })) {
    return absl::CancelledError("fake: cancelled before it started");
  }
  absl::Status result;
  {
    absl::MutexLock lock(&mutex_);
    ++held_;
    const bool honour = honour_cancel_;
    const uint64_t generation = release_generation_;
    auto ends = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return release_generation_ != generation || (honour && *cancelled);
    };
    const absl::Time give_up = honour ? deadline : absl::Now() + absl::Minutes(1);
    if (!mutex_.AwaitWithDeadline(absl::Condition(&ends), give_up)) {
      result = absl::DeadlineExceededError("fake: deadline passed while held");
    } else if (release_generation_ == generation) {
      result = absl::CancelledError("fake: cancelled");
      ++cancelled_;
    }
    --held_;
  }
  canceller.Unregister(cancelled.get());
  return result;
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

void FakeShardTransport::Block() {
  absl::MutexLock lock(&mutex_);
  blocking_ = true;
}

void FakeShardTransport::Release() {
  absl::MutexLock lock(&mutex_);
  blocking_ = false;
  ++release_generation_;
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
  return held_;
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
