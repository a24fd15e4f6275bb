#include "cuda/cuda_codec_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/device_codec.h"
#include "cuda/device_memory.h"
#include "cuda/kernels.h"

namespace harrier {
namespace cuda {
namespace {

absl::Status Check(int err, absl::string_view what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA error in ", what, ": ", kernels::ErrorString(err)));
}

// A zeroed device array of n floats (the residual, u and v start at zero).
absl::StatusOr<DeviceArray> Zeros(size_t n) {
  absl::StatusOr<DeviceArray> a = DeviceArray::Create(n);
  if (!a.ok()) return a.status();
  absl::Status st = Check(kernels::Memset(a->data(), 0, 4 * n), "cudaMemset");
  if (!st.ok()) return st;
  return a;
}

// Host bytes (possibly in pieces) to device memory, piece by piece: no
// host staging copy of a fragmented reply.
absl::Status PayloadToDevice(const PayloadView& host, void* device) {
  char* dst = static_cast<char*>(device);
  for (absl::string_view piece : host.pieces()) {
    absl::Status st =
        Check(kernels::ToDevice(dst, piece.data(), piece.size()), "copy to device");
    if (!st.ok()) return st;
    dst += piece.size();
  }
  return absl::OkStatus();
}

class CudaPushStream : public PushStream {
 public:
  CudaPushStream(std::unique_ptr<DeviceCodec> codec, size_t n, PushState mode,
                 float momentum, DeviceArray a, DeviceArray b)
      : codec_(std::move(codec)),
        n_(n),
        mode_(mode),
        momentum_(momentum),
        residual_or_u_(std::move(a)),
        v_(std::move(b)) {}

  absl::Status Encode(const float* values, size_t n, const CodecContext& ctx,
                      std::string* payload) override {
    payload->clear();
    if (n != n_) {
      return absl::InvalidArgumentError(
          absl::StrCat("push stream of ", n_, " elements given ", n));
    }
    switch (mode_) {
      case PushState::kMomentum:
        return DgcMomentumOnDevice(*codec_, momentum_, values,
                                   residual_or_u_.data(), v_.data(), n, ctx,
                                   payload);
      case PushState::kErrorFeedback:
        return ErrorFeedbackOnDevice(*codec_, values, residual_or_u_.data(), n,
                                     ctx, payload);
      case PushState::kNone:
        break;
    }
    return codec_->Encode(values, n, ctx, payload);
  }

 private:
  const std::unique_ptr<DeviceCodec> codec_;
  const size_t n_;
  const PushState mode_;
  const float momentum_;
  DeviceArray residual_or_u_;  // the residual e, or DGC's u
  DeviceArray v_;              // DGC's v
};

class CudaPullMirror : public PullMirror {
 public:
  CudaPullMirror(std::unique_ptr<DeviceCodec> decoder, DeviceArray mirror)
      : decoder_(std::move(decoder)), mirror_(std::move(mirror)) {}

  bool empty() const override { return !filled_; }

  absl::Status SetDense(const PayloadView& payload, float* out) override {
    const size_t n = mirror_.size();
    if (payload.size() != n * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dense reply of ", payload.size(), " bytes for a mirror of ", n, " floats"));
    }
    // A half-copied mirror is not a mirror: empty until the copy succeeds.
    filled_ = false;
    absl::Status st = PayloadToDevice(payload, mirror_.data());
    if (st.ok() && n > 0) {
      st = Check(kernels::DeviceToDevice(out, mirror_.data(), 4 * n), "copy device to device");
    }
    if (!st.ok()) return st;
    filled_ = true;
    return absl::OkStatus();
  }

  absl::Status SetDenseFrom(const float* values, float* out) override {
    const size_t n = mirror_.size();
    filled_ = false;
    absl::Status st = absl::OkStatus();
    if (n > 0) {
      st = Check(kernels::DeviceToDevice(mirror_.data(), values, 4 * n), "copy device to device");
    }
    if (st.ok() && n > 0 && out != values) {
      st = Check(kernels::DeviceToDevice(out, values, 4 * n), "copy device to device");
    }
    if (!st.ok()) return st;
    filled_ = true;
    return absl::OkStatus();
  }

