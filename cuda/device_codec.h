// CUDA twins of the CPU gradient codecs (common/codec) and of error
// feedback: the input gradient, the decode output and the residual live in
// device memory; payloads are ordinary host strings in the wire format of
// common/codec/codec.h, so a payload encoded here decodes with the CPU codec
// and vice versa.
//
// Plain C++: no CUDA types, so code built without nvcc can include it. The
// implementation links only with --config=cuda (target //cuda:device_codec).
//
// Equality with the CPU codec (see README.md for why):
//   bit-exact payloads: none, fp16, bf16, topk, randomk, threshold (fixed
//     tau and sampled tau), signum, sign without scale, powersgd;
//   bit-exact masks, scales within a rounding of the CPU's: sign:scale=1,
//     efsign, onebit (their scales are double sums in a parallel order);
//   same distribution, bit-exact norms / scale: qsgd, terngrad (per-element
//     counter-based uniforms instead of the CPU's sequential stream);
//   decodes are bit-exact for every codec, given the same payload.
//
// Threads and streams: every call is synchronous on the legacy default
// stream of the current device; it returns when the payload or the output is
// complete. A DeviceCodec, like a Codec, is used by one thread at a time
// (it owns scratch memory and PowerSGD's warm start). The free functions
// build a temporary DeviceCodec and are safe to call concurrently, at the
// price of allocating scratch on every call.

#ifndef HARRIER_CUDA_DEVICE_CODEC_H_
#define HARRIER_CUDA_DEVICE_CODEC_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codec/codec.h"

namespace harrier {
namespace cuda {

// True if the CUDA runtime reports at least one device.
bool DeviceAvailable();

class DeviceCodec {
 public:
  // InvalidArgument for a spec that CreateCodec would refuse;
  // FailedPrecondition when no CUDA device is present.
  static absl::StatusOr<std::unique_ptr<DeviceCodec>> Create(
      const CodecSpec& spec);
  ~DeviceCodec();
  DeviceCodec(const DeviceCodec&) = delete;
  DeviceCodec& operator=(const DeviceCodec&) = delete;

  const CodecSpec& spec() const;

  // Overwrites *payload with the encoding of the n floats at device_input.
  // Same refusals and messages as Codec::Encode (non-finite input, fp16
  // overflow, ...); on error *payload is empty. Sparse codecs on the device
  // need n < 2^31 (Unimplemented above).
  absl::Status Encode(const float* device_input, size_t n,
                      const CodecContext& ctx, std::string* payload);

  // device_out[0, n) = D(payload). The payload must have been encoded by
  // this codec's id; it is validated on the host first, exactly as the CPU
  // decoder does, and a refused payload leaves device_out untouched.
  absl::Status Decode(absl::string_view payload, float* device_out, size_t n);

  // device_accum[0, n) += scale * D(payload), as Codec::DecodeAdd (sparse
  // payloads scatter-add without densifying); validated on the host first,
  // a refused payload leaves device_accum untouched. Bit-exact with the CPU.
  absl::Status DecodeAdd(absl::string_view payload, float scale, float* device_accum,
                         size_t n);

 private:
  struct Impl;
  explicit DeviceCodec(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend absl::Status ErrorFeedbackOnDevice(DeviceCodec&, const float*, float*,
                                            size_t, const CodecContext&,
                                            std::string*);
  friend absl::Status DgcMomentumOnDevice(DeviceCodec&, float, const float*,
                                          float*, float*, size_t,
                                          const CodecContext&, std::string*);
};

// One-shot forms (a fresh DeviceCodec per call; PowerSGD then starts from
// its seeded Q, like a fresh CPU codec).
absl::Status EncodeOnDevice(const CodecSpec& spec, const float* device_input,
                            size_t n, const CodecContext& ctx,
                            std::string* payload);
// Decodes with the codec named in the payload header.
absl::Status DecodeOnDevice(absl::string_view payload, float* device_out,
                            size_t n);

// Error feedback with the residual e in device memory (n floats, owned by
// the caller, zero at the start of a stream):
//   c = g + e;  p = C(c);  e = c - D(p)
// in fp32, the same operations as ErrorFeedback::Compress. On error e is
// unchanged and *payload is empty.
absl::Status ErrorFeedbackOnDevice(DeviceCodec& codec, const float* device_grad,
                                   float* device_residual, size_t n,
                                   const CodecContext& ctx,
                                   std::string* payload);
// DGC momentum correction (common/codec/error_feedback.h,
// DgcMomentumCorrection) with u and v in device memory (n floats each,
// owned by the caller, zero at the start of a stream):
//   u = momentum u + g;  v = v + u;  p = C(v);  v = v - D(p);
//   u_i = 0 where D(p)_i != 0
// in the CPU's fp32 operations, so u and v equal the CPU's bitwise for the
// same payload. On error u, v are unchanged and *payload is empty.
absl::Status DgcMomentumOnDevice(DeviceCodec& codec, float momentum,
                                 const float* device_grad, float* device_u,
                                 float* device_v, size_t n,
                                 const CodecContext& ctx, std::string* payload);

// CRC32C (common/crc32c.h) of `bytes` bytes of device memory, computed on
// the device; equal to the host's Crc32c of the same bytes.
absl::StatusOr<uint32_t> DeviceCrc32c(const void* device_data, size_t bytes);

absl::Status ErrorFeedbackOnDevice(const CodecSpec& spec,
                                   const float* device_grad,
                                   float* device_residual, size_t n,
                                   const CodecContext& ctx,
                                   std::string* payload);

}  // namespace cuda
}  // namespace harrier

#endif  // HARRIER_CUDA_DEVICE_CODEC_H_
