#include "worker/chunk_codec.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec/host_codec_backend.h"
#include "common/codec/pull_pairing.h"
#include "common/crc32c.h"

namespace harrier {

// The codecs of one tensor's pushes and pulls, with the parameters as sent.
struct ChunkCodec::CodecPair {
  CodecSpec push_spec;
  std::string push_params;  // push_spec without worker-only fields
  CodecSpec pull_spec;
  std::string pull_params;

  static absl::StatusOr<std::shared_ptr<const CodecPair>> Make(const std::string& push_codec,
                                                               const std::string& pull_codec) {
    auto push_spec = CodecSpec::Parse(push_codec);
    if (!push_spec.ok()) return push_spec.status();
    // "paired": the pull codec that goes with the push codec.
    auto pull_text = ResolvePullCodec(push_codec, pull_codec);
    if (!pull_text.ok()) return pull_text.status();
    auto pull_spec = CodecSpec::Parse(*pull_text);
    if (!pull_spec.ok()) return pull_spec.status();
    // Refused specs fail here, not at the first push.
    if (auto codec = CreateCodec(*push_spec); !codec.ok()) return codec.status();
    if (auto codec = CreateCodec(*pull_spec); !codec.ok()) return codec.status();
    auto pair = std::make_shared<CodecPair>();
    pair->push_spec = *push_spec;
    // Momentum correction happens on the worker only; the payload is a
    // plain threshold payload, so the shard (and a BSP round, which needs
    // one codec from every worker) is told the spec without it.
    CodecSpec wire = *push_spec;
    wire.momentum = 0.0;
    pair->push_params = wire.ToString();
    pair->pull_spec = *pull_spec;
    pair->pull_params = pull_spec->ToString();
    return std::shared_ptr<const CodecPair>(std::move(pair));
  }
};

// Where a tensor's buffers live, the backend that compresses them and the
// codecs it uses.
struct ChunkCodec::TensorState {
  MemoryKind memory = MemoryKind::kHost;
  bool staging_buffers = false;  // TensorInfo::staging_buffers
  std::shared_ptr<CodecBackend> backend;
  std::shared_ptr<const CodecPair> codecs;
  // Device tensors: a landing buffer per chunk for dense pull replies,
  // made on first use, taken by one transport call at a time.
  mutable absl::Mutex landing_mutex;
  mutable absl::flat_hash_map<uint32_t, std::shared_ptr<LandingSlot>> landings
      ABSL_GUARDED_BY(landing_mutex);
  // The backend has no buffers (NewBuffer failed once): never land.
  mutable bool landing_unsupported ABSL_GUARDED_BY(landing_mutex) = false;
};

struct ChunkCodec::LandingSlot {
  std::unique_ptr<BackendBuffer> buffer;  // immutable once the slot is in the map
  std::atomic<bool> taken{false};
};

ChunkCodec::Landings::~Landings() {
  absl::MutexLock lock(&mutex_);
  for (auto& slot : taken_) slot->taken.store(false, std::memory_order_release);
}

// Compression state of one chunk: its push stream (codec, residual or DGC's
// u/v, in the backend's memory) and the spec it was made with.
struct ChunkCodec::PushState {
  absl::Mutex mutex;
  std::unique_ptr<PushStream> stream ABSL_GUARDED_BY(mutex);
};

// The parameters of one chunk as rebuilt from compressed pull replies.
struct ChunkCodec::Mirror {
  absl::Mutex mutex;
  std::string params;  // the pull codec's parameters, immutable
  std::unique_ptr<PullMirror> mirror ABSL_GUARDED_BY(mutex);  // empty until a dense reply
  uint64_t version ABSL_GUARDED_BY(mutex) = 0;  // the shard's view version of the mirror
};

absl::StatusOr<std::unique_ptr<ChunkCodec>> ChunkCodec::Create(
    const std::string& push_codec, const std::string& pull_codec, size_t compress_min_bytes,
    std::shared_ptr<CodecBackend> host_backend, std::shared_ptr<CodecBackend> device_backend) {
  auto codecs = CodecPair::Make(push_codec, pull_codec);
  if (!codecs.ok()) return codecs.status();
  if (host_backend == nullptr) host_backend = NewHostCodecBackend();
  if (host_backend->memory() != MemoryKind::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("host codec backend '", host_backend->name(), "' works on device memory"));
  }
  if (device_backend != nullptr && device_backend->memory() != MemoryKind::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat("device codec backend '",
                                                   device_backend->name(),
                                                   "' works on host memory"));
  }
  return std::unique_ptr<ChunkCodec>(new ChunkCodec(*std::move(codecs), push_codec, pull_codec,
                                                    compress_min_bytes, std::move(host_backend),
                                                    std::move(device_backend)));
}

