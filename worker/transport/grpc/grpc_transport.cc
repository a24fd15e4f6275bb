#include "worker/transport/grpc/grpc_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/chunk_wire.h"
#include "common/grpc_status.h"

namespace harrier {
namespace {

// Payloads below this are copied into the header's slice: one slice and no
// release tracking are cheaper than a borrowed slice for small messages.
constexpr size_t kBorrowThresholdBytes = 32 << 10;

// How long a call waits, after its call object is destroyed, for gRPC to
// release the payload slices it borrowed (no thread waits: the release or
// the timer completes the call). gRPC may hold a slice after
// Finish() returned (the bytes may still sit in the TCP write queue); a
// healthy connection drains in milliseconds. A message a stream never sent
// stays with the call until the call is destroyed, so the wait comes after
// that: a call to a stopped shard then completes at its deadline. After a shard is killed, gRPC
// still holds a slice past the call in some runs (4 of 6 of
// //tests/integration:shard_kill_training_grpc_test), so the grace stays:
// past it the call completes with an error instead of hanging; gRPC only ever reads
// the bytes, and a dead connection never sends them, so the caller reusing
// its buffer cannot corrupt anything that is still delivered. (The count
// itself outlives the call, see below.)
constexpr absl::Duration kSliceReleaseGrace = absl::Seconds(5);

// Counts borrowed payload slices gRPC still references; a call completes
// once the count is zero. The count lives in a shared block that every
// slice's destroy callback holds, so a release after the grace passed
// touches live memory.
class BorrowedSlices {
 public:
  BorrowedSlices() : state_(std::make_shared<State>()) {}

  grpc::Slice Borrow(absl::string_view bytes) {
    {
      absl::MutexLock lock(&state_->mutex);
      ++state_->outstanding;
    }
    // gRPC only reads the memory; the Slice API takes it non-const.
    return grpc::Slice(const_cast<char*>(bytes.data()), bytes.size(), &BorrowedSlices::Release,
                       new std::shared_ptr<State>(state_));
  }

  // Runs `then` once: with OK when every borrowed slice is released (at
  // once if none is held), or with DEADLINE_EXCEEDED if gRPC still holds
  // some `grace` later (on `timer`). Call once, after the stream ended.
  void WhenReleased(TimerThread& timer, absl::Duration grace,
                    std::function<void(absl::Status)> then) {
    {
      absl::MutexLock lock(&state_->mutex);
      if (state_->outstanding > 0) {
        state_->then = std::move(then);
        timer.After(grace, [state = state_] {
          std::function<void(absl::Status)> late;
          int outstanding = 0;
          {
            absl::MutexLock lock(&state->mutex);
            late = std::move(state->then);
            state->then = nullptr;
            outstanding = state->outstanding;
          }
          if (late) {
            late(absl::DeadlineExceededError(
                absl::StrCat("gRPC still holds ", outstanding,
                             " payload slices of this call; gave up waiting for their release")));
          }
        });
        return;
      }
    }
    then(absl::OkStatus());
  }

 private:
  struct State {
    absl::Mutex mutex;
    int outstanding ABSL_GUARDED_BY(mutex) = 0;
    std::function<void(absl::Status)> then ABSL_GUARDED_BY(mutex);
  };

  static void Release(void* arg) {
    auto* holder = static_cast<std::shared_ptr<State>*>(arg);
    std::function<void(absl::Status)> then;
    {
      State& state = **holder;
      absl::MutexLock lock(&state.mutex);
      if (--state.outstanding == 0 && state.then) {
        then = std::move(state.then);
        state.then = nullptr;
      }
    }
    delete holder;
    if (then) then(absl::OkStatus());
  }

