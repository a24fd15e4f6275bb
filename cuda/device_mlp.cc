#include "cuda/device_mlp.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cuda/device_codec.h"
#include "cuda/kernels.h"
#include "cuda/mlp_kernels.h"

namespace harrier {
namespace cuda {
namespace {

namespace k = kernels;
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

absl::Status CheckLayerSizes(const std::vector<int>& sizes) {
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP needs at least an input and an output size, got ",
                     sizes.size(), " layer sizes"));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MLP layer size ", i, " is ", sizes[i], "; must be positive"));
    }
  }
  if (sizes.back() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MLP output size ", sizes.back(), " exceeds 256 classes"));
  }
  return absl::OkStatus();
}

}  // namespace

struct DeviceMlp::Impl {
  std::vector<int> sizes;
  void* blas = nullptr;
  // Tensor t = 2 * layer (weight) or 2 * layer + 1 (bias).
  std::vector<DeviceBuffer> params;
  std::vector<DeviceBuffer> grads;
  std::vector<size_t> tensor_sizes;  // floats per tensor
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

  absl::Status CheckBatch(const float* images_in, const uint8_t* labels_in,
                          int batch) const {
    if (batch <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch size ", batch, " must be positive"));
    }
    if (images_in == nullptr || labels_in == nullptr) {
      return absl::InvalidArgumentError("null images or labels");
    }
    for (int b = 0; b < batch; ++b) {
      if (labels_in[b] >= sizes.back()) {
        return absl::InvalidArgumentError(
            absl::StrCat("label ", int{labels_in[b]}, " of batch example ", b,
                         " is out of range [0, ", sizes.back(), ")"));
      }
    }
    return absl::OkStatus();
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
  absl::Status status = CheckLayerSizes(layer_sizes);
  if (!status.ok()) return status;
  if (!DeviceAvailable()) {
    return absl::FailedPreconditionError(
        "no CUDA device: cannot create a device MLP");
  }
  auto impl = std::make_unique<Impl>();
  impl->sizes = layer_sizes;
  status = CheckBlas(mk::BlasCreate(&impl->blas), "cublasCreate");
  if (!status.ok()) return status;
  const int layers = impl->layers();
  for (int i = 0; i < layers; ++i) {
    impl->tensor_sizes.push_back(static_cast<size_t>(layer_sizes[i + 1]) *
                                 layer_sizes[i]);
    impl->tensor_sizes.push_back(static_cast<size_t>(layer_sizes[i + 1]));
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

namespace {

// InvalidArgument unless `params` has the layout of an MLP with `sizes`.
absl::Status CheckLayout(const std::vector<int>& sizes,
                         const std::vector<workload::ParamTensor>& params) {
  const size_t want = 2 * (sizes.size() - 1);
  if (params.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", params.size(), " parameter tensors for a ",
                     absl::StrJoin(sizes, ","), " MLP, which has ", want));
  }
  for (size_t t = 0; t < params.size(); ++t) {
    const int layer = static_cast<int>(t / 2);
    const std::vector<int64_t> shape =
        t % 2 == 0 ? std::vector<int64_t>{sizes[layer + 1], sizes[layer]}
                   : std::vector<int64_t>{sizes[layer + 1]};
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    if (params[t].shape != shape || params[t].values.size() != count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", params[t].name, " (tensor ", t, ") has shape {",
          absl::StrJoin(params[t].shape, ","), "} and ",
          params[t].values.size(), " values; expected {",
          absl::StrJoin(shape, ","), "}"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DeviceMlp::UploadParams(
    const std::vector<workload::ParamTensor>& params) {
  absl::Status status = CheckLayout(impl_->sizes, params);
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
    std::vector<workload::ParamTensor>* params) const {
  if (params == nullptr) return absl::InvalidArgumentError("null parameters");
  absl::Status status = CheckLayout(impl_->sizes, *params);
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
    workload::Gradients* host_grads) {
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

absl::StatusOr<double> DeviceMlp::Evaluate(const workload::Dataset& data) {
  Impl& m = *impl_;
  if (data.example_size() != input_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data set examples have ", data.rows, "x", data.cols,
                     " = ", data.example_size(), " values; the MLP takes ",
                     input_size()));
  }
  if (data.num_examples <= 0 ||
      data.images.size() !=
          static_cast<size_t>(data.num_examples) * data.example_size() ||
      data.labels.size() != static_cast<size_t>(data.num_examples)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data set is empty or inconsistent: ", data.num_examples,
        " examples, ", data.images.size(), " pixels, ", data.labels.size(),
        " labels"));
  }
  if (!m.params_uploaded) {
    return absl::FailedPreconditionError("device MLP parameters never uploaded");
  }
  const int chunk = std::min(data.num_examples, kEvalBatch);
  absl::Status status = m.Reserve(chunk);
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

}  // namespace cuda
}  // namespace harrier