ChunkCodec::ChunkCodec(std::shared_ptr<const CodecPair> codecs, std::string push_codec,
                       std::string pull_codec, size_t compress_min_bytes,
                       std::shared_ptr<CodecBackend> host_backend,
                       std::shared_ptr<CodecBackend> device_backend)
    : default_codecs_(std::move(codecs)),
      default_push_codec_(std::move(push_codec)),
      default_pull_codec_(std::move(pull_codec)),
      compress_min_bytes_(compress_min_bytes),
      host_backend_(std::move(host_backend)),
      device_backend_(std::move(device_backend)) {}

absl::StatusOr<std::shared_ptr<const ChunkCodec::CodecPair>> ChunkCodec::CodecsOf(
    const TensorInfo& info) const {
  if (info.push_codec.empty() && info.pull_codec.empty()) return default_codecs_;
  return CodecPair::Make(info.push_codec.empty() ? default_push_codec_ : info.push_codec,
                         info.pull_codec.empty() ? default_pull_codec_ : info.pull_codec);
}

absl::Status ChunkCodec::CheckCodecs(const TensorInfo& info) const {
  return CodecsOf(info).status();
}

ChunkCodec::~ChunkCodec() = default;

bool ChunkCodec::Supports(MemoryKind memory) const {
  return memory == MemoryKind::kHost || device_backend_ != nullptr;
}

bool ChunkCodec::ChunkPushSpec(const TensorInfo& info, const CodecSpec& push_spec,
                               const ChunkSpan& span, CodecSpec* spec) const {
  if (push_spec.id == CodecId::kNone) return false;
  *spec = push_spec;
  if (push_spec.id != CodecId::kPowerSgd || push_spec.cols != 0) return true;
  // PowerSGD on the layer's matrix: rows of d1*d2*... elements.
  if (info.shape.size() <= 1) return false;  // a bias, say: no matrix to factor
  uint64_t row = 1;
  for (size_t i = 1; i < info.shape.size(); ++i) row *= static_cast<uint64_t>(info.shape[i]);
  if (row == 0) return false;
  if (span.offset % row == 0 && span.num_elements % row == 0) {
    spec->cols = row;
  } else {
    // The chunk cuts a row: its matrix would not be the layer's. A column
    // count that does not divide the chunk makes the codec send its
    // uncompressed form (powersgd_codec.cc).
    spec->cols = static_cast<uint64_t>(span.num_elements) + 1;
  }
  return true;
}

absl::Status ChunkCodec::AddTensor(const TensorInfo& info) {
  std::shared_ptr<CodecBackend> backend =
      info.memory == MemoryKind::kDevice ? device_backend_ : host_backend_;
  if (backend == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", info.name,
                     "' lives in device memory but the client has no device codec backend "
                     "(ClientOptions::device_backend)"));
  }
  auto codecs = CodecsOf(info);
  if (!codecs.ok()) return codecs.status();
  auto tensor = std::make_shared<TensorState>();
  tensor->memory = info.memory;
  tensor->staging_buffers = info.staging_buffers;
  tensor->backend = backend;
  tensor->codecs = *codecs;
  const CodecPair& pair = **codecs;
  std::vector<std::pair<ChunkKey, std::shared_ptr<PushState>>> push;
  std::vector<std::pair<ChunkKey, std::shared_ptr<Mirror>>> mirrored;
  for (const ShardGroup& group : info.groups) {
    for (const ChunkSpan& span : group.spans) {
      if (span.num_elements * sizeof(float) < compress_min_bytes_) continue;
      ChunkKey key{info.name, span.chunk};
      if (pair.pull_spec.id != CodecId::kNone) {
        auto mirror = backend->NewPullMirror(pair.pull_spec, span.num_elements);
        if (!mirror.ok()) return mirror.status();
        auto state = std::make_shared<Mirror>();
        state->params = pair.pull_params;
        absl::MutexLock lock(&state->mutex);
        state->mirror = std::move(*mirror);
        mirrored.emplace_back(key, std::move(state));
      }
      CodecSpec spec;
      if (!ChunkPushSpec(info, pair.push_spec, span, &spec)) continue;
      auto stream = backend->NewPushStream(spec, span.num_elements);
      if (!stream.ok()) return stream.status();
      auto state = std::make_shared<PushState>();
      absl::MutexLock lock(&state->mutex);
      state->stream = std::move(*stream);
      push.emplace_back(std::move(key), std::move(state));
    }
  }
  absl::MutexLock lock(&mutex_);
  // A re-registration starts over: chunks that now travel dense (another
  // shape) must not keep an old stream.
  absl::erase_if(push_, [&](const auto& entry) { return entry.first.name == info.name; });
  absl::erase_if(mirrors_, [&](const auto& entry) { return entry.first.name == info.name; });
  for (auto& entry : push) push_[entry.first] = std::move(entry.second);
  for (auto& entry : mirrored) mirrors_[entry.first] = std::move(entry.second);
  tensors_[info.name] = std::move(tensor);
  return absl::OkStatus();
}

