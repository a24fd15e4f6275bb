#ifndef HARRIER_WORKER_CHUNK_CODEC_H_
#define HARRIER_WORKER_CHUNK_CODEC_H_

// What the client does to the bytes of each tensor chunk: the push side
// encodes gradients with the push codec through a per-chunk PushStream
// (which keeps error feedback or DGC momentum correction between pushes);
// the pull side checks every reply chunk and rebuilds compressed pull
// replies in a per-chunk PullMirror. Both come from the codec backend of
// the tensor's memory (common/codec/codec_backend.h): the host backend for
// host tensors, the device backend for device tensors, so a device
// tensor's values are compressed where they live and only payloads cross
// to the host. Chunks below compress_min_bytes travel dense.
//
// PowerSGD factors each chunk as a matrix of the layer's own shape: with
// the user's cols = 0, a chunk of a tensor of shape [d0, d1, ...] is a
// (rows x d1*d2*...) matrix. A 1-D tensor has no such matrix and travels
// dense. A chunk that does not hold whole rows (the chunk boundary cuts a
// row: chunk_bytes not a multiple of the row's bytes) is sent in the
// codec's uncompressed form; chunk_bytes a multiple of 4 * d1*d2*... avoids
// it. The wire codec_params stay the user's spec (the shard reads the
// matrix shape from each payload's header).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/codec/codec.h"
#include "common/codec/codec_backend.h"
#include "common/payload_view.h"
#include "proto/harrier.pb.h"
#include "worker/tensor_table.h"
#include "worker/transport/transport.h"

namespace harrier {

// Thread-safe. Pushes of one chunk are serialised (its residual is one
// stream); different chunks encode and decode in parallel.
class ChunkCodec {
 public:
  // `push_codec` and `pull_codec` are codec specs (common/codec/README.md);
  // `pull_codec` may also be "paired" (kPairedPullCodec): the pull codec
  // paired with `push_codec` (common/codec/pull_pairing.h). INVALID_ARGUMENT
  // if either does not parse. `host_backend` compresses
  // host tensors (null: NewHostCodecBackend()); `device_backend` device
  // tensors (null: AddTensor of a device tensor is FAILED_PRECONDITION).
  static absl::StatusOr<std::unique_ptr<ChunkCodec>> Create(
      const std::string& push_codec, const std::string& pull_codec, size_t compress_min_bytes,
      std::shared_ptr<CodecBackend> host_backend = nullptr,
      std::shared_ptr<CodecBackend> device_backend = nullptr);
  ~ChunkCodec();

  // (Re)creates the state of every chunk of `info` in the backend of
  // info.memory: fresh push streams and empty mirrors, with the tensor's
  // own codecs (TensorInfo::push_codec, pull_codec) where it names them.
  // On error nothing changes.
  absl::Status AddTensor(const TensorInfo& info);
  // INVALID_ARGUMENT if the tensor's own codecs do not parse (AddTensor
  // would refuse it), before anything is registered.
  absl::Status CheckCodecs(const TensorInfo& info) const;

  // Whether tensors in `memory` can be added (a backend for it exists).
  bool Supports(MemoryKind memory) const;

  // The pull-codec parameters a pull of this chunk asks for; empty when the
  // chunk is pulled dense.
  std::string PullParams(const ChunkKey& key) const;

  // The version of the chunk's pull view (the last reply's view_version;
  // 0: none, or the chunk is pulled dense). A pull sends it so the shard
  // answers from the view this client holds, whatever replies were lost.
  // Read it for every attempt of a call: a retried call may follow one
  // whose first chunks arrived.
  uint64_t ViewVersion(const ChunkKey& key) const;

  // Fills the codec fields, payload and checksum of `out` for the chunk's
  // `values` (in the tensor's memory; its identity fields are the
  // caller's). A dense chunk of a host tensor borrows `values`, which must
  // outlive the send, and leaves its checksum to the transport
  // (OutgoingChunk::checksum_pending); one of a device tensor borrows them too when
  // `transport_sends_from_device` (ShardTransport::SendsFromDeviceMemory),
  // else it is staged into host memory. `clock` and `rank` seed random
  // codecs (DeriveSeed), as the shard derives them.
  absl::Status EncodePush(const ChunkKey& key, absl::Span<const float> values, int64_t clock,
                          uint32_t rank, OutgoingChunk* out,
                          bool transport_sends_from_device = false);

  // Checks one reply chunk (it must be one of `spans`, of the tensor
  // `name`, with a matching checksum) and writes its parameters to
  // `tensor` (the whole tensor's buffer, in the tensor's memory) at the
  // chunk's offset; nothing is written on error (DATA_LOSS, without the
  // shard's name), except in a staging buffer (LandsInStaging), which a
  // failed pull may leave part-written.
  // `payload_memory` kDevice: the payload is in a landing buffer Land()
  // gave (device memory), checked and copied there.
  absl::Status DecodePull(const std::string& name, absl::Span<const ChunkSpan> spans,
                          const proto::TensorChunk& reply, const PayloadView& payload,
                          float* tensor, MemoryKind payload_memory = MemoryKind::kHost);

