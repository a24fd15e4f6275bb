#include "worker/transport/grpc/grpc_transport.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_wire.h"
#include "common/grpc_status.h"
#include "common/parallel_for.h"

namespace harrier {
namespace {

// Payloads below this are copied into the header's slice: one slice and no
// release tracking are cheaper than a borrowed slice for small messages.
constexpr size_t kBorrowThresholdBytes = 32 << 10;

// Registers the call's context for cancellation for the scope's lifetime.
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
  grpc::ClientContext* context_;
  bool registered_ = false;
};

absl::Status Cancelled() { return absl::CancelledError("operation cancelled"); }

// How long a call waits, after its call object is destroyed, for gRPC to
// release the payload slices it borrowed. gRPC may hold a slice after
// Finish() returned (the bytes may still sit in the TCP write queue); a
// healthy connection drains in milliseconds. A message a stream never sent
// stays with the call until the call is destroyed, so the wait comes after
// that: a call to a stopped shard then returns at its deadline (1.0 s after a
// 1 s deadline, 6.0 s when it waited first). After a shard is killed, gRPC
// still holds a slice past the call in some runs (4 of 6 of
// //tests/integration:shard_kill_training_grpc_test), so the grace stays:
// past it the call returns an error instead of hanging; gRPC only ever reads
// the bytes, and a dead connection never sends them, so the caller reusing
// its buffer cannot corrupt anything that is still delivered. (The count
// itself outlives the call, see below.)
constexpr absl::Duration kSliceReleaseGrace = absl::Seconds(5);

// Counts borrowed payload slices gRPC still references. A call waits for
// the count to reach zero before it returns and its caller may reuse the
// memory. The count lives in a shared block that every slice's destroy
// callback holds, so a release after a timed-out wait touches live memory.
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

  // OK once every borrowed slice is released; DEADLINE_EXCEEDED if gRPC
  // still holds some at `deadline`.
  absl::Status WaitReleased(absl::Time deadline) {
    absl::MutexLock lock(&state_->mutex);
    State* state = state_.get();
    auto released = [state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mutex) {
      return state->outstanding == 0;
    };
    if (state_->mutex.AwaitWithDeadline(absl::Condition(&released), deadline)) {
      return absl::OkStatus();
    }
    return absl::DeadlineExceededError(
        absl::StrCat("gRPC still holds ", state_->outstanding,
                     " payload slices of this call; gave up waiting for their release"));
  }

 private:
  struct State {
    absl::Mutex mutex;
    int outstanding ABSL_GUARDED_BY(mutex) = 0;
  };

  static void Release(void* arg) {
    auto* holder = static_cast<std::shared_ptr<State>*>(arg);
    {
      absl::MutexLock lock(&(*holder)->mutex);
      --(*holder)->outstanding;
    }
    delete holder;
  }

  std::shared_ptr<State> state_;
};

// The stream's status, which keeps its code (UNAVAILABLE stays retryable)
// if the borrowed payloads could not be reclaimed either.
absl::Status AfterRelease(BorrowedSlices& borrowed, absl::Status status) {
  absl::Status released = borrowed.WaitReleased(absl::Now() + kSliceReleaseGrace);
  if (released.ok()) return status;
  if (status.ok()) return released;
  return absl::Status(status.code(), absl::StrCat(status.message(), " (", released.message(), ")"));
}

grpc::ByteBuffer EncodeChunk(const OutgoingChunk& chunk, BorrowedSlices& borrowed) {
  const absl::string_view payload = chunk.payload();
  std::string prefix = EncodeChunkPrefix(chunk.header, payload.size());
  if (payload.size() < kBorrowThresholdBytes) {
    prefix.append(payload.data(), payload.size());
    grpc::Slice slice(prefix);
    return grpc::ByteBuffer(&slice, 1);
  }
  grpc::Slice slices[2] = {grpc::Slice(prefix), borrowed.Borrow(payload)};
  return grpc::ByteBuffer(slices, 2);
}

