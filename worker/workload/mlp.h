#ifndef HARRIER_WORKER_WORKLOAD_MLP_H_
#define HARRIER_WORKER_WORKLOAD_MLP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/model.h"

namespace harrier::workload {

struct MlpOptions {
  // Input size, hidden sizes, number of classes. At least two entries, all
  // positive. The default fits 28x28 Fashion-MNIST.
  std::vector<int> layer_sizes = {784, 256, 256, 10};
  // Same seed, same initial parameters, on every machine: workers that
  // start from their own copy agree without a pull.
  uint64_t seed = 1;
};

// The rules every MLP implementation (this CPU one and
// //worker/workload/cuda:device_mlp) shares, so that both accept the same
// inputs with the same messages and use the same parameter layout.

// InvalidArgument unless `layer_sizes` obeys MlpOptions::layer_sizes (at
// least two entries, all positive, at most 256 classes).
absl::Status CheckMlpLayerSizes(const std::vector<int>& layer_sizes);

// The parameter layout of an MLP with valid `layer_sizes`, as Mlp::params()
// (names and shapes described at Mlp), values zero-filled.
std::vector<ParamTensor> MlpParamLayout(const std::vector<int>& layer_sizes);

// InvalidArgument for a non-positive batch, null pointers or a label >=
// num_classes. Reads batch_size labels.
absl::Status CheckMlpBatch(const float* images, const uint8_t* labels,
                           int batch_size, int num_classes);

// InvalidArgument unless `data` is non-empty, consistent and has examples of
// input_size values.
absl::Status CheckMlpEvalData(const Dataset& data, int input_size);

// A fully connected ReLU network with a softmax cross-entropy loss, on the
// CPU through OpenBLAS. ParamTensor and Gradients are in model.h.
//
// Layer i has parameters "fc<i>.weight" (shape {out, in}) and "fc<i>.bias"
// (shape {out}), in that order, i = 0 .. layer_sizes.size() - 2. Hidden
// layers use He-uniform initialisation (they feed a ReLU), the output layer
// Glorot-uniform; biases start at zero.
//
// Thread-compatible: const methods may run concurrently with each other
// (each allocates its own scratch); ComputeGradients and SgdStep need
// exclusive access because they reuse member scratch buffers. OpenBLAS's own
// thread count is process-wide; set OPENBLAS_NUM_THREADS=1 when several
// workers share a machine.
class Mlp : public Model {
 public:
  static absl::StatusOr<Mlp> Create(const MlpOptions& options);

  Mlp(Mlp&&) = default;
  Mlp& operator=(Mlp&&) = default;
  Mlp(const Mlp&) = default;
  Mlp& operator=(const Mlp&) = default;

  // Callers may overwrite `values` (e.g. after a pull) but must keep the
  // names, shapes and sizes.
  std::vector<ParamTensor>& params() override { return params_; }
  const std::vector<ParamTensor>& params() const override { return params_; }

  int input_size() const override { return layer_sizes_.front(); }
  int num_classes() const override { return layer_sizes_.back(); }
  const std::vector<int>& layer_sizes() const { return layer_sizes_; }
  int64_t num_parameters() const override;

  // Zero-filled gradients in the params() layout.
  Gradients ZeroGradients() const override;

  // Forward and backward over `batch_size` examples: `images` holds
  // batch_size * input_size() floats, `labels` batch_size class indices.
  // Returns the mean cross-entropy loss (nats) and writes d(mean loss)/d(param)
  // into `*grads`, resizing it to the params() layout. Pointers are borrowed
  // for the call only. InvalidArgument for a non-positive batch, null
  // pointers or a label >= num_classes().
  absl::StatusOr<float> ComputeGradients(const float* images,
                                         const uint8_t* labels, int batch_size,
                                         Gradients* grads) override;

  // Mean cross-entropy loss of a batch, same arguments and errors as above.
  absl::StatusOr<float> Loss(const float* images, const uint8_t* labels,
                             int batch_size) const;

  // Fraction of `data` classified correctly, computed in batches so memory
  // stays bounded. InvalidArgument when the image size does not match
  // input_size(), the data set is empty or a label is out of range.
  absl::StatusOr<double> Evaluate(const Dataset& data) const override;

  // params -= lr * grads. `grads` must have the params() layout (as written
  // by ComputeGradients); InvalidArgument otherwise, leaving params intact.
  absl::Status SgdStep(const Gradients& grads, float lr) override;

 private:
  // Per-batch intermediate values; sized for the largest batch seen.
  struct Scratch {
    int capacity = 0;
    // activations[0] is unused (the input is borrowed); activations[i] is
    // layer i-1's output: pre-softmax logits for the last layer, post-ReLU
    // values otherwise.
    std::vector<std::vector<float>> activations;
    // Gradient w.r.t. a layer's pre-activation, and w.r.t. its input.
    std::vector<float> delta;
    std::vector<float> delta_prev;
  };

  explicit Mlp(std::vector<int> layer_sizes);

  int num_layers() const { return static_cast<int>(layer_sizes_.size()) - 1; }
  absl::Status CheckBatch(const float* images, const uint8_t* labels,
                          int batch_size) const;
  void Reserve(int batch_size, Scratch* scratch) const;
  // Fills scratch->activations for the batch; returns the logits.
  const float* Forward(const float* images, int batch_size,
                       Scratch* scratch) const;

  std::vector<int> layer_sizes_;
  std::vector<ParamTensor> params_;
  Scratch scratch_;
};

}  // namespace harrier::workload

#endif  // HARRIER_WORKER_WORKLOAD_MLP_H_