  // Dense pull replies of device tensors received in device memory
  // (a pull's landing chooser, where the transport
  // ReceivesIntoDeviceMemory): each chunk has a landing buffer of the device
  // backend, so a reply goes from the network to the tensor without
  // crossing the host; it is checked (CRC on the device) before the tensor
  // is written. A transport call holds a Landings for the buffers it took;
  // they are given back when it is destroyed, after the call returned.
  struct LandingSlot;
  class Landings {
   public:
    Landings() = default;
    ~Landings();
    Landings(const Landings&) = delete;
    Landings& operator=(const Landings&) = delete;

   private:
    friend class ChunkCodec;
    absl::Mutex mutex_;
    std::vector<std::shared_ptr<LandingSlot>> taken_ ABSL_GUARDED_BY(mutex_);
  };
  // True for a device tensor whose backend may have landing buffers.
  bool LandsInDeviceMemory(const std::string& name) const;
  // Where the reply chunk `header` of `bytes` bytes lands: the chunk's
  // buffer (taken into `landings`), or nowhere (a compressed or unexpected
  // reply, a host tensor, a backend without buffers, the buffer taken by
  // another call).
  ReplyLanding Land(const std::string& name, absl::Span<const ChunkSpan> spans,
                    const proto::TensorChunk& header, size_t bytes, Landings* landings) const;
  // Bytes of pull replies that reached device tensors through a landing.
  uint64_t landed_bytes() const { return landed_bytes_; }

  // Host tensors registered with staging buffers (TensorInfo::
  // staging_buffers): their caller reads a pull's buffer only after the
  // pull succeeded, so a dense reply may be received straight into it, at
  // its chunk's place, where the transport reads into host landings (tcp,
  // UCX). DecodePull then only checks it: no receive buffer, no copy.
  bool LandsInStaging(const std::string& name) const;
  // The place in `tensor` (the pull's output, the whole tensor) where the
  // dense reply chunk `header` of `bytes` bytes lands; nowhere for a
  // compressed or unexpected reply, a chunk with a pull view, or a tensor
  // that is not a host staging one.
  ReplyLanding LandInStaging(const std::string& name, absl::Span<const ChunkSpan> spans,
                             const proto::TensorChunk& header, size_t bytes, float* tensor) const;
  // Bytes of pull replies received in place in staging buffers.
  uint64_t landed_in_staging_bytes() const { return landed_in_staging_bytes_; }

  // Bytes of dense device chunks copied to host memory for a transport
  // that cannot send from device memory.
  uint64_t staged_bytes() const { return staged_bytes_; }

 private:
  struct CodecPair;
  struct TensorState;
  struct PushState;
  struct Mirror;

  ChunkCodec(std::shared_ptr<const CodecPair> codecs, std::string push_codec,
             std::string pull_codec, size_t compress_min_bytes,
             std::shared_ptr<CodecBackend> host_backend,
             std::shared_ptr<CodecBackend> device_backend);
  absl::StatusOr<std::shared_ptr<const CodecPair>> CodecsOf(const TensorInfo& info) const;
  // Shared, so a re-registration replacing an entry never frees state that
  // a push or pull in flight still uses.
  std::shared_ptr<const TensorState> TensorStateFor(const std::string& name) const;
  std::shared_ptr<PushState> PushStateFor(const ChunkKey& key) const;
  std::shared_ptr<Mirror> MirrorFor(const ChunkKey& key) const;
  // The push spec of one chunk of `info` (PowerSGD gets the layer's row
  // length); nullopt-like false: the chunk is pushed dense.
  bool ChunkPushSpec(const TensorInfo& info, const CodecSpec& push_spec, const ChunkSpan& span,
                     CodecSpec* spec) const;
  absl::Status DecodeLandedPull(const std::string& name, const ChunkSpan& span,
                                const TensorState& state, const proto::TensorChunk& reply,
                                const PayloadView& payload, float* out);
  absl::Status DecodeIntoMirror(const std::string& name, const ChunkSpan& span,
                                const proto::TensorChunk& reply, const PayloadView& payload,
                                Mirror& mirror, float* tensor) const;

  // The client's codecs (ClientOptions::codec, pull_codec), for tensors
  // that name none of their own.
  const std::shared_ptr<const CodecPair> default_codecs_;
  const std::string default_push_codec_;
  const std::string default_pull_codec_;
  const size_t compress_min_bytes_;
  const std::shared_ptr<CodecBackend> host_backend_;
  const std::shared_ptr<CodecBackend> device_backend_;
  std::atomic<uint64_t> staged_bytes_{0};
  std::atomic<uint64_t> landed_bytes_{0};
  std::atomic<uint64_t> landed_in_staging_bytes_{0};

  mutable absl::Mutex mutex_;  // guards the maps; each entry has its own lock
  absl::flat_hash_map<std::string, std::shared_ptr<const TensorState>> tensors_
      ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<ChunkKey, std::shared_ptr<PushState>, absl::Hash<ChunkKey>> push_
      ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<ChunkKey, std::shared_ptr<Mirror>, absl::Hash<ChunkKey>> mirrors_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_CHUNK_CODEC_H_
