// Where a tensor's compression runs: the per-chunk state the client keeps
// for pushes (codec, error feedback or DGC momentum correction) and for
// compressed pulls (the mirror of the parameters), in the memory the tensor
// lives in. The host backend (host_codec_backend.h) runs the CPU codecs on
// host memory; the CUDA backend (//cuda:cuda_codec_backend) runs their
// device twins on device memory, so a device tensor's values never cross to
// the host: only encoded payloads do (or, for dense chunks, the values
// themselves when the transport cannot send from device memory).
//
// Payloads are always host strings in the wire format of codec.h, so what
// one backend encodes the other decodes.

#ifndef HARRIER_COMMON_CODEC_CODEC_BACKEND_H_
#define HARRIER_COMMON_CODEC_CODEC_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codec/codec.h"
#include "common/payload_view.h"

namespace harrier {

// Where the floats a caller hands over live.
enum class MemoryKind { kHost, kDevice };

absl::string_view MemoryKindName(MemoryKind kind);  // "host" or "device"

// The biased codecs, whose pushes keep error feedback (topk, threshold,
// efsign, onebit, powersgd, unscaled randomk): without feeding back what
// they drop, SGD drifts. A spec with momentum > 0 keeps DGC's momentum
// correction instead. One rule for every backend.
bool NeedsErrorFeedback(const CodecSpec& spec);

// What a push stream keeps besides its codec, by that rule: DGC's u and v
// (momentum > 0), an error-feedback residual, or nothing. Every backend
// asks this one function, so CPU and GPU streams never disagree.
enum class PushState { kNone, kErrorFeedback, kMomentum };
PushState PushStateFor(const CodecSpec& spec);

// One chunk's push stream: the codec (PowerSGD keeps its warm start in it)
// and at most one of an error-feedback residual or DGC's u and v, all in
// the backend's memory. Used by one thread at a time.
class PushStream {
 public:
  virtual ~PushStream() = default;
  // Overwrites *payload with the encoding of the n floats at `values` (in
  // the backend's memory), updating the residual or momentum state. On
  // error the state is unchanged and *payload is empty.
  virtual absl::Status Encode(const float* values, size_t n, const CodecContext& ctx,
                              std::string* payload) = 0;
};

// A chunk's parameters as rebuilt from compressed pull replies, in the
// backend's memory. Empty until the first dense reply. Used by one thread
// at a time.
class PullMirror {
 public:
  virtual ~PullMirror() = default;
  virtual bool empty() const = 0;
  // mirror = the dense reply (host bytes, n floats); out (n floats in the
  // backend's memory) = the same. INVALID_ARGUMENT if the sizes differ.
  virtual absl::Status SetDense(const PayloadView& payload, float* out) = 0;
  // mirror += D(payload) (a host payload of the mirror's codec), then
  // out = mirror. FAILED_PRECONDITION while empty; on any error neither
  // the mirror nor out is written.
  virtual absl::Status AddCompressed(absl::string_view payload, float* out) = 0;
  // As SetDense, from n floats already in the backend's memory (a dense
  // reply the transport received there: CodecBackend::NewBuffer). The
  // default is UNIMPLEMENTED (then nothing lands there).
  virtual absl::Status SetDenseFrom(const float* values, float* out);
};

// n floats of a backend's memory: where the transport receives a dense pull
// reply of a device tensor (ShardTransport::PullInto), so it reaches the
// tensor without crossing the host.
class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  virtual float* data() = 0;
  virtual size_t size() const = 0;
};

// Thread-safe: streams and mirrors are made and used concurrently (each by
// one thread at a time).
class CodecBackend {
 public:
  virtual ~CodecBackend() = default;

  virtual MemoryKind memory() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda"; test fakes say what they are

  // A fresh push stream of `spec` for chunks of n elements: error feedback
  // as NeedsErrorFeedback says, DGC momentum correction for momentum > 0.
  // INVALID_ARGUMENT for a spec the codecs refuse.
  virtual absl::StatusOr<std::unique_ptr<PushStream>> NewPushStream(const CodecSpec& spec,
                                                                    size_t n) = 0;
  // An empty mirror of n elements for pull replies compressed with `spec`.
  virtual absl::StatusOr<std::unique_ptr<PullMirror>> NewPullMirror(const CodecSpec& spec,
                                                                    size_t n) = 0;

  // Dense chunks of tensors in this backend's memory: the staging copies
  // to and from host memory (plain memcpy on the host backend).
  virtual absl::Status CopyToHost(const float* values, size_t n, float* host) = 0;
  virtual absl::Status CopyFromHost(const PayloadView& host, float* values) = 0;

  // CRC32C (common/crc32c.h) of `bytes` bytes at `data` in this backend's
  // memory: the checksum of a dense chunk sent straight from it.
  virtual absl::StatusOr<uint32_t> Crc32c(const void* data, size_t bytes) = 0;

  // Receiving pull replies in place (optional; the defaults are
  // UNIMPLEMENTED, and then replies are staged through host memory):
  // a buffer of n floats in this backend's memory, and a copy within it.
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> NewBuffer(size_t n);
  virtual absl::Status CopyWithin(const float* from, size_t n, float* to);
};

}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_CODEC_BACKEND_H_