// Reads every reply, handing each to the sink; the first error (a malformed
// reply or the sink's) wins, but the stream is drained so Finish() reports
// the shard's own status.
template <typename Reader>
absl::Status ReadReplies(Reader* reader, const ChunkViewSink& sink) {
  grpc::ByteBuffer buffer;
  std::vector<grpc::Slice> slices;
  proto::TensorChunk header;
  PayloadView payload;
  absl::Status status;
  while (reader->Read(&buffer)) {
    if (!status.ok()) continue;
    slices.clear();
    if (!buffer.Dump(&slices).ok()) {
      status = absl::DataLossError("unreadable reply from the shard");
      continue;
    }
    header.Clear();
    status = DecodeChunk(slices, &header, &payload);
    if (!status.ok()) {
      status = absl::DataLossError(absl::StrCat("reply from the shard: ", status.message()));
      continue;
    }
    status = sink(header, payload);
  }
  return status;
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

  absl::Status Push(const std::vector<const OutgoingChunk*>& chunks, absl::Time deadline,
                    CallCanceller& canceller);
  absl::Status Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                    absl::Time deadline, CallCanceller& canceller);
  absl::Status PushPull(const std::vector<const OutgoingChunk*>& chunks,
                        const ChunkViewSink& sink, absl::Time deadline,
                        CallCanceller& canceller);

  const std::shared_ptr<grpc::Channel> channel;
  const grpc::internal::RpcMethod push_method;
  const grpc::internal::RpcMethod pull_method;
  const grpc::internal::RpcMethod push_pull_method;
};

namespace {

// Runs part(i) for i in [0, parts) on this thread and the shared
// parallel-for pool, and returns the first error by part order (every part
// runs to its end: each holds borrowed payloads until it has).
absl::Status RunParts(size_t parts, const std::function<absl::Status(size_t)>& part) {
  if (parts == 1) return part(0);
  std::vector<absl::Status> statuses(parts);
  ParallelFor(parts, [&](size_t i) { statuses[i] = part(i); });
  for (auto& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

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

// One sink call at a time: the parts' replies arrive on their own threads.
ChunkViewSink Serialised(const ChunkViewSink& sink, absl::Mutex* mutex, size_t parts) {
  if (parts == 1) return sink;
  return [&sink, mutex](const proto::TensorChunk& header, const PayloadView& payload) {
    absl::MutexLock lock(mutex);
    return sink(header, payload);
  };
}

uint64_t PayloadBytes(const std::vector<OutgoingChunk>& chunks) {
  uint64_t bytes = 0;
  for (const auto& chunk : chunks) bytes += chunk.payload().size();
  return bytes;
}

}  // namespace

GrpcShardTransport::GrpcShardTransport(std::shared_ptr<grpc::Channel> channel)
    : GrpcShardTransport(std::vector<std::shared_ptr<grpc::Channel>>{std::move(channel)}) {}

GrpcShardTransport::GrpcShardTransport(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                       size_t spread_min_bytes)
    : spread_min_bytes_(spread_min_bytes) {
  for (auto& channel : channels) links_.push_back(std::make_unique<Link>(std::move(channel)));
}

GrpcShardTransport::~GrpcShardTransport() = default;

size_t GrpcShardTransport::PartsFor(size_t count, uint64_t bytes) const {
  if (links_.size() < 2 || count < 2 || bytes < spread_min_bytes_) return 1;
  return std::min(links_.size(), count);
}

absl::Status GrpcShardTransport::Push(const std::vector<OutgoingChunk>& chunks,
                                      absl::Time deadline, CallCanceller& canceller) {
  if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) return refused;
  const size_t parts = PartsFor(chunks.size(), PayloadBytes(chunks));
  return RunParts(parts, [&](size_t part) {
    return links_[part]->Push(PartOf(chunks, parts, part), deadline, canceller);
  });
}

absl::Status GrpcShardTransport::Pull(const proto::PullRequest& request,
                                      const ChunkViewSink& sink, absl::Time deadline,
                                      CallCanceller& canceller) {
  uint64_t bytes = 0;
  for (const auto& ref : request.chunks()) bytes += ref.num_elements() * sizeof(float);
  const size_t parts = PartsFor(request.chunks_size(), bytes);
  if (parts == 1) return links_[0]->Pull(request, sink, deadline, canceller);
  absl::Mutex mutex;
  const ChunkViewSink serialised = Serialised(sink, &mutex, parts);
  return RunParts(parts, [&](size_t part) {
    proto::PullRequest sub = request;
    sub.clear_chunks();
    const auto range = PartRange(request.chunks_size(), parts, part);
    for (size_t i = range.first; i < range.second; ++i) {
      *sub.add_chunks() = request.chunks(static_cast<int>(i));
    }
    return links_[part]->Pull(sub, serialised, deadline, canceller);
  });
}

absl::Status GrpcShardTransport::PushPull(const std::vector<OutgoingChunk>& chunks,
                                          const ChunkViewSink& sink, absl::Time deadline,
                                          CallCanceller& canceller) {
  if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) return refused;
  const size_t parts = PartsFor(chunks.size(), PayloadBytes(chunks));
  absl::Mutex mutex;
  const ChunkViewSink serialised = Serialised(sink, &mutex, parts);
  return RunParts(parts, [&](size_t part) {
    return links_[part]->PushPull(PartOf(chunks, parts, part), serialised, deadline, canceller);
  });
}