  absl::Status AddCompressed(absl::string_view payload, float* out) override {
    if (!filled_) {
      return absl::FailedPreconditionError("compressed reply before the first dense one");
    }
    const size_t n = mirror_.size();
    // DecodeAdd validates the whole payload on the host before it touches
    // the mirror, so a refused reply writes neither the mirror nor out.
    absl::Status st = decoder_->DecodeAdd(payload, 1.0f, mirror_.data(), n);
    if (!st.ok()) return st;
    if (n == 0) return absl::OkStatus();
    return Check(kernels::DeviceToDevice(out, mirror_.data(), 4 * n), "copy device to device");
  }

 private:
  const std::unique_ptr<DeviceCodec> decoder_;
  DeviceArray mirror_;
  bool filled_ = false;
};

class CudaBuffer : public BackendBuffer {
 public:
  explicit CudaBuffer(DeviceArray array) : array_(std::move(array)) {}
  float* data() override { return array_.data(); }
  size_t size() const override { return array_.size(); }

 private:
  DeviceArray array_;
};

class CudaCodecBackend : public CodecBackend {
 public:
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  std::string name() const override { return "cuda"; }

  absl::StatusOr<std::unique_ptr<PushStream>> NewPushStream(const CodecSpec& spec,
                                                            size_t n) override {
    absl::StatusOr<std::unique_ptr<DeviceCodec>> codec = DeviceCodec::Create(spec);
    if (!codec.ok()) return codec.status();
    const PushState mode = PushStateFor(spec);
    DeviceArray a, b;
    if (mode != PushState::kNone) {
      absl::StatusOr<DeviceArray> z = Zeros(n);
      if (!z.ok()) return z.status();
      a = std::move(*z);
    }
    if (mode == PushState::kMomentum) {
      absl::StatusOr<DeviceArray> z = Zeros(n);
      if (!z.ok()) return z.status();
      b = std::move(*z);
    }
    return std::unique_ptr<PushStream>(
        new CudaPushStream(std::move(*codec), n, mode, static_cast<float>(spec.momentum),
                           std::move(a), std::move(b)));
  }

  absl::StatusOr<std::unique_ptr<PullMirror>> NewPullMirror(const CodecSpec& spec,
                                                            size_t n) override {
    absl::StatusOr<std::unique_ptr<DeviceCodec>> codec = DeviceCodec::Create(spec);
    if (!codec.ok()) return codec.status();
    absl::StatusOr<DeviceArray> mirror = DeviceArray::Create(n);
    if (!mirror.ok()) return mirror.status();
    return std::unique_ptr<PullMirror>(new CudaPullMirror(std::move(*codec), std::move(*mirror)));
  }

  absl::Status CopyToHost(const float* values, size_t n, float* host) override {
    return Check(kernels::ToHost(host, values, 4 * n), "copy to host");
  }

  absl::Status CopyFromHost(const PayloadView& host, float* values) override {
    return PayloadToDevice(host, values);
  }

  absl::StatusOr<uint32_t> Crc32c(const void* data, size_t bytes) override {
    return DeviceCrc32c(data, bytes);
  }

  absl::StatusOr<std::unique_ptr<BackendBuffer>> NewBuffer(size_t n) override {
    absl::StatusOr<DeviceArray> array = DeviceArray::Create(n);
    if (!array.ok()) return array.status();
    return std::unique_ptr<BackendBuffer>(new CudaBuffer(std::move(*array)));
  }

  absl::Status CopyWithin(const float* from, size_t n, float* to) override {
    if (n == 0 || from == to) return absl::OkStatus();
    return Check(kernels::DeviceToDevice(to, from, 4 * n), "copy device to device");
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<CodecBackend>> NewCudaCodecBackend() {
  if (!DeviceAvailable()) {
    return absl::FailedPreconditionError("no CUDA device: cannot create the CUDA codec backend");
  }
  return std::shared_ptr<CodecBackend>(std::make_shared<CudaCodecBackend>());
}

}  // namespace cuda
}  // namespace harrier