  std::shared_ptr<State> state_;
};

// The stream's status, which keeps its code (UNAVAILABLE stays retryable)
// if the borrowed payloads could not be reclaimed either.
absl::Status WithRelease(absl::Status status, const absl::Status& released) {
  if (released.ok()) return status;
  if (status.ok()) return released;
  return absl::Status(status.code(), absl::StrCat(status.message(), " (", released.message(), ")"));
}

// WithRelease once the borrowed slices are back or the grace has passed,
// waiting on this thread (the calls a waiting caller runs itself).
absl::Status AfterRelease(BorrowedSlices& borrowed, TimerThread& timer, absl::Status status) {
  struct Released {
    absl::Notification done;
    absl::Status status;
  };
  auto released = std::make_shared<Released>();
  borrowed.WhenReleased(timer, kSliceReleaseGrace, [released](absl::Status release_status) {
    released->status = std::move(release_status);
    released->done.Notify();
  });
  released->done.WaitForNotification();
  return WithRelease(std::move(status), released->status);
}

// Host payloads of a push are copied into reused send buffers rather than
// lent to gRPC. Measured on the 2-core machine of docs/performance.md
// ("CPU per byte"): the kernel's send copy out of a caller's large gradient
// (hundreds of MB on 4 KiB pages, touched once a step) costs about twice
// what it costs out of a buffer written a moment before, and more than the
// user-space copy that fills that buffer. The buffers come back when gRPC
// releases their slices; up to kMaxStagedBytes are in use at once (past
// that a payload is lent, as before), up to kMaxIdleBytes wait for reuse.
class SendBufferPool {
 public:
  static SendBufferPool& Instance() {
    static SendBufferPool* pool = new SendBufferPool();  // never destroyed: slices outlive main
    return *pool;
  }

  // A slice holding a copy of `bytes`, or nullopt when kMaxStagedBytes are
  // in use already.
  std::optional<grpc::Slice> Copy(absl::string_view bytes) {
    Buffer* buffer = nullptr;
    {
      absl::MutexLock lock(&mutex_);
      if (staged_bytes_ + bytes.size() > kMaxStagedBytes) return std::nullopt;
      // A buffer of at least the size, and at most twice it: pieces of a
      // step come in a few sizes, so this keeps memory close to its use.
      for (size_t i = 0; i < idle_.size(); ++i) {
        if (idle_[i]->capacity >= bytes.size() && idle_[i]->capacity <= 2 * bytes.size()) {
          buffer = idle_[i];
          idle_bytes_ -= buffer->capacity;
          idle_[i] = idle_.back();
          idle_.pop_back();
          break;
        }
      }
      staged_bytes_ += buffer != nullptr ? buffer->capacity : bytes.size();
    }
    if (buffer == nullptr) {
      buffer = new Buffer{bytes.size(), std::unique_ptr<char[]>(new char[bytes.size()])};
    }
    std::memcpy(buffer->data.get(), bytes.data(), bytes.size());
    return grpc::Slice(buffer->data.get(), bytes.size(), &SendBufferPool::Release, buffer);
  }

 private:
  struct Buffer {
    size_t capacity = 0;
    std::unique_ptr<char[]> data;
  };
  static constexpr size_t kMaxStagedBytes = 64 << 20;
  static constexpr size_t kMaxIdleBytes = 16 << 20;

  static void Release(void* arg) { Instance().GiveBack(static_cast<Buffer*>(arg)); }

  void GiveBack(Buffer* buffer) {
    {
      absl::MutexLock lock(&mutex_);
      staged_bytes_ -= buffer->capacity;
      if (idle_bytes_ + buffer->capacity <= kMaxIdleBytes) {
        idle_bytes_ += buffer->capacity;
        idle_.push_back(buffer);
        return;
      }
    }
    delete buffer;
  }

