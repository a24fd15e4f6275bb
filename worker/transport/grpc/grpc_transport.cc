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
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/queue_event.h"

namespace harrier {
namespace {

// Payloads below this are copied into the header's slice: one slice and no
// release tracking are cheaper than a borrowed slice for small messages.
constexpr size_t kBorrowThresholdBytes = 32 << 10;

// GrpcSendCounters, process-wide as the send buffers are.
std::atomic<int64_t> send_copied_bytes{0};
std::atomic<int64_t> send_lent_bytes{0};

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
// A caller's own staging (OutgoingChunk::send_in_place) is lent: its owner
// wrote it this step and leaves it alone until the call completes, so a
// copy would add one without sparing one (docs/performance.md, "Staging
// buffers").
class SendBufferPool {
 public:
  static SendBufferPool& Instance() {
    static SendBufferPool* pool = new SendBufferPool();  // never destroyed: slices outlive main
    return *pool;
  }

  // A slice holding a copy of `bytes`, or nullopt when kMaxStagedBytes are
  // in use already. With `crc`, also sets *crc to the CRC32C of `bytes`,
  // taken during the copy (Crc32cCopy): the caller's memory is read once.
  std::optional<grpc::Slice> Copy(absl::string_view bytes, uint32_t* crc = nullptr) {
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
    if (crc == nullptr) {
      std::memcpy(buffer->data.get(), bytes.data(), bytes.size());
    } else {
      *crc = Crc32cCopy(0, buffer->data.get(), bytes.data(), bytes.size());
    }
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
  if (payload.size() < kBorrowThresholdBytes) {
    std::string prefix = EncodeChunkPrefix(
        chunk.checksum_pending ? WireHeader(chunk) : chunk.header, payload.size());
    prefix.append(payload.data(), payload.size());
    grpc::Slice slice(prefix);
    return grpc::ByteBuffer(&slice, 1);
  }
  std::optional<grpc::Slice> staged;
  uint32_t copied_crc = 0;
  // Only the caller's memory; an owned payload (compressed, or staged from
  // a device) was just written and is lent as it is, and so is the
  // caller's staging that it wrote just before the push.
  if (chunk.is_borrowed && chunk.borrowed_memory == MemoryKind::kHost && !chunk.send_in_place) {
    staged =
        SendBufferPool::Instance().Copy(payload, chunk.checksum_pending ? &copied_crc : nullptr);
  }
  std::string prefix;
  if (chunk.checksum_pending) {
    // A payload lent rather than copied (sent in place, or the pool is
    // full) is read for its CRC here.
    proto::TensorChunk header = chunk.header;
    header.set_checksum(staged.has_value() ? copied_crc : ChecksumOf(chunk));
    prefix = EncodeChunkPrefix(header, payload.size());
  } else {
    prefix = EncodeChunkPrefix(chunk.header, payload.size());
  }
  (staged.has_value() ? send_copied_bytes : send_lent_bytes)
      .fetch_add(static_cast<int64_t>(payload.size()), std::memory_order_relaxed);
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

// One stream of a call, whatever its kind, on the transport's completion
// queue: owns its context and messages, registers with the canceller and
// the queue, and reads replies. Its reactions run on the queue's thread;
// the operations the caller's thread starts in Start may complete there
// before Start returns. Counts the operations in flight: once the last is
// back (and Start is over), the stream deletes itself, which destroys its
// call and any message the stream never sent, and ends its part once gRPC
// has released the borrowed slices (no thread waits for that).
class Stream {
 public:
  Stream(absl::Time deadline, CallCanceller& canceller, std::shared_ptr<TimerThread> timer,
         std::shared_ptr<PartsJoin> join, size_t part)
      : canceller_(canceller), timer_(std::move(timer)), join_(std::move(join)), part_(part) {
    context_.set_deadline(absl::ToChronoTime(deadline));
  }
  virtual ~Stream() = default;

 protected:
  // Registers the stream with the canceller and holds `calls`. False: the
  // call was cancelled or the queue is closing; the part has ended and the
  // stream is deleted. The abort cancels the context directly: with the
  // asynchronous API no reaction runs from TryCancel, so the canceller's
  // lock is safe to hold.
  bool Open(ClientCallQueue& calls) {
    absl::Status refused;
    if (!canceller_.Register(this, [this] { context_.TryCancel(); })) {
      refused = absl::CancelledError("operation cancelled");
    } else if (open_ = calls.Open(&context_); open_ == nullptr) {
      canceller_.Unregister(this);
      refused = absl::CancelledError("the transport is shutting down");
    }
    if (refused.ok()) return true;
    join_->PartDone(part_, std::move(refused));
    delete this;
    return false;
  }

  // Opens the stream and encodes its messages (false: as Open).
  bool Prepare(ClientCallQueue& calls, const std::vector<const OutgoingChunk*>& chunks) {
    if (!Open(calls)) return false;
    for (const OutgoingChunk* chunk : chunks) messages_.push_back(EncodeChunk(*chunk, borrowed_));
    return true;
  }

  grpc::CompletionQueue* queue() { return open_->queue(); }

  // An operation is about to start / has come back. The count starts at
  // one, for Start; Start's last step gives it back.
  void Hold() { in_flight_.Hold(); }
  void Release() {
    if (in_flight_.Release()) End();
  }

  // Writes the next message on `writer` (a client writer or reader-writer)
  // with `event`: the last one carries the half-close with it (one HTTP/2
  // frame and no extra round), so the shard sees the end of the push with
  // its last chunk. Nothing once the half-close went out.
  template <class Writer>
  void WriteNext(Writer& writer, QueueEvent* event) {
    if (closed_) return;
    Hold();
    if (next_ == messages_.size()) {  // no message at all: only the close
      closed_ = true;
      writer.WritesDone(Sent(event));
      return;
    }
    grpc::ByteBuffer& message = messages_[next_++];
    if (next_ == messages_.size()) {
      closed_ = true;
      writer.Write(message, grpc::WriteOptions().set_last_message(), Sent(event));
    } else {
      writer.Write(message, Sent(event));
    }
  }

  // One reply message (`ok`: one was read).
  void OnReply(bool ok) {
    if (ok)
      replies_.Take(buffer_, [this](const proto::TensorChunk& header, const PayloadView& payload) {
        return join_->Reply(header, payload);
      });
  }

  grpc::ClientContext context_;
  grpc::ByteBuffer buffer_;  // the reply being read
  grpc::Status status_;      // the stream's, filled by its Finish

 private:
  // The last operation is back: drops the stream and ends the part once
  // the borrowed slices are back.
  void End() {
    canceller_.Unregister(this);
    open_.reset();
    absl::Status status = FromGrpcStatus(status_);
    if (status.ok()) status = replies_.status();
    BorrowedSlices borrowed = borrowed_;
    std::shared_ptr<TimerThread> timer = std::move(timer_);
    std::shared_ptr<PartsJoin> join = join_;
    const size_t part = part_;
    delete this;
    borrowed.WhenReleased(*timer, kSliceReleaseGrace, [join, part, status](absl::Status released) {
      join->PartDone(part, WithRelease(status, released));
    });
  }

  std::unique_ptr<ClientCallQueue::OpenCall> open_;
  CallCanceller& canceller_;
  // Shared: a stream may end after its transport is gone (destroyed by a
  // completion on the queue's thread, which cannot wait for the calls).
  std::shared_ptr<TimerThread> timer_;
  const std::shared_ptr<PartsJoin> join_;
  const size_t part_;
  OperationCount in_flight_{1};
  BorrowedSlices borrowed_;
  std::vector<grpc::ByteBuffer> messages_;
  size_t next_ = 0;      // the next message to write
  bool closed_ = false;  // the half-close went out (with the last message or alone)
  ReplyReader replies_;
};

// A push: the messages one after another, the last with the half-close.
// The status (with the shard's empty PushResponse) is asked for at once:
// only that operation receives the shard's metadata.
class PushCall final : public Stream {
 public:
  using Stream::Stream;

  static void Start(const grpc::internal::RpcMethod& method, grpc::Channel* channel,
                    ClientCallQueue& calls, const std::vector<const OutgoingChunk*>& chunks,
                    PushCall* stream) {
    if (!stream->Prepare(calls, chunks)) return;
    // The metadata goes with the first message, in one batch.
    stream->context_.set_initial_metadata_corked(true);
    stream->writer_ = grpc::internal::ClientAsyncWriterFactory<grpc::ByteBuffer>::Create(
        channel, stream->queue(), method, &stream->context_, &stream->response_, false, nullptr);
    stream->writer_->StartCall(nullptr);  // corked: no operation of its own
    stream->Hold();
    stream->writer_->Finish(&stream->status_, Sent(&stream->finish_event_));
    stream->WriteNext(*stream->writer_, &stream->write_event_);
    stream->Release();
  }

 private:
  void WriteDone(bool ok) {
    if (ok) WriteNext(*writer_, &write_event_);  // else the stream failed: its status says why
    Release();
  }
  void FinishDone(bool) { Release(); }

  grpc::ClientAsyncWriter<grpc::ByteBuffer>* writer_ = nullptr;  // in the call's arena
  grpc::ByteBuffer response_;  // a PushResponse; nothing in it is needed
  MemberEvent<PushCall, &PushCall::WriteDone> write_event_{this};
  MemberEvent<PushCall, &PushCall::FinishDone> finish_event_{this};
};

// Reads replies until the stream ends, then asks for its status (Finish
// only after the reads: the first read receives the shard's metadata).
template <class Self, class Reader>
class ReadsReplies {
 protected:
  void StartReading(Reader& reader) {
    Self& self = static_cast<Self&>(*this);
    self.Hold();
    reader.Read(&self.buffer_, Sent(&read_event_));
  }

 private:
  void ReadDone(bool ok) {
    Self& self = static_cast<Self&>(*this);
    self.OnReply(ok);
    self.Hold();
    if (ok) {
      self.reader().Read(&self.buffer_, Sent(&read_event_));
    } else {
      self.reader().Finish(&self.status_, Sent(&finish_event_));
    }
    self.Release();
  }
  void FinishDone(bool) { static_cast<Self&>(*this).Release(); }

  MemberEvent<ReadsReplies, &ReadsReplies::ReadDone> read_event_{this};
  MemberEvent<ReadsReplies, &ReadsReplies::FinishDone> finish_event_{this};
};

class PullCall final : public Stream,
                       public ReadsReplies<PullCall, grpc::ClientAsyncReader<grpc::ByteBuffer>> {
 public:
  using Stream::Stream;

  static void Start(const grpc::internal::RpcMethod& method, grpc::Channel* channel,
                    ClientCallQueue& calls, proto::PullRequest request, PullCall* stream) {
    if (!stream->Open(calls)) return;
    // The request, its metadata and the half-close go out in one batch.
    stream->reader_ = grpc::internal::ClientAsyncReaderFactory<grpc::ByteBuffer>::Create(
        channel, stream->queue(), method, &stream->context_, request, false, nullptr);
    stream->Hold();
    stream->reader_->StartCall(Sent(&stream->start_event_));
    stream->StartReading(*stream->reader_);
    stream->Release();
  }

 private:
  friend class ReadsReplies<PullCall, grpc::ClientAsyncReader<grpc::ByteBuffer>>;
  grpc::ClientAsyncReader<grpc::ByteBuffer>& reader() { return *reader_; }
  void StartDone(bool) { Release(); }

  grpc::ClientAsyncReader<grpc::ByteBuffer>* reader_ = nullptr;  // in the call's arena
  MemberEvent<PullCall, &PullCall::StartDone> start_event_{this};
};

using AsyncReaderWriter = grpc::ClientAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

class PushPullCall final : public Stream, public ReadsReplies<PushPullCall, AsyncReaderWriter> {
 public:
  using Stream::Stream;

  static void Start(const grpc::internal::RpcMethod& method, grpc::Channel* channel,
                    ClientCallQueue& calls, const std::vector<const OutgoingChunk*>& chunks,
                    PushPullCall* stream) {
    if (!stream->Prepare(calls, chunks)) return;
    stream->context_.set_initial_metadata_corked(true);
    stream->stream_ =
        grpc::internal::ClientAsyncReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel, stream->queue(), method, &stream->context_, false, nullptr);
    stream->stream_->StartCall(nullptr);  // corked: no operation of its own
    stream->StartReading(*stream->stream_);
    stream->WriteNext(*stream->stream_, &stream->write_event_);
    stream->Release();
  }

 private:
  friend class ReadsReplies<PushPullCall, AsyncReaderWriter>;
  AsyncReaderWriter& reader() { return *stream_; }
  void WriteDone(bool ok) {
    if (ok) WriteNext(*stream_, &write_event_);
    Release();
  }

  AsyncReaderWriter* stream_ = nullptr;  // in the call's arena
  MemberEvent<PushPullCall, &PushPullCall::WriteDone> write_event_{this};
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
                                       std::shared_ptr<grpc::Channel> pull_channel,
                                       std::shared_ptr<ClientCallQueue> calls)
    : ShardTransport(TransportTraits{"grpc"}),
      spread_min_bytes_(spread_min_bytes),
      timer_(timer != nullptr ? std::move(timer)
                              : std::make_shared<TimerThread>("grpc-transport")),
      calls_(calls != nullptr ? std::move(calls) : std::make_shared<ClientCallQueue>("grpc-calls")) {
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
    PushCall::Start(link.push_method, link.channel.get(), *calls_, PartOf(chunks, parts, part),
                    new PushCall(deadline, canceller, timer_, join, part));
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
    PullCall::Start(link.pull_method, link.channel.get(), *calls_, std::move(sub),
                    new PullCall(deadline, canceller, timer_, join, part));
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
    PushPullCall::Start(link.push_pull_method, link.channel.get(), *calls_,
                        PartOf(chunks, parts, part),
                        new PushPullCall(deadline, canceller, timer_, join, part));
  }
}

GrpcSendCounters GrpcSendCountersNow() {
  GrpcSendCounters counters;
  counters.copied_bytes = send_copied_bytes.load(std::memory_order_relaxed);
  counters.lent_bytes = send_lent_bytes.load(std::memory_order_relaxed);
  return counters;
}

}  // namespace harrier
