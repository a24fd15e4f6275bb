#include "worker/workload/cuda/device_mlp_model.h"

#include <utility>

namespace harrier {
namespace workload {

DeviceMlpModel::DeviceMlpModel(Mlp host,
                               std::unique_ptr<DeviceMlp> device)
    : host_(std::move(host)), device_(std::move(device)) {}

absl::StatusOr<std::unique_ptr<DeviceMlpModel>> DeviceMlpModel::Create(
    const MlpOptions& options) {
  absl::StatusOr<Mlp> host = Mlp::Create(options);
  if (!host.ok()) return host.status();
  absl::StatusOr<std::unique_ptr<DeviceMlp>> device =
      DeviceMlp::Create(host->layer_sizes());
  if (!device.ok()) return device.status();
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