  absl::Mutex mutex_;
  size_t staged_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<Buffer*> idle_ ABSL_GUARDED_BY(mutex_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

grpc::ByteBuffer EncodeChunk(const OutgoingChunk& chunk, BorrowedSlices& borrowed) {
  const absl::string_view payload = chunk.payload();
  std::string prefix = EncodeChunkPrefix(chunk.header, payload.size());
  if (payload.size() < kBorrowThresholdBytes) {
    prefix.append(payload.data(), payload.size());
    grpc::Slice slice(prefix);
    return grpc::ByteBuffer(&slice, 1);
  }
  std::optional<grpc::Slice> staged;
  // Only the caller's memory; an owned payload (compressed, or staged from
  // a device) was just written and is lent as it is.
  if (chunk.is_borrowed && chunk.borrowed_memory == MemoryKind::kHost) {
    staged = SendBufferPool::Instance().Copy(payload);
  }
  grpc::Slice slices[2] = {grpc::Slice(prefix),
                           staged.has_value() ? *std::move(staged) : borrowed.Borrow(payload)};
  return grpc::ByteBuffer(slices, 2);
}

// Decodes a call's reply messages and hands each to a sink; after the
// first error (a malformed reply or the sink's) the rest are drained
// unread, so the stream's own status is still reported when it is not OK.
class ReplyReader {
 public:
  void Take(grpc::ByteBuffer& message, const ChunkViewSink& sink) {
    if (!status_.ok()) return;
    slices_.clear();
    if (!message.Dump(&slices_).ok()) {
      status_ = absl::DataLossError("unreadable reply from the shard");
      return;
    }
    header_.Clear();
    PayloadView payload;
    status_ = DecodeChunk(slices_, &header_, &payload);
    if (!status_.ok()) {
      status_ = absl::DataLossError(absl::StrCat("reply from the shard: ", status_.message()));
      return;
    }
    status_ = sink(header_, payload);
  }
  const absl::Status& status() const { return status_; }

 private:
  std::vector<grpc::Slice> slices_;
  proto::TensorChunk header_;
  absl::Status status_;
};

// Joins the parts of one call (one stream per channel): completes the
// call when the last part ended, with the first error by part order, and
// hands the parts' replies to the sink one at a time.
class PartsJoin {
 public:
  PartsJoin(size_t parts, const LandedChunkSink* sink, CallDone done)
      : sink_(sink),
        statuses_(parts),
        remaining_(static_cast<int>(parts)),
        done_(std::move(done)) {}

  absl::Status Reply(const proto::TensorChunk& header, const PayloadView& payload) {
    absl::MutexLock lock(&sink_mutex_);
    return (*sink_)(header, payload, MemoryKind::kHost);
  }

  void PartDone(size_t part, absl::Status status) {
    absl::Status result;
    {
      absl::MutexLock lock(&mutex_);
      statuses_[part] = std::move(status);
      if (--remaining_ > 0) return;
      for (absl::Status& part_status : statuses_) {
        if (!part_status.ok()) {
          result = std::move(part_status);
          break;
        }
      }
    }
    done_(std::move(result));
  }

 private:
  const LandedChunkSink* const sink_;
  absl::Mutex sink_mutex_;
  absl::Mutex mutex_;
  std::vector<absl::Status> statuses_ ABSL_GUARDED_BY(mutex_);
  int remaining_ ABSL_GUARDED_BY(mutex_);
  const CallDone done_;
};

// One stream of a call, whatever its kind: owns its context and messages,
// registers with the canceller, reads replies, and on gRPC's OnDone waits
// (without a thread) for its borrowed slices, then ends its part. Owns
// itself from Start until OnDone.
class Stream {
 public:
  Stream(absl::Time deadline, CallCanceller& canceller, TimerThread& timer,
         std::shared_ptr<PartsJoin> join, size_t part)
      : canceller_(canceller), timer_(timer), join_(std::move(join)), part_(part) {
    context_.set_deadline(absl::ToChronoTime(deadline));
  }
  virtual ~Stream() = default;

 protected:
  // Registers the stream with the canceller (false: already cancelled, and
  // the part has ended). The abort hands TryCancel to the timer thread: it
  // runs under the canceller's lock, where gRPC must not run our OnDone.
  template <typename Self>
  bool Register(const std::shared_ptr<Self>& self) {
    std::weak_ptr<Self> weak = self;
    TimerThread* timer = &timer_;
    registered_ = canceller_.Register(this, [timer, weak] {
      timer->At(absl::InfinitePast(), [weak] {
        if (auto stream = weak.lock()) stream->context_.TryCancel();
      });
    });
    if (!registered_) join_->PartDone(part_, absl::CancelledError("operation cancelled"));
    return registered_;
  }

  // Registers the stream and encodes its messages (false: cancelled
  // already, and the part has ended).
  template <typename Self>
  bool Prepare(const std::shared_ptr<Self>& self, const std::vector<const OutgoingChunk*>& chunks) {
    if (!Register(self)) return false;
    for (const OutgoingChunk* chunk : chunks) messages_.push_back(EncodeChunk(*chunk, borrowed_));
    return true;
  }

  // The next message to write, or null once every one was written.
  grpc::ByteBuffer* NextMessage() {
    return next_ < messages_.size() ? &messages_[next_++] : nullptr;
  }

  // Writes `message`; the last one carries the half-close with it (one
  // HTTP/2 frame and no WritesDone round through OnWriteDone), so the
  // shard sees the end of the push with its last chunk.
  template <class Reactor>
  void WriteOrWriteLast(Reactor& reactor, grpc::ByteBuffer* message) {
    if (next_ == messages_.size()) {
      wrote_last_ = true;
      reactor.StartWriteLast(message, grpc::WriteOptions());
    } else {
      reactor.StartWrite(message);
    }
  }
  bool wrote_last() const { return wrote_last_; }

  // One reply message (`ok`: one was read).
  void OnReply(bool ok) {
    if (ok)
      replies_.Take(buffer_, [this](const proto::TensorChunk& header, const PayloadView& payload) {
        return join_->Reply(header, payload);
      });
  }

  // gRPC's OnDone: the last reaction. Drops the stream (its context and
  // call, which may still hold unsent messages) and ends the part once the
  // borrowed slices are back.
  void Finish(const grpc::Status& grpc_status, std::shared_ptr<Stream> self) {
    if (registered_) canceller_.Unregister(this);
    absl::Status status = FromGrpcStatus(grpc_status);
    if (status.ok()) status = replies_.status();
    BorrowedSlices borrowed = borrowed_;
    TimerThread& timer = timer_;
    std::shared_ptr<PartsJoin> join = join_;
    const size_t part = part_;
    self.reset();  // may destroy this stream
    borrowed.WhenReleased(timer, kSliceReleaseGrace, [join, part, status](absl::Status released) {
      join->PartDone(part, WithRelease(status, released));
    });
  }

  grpc::ClientContext context_;
  grpc::ByteBuffer buffer_;  // the reply being read

 private:
  CallCanceller& canceller_;
  TimerThread& timer_;
  const std::shared_ptr<PartsJoin> join_;
  const size_t part_;
  bool registered_ = false;
  BorrowedSlices borrowed_;
  std::vector<grpc::ByteBuffer> messages_;
  size_t next_ = 0;          // the next message to write
  bool wrote_last_ = false;  // the half-close went with the last message
  ReplyReader replies_;
};

class PushCall : public Stream, public grpc::ClientWriteReactor<grpc::ByteBuffer> {
 public:
  using Stream::Stream;

  static void Start(const grpc::internal::RpcMethod& method, grpc::Channel* channel,
                    const std::vector<const OutgoingChunk*>& chunks,
                    std::shared_ptr<PushCall> self) {
    if (!self->Prepare(self, chunks)) return;
    PushCall* stream = self.get();
    stream->self_ = std::move(self);
    grpc::internal::ClientCallbackWriterFactory<grpc::ByteBuffer>::Create(
        channel, method, &stream->context_, &stream->response_, stream);
    stream->WriteNext();
    stream->StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();  // else the stream failed: OnDone says why
  }
  void OnDone(const grpc::Status& status) override { Finish(status, std::move(self_)); }

 private:
  void WriteNext() {
    if (grpc::ByteBuffer* message = NextMessage()) {
      WriteOrWriteLast(*this, message);
    } else if (!wrote_last()) {
      StartWritesDone();
    }
  }

  grpc::ByteBuffer response_;  // a PushResponse; nothing in it is needed
  std::shared_ptr<Stream> self_;
};

class PullCall : public Stream, public grpc::ClientReadReactor<grpc::ByteBuffer> {
 public:
  using Stream::Stream;

  static void Start(const grpc::internal::RpcMethod& method, grpc::Channel* channel,
                    proto::PullRequest request, std::shared_ptr<PullCall> self) {
    self->request_ = std::move(request);
    if (!self->Register(self)) return;
    PullCall* stream = self.get();
    stream->self_ = std::move(self);
    grpc::internal::ClientCallbackReaderFactory<grpc::ByteBuffer>::Create(
        channel, method, &stream->context_, &stream->request_, stream);
    stream->StartRead(&stream->buffer_);
    stream->StartCall();
  }

  void OnReadDone(bool ok) override {
    OnReply(ok);
    if (ok) StartRead(&buffer_);
  }
  void OnDone(const grpc::Status& status) override { Finish(status, std::move(self_)); }

 private:
  proto::PullRequest request_;
  std::shared_ptr<Stream> self_;
};

class PushPullCall : public Stream,
                     public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  using Stream::Stream;

  static void Start(const grpc::internal::RpcMethod& method, grpc::Channel* channel,
                    const std::vector<const OutgoingChunk*>& chunks,
                    std::shared_ptr<PushPullCall> self) {
    if (!self->Prepare(self, chunks)) return;
    PushPullCall* stream = self.get();
    stream->self_ = std::move(self);
    grpc::internal::ClientCallbackReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
        channel, method, &stream->context_, stream);
    stream->WriteNext();
    stream->StartRead(&stream->buffer_);
    stream->StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnReadDone(bool ok) override {
    OnReply(ok);
    if (ok) StartRead(&buffer_);
  }
  void OnDone(const grpc::Status& status) override { Finish(status, std::move(self_)); }

 private:
  void WriteNext() {
    if (grpc::ByteBuffer* message = NextMessage()) {
      WriteOrWriteLast(*this, message);
    } else if (!wrote_last()) {
      StartWritesDone();
    }
  }

  std::shared_ptr<Stream> self_;
};

// Part `part` of `parts` over [0, count): a contiguous range, so each
// connection carries neighbouring chunks.
std::pair<size_t, size_t> PartRange(size_t count, size_t parts, size_t part) {
  return {count * part / parts, count * (part + 1) / parts};
}

std::vector<const OutgoingChunk*> PartOf(const std::vector<OutgoingChunk>& chunks, size_t parts,
                                         size_t part) {
  const auto range = PartRange(chunks.size(), parts, part);
  std::vector<const OutgoingChunk*> out;
  for (size_t i = range.first; i < range.second; ++i) out.push_back(&chunks[i]);
  return out;
}

uint64_t PayloadBytes(const std::vector<OutgoingChunk>& chunks) {
  uint64_t bytes = 0;
  for (const auto& chunk : chunks) bytes += chunk.payload().size();
  return bytes;
}

}  // namespace

struct GrpcShardTransport::Link {
  explicit Link(std::shared_ptr<grpc::Channel> channel_in)
      : channel(std::move(channel_in)),
        push_method("/harrier.proto.ParameterService/Push",
                    grpc::internal::RpcMethod::CLIENT_STREAMING, channel),
        pull_method("/harrier.proto.ParameterService/Pull",
                    grpc::internal::RpcMethod::SERVER_STREAMING, channel),
        push_pull_method("/harrier.proto.ParameterService/PushPull",
                         grpc::internal::RpcMethod::BIDI_STREAMING, channel) {}

