#include "worker/transport/grpc/grpc_transport.h"

#include "common/grpc_status.h"

namespace harrier {
namespace {

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

// Reads every reply, handing each to the sink; the first sink error wins,
// but the stream is drained so Finish() reports the shard's own status.
template <typename Reader>
absl::Status ReadReplies(Reader* reader, const ChunkSink& sink) {
  proto::TensorChunk reply;
  absl::Status status;
  while (reader->Read(&reply)) {
    if (status.ok()) status = sink(reply);
  }
  return status;
}

}  // namespace

GrpcShardTransport::GrpcShardTransport(std::shared_ptr<grpc::Channel> channel)
    : stub_(proto::ParameterService::NewStub(std::move(channel))) {}

absl::Status GrpcShardTransport::RegisterMemory(void*, size_t, MemoryKind kind) {
  if (kind != MemoryKind::kHost) {
    return absl::UnimplementedError("the gRPC transport reads host memory only");
  }
  return absl::OkStatus();
}

absl::Status GrpcShardTransport::Push(const std::vector<proto::TensorChunk>& chunks,
                                      absl::Time deadline, CallCanceller& canceller) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  CancelScope scope(canceller, &context);
  if (!scope.registered()) return Cancelled();
  proto::PushResponse response;
  auto writer = stub_->Push(&context, &response);
  for (const auto& chunk : chunks) {
    if (!writer->Write(chunk)) break;  // Finish() says why
  }
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

absl::Status GrpcShardTransport::Pull(const proto::PullRequest& request, const ChunkSink& sink,
                                      absl::Time deadline, CallCanceller& canceller) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  CancelScope scope(canceller, &context);
  if (!scope.registered()) return Cancelled();
  auto reader = stub_->Pull(&context, request);
  absl::Status sink_status = ReadReplies(reader.get(), sink);
  absl::Status status = FromGrpcStatus(reader->Finish());
  return status.ok() ? sink_status : status;
}

absl::Status GrpcShardTransport::PushPull(const std::vector<proto::TensorChunk>& chunks,
                                          const ChunkSink& sink, absl::Time deadline,
                                          CallCanceller& canceller) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  CancelScope scope(canceller, &context);
  if (!scope.registered()) return Cancelled();
  auto stream = stub_->PushPull(&context);
  for (const auto& chunk : chunks) {
    if (!stream->Write(chunk)) break;
  }
  stream->WritesDone();
  absl::Status sink_status = ReadReplies(stream.get(), sink);
  absl::Status status = FromGrpcStatus(stream->Finish());
  return status.ok() ? sink_status : status;
}

}  // namespace harrier
