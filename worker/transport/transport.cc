#include "worker/transport/transport.h"

#include <algorithm>
#include <string>

namespace harrier {

bool CallCanceller::Register(const void* call, std::function<void()> abort) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancelled_) return false;
  calls_.emplace_back(call, std::move(abort));
  return true;
}

void CallCanceller::Unregister(const void* call) {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                              [call](const auto& entry) { return entry.first == call; }),
               calls_.end());
}

void CallCanceller::CancelAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = true;
  for (auto& entry : calls_) entry.second();
}

bool CallCanceller::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

proto::TensorChunk OutgoingChunk::ToProto() const {
  proto::TensorChunk chunk = header;
  const absl::string_view bytes = payload();
  chunk.set_payload(std::string(bytes));
  return chunk;
}

namespace {

std::vector<proto::TensorChunk> ToProtos(const std::vector<OutgoingChunk>& chunks) {
  std::vector<proto::TensorChunk> protos;
  protos.reserve(chunks.size());
  for (const OutgoingChunk& chunk : chunks) protos.push_back(chunk.ToProto());
  return protos;
}

// The views point into `chunks`, which outlive the call they are used for.
std::vector<OutgoingChunk> ToViews(const std::vector<proto::TensorChunk>& chunks) {
  std::vector<OutgoingChunk> views(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    views[i].header = chunks[i];
    views[i].header.clear_payload();
    views[i].borrowed = chunks[i].payload();
    views[i].is_borrowed = true;
  }
  return views;
}

ChunkSink ToProtoSink(const ChunkViewSink& sink) {
  return [&sink](const proto::TensorChunk& chunk) {
    return sink(chunk, PayloadView(chunk.payload()));
  };
}

ChunkViewSink ToViewSink(const ChunkSink& sink) {
  return [&sink](const proto::TensorChunk& header, const PayloadView& payload) {
    proto::TensorChunk chunk = header;
    std::string bytes(payload.size(), '\0');
    payload.CopyTo(bytes.data());
    chunk.set_payload(std::move(bytes));
    return sink(chunk);
  };
}

}  // namespace

// Default adapters between the two forms; see transport.h. A backend that
// overrides neither form of an operation would recurse forever, so each
// backend's tests exercise every operation.
absl::Status ShardTransport::Push(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                                  CallCanceller& canceller) {
  return Push(ToProtos(chunks), deadline, canceller);
}

absl::Status ShardTransport::Pull(const proto::PullRequest& request, const ChunkViewSink& sink,
                                  absl::Time deadline, CallCanceller& canceller) {
  return Pull(request, ToProtoSink(sink), deadline, canceller);
}

absl::Status ShardTransport::PushPull(const std::vector<OutgoingChunk>& chunks,
                                      const ChunkViewSink& sink, absl::Time deadline,
                                      CallCanceller& canceller) {
  return PushPull(ToProtos(chunks), ToProtoSink(sink), deadline, canceller);
}

absl::Status ShardTransport::Push(const std::vector<proto::TensorChunk>& chunks,
                                  absl::Time deadline, CallCanceller& canceller) {
  return Push(ToViews(chunks), deadline, canceller);
}

absl::Status ShardTransport::Pull(const proto::PullRequest& request, const ChunkSink& sink,
                                  absl::Time deadline, CallCanceller& canceller) {
  return Pull(request, ToViewSink(sink), deadline, canceller);
}

absl::Status ShardTransport::PushPull(const std::vector<proto::TensorChunk>& chunks,
                                      const ChunkSink& sink, absl::Time deadline,
                                      CallCanceller& canceller) {
  return PushPull(ToViews(chunks), ToViewSink(sink), deadline, canceller);
}

}  // namespace harrier