  // The calls a waiting caller runs on its own thread (CallerWaitsScope):
  // gRPC's synchronous API drives the stream from this thread, and the
  // status is the call's done's.
  absl::Status PushHere(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                        CallCanceller& canceller, TimerThread& timer) const;
  absl::Status PullHere(const proto::PullRequest& request, const LandedChunkSink& sink,
                        absl::Time deadline, CallCanceller& canceller) const;
  absl::Status PushPullHere(const std::vector<OutgoingChunk>& chunks, const LandedChunkSink& sink,
                            absl::Time deadline, CallCanceller& canceller,
                            TimerThread& timer) const;

  const std::shared_ptr<grpc::Channel> channel;
  const grpc::internal::RpcMethod push_method;
  const grpc::internal::RpcMethod pull_method;
  const grpc::internal::RpcMethod push_pull_method;
};

namespace {

// Registers a call run on the caller's thread with the canceller for the
// scope's lifetime. Its abort may cancel the context under the canceller's
// lock: the synchronous API runs no reaction of ours from TryCancel.
class CancelScope {
 public:
  CancelScope(CallCanceller& canceller, grpc::ClientContext* context)
      : canceller_(canceller), context_(context) {
    registered_ = canceller_.Register(context_, [context] { context->TryCancel(); });
  }
  ~CancelScope() {
    if (registered_) canceller_.Unregister(context_);
  }
  bool registered() const { return registered_; }

