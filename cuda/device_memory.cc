#include "cuda/device_memory.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/kernels.h"

namespace harrier {
namespace cuda {
namespace {

absl::Status Check(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA error in ", what, ": ",
                                          kernels::ErrorString(err)));
}

absl::Status CheckSize(size_t have, size_t want) {
  if (want <= have) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("copy of ", want, " floats into a device array of ", have));
}

}  // namespace

absl::StatusOr<DeviceArray> DeviceArray::Create(size_t n) {
  DeviceArray a;
  void* p = nullptr;
  absl::Status st = Check(kernels::Malloc(&p, 4 * n), "cudaMalloc");
  if (!st.ok()) return st;
  a.data_ = static_cast<float*>(p);
  a.size_ = n;
  return a;
}

DeviceArray::DeviceArray(DeviceArray&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceArray& DeviceArray::operator=(DeviceArray&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) kernels::Free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceArray::~DeviceArray() {
  if (data_ != nullptr) kernels::Free(data_);
}

absl::Status DeviceArray::CopyFromHost(const float* src, size_t n) {
  absl::Status st = CheckSize(size_, n);
  if (!st.ok()) return st;
  return Check(kernels::ToDevice(data_, src, 4 * n), "copy to device");
}

absl::Status DeviceArray::CopyToHost(float* dst, size_t n) const {
  absl::Status st = CheckSize(size_, n);
  if (!st.ok()) return st;
  return Check(kernels::ToHost(dst, data_, 4 * n), "copy to host");
}

absl::Status DeviceArray::CopyFrom(const DeviceArray& src) {
  absl::Status st = CheckSize(size_, src.size_);
  if (!st.ok()) return st;
  return Check(kernels::DeviceToDevice(data_, src.data_, 4 * src.size_),
               "device copy");
}

absl::Status DeviceArray::Fill(float value) {
  std::vector<float> host(size_, value);
  return CopyFromHost(host.data(), size_);
}

absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  return Check(kernels::DeviceToDevice(dst, src, bytes), "device copy");
}

absl::Status SynchronizeDevice() {
  return Check(kernels::Synchronize(), "synchronize");
}

}  // namespace cuda
}  // namespace harrier