absl::Status GrpcShardTransport::Link::Push(const std::vector<const OutgoingChunk*>& chunks,
                                            absl::Time deadline, CallCanceller& canceller) {
  BorrowedSlices borrowed;  // declared first: outlives the call's objects
  absl::Status status;
  {
    // The call (owned by the context) keeps a message it could not send,
    // slices included, until it is destroyed: a stream to a killed shard
    // releases them only here, so the wait below comes after this scope.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    CancelScope scope(canceller, &context);
    if (!scope.registered()) return Cancelled();
    grpc::ByteBuffer response;  // a PushResponse; nothing in it is needed
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), push_method,
                                                                      &context, &response));
    for (const OutgoingChunk* chunk : chunks) {
      if (!writer->Write(EncodeChunk(*chunk, borrowed))) break;  // Finish() says why
    }
    writer->WritesDone();
    status = FromGrpcStatus(writer->Finish());
  }
  return AfterRelease(borrowed, status);
}

absl::Status GrpcShardTransport::Link::Pull(const proto::PullRequest& request,
                                            const ChunkViewSink& sink, absl::Time deadline,
                                            CallCanceller& canceller) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  CancelScope scope(canceller, &context);
  if (!scope.registered()) return Cancelled();
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), pull_method,
                                                                    &context, request));
  absl::Status sink_status = ReadReplies(reader.get(), sink);
  absl::Status status = FromGrpcStatus(reader->Finish());
  return status.ok() ? sink_status : status;
}

absl::Status GrpcShardTransport::Link::PushPull(const std::vector<const OutgoingChunk*>& chunks,
                                                const ChunkViewSink& sink, absl::Time deadline,
                                                CallCanceller& canceller) {
  BorrowedSlices borrowed;  // declared first: outlives the call's objects
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  CancelScope scope(canceller, &context);
  if (!scope.registered()) return Cancelled();
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), push_pull_method, &context));
  for (const OutgoingChunk* chunk : chunks) {
    if (!stream->Write(EncodeChunk(*chunk, borrowed))) break;
  }
  stream->WritesDone();
  absl::Status sink_status = ReadReplies(stream.get(), sink);
  absl::Status status = FromGrpcStatus(stream->Finish());
  stream.reset();
  return AfterRelease(borrowed, status.ok() ? sink_status : status);
}

}  // namespace harrier
