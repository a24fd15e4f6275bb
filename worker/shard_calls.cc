#include "worker/shard_calls.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace harrier {
ShardCalls::ShardCalls(ShardCallsConfig config, std::vector<ShardTransport*> transports,
                       ChunkCodec& codec, OperationEngine& engine)
    : config_(std::move(config)),
      transports_(std::move(transports)),
      codec_(codec),
      engine_(engine),
      shard_bytes_pushed_(new std::atomic<uint64_t>[transports_.size()]()),
      shard_bytes_pulled_(new std::atomic<uint64_t>[transports_.size()]()),
      acknowledged_(transports_.size()) {}

std::vector<uint64_t> ShardCalls::bytes_pushed_per_shard() const {
  std::vector<uint64_t> bytes(transports_.size());
  for (size_t s = 0; s < bytes.size(); ++s) bytes[s] = shard_bytes_pushed_[s];
  return bytes;
}

std::vector<uint64_t> ShardCalls::bytes_pulled_per_shard() const {
  std::vector<uint64_t> bytes(transports_.size());
  for (size_t s = 0; s < bytes.size(); ++s) bytes[s] = shard_bytes_pulled_[s];
  return bytes;
}

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
    shard_bytes_pushed_[group.shard] += chunks[i].payload().size();
  }
  return chunks;
}

void ShardCalls::OnShard(Operation& op, int shard, OperationEngine::Attempt attempt, Done done) {
  engine_.WithRetries(op.canceller(), std::move(attempt),
                      [this, shard, done = std::move(done)](absl::Status status) {
                        if (!status.ok()) {
                          status = absl::Status(status.code(), absl::StrCat(config_.shard_name(shard),
                                                                            ": ", status.message()));
                        }
                        done(std::move(status));
                      });
}

namespace {

// A pull-like call's reading state, shared by its tries.
struct Receiving {
  std::atomic<size_t> received{0};
  LandedChunkSink sink;
};

// Whether `a` and `b`, a tensor's buffers, overlap where `group`'s chunks
// lie (a null `a`: no).
bool SharesMemory(const float* a, const float* b, const ShardGroup& group) {
  if (a == nullptr || group.spans.empty()) return false;
  size_t low = group.spans.front().offset, high = low;
  for (const ChunkSpan& span : group.spans) {
    low = std::min<size_t>(low, span.offset);
    high = std::max<size_t>(high, span.offset + span.num_elements);
  }
  const auto begin = [low](const float* p) { return reinterpret_cast<uintptr_t>(p + low); };
  const auto end = [high](const float* p) { return reinterpret_cast<uintptr_t>(p + high); };
  return begin(a) < end(b) && begin(b) < end(a);
}

// One try's landing buffers and the chooser that hands them out.
struct TryLandings {
  ChunkCodec::Landings landings;
  ReplyLandingChooser choose;
};

}  // namespace

void ShardCalls::ReceiveInto(Operation& op, const std::string& name, const ShardGroup& group,
                             float* out, const float* pushed_from, ReceivingCall call, Done done) {
  auto receiving = std::make_shared<Receiving>();
  Receiving* state = receiving.get();
  receiving->sink = [this, state, name, &group, out](const proto::TensorChunk& reply,
                                                     const PayloadView& payload,
                                                     MemoryKind memory) {
    ++state->received;
    if (auto status = codec_.DecodePull(name, group.spans, reply, payload, out, memory);
        !status.ok()) {
      return status;
    }
    bytes_pulled_ += payload.size();
    shard_bytes_pulled_[group.shard] += payload.size();
    last_min_clock_ = reply.min_clock();
    return absl::OkStatus();
  };
  const bool land = transports_[group.shard]->ReceivesIntoDeviceMemory() &&
                    codec_.LandsInDeviceMemory(name);
  // A staging buffer takes its replies in place: one chooser for every try
  // (a transport that lands nothing in host memory, gRPC, ignores it). Not
  // where a push-pull's gradient shares the memory: a try cut short would
  // leave parameters where its retry pushes from.
  std::shared_ptr<const ReplyLandingChooser> in_staging;
  if (!land && !SharesMemory(pushed_from, out, group) && codec_.LandsInStaging(name)) {
    in_staging = std::make_shared<const ReplyLandingChooser>(
        [this, name, &group, out](const proto::TensorChunk& header, size_t bytes) {
          return codec_.LandInStaging(name, group.spans, header, bytes, out);
        });
  }
  OnShard(
      op, group.shard,
      [this, receiving, call = std::move(call), land, in_staging, name, &group](CallDone try_done) {
        receiving->received = 0;  // a retried call starts over
        // This closure lives until the operation ends, and with it the chooser.
        if (in_staging != nullptr) {
          return call(in_staging.get(), receiving->sink, std::move(try_done));
        }
        if (!land) return call(nullptr, receiving->sink, std::move(try_done));
        // Per try: the buffers go back once the transport call completed.
        auto landings = std::make_shared<TryLandings>();
        TryLandings* raw = landings.get();
        landings->choose = [this, raw, name, &group](const proto::TensorChunk& header,
                                                     size_t bytes) {
          return codec_.Land(name, group.spans, header, bytes, &raw->landings);
        };
        call(&landings->choose, receiving->sink,
             [landings, try_done = std::move(try_done)](absl::Status status) mutable {
               landings.reset();
               try_done(std::move(status));
             });
      },
      [this, receiving, name, &group, done = std::move(done)](absl::Status status) {
        const size_t received = receiving->received;
        if (status.ok() && received != group.spans.size()) {
          status = absl::DataLossError(absl::StrCat(config_.shard_name(group.shard), ": ",
                                                    received, " of ", group.spans.size(),
                                                    " chunks of '", name, "' arrived"));
        }
        done(std::move(status));
      });
}

