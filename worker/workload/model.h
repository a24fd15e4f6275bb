#ifndef HARRIER_WORKER_WORKLOAD_MODEL_H_
#define HARRIER_WORKER_WORKLOAD_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/workload/fashion_mnist.h"

namespace harrier::workload {

// One named parameter: `values` holds the product of `shape` floats,
// row-major. This is the unit a parameter-server client pulls and pushes.
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Gradients, one float vector per parameter tensor, in the same order and
// with the same sizes as Model::params().
using Gradients = std::vector<std::vector<float>>;

// What the trainer needs from a model, wherever it computes: named host
// parameter tensors it pulls into and pushes from, gradients of a batch, a
// local SGD step and test-set accuracy. Implemented by the CPU workload::Mlp
// and by cuda::DeviceMlpModel (//cuda, --config=cuda builds only), whose
// params() are host mirrors uploaded to the device before each computation.
//
// Not thread-safe as an interface: callers use a model from one thread at a
// time (an implementation may document more). Errors are InvalidArgument for
// bad arguments; a device model may also return Internal for device errors.
class DeviceResidentModel;

class Model {
 public:
  virtual ~Model() = default;

  // Non-null for a model whose parameters and gradients live in device
  // memory (cuda::DeviceMlpModel): the trainer then pulls into and pushes
  // from device memory through that interface, and the client compresses
  // on the device. Null (the default): the host interface below.
  virtual DeviceResidentModel* device() { return nullptr; }

  // The parameters, in a fixed order. Callers may overwrite `values` (e.g.
  // after a pull) but must keep the names, shapes and sizes; the next
  // ComputeGradients / Evaluate uses the new values.
  virtual std::vector<ParamTensor>& params() = 0;
  virtual const std::vector<ParamTensor>& params() const = 0;

  virtual int input_size() const = 0;
  virtual int num_classes() const = 0;
  virtual int64_t num_parameters() const = 0;

  // Zero-filled gradients in the params() layout.
  virtual Gradients ZeroGradients() const = 0;

  // Forward and backward over `batch_size` examples: `images` holds
  // batch_size * input_size() floats, `labels` batch_size class indices,
  // both in host memory and borrowed for the call. Returns the mean
  // cross-entropy loss (nats) and writes d(mean loss)/d(param) into
  // `*grads`, resized to the params() layout.
  virtual absl::StatusOr<float> ComputeGradients(const float* images,
                                                 const uint8_t* labels,
                                                 int batch_size,
                                                 Gradients* grads) = 0;

  // Fraction of `data` classified correctly.
  virtual absl::StatusOr<double> Evaluate(const Dataset& data) const = 0;

  // params -= lr * grads; InvalidArgument (params intact) unless `grads`
  // has the params() layout.
  virtual absl::Status SgdStep(const Gradients& grads, float lr) = 0;
};

// Training with parameters and gradients kept in device memory. Tensors are
// those of Model::params() (names, shapes, order); their values there are
// the initial values, read once when the trainer registers the tensors.
// Pointers stay valid for the model's life. Same threading as Model.
class DeviceResidentModel {
 public:
  virtual ~DeviceResidentModel() = default;

  // The buffers of tensor k (params() order), each params()[k] size floats
  // of device memory. kParams and kGrads exist from the start; the trainer
  // asks for kMomentum (signum's gradient momentum) and kScratch (local
  // SGD's round start) only when it needs them, allocated zeroed on first
  // use (INTERNAL on a device error).
  enum class Buffer { kParams, kGrads, kMomentum, kScratch };
  virtual absl::StatusOr<float*> buffer(size_t tensor, Buffer which) = 0;

  // Forward and backward with the device parameters over a host batch (as
  // Model::ComputeGradients); the gradients are left in the kGrads
  // buffers. Returns the mean loss.
  virtual absl::StatusOr<float> ComputeGradients(const float* images, const uint8_t* labels,
                                                 int batch_size) = 0;
  // y = a x + b y over n device floats (y = a x when b is 0, whatever y
  // held): the trainer's gradient momentum and local-SGD deltas.
  virtual absl::Status Axpby(float a, const float* x, float b, float* y, size_t n) = 0;
  // kParams -= lr * kGrads for every tensor (a local SGD step).
  virtual absl::Status SgdStep(float lr) = 0;
  // Fraction of `data` classified correctly with the device parameters.
  virtual absl::StatusOr<double> Evaluate(const Dataset& data) = 0;
};

}  // namespace harrier::workload

#endif  // HARRIER_WORKER_WORKLOAD_MODEL_H_