std::shared_ptr<const ChunkCodec::TensorState> ChunkCodec::TensorStateFor(
    const std::string& name) const {
  absl::ReaderMutexLock lock(&mutex_);
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
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

std::string ChunkCodec::PullParams(const ChunkKey& key) const {
  std::shared_ptr<Mirror> mirror = MirrorFor(key);
  return mirror != nullptr ? mirror->params : std::string();
}

uint64_t ChunkCodec::ViewVersion(const ChunkKey& key) const {
  std::shared_ptr<Mirror> mirror = MirrorFor(key);
  if (mirror == nullptr) return 0;
  absl::MutexLock lock(&mirror->mutex);
  return mirror->mirror->empty() ? 0 : mirror->version;
}

absl::Status ChunkCodec::EncodePush(const ChunkKey& key, absl::Span<const float> values,
                                    int64_t clock, uint32_t rank, OutgoingChunk* out,
                                    bool transport_sends_from_device) {
  proto::TensorChunk& header = out->header;
  std::shared_ptr<const TensorState> tensor = TensorStateFor(key.name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor '", key.name, "' is not registered"));
  }
  auto fail = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat("tensor '", key.name, "' chunk ", key.chunk,
                                                    ": ", status.message()));
  };
  const std::string pull_params = PullParams(key);
  if (!pull_params.empty()) header.set_pull_codec_params(pull_params);
  std::shared_ptr<PushState> state = PushStateFor(key);
  const size_t bytes = values.size() * sizeof(float);
  out->borrowed_memory = MemoryKind::kHost;
  out->checksum_pending = false;
  out->send_in_place = false;
  if (state == nullptr) {
    header.set_codec(0);
    header.clear_codec_params();
    if (tensor->memory == MemoryKind::kHost ||
        (tensor->memory == MemoryKind::kDevice && transport_sends_from_device)) {
      // Not copied: the transport sends straight from the caller's gradient.
      out->borrowed = absl::string_view(reinterpret_cast<const char*>(values.data()), bytes);
      out->is_borrowed = true;
      out->borrowed_memory = tensor->memory;
      if (tensor->memory == MemoryKind::kDevice) {
        auto crc = tensor->backend->Crc32c(values.data(), bytes);
        if (!crc.ok()) return fail(crc.status());
        header.set_checksum(*crc);
        return absl::OkStatus();
      }
      // The transport takes the CRC as it reads the gradient to send it.
      header.clear_checksum();
      out->checksum_pending = true;
      out->send_in_place = tensor->staging_buffers;
      return absl::OkStatus();
    } else {
      // Staged: the transport reads host memory only.
      out->is_borrowed = false;
      out->owned.resize(bytes);
      if (auto status = tensor->backend->CopyToHost(values.data(), values.size(),
                                                    reinterpret_cast<float*>(out->owned.data()));
          !status.ok()) {
        out->owned.clear();
        return fail(status);
      }
      staged_bytes_ += bytes;
    }
  } else {
    absl::MutexLock lock(&state->mutex);
    CodecContext context;
    context.seed = DeriveSeed(key.name, key.chunk, clock, rank, tensor->codecs->push_spec.seed);
    absl::Status status = state->stream->Encode(values.data(), values.size(), context, &out->owned);
    out->is_borrowed = false;
    if (!status.ok()) return fail(status);
    header.set_codec(static_cast<uint32_t>(tensor->codecs->push_spec.id));
    header.set_codec_params(tensor->codecs->push_params);
  }
  const absl::string_view payload = out->payload();
  header.set_checksum(Crc32c(payload.data(), payload.size()));
  return absl::OkStatus();
}

