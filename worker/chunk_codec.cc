#include "worker/chunk_codec.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec/error_feedback.h"
#include "common/crc32c.h"

namespace harrier {

// Compression state of one chunk: its codec (PowerSGD keeps a warm start in
// it) and at most one of a residual or DGC's u/v.
struct ChunkCodec::PushState {
  absl::Mutex mutex;
  std::unique_ptr<Codec> codec ABSL_GUARDED_BY(mutex);
  std::unique_ptr<ErrorFeedback> error_feedback ABSL_GUARDED_BY(mutex);
  std::unique_ptr<DgcMomentumCorrection> momentum ABSL_GUARDED_BY(mutex);
};

// The parameters of one chunk as rebuilt from compressed pull replies.
struct ChunkCodec::Mirror {
  absl::Mutex mutex;
  std::vector<float> values ABSL_GUARDED_BY(mutex);  // empty until the first (dense) reply
  uint64_t version ABSL_GUARDED_BY(mutex) = 0;       // the shard's view version of `values`
};

absl::StatusOr<std::unique_ptr<ChunkCodec>> ChunkCodec::Create(const std::string& push_codec,
                                                               const std::string& pull_codec,
                                                               size_t compress_min_bytes) {
  auto push_spec = CodecSpec::Parse(push_codec);
  if (!push_spec.ok()) return push_spec.status();
  auto pull_spec = CodecSpec::Parse(pull_codec);
  if (!pull_spec.ok()) return pull_spec.status();
  auto pull_decoder = CreateCodec(*pull_spec);
  if (!pull_decoder.ok()) return pull_decoder.status();
  return std::unique_ptr<ChunkCodec>(
      new ChunkCodec(*push_spec, *pull_spec, std::move(*pull_decoder), compress_min_bytes));
}

ChunkCodec::ChunkCodec(CodecSpec push_spec, CodecSpec pull_spec,
                       std::unique_ptr<Codec> pull_decoder, size_t compress_min_bytes)
    : push_spec_(push_spec),
      pull_spec_(pull_spec),
      pull_params_(pull_spec.ToString()),
      pull_decoder_(std::move(pull_decoder)),
      compress_min_bytes_(compress_min_bytes) {
  // Momentum correction happens on the worker only; the payload is a plain
  // threshold payload, so the shard (and a BSP round, which needs one codec
  // from every worker) is told the spec without it.
  CodecSpec wire = push_spec;
  wire.momentum = 0.0;
  push_params_ = wire.ToString();
}

ChunkCodec::~ChunkCodec() = default;

absl::Status ChunkCodec::AddTensor(const TensorInfo& info) {
  std::vector<std::pair<ChunkKey, std::shared_ptr<PushState>>> push;
  std::vector<ChunkKey> mirrored;
  for (const ShardGroup& group : info.groups) {
    for (const ChunkSpan& span : group.spans) {
      if (span.num_elements * sizeof(float) < compress_min_bytes_) continue;
      ChunkKey key{info.name, span.chunk};
      if (pull_spec_.id != CodecId::kNone) mirrored.push_back(key);
      if (push_spec_.id == CodecId::kNone) continue;
      auto codec = CreateCodec(push_spec_);
      if (!codec.ok()) return codec.status();
      auto state = std::make_shared<PushState>();
      absl::MutexLock lock(&state->mutex);
      state->codec = std::move(*codec);
      if (push_spec_.momentum > 0.0) {
        state->momentum = std::make_unique<DgcMomentumCorrection>(
            span.num_elements, static_cast<float>(push_spec_.momentum));
      } else if (NeedsErrorFeedback(push_spec_)) {
        state->error_feedback = std::make_unique<ErrorFeedback>(span.num_elements);
      }
      push.emplace_back(std::move(key), std::move(state));
    }
  }
  absl::MutexLock lock(&mutex_);
  for (auto& entry : push) push_[entry.first] = std::move(entry.second);
  for (ChunkKey& key : mirrored) mirrors_[std::move(key)] = std::make_shared<Mirror>();
  return absl::OkStatus();
}

std::shared_ptr<ChunkCodec::PushState> ChunkCodec::PushStateFor(const ChunkKey& key) const {
  absl::ReaderMutexLock lock(&mutex_);
  auto it = push_.find(key);
  return it == push_.end() ? nullptr : it->second;
}

std::shared_ptr<ChunkCodec::Mirror> ChunkCodec::MirrorFor(const ChunkKey& key) const {
  absl::ReaderMutexLock lock(&mutex_);
  auto it = mirrors_.find(key);
  return it == mirrors_.end() ? nullptr : it->second;
}

const std::string& ChunkCodec::PullParams(const ChunkKey& key) const {
  static const std::string* const kDense = new std::string();
  return MirrorFor(key) != nullptr ? pull_params_ : *kDense;
}

uint64_t ChunkCodec::ViewVersion(const ChunkKey& key) const {
  std::shared_ptr<Mirror> mirror = MirrorFor(key);
  if (mirror == nullptr) return 0;
  absl::MutexLock lock(&mirror->mutex);
  return mirror->values.empty() ? 0 : mirror->version;
}

absl::Status ChunkCodec::EncodePush(const ChunkKey& key, absl::Span<const float> values,
                                    int64_t clock, uint32_t rank, OutgoingChunk* out) {
  proto::TensorChunk& header = out->header;
  const std::string& pull_params = PullParams(key);
  if (!pull_params.empty()) header.set_pull_codec_params(pull_params);
  std::shared_ptr<PushState> state = PushStateFor(key);
  if (state == nullptr) {
    header.set_codec(0);
    header.clear_codec_params();
    // Not copied: the transport sends straight from the caller's gradient.
    out->borrowed = absl::string_view(reinterpret_cast<const char*>(values.data()),
                                      values.size() * sizeof(float));
    out->is_borrowed = true;
  } else {
    absl::MutexLock lock(&state->mutex);
    CodecContext context;
    context.seed = DeriveSeed(key.name, key.chunk, clock, rank, push_spec_.seed);
    absl::Status status;
    if (state->momentum != nullptr) {
      status = state->momentum->Compress(*state->codec, values, context, &out->owned);
    } else if (state->error_feedback != nullptr) {
      status = state->error_feedback->Compress(*state->codec, values, context, &out->owned);
    } else {
      status = state->codec->Encode(values, context, &out->owned);
    }
    out->is_borrowed = false;
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("tensor '", key.name, "' chunk ", key.chunk,
                                                      ": ", status.message()));
    }
    header.set_codec(static_cast<uint32_t>(push_spec_.id));
    header.set_codec_params(push_params_);
  }
  const absl::string_view payload = out->payload();
  header.set_checksum(Crc32c(payload.data(), payload.size()));
  return absl::OkStatus();
}

