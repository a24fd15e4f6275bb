// The CPU MLP (worker/workload/mlp.h) on a CUDA device: the same network,
// parameter layout and loss, with the layers as cuBLAS SGEMMs and the glue
// (bias, ReLU, softmax cross-entropy, bias gradients, SGD) as CUDA kernels.
//
// Plain C++: no CUDA types, so code built without nvcc can include it. The
// implementation links only with --config=cuda (target :device_mlp). The
// generic device pieces (memory, runtime wrappers) come from //cuda, which
// knows nothing of workloads; what is MLP-shaped lives here.
//
// Equality with Mlp: the same fp32 operations except for the GEMMs, whose
// summation order is cuBLAS's, and expf/logf (CUDA's, within
// 2 ulp); loss, gradients and parameters after SGD agree within ~1e-5
// relative (//tests/cuda:mlp_gpu_test checks 1e-4). Bias gradients sum the
// batch in the CPU's order; the loss is summed in double on the host.
//
// Threads and streams: every call is synchronous on the legacy default
// stream of the calling thread's current device and returns when its
// results are in host memory. A DeviceMlp owns device memory and a cuBLAS
// handle and is used by one thread at a time.

#ifndef HARRIER_WORKER_WORKLOAD_CUDA_DEVICE_MLP_H_
#define HARRIER_WORKER_WORKLOAD_CUDA_DEVICE_MLP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/model.h"

namespace harrier {
namespace workload {

class DeviceMlp {
 public:
  // Allocates parameters and gradients for `layer_sizes` (input, hidden...,
  // classes; the rules of MlpOptions). InvalidArgument for bad
  // sizes, FailedPrecondition when no CUDA device is present, Internal for
  // CUDA / cuBLAS failures. Parameters hold no values until UploadParams.
  static absl::StatusOr<std::unique_ptr<DeviceMlp>> Create(
      const std::vector<int>& layer_sizes);
  ~DeviceMlp();
  DeviceMlp(const DeviceMlp&) = delete;
  DeviceMlp& operator=(const DeviceMlp&) = delete;

  const std::vector<int>& layer_sizes() const;
  int input_size() const { return layer_sizes().front(); }
  int num_classes() const { return layer_sizes().back(); }

  // Copies host parameters in Mlp's layout ("fc<i>.weight"
  // {out, in}, "fc<i>.bias" {out}, in order) to the device. InvalidArgument,
  // naming the tensor, when the count or a shape differs (device values are
  // then unspecified until the next successful upload).
  absl::Status UploadParams(const std::vector<ParamTensor>& params);

  // Copies the device parameters into `params`, which must already have the
  // layout (e.g. Mlp::params()); only `values` are written.
  absl::Status DownloadParams(std::vector<ParamTensor>* params) const;

  // Copies the batch (host memory, borrowed for the call) to the device,
  // runs forward and backward, and returns the mean cross-entropy loss.
  // Keeps the gradients on the device (for SgdStep) and, unless host_grads
  // is null, copies them into *host_grads, resized to the params layout.
  // Same InvalidArgument checks and messages as Mlp;
  // FailedPrecondition before the first UploadParams.
  absl::StatusOr<float> ComputeGradients(const float* host_images,
                                         const uint8_t* host_labels, int batch,
                                         Gradients* host_grads);

  // Device parameters -= lr * the gradients of the last ComputeGradients.
  // FailedPrecondition when no gradients have been computed.
  absl::Status SgdStep(float lr);

  // The device buffers, for callers that keep training state on the device
  // (DeviceMlpModel::device()): tensor t in Mlp's params() order,
  // tensor_size(t) floats each, valid for this object's life. Writing the
  // parameters directly is allowed once UploadParams has run (they then
  // are what the next computation uses); the gradients are those of the
  // last ComputeGradients.
  size_t num_tensors() const;
  size_t tensor_size(size_t t) const;
  float* device_params(size_t t) const;
  float* device_grads(size_t t) const;

  // Sets every gradient to 0 on the device; SgdStep is then a no-op step
  // rather than FailedPrecondition (gradient buffers hold defined values
  // from the start).
  absl::Status ZeroGradients();

  // y = a x + b y over n device floats, as fl(fl(a x) + fl(b y)) (no FMA);
  // y = fl(a x) when b is 0, whatever y held.
  absl::Status Axpby(float a, const float* x, float b, float* y, size_t n);

  // Fraction of `data` classified correctly (ties: the lowest class wins, as
  // on the CPU), in device batches of 512. Same InvalidArgument checks as
  // Mlp::Evaluate; FailedPrecondition before UploadParams.
  absl::StatusOr<double> Evaluate(const Dataset& data);

 private:
  struct Impl;
  explicit DeviceMlp(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace workload
}  // namespace harrier

#endif  // HARRIER_WORKER_WORKLOAD_CUDA_DEVICE_MLP_H_