void ShardCalls::Push(Operation& op, const std::string& name, const ShardGroup& group,
                      const float* gradient, int64_t clock, Done done) {
  auto built = BuildChunks(name, group, gradient, clock);
  if (!built.ok()) return done(built.status());
  auto chunks = std::make_shared<std::vector<OutgoingChunk>>(std::move(*built));
  ShardTransport* transport = transports_[group.shard];
  CallCanceller* canceller = &op.canceller();
  OnShard(
      op, group.shard,
      [this, chunks, transport, canceller](CallDone try_done) {
        transport->StartPush(*chunks, Deadline(), *canceller, std::move(try_done));
      },
      [this, chunks, name, &group, clock, done = std::move(done)](absl::Status status) {
        if (status.ok()) Acknowledged(name, group, clock);
        done(std::move(status));
      });
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

void ShardCalls::Pull(Operation& op, const std::string& name, const ShardGroup& group, float* out,
                      int64_t clock, Done done) {
  auto request = std::make_shared<proto::PullRequest>();
  request->set_job(config_.job);
  request->set_rank(config_.rank);
  *request->mutable_session() = config_.session;
  request->set_clock(clock);
  for (const ChunkSpan& span : group.spans) {
    proto::ChunkRef* ref = request->add_chunks();
    ref->set_key(name);
    ref->set_chunk(span.chunk);
    ref->set_num_elements(span.num_elements);
    const std::string pull_params = codec_.PullParams(ChunkKey{name, span.chunk});
    if (!pull_params.empty()) ref->set_codec_params(pull_params);
  }
  ShardTransport* transport = transports_[group.shard];
  CallCanceller* canceller = &op.canceller();
  ReceiveInto(
      op, name, group, out, /*pushed_from=*/nullptr,
      [this, request, name, transport, canceller](const ReplyLandingChooser* choose,
                                                  const LandedChunkSink& sink, CallDone try_done) {
        // Each try says which pull views it holds now (ChunkCodec::ViewVersion).
        for (proto::ChunkRef& ref : *request->mutable_chunks()) {
          ref.set_view_version(codec_.ViewVersion(ChunkKey{name, ref.chunk()}));
        }
        transport->StartPull(*request, choose, sink, Deadline(), *canceller, std::move(try_done));
      },
      std::move(done));
}

void ShardCalls::PushPull(Operation& op, const std::string& name, const ShardGroup& group,
                          const float* gradient, float* out, int64_t clock, Done done) {
  auto built = BuildChunks(name, group, gradient, clock);
  if (!built.ok()) return done(built.status());
  auto chunks = std::make_shared<std::vector<OutgoingChunk>>(std::move(*built));
  ShardTransport* transport = transports_[group.shard];
  CallCanceller* canceller = &op.canceller();
  ReceiveInto(
      op, name, group, out, gradient,
      [this, chunks, name, transport, canceller](const ReplyLandingChooser* choose,
                                                 const LandedChunkSink& sink, CallDone try_done) {
        for (OutgoingChunk& chunk : *chunks) {  // as in Pull
          chunk.header.set_pull_view_version(
              codec_.ViewVersion(ChunkKey{name, chunk.header.chunk()}));
        }
        transport->StartPushPull(*chunks, choose, sink, Deadline(), *canceller,
                                 std::move(try_done));
      },
      [this, chunks, name, &group, clock, done = std::move(done)](absl::Status status) {
        if (status.ok()) Acknowledged(name, group, clock);
        done(std::move(status));
      });
}

}  // namespace harrier