 private:
  CallCanceller& canceller_;
  grpc::ClientContext* const context_;
  bool registered_ = false;
};

ChunkViewSink HostSink(const LandedChunkSink& sink) {
  return [&sink](const proto::TensorChunk& header, const PayloadView& payload) {
    return sink(header, payload, MemoryKind::kHost);
  };
}

template <typename Reader>
absl::Status ReadAll(Reader& reader, const LandedChunkSink& sink) {
  ReplyReader replies;
  const ChunkViewSink host = HostSink(sink);
  grpc::ByteBuffer message;
  while (reader.Read(&message)) replies.Take(message, host);
  return replies.status();
}

// Writes `chunks` on the stream `open(context)` makes, half-closes it, and
// returns `finish(stream)` once gRPC has let go of the borrowed slices. The
// call (owned by the context) keeps a message it could not send, slices
// included, until it is destroyed, so the release wait comes after the
// context's scope.
template <typename Open, typename Finish>
absl::Status WriteChunksHere(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                             CallCanceller& canceller, TimerThread& timer, Open open,
                             Finish finish) {
  BorrowedSlices borrowed;
  absl::Status status;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    CancelScope scope(canceller, &context);
    if (!scope.registered()) return absl::CancelledError("operation cancelled");
    auto stream = open(&context);
    // The last chunk carries the half-close; after it (sent or not) the
    // stream must not be closed a second time.
    bool closed = false;
    for (size_t i = 0; i < chunks.size(); ++i) {
      grpc::ByteBuffer message = EncodeChunk(chunks[i], borrowed);
      closed = i + 1 == chunks.size();
      const bool sent = closed ? stream->Write(message, grpc::WriteOptions().set_last_message())
                               : stream->Write(message);
      if (!sent) break;  // finishing says why
    }
    if (!closed) stream->WritesDone();
    status = finish(*stream);
  }
  return AfterRelease(borrowed, timer, std::move(status));
}

}  // namespace

absl::Status GrpcShardTransport::Link::PushHere(const std::vector<OutgoingChunk>& chunks,
                                                absl::Time deadline, CallCanceller& canceller,
                                                TimerThread& timer) const {
  grpc::ByteBuffer response;  // a PushResponse; nothing in it is needed
  return WriteChunksHere(
      chunks, deadline, canceller, timer,
      [&](grpc::ClientContext* context) {
        return std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>>(
            grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
                channel.get(), push_method, context, &response));
      },
      [](grpc::ClientWriter<grpc::ByteBuffer>& writer) { return FromGrpcStatus(writer.Finish()); });
}

