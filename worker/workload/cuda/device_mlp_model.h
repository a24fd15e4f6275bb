// Model on a CUDA device: the trainer's view of DeviceMlp, in two forms.
//
// Host interface (Model): params() are host mirrors (the trainer pulls into
// and pushes from them); ComputeGradients and Evaluate upload them first,
// so the device computes with what the host holds, and gradients come back
// to host memory. SgdStep (local SGD) updates the host mirrors with the CPU
// Mlp's SgdStep.
//
// Device-resident interface (device(), workload::DeviceResidentModel):
// kParams and kGrads are DeviceMlp's own buffers, so the trainer pulls into
// and pushes from device memory and nothing but the batch and the loss
// crosses PCIe per step. The device parameters start as params()'s initial
// values (uploaded by Create). Use one interface per training run: the
// host ComputeGradients / Evaluate overwrite the device parameters with
// params(), and the device interface never updates params().
//
// Plain C++ (no CUDA types); links only with --config=cuda
// (//worker/workload/cuda:device_mlp_model). Used by one thread at a time,
// including the const Evaluate, which reuses the device scratch.

#ifndef HARRIER_WORKER_WORKLOAD_CUDA_DEVICE_MLP_MODEL_H_
#define HARRIER_WORKER_WORKLOAD_CUDA_DEVICE_MLP_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/workload/cuda/device_mlp.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/mlp.h"
#include "worker/workload/model.h"

namespace harrier {
namespace workload {

class DeviceMlpModel : public Model {
 public:
  ~DeviceMlpModel() override;
  // The initial parameters are Mlp::Create(options)'s, so a CPU
  // and a CUDA worker with the same seed start from the same values.
  // Errors: those of Mlp::Create and DeviceMlp::Create (FailedPrecondition
  // without a device).
  static absl::StatusOr<std::unique_ptr<DeviceMlpModel>> Create(
      const MlpOptions& options);

  std::vector<ParamTensor>& params() override {
    return host_.params();
  }
  const std::vector<ParamTensor>& params() const override {
    return host_.params();
  }
  DeviceResidentModel* device() override { return resident_.get(); }

  int input_size() const override { return host_.input_size(); }
  int num_classes() const override { return host_.num_classes(); }
  int64_t num_parameters() const override { return host_.num_parameters(); }
  Gradients ZeroGradients() const override {
    return host_.ZeroGradients();
  }

  absl::StatusOr<float> ComputeGradients(const float* images,
                                         const uint8_t* labels, int batch_size,
                                         Gradients* grads) override;
  absl::StatusOr<double> Evaluate(const Dataset& data) const override;
  absl::Status SgdStep(const Gradients& grads, float lr) override;

 private:
  class Resident;
  DeviceMlpModel(Mlp host, std::unique_ptr<DeviceMlp> device);

  // Holds the host parameters; its own CPU compute is not used.
  Mlp host_;
  std::unique_ptr<DeviceMlp> device_;
  std::unique_ptr<DeviceResidentModel> resident_;
};

}  // namespace workload
}  // namespace harrier

#endif  // HARRIER_WORKER_WORKLOAD_CUDA_DEVICE_MLP_MODEL_H_
