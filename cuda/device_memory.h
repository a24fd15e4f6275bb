// Minimal device-memory helpers in plain C++ (no CUDA headers) for callers
// built without nvcc: tests, benchmarks, and glue that hands gradients to
// //cuda:device_codec. All copies are synchronous on the legacy default
// stream.

#ifndef HARRIER_CUDA_DEVICE_MEMORY_H_
#define HARRIER_CUDA_DEVICE_MEMORY_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace harrier {
namespace cuda {

// An owned array of n floats in device memory. Movable, not copyable;
// not thread-safe.
class DeviceArray {
 public:
  static absl::StatusOr<DeviceArray> Create(size_t n);
  DeviceArray() = default;
  DeviceArray(DeviceArray&& other) noexcept;
  DeviceArray& operator=(DeviceArray&& other) noexcept;
  ~DeviceArray();

  float* data() const { return data_; }
  size_t size() const { return size_; }

  absl::Status CopyFromHost(const float* src, size_t n);
  absl::Status CopyToHost(float* dst, size_t n) const;
  absl::Status CopyFrom(const DeviceArray& src);  // device to device
  absl::Status Fill(float value);                 // via a host buffer

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

// Device-to-device copy of bytes (for memcpy baselines).
absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes);
// Waits for all work on the current device; reports any pending CUDA error.
absl::Status SynchronizeDevice();

}  // namespace cuda
}  // namespace harrier

#endif  // HARRIER_CUDA_DEVICE_MEMORY_H_