absl::Status GrpcShardTransport::Link::PullHere(const proto::PullRequest& request,
                                                const LandedChunkSink& sink, absl::Time deadline,
                                                CallCanceller& canceller) const {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  CancelScope scope(canceller, &context);
  if (!scope.registered()) return absl::CancelledError("operation cancelled");
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), pull_method,
                                                                    &context, request));
  absl::Status sink_status = ReadAll(*reader, sink);
  absl::Status status = FromGrpcStatus(reader->Finish());
  return status.ok() ? sink_status : status;
}

absl::Status GrpcShardTransport::Link::PushPullHere(const std::vector<OutgoingChunk>& chunks,
                                                    const LandedChunkSink& sink,
                                                    absl::Time deadline, CallCanceller& canceller,
                                                    TimerThread& timer) const {
  using Stream = grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  return WriteChunksHere(
      chunks, deadline, canceller, timer,
      [&](grpc::ClientContext* context) {
        return std::unique_ptr<Stream>(
            grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
                channel.get(), push_pull_method, context));
      },
      [&sink](Stream& stream) {
        absl::Status sink_status = ReadAll(stream, sink);
        absl::Status status = FromGrpcStatus(stream.Finish());
        return status.ok() ? sink_status : status;
      });
}

GrpcShardTransport::GrpcShardTransport(std::shared_ptr<grpc::Channel> channel)
    : GrpcShardTransport(std::vector<std::shared_ptr<grpc::Channel>>{std::move(channel)}) {}

