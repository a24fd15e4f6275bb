#include "worker/workload/cuda/device_mlp_model.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/device_memory.h"

namespace harrier {
namespace workload {

// The device-resident view: DeviceMlp's buffers plus the optional
// momentum and scratch buffers the trainer asks for.
class DeviceMlpModel::Resident : public DeviceResidentModel {
 public:
  explicit Resident(DeviceMlp* mlp)
      : mlp_(mlp), momentum_(mlp->num_tensors()), scratch_(mlp->num_tensors()) {}

  absl::StatusOr<float*> buffer(size_t tensor, Buffer which) override {
    if (tensor >= mlp_->num_tensors()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", tensor, " out of range: the model has ", mlp_->num_tensors()));
    }
    switch (which) {
      case Buffer::kParams:
        return mlp_->device_params(tensor);
      case Buffer::kGrads:
        return mlp_->device_grads(tensor);
      case Buffer::kMomentum:
        return Lazy(&momentum_[tensor], tensor);
      case Buffer::kScratch:
        return Lazy(&scratch_[tensor], tensor);
    }
    return absl::InvalidArgumentError("unknown buffer");
  }

  absl::StatusOr<float> ComputeGradients(const float* images, const uint8_t* labels,
                                         int batch_size) override {
    // No host gradients: they stay in the kGrads buffers.
    return mlp_->ComputeGradients(images, labels, batch_size, nullptr);
  }

  absl::Status Axpby(float a, const float* x, float b, float* y, size_t n) override {
    return mlp_->Axpby(a, x, b, y, n);
  }

  absl::Status SgdStep(float lr) override { return mlp_->SgdStep(lr); }

  absl::StatusOr<double> Evaluate(const Dataset& data) override {
    return mlp_->Evaluate(data);
  }

 private:
  absl::StatusOr<float*> Lazy(cuda::DeviceArray* array, size_t tensor) {
    if (array->data() == nullptr) {
      absl::StatusOr<cuda::DeviceArray> created =
          cuda::DeviceArray::Create(mlp_->tensor_size(tensor));
      if (!created.ok()) return created.status();
      absl::Status status = created->Fill(0.0f);
      if (!status.ok()) return status;
      *array = std::move(*created);
    }
    return array->data();
  }

  DeviceMlp* const mlp_;
  std::vector<cuda::DeviceArray> momentum_;
  std::vector<cuda::DeviceArray> scratch_;
};

DeviceMlpModel::DeviceMlpModel(Mlp host,
                               std::unique_ptr<DeviceMlp> device)
    : host_(std::move(host)),
      device_(std::move(device)),
      resident_(std::make_unique<Resident>(device_.get())) {}

DeviceMlpModel::~DeviceMlpModel() = default;

absl::StatusOr<std::unique_ptr<DeviceMlpModel>> DeviceMlpModel::Create(
    const MlpOptions& options) {
  absl::StatusOr<Mlp> host = Mlp::Create(options);
  if (!host.ok()) return host.status();
  absl::StatusOr<std::unique_ptr<DeviceMlp>> device =
      DeviceMlp::Create(host->layer_sizes());
  if (!device.ok()) return device.status();
  // The device-resident interface starts from the initial parameters and
  // defined (zero) gradients.
  absl::Status status = (*device)->UploadParams(host->params());
  if (status.ok()) status = (*device)->ZeroGradients();
  if (!status.ok()) return status;
  return std::unique_ptr<DeviceMlpModel>(
      new DeviceMlpModel(std::move(*host), std::move(*device)));
}

absl::StatusOr<float> DeviceMlpModel::ComputeGradients(
    const float* images, const uint8_t* labels, int batch_size,
    Gradients* grads) {
  if (grads == nullptr) return absl::InvalidArgumentError("null gradients");
  absl::Status status = device_->UploadParams(host_.params());
  if (!status.ok()) return status;
  return device_->ComputeGradients(images, labels, batch_size, grads);
}

absl::StatusOr<double> DeviceMlpModel::Evaluate(
    const Dataset& data) const {
  absl::Status status = device_->UploadParams(host_.params());
  if (!status.ok()) return status;
  return device_->Evaluate(data);
}

absl::Status DeviceMlpModel::SgdStep(const Gradients& grads,
                                     float lr) {
  return host_.SgdStep(grads, lr);
}

}  // namespace workload
}  // namespace harrier
