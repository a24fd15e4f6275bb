// The device codecs (device_codec.h) behind CodecBackend
// (common/codec/codec_backend.h): push streams with the residual or DGC's
// u and v in device memory, pull mirrors in device memory (DecodeAdd on
// the device), staging copies and CRC32C on the device. What the client
// uses for tensors registered with MemoryKind::kDevice.
//
// Plain C++ (no CUDA types); links only with --config=cuda
// (//cuda:cuda_codec_backend). All work runs on the current device's
// legacy default stream, synchronously, like DeviceCodec.

#ifndef HARRIER_CUDA_CUDA_CODEC_BACKEND_H_
#define HARRIER_CUDA_CUDA_CODEC_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/codec/codec_backend.h"

namespace harrier {
namespace cuda {

// FAILED_PRECONDITION when no CUDA device is present.
absl::StatusOr<std::shared_ptr<CodecBackend>> NewCudaCodecBackend();

}  // namespace cuda
}  // namespace harrier

#endif  // HARRIER_CUDA_CUDA_CODEC_BACKEND_H_