namespace {

// The span of `spans` a dense reply chunk of `name` with `bytes` of payload
// fills; null for a compressed reply, another tensor's, or another size.
// Only such replies land.
const ChunkSpan* DenseReplySpan(const std::string& name, absl::Span<const ChunkSpan> spans,
                                const proto::TensorChunk& header, size_t bytes) {
  if (header.codec() != 0 || header.key() != name) return nullptr;
  for (const ChunkSpan& span : spans) {
    if (span.chunk == header.chunk()) {
      return bytes == span.num_elements * sizeof(float) ? &span : nullptr;
    }
  }
  return nullptr;
}

}  // namespace

bool ChunkCodec::LandsInDeviceMemory(const std::string& name) const {
  std::shared_ptr<const TensorState> state = TensorStateFor(name);
  if (state == nullptr || state->memory != MemoryKind::kDevice) return false;
  absl::MutexLock lock(&state->landing_mutex);
  return !state->landing_unsupported;
}

ReplyLanding ChunkCodec::Land(const std::string& name, absl::Span<const ChunkSpan> spans,
                              const proto::TensorChunk& header, size_t bytes,
                              Landings* landings) const {
  const ChunkSpan* span = DenseReplySpan(name, spans, header, bytes);
  if (span == nullptr) return {};
  std::shared_ptr<const TensorState> state = TensorStateFor(name);
  if (state == nullptr || state->memory != MemoryKind::kDevice) return {};
  std::shared_ptr<LandingSlot> slot;
  {
    absl::MutexLock lock(&state->landing_mutex);
    if (state->landing_unsupported) return {};
    auto it = state->landings.find(span->chunk);
    if (it == state->landings.end()) {
      auto buffer = state->backend->NewBuffer(span->num_elements);
      if (!buffer.ok()) {
        state->landing_unsupported = true;
        return {};
      }
      auto made = std::make_shared<LandingSlot>();
      made->buffer = std::move(*buffer);
      it = state->landings.emplace(span->chunk, std::move(made)).first;
    }
    slot = it->second;
  }
  // One call at a time: two pulls of one chunk at once, the second stages.
  if (slot->taken.exchange(true, std::memory_order_acq_rel)) return {};
  {
    absl::MutexLock lock(&landings->mutex_);
    landings->taken_.push_back(slot);
  }
  ReplyLanding landing;
  landing.data = slot->buffer->data();
  landing.capacity = slot->buffer->size() * sizeof(float);
  landing.memory = MemoryKind::kDevice;
  return landing;
}

bool ChunkCodec::LandsInStaging(const std::string& name) const {
  std::shared_ptr<const TensorState> state = TensorStateFor(name);
  return state != nullptr && state->memory == MemoryKind::kHost && state->staging_buffers;
}

ReplyLanding ChunkCodec::LandInStaging(const std::string& name, absl::Span<const ChunkSpan> spans,
                                       const proto::TensorChunk& header, size_t bytes,
                                       float* tensor) const {
  const ChunkSpan* span = DenseReplySpan(name, spans, header, bytes);
  if (span == nullptr || !LandsInStaging(name)) return {};
  // A chunk with a pull view keeps its mirror: its replies go through it.
  if (MirrorFor(ChunkKey{name, span->chunk}) != nullptr) return {};
  ReplyLanding landing;
  landing.data = tensor + span->offset;
  landing.capacity = bytes;
  landing.memory = MemoryKind::kHost;
  return landing;
}

absl::Status ChunkCodec::DecodeLandedPull(const std::string& name, const ChunkSpan& span,
                                          const TensorState& state,
                                          const proto::TensorChunk& reply,
                                          const PayloadView& payload, float* out) {
  // The reply is in a landing buffer of the device backend: checked there,
  // then copied within device memory.
  if (reply.codec() != 0 || !payload.contiguous()) {
    return absl::DataLossError(absl::StrCat("reply for '", name, "' chunk ", reply.chunk(),
                                            " landed in device memory but is not dense"));
  }
  const float* landed = reinterpret_cast<const float*>(payload.first().data());
  auto crc = state.backend->Crc32c(landed, payload.size());
  if (!crc.ok()) {
    return absl::Status(crc.status().code(), absl::StrCat("'", name, "' chunk ", reply.chunk(),
                                                          ": ", crc.status().message()));
  }
  if (*crc != reply.checksum()) {
    return absl::DataLossError(
        absl::StrCat("checksum mismatch in '", name, "' chunk ", reply.chunk()));
  }
  absl::Status status;
  if (std::shared_ptr<Mirror> mirror = MirrorFor(ChunkKey{name, span.chunk}); mirror != nullptr) {
    absl::MutexLock lock(&mirror->mutex);
    status = mirror->mirror->SetDenseFrom(landed, out);
    if (status.ok()) mirror->version = reply.view_version();
  } else {
    status = state.backend->CopyWithin(landed, span.num_elements, out);
  }
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("'", name, "' chunk ", reply.chunk(), ": ",
                                                    status.message()));
  }
  landed_bytes_ += payload.size();
  return absl::OkStatus();
}

