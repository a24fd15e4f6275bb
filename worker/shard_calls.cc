#include "worker/shard_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace harrier {
ShardCalls::ShardCalls(ShardCallsConfig config, std::vector<ShardTransport*> transports,
                       ChunkCodec& codec, const OperationEngine& engine)
    : config_(std::move(config)),
      transports_(std::move(transports)),
      codec_(codec),
      engine_(engine),
      acknowledged_(transports_.size()) {}

absl::StatusOr<std::vector<OutgoingChunk>> ShardCalls::BuildChunks(const std::string& name,
                                                                   const ShardGroup& group,
                                                                   const float* gradient,
                                                                   int64_t clock) {
  std::vector<OutgoingChunk> chunks(group.spans.size());
  // Device tensors' dense chunks go out from device memory where the
  // transport can; ChunkCodec stages them otherwise.
  const bool sends_from_device = transports_[group.shard]->SendsFromDeviceMemory();
  for (size_t i = 0; i < group.spans.size(); ++i) {
    const ChunkSpan& span = group.spans[i];
    proto::TensorChunk& header = chunks[i].header;
    header.set_job(config_.job);
    header.set_rank(config_.rank);
    *header.mutable_session() = config_.session;
    header.set_key(name);
    header.set_chunk(span.chunk);
    header.set_clock(clock);
    header.set_num_elements(span.num_elements);
    header.set_dtype(proto::DTYPE_FLOAT32);
    if (auto status =
            codec_.EncodePush(ChunkKey{name, span.chunk},
                              absl::MakeConstSpan(gradient + span.offset, span.num_elements), clock,
                              config_.rank, &chunks[i], sends_from_device);
        !status.ok()) {
      return status;
    }
    bytes_pushed_ += chunks[i].payload().size();
  }
  return chunks;
}

absl::Status ShardCalls::OnShard(Operation& op, int shard,
                                 const std::function<absl::Status()>& attempt) {
  absl::Status status = engine_.WithRetries(op.canceller(), attempt);
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(config_.shard_name(shard), ": ", status.message()));
}

absl::Status ShardCalls::ReceiveInto(Operation& op, const std::string& name,
                                     const ShardGroup& group, float* out,
                                     const ReceivingCall& call) {
  size_t received = 0;
  const LandedChunkSink sink = [&](const proto::TensorChunk& reply, const PayloadView& payload,
                                   MemoryKind memory) {
    ++received;
    if (auto status = codec_.DecodePull(name, group.spans, reply, payload, out, memory);
        !status.ok()) {
      return status;
    }
    bytes_pulled_ += payload.size();
    last_min_clock_ = reply.min_clock();
    return absl::OkStatus();
  };
  const bool land = transports_[group.shard]->ReceivesIntoDeviceMemory() &&
                    codec_.LandsInDeviceMemory(name);
  absl::Status status = OnShard(op, group.shard, [&] {
    received = 0;  // a retried call starts over
    if (!land) return call(nullptr, sink);
    // Per attempt: the buffers go back once the transport call returned.
    ChunkCodec::Landings landings;
    const ReplyLandingChooser choose = [&](const proto::TensorChunk& header, size_t bytes) {
      return codec_.Land(name, group.spans, header, bytes, &landings);
    };
    return call(&choose, sink);
  });
  if (!status.ok() || received == group.spans.size()) return status;
  return absl::DataLossError(absl::StrCat(config_.shard_name(group.shard), ": ", received, " of ",
                                          group.spans.size(), " chunks of '", name, "' arrived"));
}

absl::Status ShardCalls::Push(Operation& op, const std::string& name, const ShardGroup& group,
                              const float* gradient, int64_t clock) {
  auto chunks = BuildChunks(name, group, gradient, clock);
  if (!chunks.ok()) return chunks.status();
  absl::Status status = OnShard(op, group.shard, [&] {
    return PushBlocking(*transports_[group.shard], *chunks, Deadline(), op.canceller());
  });
  if (status.ok()) Acknowledged(name, group, clock);
  return status;
}

void ShardCalls::Acknowledged(const std::string& name, const ShardGroup& group, int64_t clock) {
  absl::MutexLock lock(&acknowledged_mutex_);
  auto& chunks = acknowledged_[group.shard];
  for (const ChunkSpan& span : group.spans) {
    int64_t& next = chunks[{name, span.chunk}];
    next = std::max(next, clock + 1);
  }
}

void ShardCalls::AddAcknowledgedClocks(int shard, proto::HeartbeatRequest* request) const {
  absl::MutexLock lock(&acknowledged_mutex_);
  if (shard < 0 || static_cast<size_t>(shard) >= acknowledged_.size()) return;
  for (const auto& [chunk, next] : acknowledged_[shard]) {
    proto::ChunkClock* entry = request->add_pushed();
    entry->set_key(chunk.first);
    entry->set_chunk(chunk.second);
    entry->set_next_clock(next);
  }
}

absl::Status ShardCalls::Pull(Operation& op, const std::string& name, const ShardGroup& group,
                              float* out, int64_t clock) {
  proto::PullRequest request;
  request.set_job(config_.job);
  request.set_rank(config_.rank);
  *request.mutable_session() = config_.session;
  request.set_clock(clock);
  for (const ChunkSpan& span : group.spans) {
    proto::ChunkRef* ref = request.add_chunks();
    ref->set_key(name);
    ref->set_chunk(span.chunk);
    ref->set_num_elements(span.num_elements);
    const std::string& pull_params = codec_.PullParams(ChunkKey{name, span.chunk});
    if (!pull_params.empty()) ref->set_codec_params(pull_params);
  }
  return ReceiveInto(op, name, group, out,
                     [&](const ReplyLandingChooser* choose, const LandedChunkSink& sink) {
    // Each attempt says which pull views it holds now (ChunkCodec::ViewVersion).
    for (proto::ChunkRef& ref : *request.mutable_chunks()) {
      ref.set_view_version(codec_.ViewVersion(ChunkKey{name, ref.chunk()}));
    }
    return PullBlocking(*transports_[group.shard], request, choose, sink, Deadline(),
                        op.canceller());
  });
}

absl::Status ShardCalls::PushPull(Operation& op, const std::string& name, const ShardGroup& group,
                                  const float* gradient, float* out, int64_t clock) {
  auto chunks = BuildChunks(name, group, gradient, clock);
  if (!chunks.ok()) return chunks.status();
  absl::Status status = ReceiveInto(
      op, name, group, out, [&](const ReplyLandingChooser* choose, const LandedChunkSink& sink) {
        for (OutgoingChunk& chunk : *chunks) {  // as in Pull
          chunk.header.set_pull_view_version(
              codec_.ViewVersion(ChunkKey{name, chunk.header.chunk()}));
        }
        return PushPullBlocking(*transports_[group.shard], *chunks, choose, sink, Deadline(),
                                op.canceller());
      });
  if (status.ok()) Acknowledged(name, group, clock);
  return status;
}

}  // namespace harrier