absl::Status ChunkCodec::DecodePull(const std::string& name, absl::Span<const ChunkSpan> spans,
                                    const proto::TensorChunk& reply, const PayloadView& payload,
                                    float* tensor) {
  const ChunkSpan* span = nullptr;
  for (const ChunkSpan& candidate : spans) {
    if (candidate.chunk == reply.chunk()) span = &candidate;
  }
  const bool compressed = reply.codec() != 0;
  if (reply.key() != name || span == nullptr || reply.num_elements() != span->num_elements ||
      (!compressed && payload.size() != span->num_elements * sizeof(float))) {
    return absl::DataLossError(absl::StrCat("reply for '", reply.key(), "' chunk ", reply.chunk(),
                                            " does not match the request for '", name, "'"));
  }
  // Checked before anything is written, so a corrupt reply leaves the
  // tensor as it was; then one copy, straight from the received slices.
  uint32_t crc = 0;
  for (absl::string_view piece : payload.pieces()) {
    crc = Crc32cExtend(crc, piece.data(), piece.size());
  }
  if (crc != reply.checksum()) {
    return absl::DataLossError(
        absl::StrCat("checksum mismatch in '", name, "' chunk ", reply.chunk()));
  }
  std::shared_ptr<Mirror> mirror = MirrorFor(ChunkKey{name, span->chunk});
  float* out = tensor + span->offset;
  if (!compressed) {
    payload.CopyTo(out);
    if (mirror != nullptr) {
      absl::MutexLock lock(&mirror->mutex);
      mirror->values.assign(out, out + span->num_elements);
      mirror->version = reply.view_version();
    }
    return absl::OkStatus();
  }
  if (mirror == nullptr) {
    return absl::DataLossError(absl::StrCat("compressed reply for '", name, "' chunk ",
                                            reply.chunk(), " that was pulled uncompressed"));
  }
  return DecodeIntoMirror(name, *span, reply, payload, *mirror, out);
}

absl::Status ChunkCodec::DecodeIntoMirror(const std::string& name, const ChunkSpan& span,
                                          const proto::TensorChunk& reply,
                                          const PayloadView& payload, Mirror& mirror,
                                          float* out) const {
  // A compressed reply is the difference to this worker's view: decode it
  // into the mirror, then hand out the mirror.
  if (reply.codec_params() != pull_params_) {
    return absl::DataLossError(absl::StrCat("reply for '", name, "' chunk ", reply.chunk(),
                                            " uses codec '", reply.codec_params(), "', requested '",
                                            pull_params_, "'"));
  }
  // Decoders read one contiguous buffer; replies may arrive in pieces.
  std::string joined;
  absl::string_view bytes = payload.first();
  if (!payload.contiguous()) {
    joined.resize(payload.size());
    payload.CopyTo(joined.data());
    bytes = joined;
  }
  absl::MutexLock lock(&mirror.mutex);
  if (mirror.values.size() != span.num_elements) {
    return absl::DataLossError(absl::StrCat("compressed reply for '", name, "' chunk ",
                                            reply.chunk(), " before its first dense one"));
  }
  if (reply.pull_view_version() != 0 && reply.pull_view_version() != mirror.version) {
    // Made for another view than this one (two pulls of the chunk at once):
    // adding it would part the mirror from the shard's view for good. Left
    // as it is, the mirror's version is unknown to the shard by the next
    // pull, which then resets it with a dense reply.
    return absl::DataLossError(absl::StrCat(
        "compressed reply for '", name, "' chunk ", reply.chunk(), " applies to view version ",
        reply.pull_view_version(), ", this client holds ", mirror.version,
        " (one chunk pulled twice at once?)"));
  }
  if (auto status = pull_decoder_->DecodeAdd(bytes, 1.0f, absl::MakeSpan(mirror.values));
      !status.ok()) {
    return absl::DataLossError(
        absl::StrCat("'", name, "' chunk ", reply.chunk(), ": ", status.message()));
  }
  mirror.version = reply.view_version();
  std::memcpy(out, mirror.values.data(), span.num_elements * sizeof(float));
  return absl::OkStatus();
}

}  // namespace harrier