absl::Status ChunkCodec::DecodePull(const std::string& name, absl::Span<const ChunkSpan> spans,
                                    const proto::TensorChunk& reply, const PayloadView& payload,
                                    float* tensor, MemoryKind payload_memory) {
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
  std::shared_ptr<const TensorState> state = TensorStateFor(name);
  if (state == nullptr) {
    return absl::DataLossError(absl::StrCat("reply for '", name, "', which is not registered"));
  }
  if (payload_memory == MemoryKind::kDevice) {
    if (state->memory != MemoryKind::kDevice) {
      return absl::DataLossError(absl::StrCat("reply for host tensor '", name,
                                              "' landed in device memory"));
    }
    return DecodeLandedPull(name, *span, *state, reply, payload, tensor + span->offset);
  }
  std::shared_ptr<Mirror> mirror = MirrorFor(ChunkKey{name, span->chunk});
  float* out = tensor + span->offset;
  if (!compressed && mirror == nullptr && state->memory == MemoryKind::kHost &&
      state->staging_buffers) {
    // The caller's staging, read only after a pull that succeeded: checked
    // by the CRC the transport took as the bytes arrived (then copied if
    // they did not land in place), else where it landed (LandInStaging) or
    // while copied, one pass over the bytes.
    const bool landed_in_place =
        payload.contiguous() && payload.first().data() == reinterpret_cast<const char*>(out);
    uint32_t crc;
    if (landed_in_place || payload.crc32c().has_value()) {
      crc = payload.Crc32cOfBytes();
      if (!landed_in_place && crc == reply.checksum()) payload.CopyTo(out);
    } else {
      crc = payload.CopyToWithCrc32c(out);
    }
    if (crc != reply.checksum()) {
      return absl::DataLossError(absl::StrCat("checksum mismatch in '", name, "' chunk ",
                                              reply.chunk(),
                                              " (the staging holds it part-written)"));
    }
    // Counted once checked, as the pulled bytes are.
    if (landed_in_place) landed_in_staging_bytes_ += payload.size();
    return absl::OkStatus();
  }
  // Checked before anything is written, so a corrupt reply leaves the
  // tensor as it was (by the transport's CRC where it took one as the bytes
  // arrived); then one copy, straight from the received slices.
  if (payload.Crc32cOfBytes() != reply.checksum()) {
    return absl::DataLossError(
        absl::StrCat("checksum mismatch in '", name, "' chunk ", reply.chunk()));
  }
  if (!compressed) {
    absl::Status status;
    if (mirror != nullptr) {
      absl::MutexLock lock(&mirror->mutex);
      status = mirror->mirror->SetDense(payload, out);
      if (status.ok()) mirror->version = reply.view_version();
    } else if (state->memory == MemoryKind::kHost) {
      payload.CopyTo(out);
    } else {
      status = state->backend->CopyFromHost(payload, out);
    }
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("'", name, "' chunk ", reply.chunk(), ": ",
                                                      status.message()));
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
  if (reply.codec_params() != mirror.params) {
    return absl::DataLossError(absl::StrCat("reply for '", name, "' chunk ", reply.chunk(),
                                            " uses codec '", reply.codec_params(), "', requested '",
                                            mirror.params, "'"));
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
  if (mirror.mirror->empty()) {
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
  if (auto status = mirror.mirror->AddCompressed(bytes, out); !status.ok()) {
    return absl::DataLossError(
        absl::StrCat("'", name, "' chunk ", reply.chunk(), ": ", status.message()));
  }
  mirror.version = reply.view_version();
  (void)span;
  return absl::OkStatus();
}

}  // namespace harrier
