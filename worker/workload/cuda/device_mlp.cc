#include "worker/workload/cuda/device_mlp.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cuda/device_codec.h"
#include "cuda/kernels.h"
#include "worker/workload/cuda/mlp_kernels.h"
#include "worker/workload/mlp.h"

namespace harrier {
namespace workload {
namespace {

namespace k = cuda::kernels;
namespace mk = mlp_kernels;

// Evaluate's batch, as on the CPU.
constexpr int kEvalBatch = 512;

absl::Status Check(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA error in ", what, ": ", k::ErrorString(err)));
}

absl::Status CheckBlas(int status, const char* what) {
  if (status == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error in ", what, ": ",
                                          mk::BlasStatusString(status)));
}

// An owned block of device memory. Movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { Release(); }

  // Replaces the contents with `bytes` of uninitialised device memory.
  absl::Status Allocate(size_t bytes) {
    Release();
    void* p = nullptr;
    absl::Status status = Check(k::Malloc(&p, bytes), "cudaMalloc");
    if (!status.ok()) return status;
    data_ = p;
    bytes_ = bytes;
    return absl::OkStatus();
  }

  float* f() const { return static_cast<float*>(data_); }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void Release() {
    if (data_ != nullptr) k::Free(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

struct DeviceMlp::Impl {
  std::vector<int> sizes;
  void* blas = nullptr;
  // Tensor t = 2 * layer (weight) or 2 * layer + 1 (bias).
  std::vector<DeviceBuffer> params;
  std::vector<DeviceBuffer> grads;
  // MlpParamLayout: shape and floats per tensor.
  std::vector<std::vector<int64_t>> shapes;
  std::vector<size_t> tensor_sizes;
  bool params_uploaded = false;
  bool grads_computed = false;

  // Per-batch scratch, sized for the largest batch seen.
  int capacity = 0;
  DeviceBuffer images;               // capacity x input
  DeviceBuffer labels;               // capacity bytes
  std::vector<DeviceBuffer> activations;  // [i]: layer i-1's output; [0] unused
  DeviceBuffer delta, delta_prev;    // capacity x widest
  DeviceBuffer loss;                 // capacity floats
  DeviceBuffer argmax;               // capacity int32

  ~Impl() {
    if (blas != nullptr) mk::BlasDestroy(blas);
  }

  int layers() const { return static_cast<int>(sizes.size()) - 1; }

  absl::Status Reserve(int batch) {
    if (capacity >= batch) return absl::OkStatus();
    const size_t b = static_cast<size_t>(batch);
    int widest = *std::max_element(sizes.begin(), sizes.end());
    absl::Status status = images.Allocate(4 * b * sizes.front());
    if (status.ok()) status = labels.Allocate(b);
    activations.resize(sizes.size());
    for (int i = 1; status.ok() && i <= layers(); ++i) {
      status = activations[i].Allocate(4 * b * sizes[i]);
    }
    if (status.ok()) status = delta.Allocate(4 * b * widest);
    if (status.ok()) status = delta_prev.Allocate(4 * b * widest);
    if (status.ok()) status = loss.Allocate(4 * b);
    if (status.ok()) status = argmax.Allocate(4 * b);
    capacity = status.ok() ? batch : 0;
    return status;
  }

  // InvalidArgument unless `params` has this MLP's layout.
  absl::Status CheckLayout(
      const std::vector<ParamTensor>& params) const {
    if (params.size() != shapes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("got ", params.size(), " parameter tensors for a ",
                       absl::StrJoin(sizes, ","), " MLP, which has ",
                       shapes.size()));
    }
    for (size_t t = 0; t < params.size(); ++t) {
      if (params[t].shape != shapes[t] ||
          params[t].values.size() != tensor_sizes[t]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", params[t].name, " (tensor ", t, ") has shape {",
            absl::StrJoin(params[t].shape, ","), "} and ",
            params[t].values.size(), " values; expected {",
            absl::StrJoin(shapes[t], ","), "}"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckBatch(const float* images_in, const uint8_t* labels_in,
                          int batch) const {
    return CheckMlpBatch(images_in, labels_in, batch, sizes.back());
  }

  // Copies `batch` examples in (scratch reserved) and runs the forward
  // pass; activations[layers()] then holds the logits.
  absl::Status Forward(const float* host_images, const uint8_t* host_labels,
                       int batch) {
    absl::Status status = Check(
        k::ToDevice(images.data(), host_images,
                    4 * static_cast<size_t>(batch) * sizes.front()),
        "copy images to device");
    if (status.ok() && host_labels != nullptr) {
      status = Check(k::ToDevice(labels.data(), host_labels, batch),
                     "copy labels to device");
    }
    const float* input = images.f();
    for (int i = 0; status.ok() && i < layers(); ++i) {
      const int in = sizes[i], out = sizes[i + 1];
      float* output = activations[i + 1].f();
      status = CheckBlas(mk::ForwardGemm(blas, input, params[2 * i].f(), batch,
                                         in, out, output),
                         "forward GEMM");
      if (status.ok()) {
        status = Check(mk::BiasAdd(output, params[2 * i + 1].f(), batch, out,
                                   /*relu=*/i + 1 < layers()),
                       "bias add kernel");
      }
      input = output;
    }
    return status;
  }
};

DeviceMlp::DeviceMlp(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceMlp::~DeviceMlp() = default;

const std::vector<int>& DeviceMlp::layer_sizes() const { return impl_->sizes; }

absl::StatusOr<std::unique_ptr<DeviceMlp>> DeviceMlp::Create(
    const std::vector<int>& layer_sizes) {
  absl::Status status = CheckMlpLayerSizes(layer_sizes);
  if (!status.ok()) return status;
  if (!cuda::DeviceAvailable()) {
    return absl::FailedPreconditionError(
        "no CUDA device: cannot create a device MLP");
  }
  auto impl = std::make_unique<Impl>();
  impl->sizes = layer_sizes;
  status = CheckBlas(mk::BlasCreate(&impl->blas), "cublasCreate");
  if (!status.ok()) return status;
  for (ParamTensor& p : MlpParamLayout(layer_sizes)) {
    impl->shapes.push_back(std::move(p.shape));
    impl->tensor_sizes.push_back(p.values.size());
  }
  impl->params.resize(impl->tensor_sizes.size());
  impl->grads.resize(impl->tensor_sizes.size());
  for (size_t t = 0; status.ok() && t < impl->tensor_sizes.size(); ++t) {
    status = impl->params[t].Allocate(4 * impl->tensor_sizes[t]);
    if (status.ok()) status = impl->grads[t].Allocate(4 * impl->tensor_sizes[t]);
  }
  if (!status.ok()) return status;
  return std::unique_ptr<DeviceMlp>(new DeviceMlp(std::move(impl)));
}

absl::Status DeviceMlp::UploadParams(
    const std::vector<ParamTensor>& params) {
  absl::Status status = impl_->CheckLayout(params);
  if (!status.ok()) return status;
  impl_->params_uploaded = false;
  for (size_t t = 0; t < params.size(); ++t) {
    status = Check(k::ToDevice(impl_->params[t].data(), params[t].values.data(),
                               4 * params[t].values.size()),
                   "copy parameters to device");
    if (!status.ok()) return status;
  }
  impl_->params_uploaded = true;
  return absl::OkStatus();
}

absl::Status DeviceMlp::DownloadParams(
    std::vector<ParamTensor>* params) const {
  if (params == nullptr) return absl::InvalidArgumentError("null parameters");
  absl::Status status = impl_->CheckLayout(*params);
  if (!status.ok()) return status;
  if (!impl_->params_uploaded) {
    return absl::FailedPreconditionError("device MLP parameters never uploaded");
  }
  for (size_t t = 0; t < params->size(); ++t) {
    std::vector<float>& values = (*params)[t].values;
    status = Check(k::ToHost(values.data(), impl_->params[t].data(),
                             4 * values.size()),
                   "copy parameters to host");
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<float> DeviceMlp::ComputeGradients(
    const float* host_images, const uint8_t* host_labels, int batch,
    Gradients* host_grads) {
  Impl& m = *impl_;
  absl::Status status = m.CheckBatch(host_images, host_labels, batch);
  if (!status.ok()) return status;
  if (!m.params_uploaded) {
    return absl::FailedPreconditionError("device MLP parameters never uploaded");
  }
  m.grads_computed = false;
  status = m.Reserve(batch);
  if (status.ok()) status = m.Forward(host_images, host_labels, batch);
  const int layers = m.layers();
  const int classes = m.sizes.back();
  if (status.ok()) {
    // d(mean loss)/d(logits) = (softmax - one_hot) / batch.
    status = Check(
        mk::SoftmaxCrossEntropy(m.activations[layers].f(),
                                static_cast<const uint8_t*>(m.labels.data()),
                                batch, classes,
                                1.0f / static_cast<float>(batch), m.loss.f(),
                                m.delta.f()),
        "softmax cross-entropy kernel");
  }
  for (int i = layers - 1; status.ok() && i >= 0; --i) {
    const int in = m.sizes[i], out = m.sizes[i + 1];
    const float* input = i == 0 ? m.images.f() : m.activations[i].f();
    status = CheckBlas(mk::WeightGradGemm(m.blas, m.delta.f(), input, batch,
                                          in, out, m.grads[2 * i].f()),
                       "weight gradient GEMM");
    if (status.ok()) {
      status = Check(mk::ColumnSums(m.delta.f(), batch, out,
                                    m.grads[2 * i + 1].f()),
                     "bias gradient kernel");
    }
    if (i == 0) break;  // no gradient w.r.t. the images is needed
    // d(input) = delta * W, then zero where the ReLU clamped the input.
    if (status.ok()) {
      status = CheckBlas(mk::InputGradGemm(m.blas, m.delta.f(),
                                           m.params[2 * i].f(), batch, in, out,
                                           m.delta_prev.f()),
                         "input gradient GEMM");
    }
    if (status.ok()) {
      status = Check(mk::ReluBackward(m.delta_prev.f(), input,
                                      static_cast<int64_t>(batch) * in),
                     "ReLU backward kernel");
    }
    std::swap(m.delta, m.delta_prev);
  }
  // The copies below wait for every kernel above and report their errors.
  std::vector<float> losses(batch);
  if (status.ok()) {
    status = Check(k::ToHost(losses.data(), m.loss.data(), 4 * losses.size()),
                   "copy loss to host");
  }
  if (status.ok() && host_grads != nullptr) {
    host_grads->resize(m.tensor_sizes.size());
    for (size_t t = 0; status.ok() && t < m.tensor_sizes.size(); ++t) {
      (*host_grads)[t].resize(m.tensor_sizes[t]);
      status = Check(k::ToHost((*host_grads)[t].data(), m.grads[t].data(),
                               4 * m.tensor_sizes[t]),
                     "copy gradients to host");
    }
  }
  if (!status.ok()) return status;
  m.grads_computed = true;
  double loss_sum = 0.0;
  for (float l : losses) loss_sum += l;
  return static_cast<float>(loss_sum / batch);
}

absl::Status DeviceMlp::SgdStep(float lr) {
  if (!impl_->grads_computed) {
    return absl::FailedPreconditionError(
        "device MLP SGD step before any gradients were computed");
  }
  for (size_t t = 0; t < impl_->tensor_sizes.size(); ++t) {
    absl::Status status =
        Check(mk::SgdStep(impl_->params[t].f(), impl_->grads[t].f(),
                          static_cast<int64_t>(impl_->tensor_sizes[t]), lr),
              "SGD kernel");
    if (!status.ok()) return status;
  }
  return Check(k::Synchronize(), "SGD step");
}

size_t DeviceMlp::num_tensors() const { return impl_->tensor_sizes.size(); }
size_t DeviceMlp::tensor_size(size_t t) const { return impl_->tensor_sizes[t]; }
float* DeviceMlp::device_params(size_t t) const { return impl_->params[t].f(); }
float* DeviceMlp::device_grads(size_t t) const { return impl_->grads[t].f(); }

absl::Status DeviceMlp::ZeroGradients() {
  for (size_t t = 0; t < impl_->tensor_sizes.size(); ++t) {
    absl::Status status = Check(
        k::Memset(impl_->grads[t].data(), 0, 4 * impl_->tensor_sizes[t]), "cudaMemset");
    if (!status.ok()) return status;
  }
  impl_->grads_computed = true;
  return Check(k::Synchronize(), "zero gradients");
}

absl::Status DeviceMlp::Axpby(float a, const float* x, float b, float* y,
                              size_t n) {
  if (n == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("Axpby: null device pointer");
  }
  absl::Status status = Check(
      mk::Axpby(a, x, b, y, static_cast<int64_t>(n)), "axpby kernel");
  if (!status.ok()) return status;
  return Check(k::Synchronize(), "axpby");
}

absl::StatusOr<double> DeviceMlp::Evaluate(const Dataset& data) {
  Impl& m = *impl_;
  absl::Status status = CheckMlpEvalData(data, input_size());
  if (!status.ok()) return status;
  if (!m.params_uploaded) {
    return absl::FailedPreconditionError("device MLP parameters never uploaded");
  }
  const int chunk = std::min(data.num_examples, kEvalBatch);
  status = m.Reserve(chunk);
  if (!status.ok()) return status;
  std::vector<int32_t> predicted(chunk);
  int64_t correct = 0;
  for (int start = 0; start < data.num_examples; start += chunk) {
    const int n = std::min(chunk, data.num_examples - start);
    const uint8_t* labels = &data.labels[start];
    status = m.CheckBatch(data.image(start), labels, n);
    if (status.ok()) status = m.Forward(data.image(start), nullptr, n);
    if (status.ok()) {
      status = Check(mk::ArgMax(m.activations[m.layers()].f(), n,
                                num_classes(),
                                static_cast<int32_t*>(m.argmax.data())),
                     "argmax kernel");
    }
    if (status.ok()) {
      status = Check(k::ToHost(predicted.data(), m.argmax.data(), 4 * n),
                     "copy predictions to host");
    }
    if (!status.ok()) return status;
    for (int b = 0; b < n; ++b) {
      if (predicted[b] == labels[b]) ++correct;
    }
  }
  return static_cast<double>(correct) / data.num_examples;
}

}  // namespace workload
}  // namespace harrier
