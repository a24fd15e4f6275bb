#ifndef HARRIER_WORKER_WORKLOAD_CNN_H_
#define HARRIER_WORKER_WORKLOAD_CNN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/model.h"

namespace harrier::workload {

struct CnnOptions {
  // Same seed, same initial parameters, on every machine.
  uint64_t seed = 1;
};

// The net of examples/torch_fashion_mnist.py, so the PyTorch and C++ runs
// compare: input 1x28x28; conv1 5x5 1->16 (padding 2), ReLU, max-pool 2;
// conv2 5x5 16->32 (padding 2), ReLU, max-pool 2; flatten in C,H,W order
// (1568); fc1 1568->128, ReLU; fc2 128->10; softmax cross-entropy, mean
// over the batch. Pixels in [0, 1] (Dataset's scale) are standardised with
// the training set's mean and standard deviation before conv1, as the
// PyTorch example does; the padding is zero after that.
//
// params(), in order: conv1.weight {16,1,5,5}, conv1.bias {16},
// conv2.weight {32,16,5,5}, conv2.bias {32}, fc1.weight {128,1568},
// fc1.bias {128}, fc2.weight {10,128}, fc2.bias {10}: 215,370 floats.
// Weights are uniform in +-sqrt(3 / fan_in) (conv1, conv2, fc1: He's
// initialisation with gain 1, see Create in cnn.cc) or Glorot-uniform (fc2,
// the logits) from the seed, bit-identical on every machine; biases start
// at zero.
//
// Convolutions are im2col + cblas_sgemm, one example at a time (an
// example's column matrix, 400 x 196 floats for conv2, stays in cache),
// forward and backward; max-pooling keeps its argmax indices for backward.
//
// Thread-compatible, as Mlp: const methods (Loss, Evaluate) allocate their
// own scratch and may run concurrently; ComputeGradients and SgdStep need
// exclusive access. ComputeGradients keeps its scratch between calls, sized
// for the largest batch seen, so a step allocates nothing after the first
// at that batch size. OpenBLAS's thread count is process-wide; set
// OPENBLAS_NUM_THREADS=1 when several workers share a machine.
class Cnn : public Model {
 public:
  static constexpr int kImageSide = 28;
  static constexpr int kClasses = 10;
  static constexpr int64_t kNumParameters = 215370;

  static absl::StatusOr<Cnn> Create(const CnnOptions& options);

  Cnn(Cnn&&) = default;
  Cnn& operator=(Cnn&&) = default;
  Cnn(const Cnn&) = default;
  Cnn& operator=(const Cnn&) = default;

  std::vector<ParamTensor>& params() override { return params_; }
  const std::vector<ParamTensor>& params() const override { return params_; }

  int input_size() const override { return kImageSide * kImageSide; }
  int num_classes() const override { return kClasses; }
  int64_t num_parameters() const override;

  Gradients ZeroGradients() const override;

  // As Model::ComputeGradients. InvalidArgument for a non-positive batch,
  // null pointers, a label >= 10, or params() whose sizes were changed;
  // nothing is written then.
  absl::StatusOr<float> ComputeGradients(const float* images, const uint8_t* labels,
                                         int batch_size, Gradients* grads) override;

  // Mean cross-entropy loss of a batch; same arguments and errors.
  absl::StatusOr<float> Loss(const float* images, const uint8_t* labels, int batch_size) const;

  // Fraction of `data` classified correctly, in batches so memory stays
  // bounded. InvalidArgument unless the examples are 28x28 and the data set
  // is non-empty and consistent with labels < 10.
  absl::StatusOr<double> Evaluate(const Dataset& data) const override;

  // params -= lr * grads; InvalidArgument (params intact) unless `grads`
  // has the params() layout.
  absl::Status SgdStep(const Gradients& grads, float lr) override;

 private:
  Cnn() = default;
  absl::Status CheckParams() const;

  std::vector<ParamTensor> params_;
  // ComputeGradients' per-batch buffers (activations, gradients, im2col
  // columns) and max-pool argmax indices, carved up in cnn.cc; sized for
  // `capacity_` examples.
  std::vector<float> arena_;
  std::vector<int32_t> argmax_;
  int capacity_ = 0;
};

// The parameter layout above, values zero-filled.
std::vector<ParamTensor> CnnParamLayout();

// The same net's loss (and, when `grads` is non-null, its gradients,
// resized to the layout) computed entirely in double precision from
// double parameters in the params() layout: the reference a test checks
// the float model and finite differences against. Same errors as
// Cnn::ComputeGradients, plus a params layout mismatch.
absl::StatusOr<double> CnnLossAndGradientsDouble(const std::vector<std::vector<double>>& params,
                                                 const float* images, const uint8_t* labels,
                                                 int batch_size,
                                                 std::vector<std::vector<double>>* grads);

}  // namespace harrier::workload

#endif  // HARRIER_WORKER_WORKLOAD_CNN_H_