GrpcShardTransport::GrpcShardTransport(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                       size_t spread_min_bytes, std::shared_ptr<TimerThread> timer,
                                       std::shared_ptr<grpc::Channel> pull_channel)
    : ShardTransport(TransportTraits{"grpc"}),
      spread_min_bytes_(spread_min_bytes),
      timer_(timer != nullptr ? std::move(timer)
                              : std::make_shared<TimerThread>("grpc-transport")) {
  for (auto& channel : channels) links_.push_back(std::make_unique<Link>(std::move(channel)));
  if (pull_channel != nullptr) pull_link_ = std::make_unique<Link>(std::move(pull_channel));
}

const GrpcShardTransport::Link& GrpcShardTransport::PullLink(size_t part) const {
  return part == 0 && pull_link_ != nullptr ? *pull_link_ : *links_[part];
}

GrpcShardTransport::~GrpcShardTransport() = default;

size_t GrpcShardTransport::PartsFor(size_t count, uint64_t bytes) const {
  if (links_.size() < 2 || count < 2 || bytes < spread_min_bytes_) return 1;
  return std::min(links_.size(), count);
}

void GrpcShardTransport::StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                                   CallCanceller& canceller, CallDone done) {
  if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) {
    return done(refused);
  }
  const size_t parts = PartsFor(chunks.size(), PayloadBytes(chunks));
  if (parts == 1 && TakeCallerWaits()) {
    return done(links_[0]->PushHere(chunks, deadline, canceller, *timer_));
  }
  auto join = std::make_shared<PartsJoin>(parts, nullptr, std::move(done));
  for (size_t part = 0; part < parts; ++part) {
    const Link& link = *links_[part];
    PushCall::Start(link.push_method, link.channel.get(), PartOf(chunks, parts, part),
                    std::make_shared<PushCall>(deadline, canceller, *timer_, join, part));
  }
}

void GrpcShardTransport::StartPull(const proto::PullRequest& request,
                                   const ReplyLandingChooser* /*choose*/,
                                   const LandedChunkSink& sink, absl::Time deadline,
                                   CallCanceller& canceller, CallDone done) {
  uint64_t bytes = 0;
  for (const auto& ref : request.chunks()) bytes += ref.num_elements() * sizeof(float);
  const size_t parts = PartsFor(request.chunks_size(), bytes);
  if (parts == 1 && TakeCallerWaits()) {
    return done(PullLink(0).PullHere(request, sink, deadline, canceller));
  }
  auto join = std::make_shared<PartsJoin>(parts, &sink, std::move(done));
  for (size_t part = 0; part < parts; ++part) {
    proto::PullRequest sub = request;
    if (parts > 1) {
      sub.clear_chunks();
      const auto range = PartRange(request.chunks_size(), parts, part);
      for (size_t i = range.first; i < range.second; ++i) {
        *sub.add_chunks() = request.chunks(static_cast<int>(i));
      }
    }
    const Link& link = PullLink(part);
    PullCall::Start(link.pull_method, link.channel.get(), std::move(sub),
                    std::make_shared<PullCall>(deadline, canceller, *timer_, join, part));
  }
}

void GrpcShardTransport::StartPushPull(const std::vector<OutgoingChunk>& chunks,
                                       const ReplyLandingChooser* /*choose*/,
                                       const LandedChunkSink& sink, absl::Time deadline,
                                       CallCanceller& canceller, CallDone done) {
  if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) {
    return done(refused);
  }
  const size_t parts = PartsFor(chunks.size(), PayloadBytes(chunks));
  if (parts == 1 && TakeCallerWaits()) {
    return done(links_[0]->PushPullHere(chunks, sink, deadline, canceller, *timer_));
  }
  auto join = std::make_shared<PartsJoin>(parts, &sink, std::move(done));
  for (size_t part = 0; part < parts; ++part) {
    const Link& link = *links_[part];
    PushPullCall::Start(link.push_pull_method, link.channel.get(), PartOf(chunks, parts, part),
                        std::make_shared<PushPullCall>(deadline, canceller, *timer_, join, part));
  }
}

}  // namespace harrier
