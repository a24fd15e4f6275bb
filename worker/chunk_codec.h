#ifndef HARRIER_WORKER_CHUNK_CODEC_H_
#define HARRIER_WORKER_CHUNK_CODEC_H_

// What the client does to the bytes of each tensor chunk: the push side
// encodes gradients with the push codec, keeping per-chunk error feedback
// (or DGC momentum correction) between pushes; the pull side checks every
// reply chunk and rebuilds compressed pull replies in a per-chunk mirror of
// the parameters. Chunks below compress_min_bytes travel dense.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/codec/codec.h"
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
  // INVALID_ARGUMENT if either does not parse.
  static absl::StatusOr<std::unique_ptr<ChunkCodec>> Create(const std::string& push_codec,
                                                            const std::string& pull_codec,
                                                            size_t compress_min_bytes);
  ~ChunkCodec();

  // (Re)creates the state of every chunk of `info`: fresh residuals and
  // empty mirrors.
  absl::Status AddTensor(const TensorInfo& info);

  // The pull-codec parameters a pull of this chunk asks for; empty when the
  // chunk is pulled dense.
  const std::string& PullParams(const ChunkKey& key) const;

  // The version of the chunk's pull view (the last reply's view_version;
  // 0: none, or the chunk is pulled dense). A pull sends it so the shard
  // answers from the view this client holds, whatever replies were lost.
  // Read it for every attempt of a call: a retried call may follow one
  // whose first chunks arrived.
  uint64_t ViewVersion(const ChunkKey& key) const;

  // Fills the codec fields, payload and checksum of `out` for the chunk's
  // `values` (its identity fields are the caller's). A dense payload
  // borrows `values`, which must outlive the send. `clock` and `rank` seed
  // random codecs (DeriveSeed), as the shard derives them.
  absl::Status EncodePush(const ChunkKey& key, absl::Span<const float> values, int64_t clock,
                          uint32_t rank, OutgoingChunk* out);

  // Checks one reply chunk (it must be one of `spans`, of the tensor
  // `name`, with a matching checksum) and writes its parameters to
  // `tensor` (the whole tensor's buffer) at the chunk's offset; nothing is
  // written on error (DATA_LOSS, without the shard's name).
  absl::Status DecodePull(const std::string& name, absl::Span<const ChunkSpan> spans,
                          const proto::TensorChunk& reply, const PayloadView& payload,
                          float* tensor);

 private:
  struct PushState;
  struct Mirror;

  ChunkCodec(CodecSpec push_spec, CodecSpec pull_spec, std::unique_ptr<Codec> pull_decoder,
             size_t compress_min_bytes);
  // Shared, so a re-registration replacing an entry never frees state that
  // a push or pull in flight still uses.
  std::shared_ptr<PushState> PushStateFor(const ChunkKey& key) const;
  std::shared_ptr<Mirror> MirrorFor(const ChunkKey& key) const;
  absl::Status DecodeIntoMirror(const std::string& name, const ChunkSpan& span,
                                const proto::TensorChunk& reply, const PayloadView& payload,
                                Mirror& mirror, float* tensor) const;

  const CodecSpec push_spec_;
  std::string push_params_;  // as sent: push_spec_ without worker-only fields
  const CodecSpec pull_spec_;
  const std::string pull_params_;
  const std::unique_ptr<Codec> pull_decoder_;  // Decode is const: shared by all chunks
  const size_t compress_min_bytes_;

  mutable absl::Mutex mutex_;  // guards the maps; each entry has its own lock
  absl::flat_hash_map<ChunkKey, std::shared_ptr<PushState>, absl::Hash<ChunkKey>> push_
      ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<ChunkKey, std::shared_ptr<Mirror>, absl::Hash<ChunkKey>> mirrors_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_CHUNK_CODEC_H_
