#include "worker/workload/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace harrier::workload {
namespace {

// Evaluate's batch: large enough for efficient GEMMs, small enough that
// scratch stays around a megabyte per hidden layer.
constexpr int kEvalBatch = 512;

// Uniform in [-limit, limit) from the top 24 bits of the generator, so
// initial values are bit-identical across standard libraries (the
// std::*_distribution algorithms are implementation-defined; mt19937_64's
// output sequence is not).
float UniformSymmetric(std::mt19937_64& rng, float limit) {
  const float unit = static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * limit;
}

// Numerically stable log(sum(exp(z))) over one row of logits.
float LogSumExp(const float* z, int n) {
  const float max = *std::max_element(z, z + n);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) sum += std::exp(z[j] - max);
  return max + std::log(sum);
}

}  // namespace

absl::Status CheckMlpLayerSizes(const std::vector<int>& sizes) {
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
    // Labels are bytes.
    return absl::InvalidArgumentError(absl::StrCat(
        "MLP output size ", sizes.back(), " exceeds 256 classes"));
  }
  return absl::OkStatus();
}

std::vector<ParamTensor> MlpParamLayout(const std::vector<int>& sizes) {
  std::vector<ParamTensor> params;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    const int in = sizes[i], out = sizes[i + 1];
    params.push_back({absl::StrCat("fc", i, ".weight"),
                      {out, in},
                      std::vector<float>(static_cast<size_t>(out) * in)});
    params.push_back({absl::StrCat("fc", i, ".bias"), {out},
                      std::vector<float>(out, 0.0f)});
  }
  return params;
}

absl::Status CheckMlpBatch(const float* images, const uint8_t* labels,
                           int batch_size, int num_classes) {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size ", batch_size, " must be positive"));
  }
  if (images == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("null images or labels");
  }
  for (int b = 0; b < batch_size; ++b) {
    if (labels[b] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", int{labels[b]}, " of batch example ", b,
                       " is out of range [0, ", num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMlpEvalData(const Dataset& data, int input_size) {
  if (data.example_size() != input_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("data set examples have ", data.rows, "x", data.cols,
                     " = ", data.example_size(), " values; the MLP takes ",
                     input_size));
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
  return absl::OkStatus();
}

Mlp::Mlp(std::vector<int> layer_sizes) : layer_sizes_(std::move(layer_sizes)) {}

absl::StatusOr<Mlp> Mlp::Create(const MlpOptions& options) {
  const std::vector<int>& sizes = options.layer_sizes;
  absl::Status status = CheckMlpLayerSizes(sizes);
  if (!status.ok()) return status;
  Mlp mlp(sizes);
  mlp.params_ = MlpParamLayout(sizes);
  std::mt19937_64 rng(options.seed);
  const int layers = mlp.num_layers();
  for (int i = 0; i < layers; ++i) {
    const int in = sizes[i], out = sizes[i + 1];
    const bool is_output = i == layers - 1;
    // He for layers feeding a ReLU keeps activation variance steady; Glorot
    // for the logits keeps the initial softmax close to uniform. Biases
    // start at zero.
    const float limit = is_output ? std::sqrt(6.0f / static_cast<float>(in + out))
                                  : std::sqrt(6.0f / static_cast<float>(in));
    for (float& w : mlp.params_[2 * i].values) w = UniformSymmetric(rng, limit);
  }
  return mlp;
}

int64_t Mlp::num_parameters() const {
  int64_t total = 0;
  for (const ParamTensor& p : params_) total += p.values.size();
  return total;
}

Gradients Mlp::ZeroGradients() const {
  Gradients grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    grads[i].assign(params_[i].values.size(), 0.0f);
  }
  return grads;
}

absl::Status Mlp::CheckBatch(const float* images, const uint8_t* labels,
                             int batch_size) const {
  return CheckMlpBatch(images, labels, batch_size, num_classes());
}

void Mlp::Reserve(int batch_size, Scratch* scratch) const {
  if (scratch->capacity >= batch_size) return;
  const int layers = num_layers();
  scratch->activations.resize(layers + 1);
  int widest = 0;
  for (int i = 1; i <= layers; ++i) {
    scratch->activations[i].resize(static_cast<size_t>(batch_size) *
                                   layer_sizes_[i]);
  }
  for (int size : layer_sizes_) widest = std::max(widest, size);
  scratch->delta.resize(static_cast<size_t>(batch_size) * widest);
  scratch->delta_prev.resize(static_cast<size_t>(batch_size) * widest);
  scratch->capacity = batch_size;
}

const float* Mlp::Forward(const float* images, int batch_size,
                          Scratch* scratch) const {
  const int layers = num_layers();
  const float* input = images;
  for (int i = 0; i < layers; ++i) {
    const int in = layer_sizes_[i], out = layer_sizes_[i + 1];
    const float* weight = params_[2 * i].values.data();
    const float* bias = params_[2 * i + 1].values.data();
    float* output = scratch->activations[i + 1].data();
    // Broadcast the bias into the output, then accumulate
    // input (B x in) * weight^T (in x out) on top of it with beta = 1.
    for (int b = 0; b < batch_size; ++b) {
      std::copy(bias, bias + out, output + static_cast<size_t>(b) * out);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch_size, out, in,
                1.0f, input, in, weight, in, 1.0f, output, out);
    if (i + 1 < layers) {
      const size_t n = static_cast<size_t>(batch_size) * out;
      for (size_t k = 0; k < n; ++k) output[k] = std::max(output[k], 0.0f);
    }
    input = output;
  }
  return input;
}

absl::StatusOr<float> Mlp::ComputeGradients(const float* images,
                                            const uint8_t* labels,
                                            int batch_size, Gradients* grads) {
  absl::Status status = CheckBatch(images, labels, batch_size);
  if (!status.ok()) return status;
  if (grads == nullptr) return absl::InvalidArgumentError("null gradients");
  Reserve(batch_size, &scratch_);
  const float* logits = Forward(images, batch_size, &scratch_);

  grads->resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    (*grads)[i].resize(params_[i].values.size());
  }

  // d(mean loss)/d(logits) = (softmax - one_hot) / batch.
  const int classes = num_classes();
  const float inv_batch = 1.0f / static_cast<float>(batch_size);
  double loss_sum = 0.0;
  float* delta = scratch_.delta.data();
  for (int b = 0; b < batch_size; ++b) {
    const float* z = logits + static_cast<size_t>(b) * classes;
    float* d = delta + static_cast<size_t>(b) * classes;
    const float lse = LogSumExp(z, classes);
    loss_sum += lse - z[labels[b]];
    for (int j = 0; j < classes; ++j) d[j] = std::exp(z[j] - lse) * inv_batch;
    d[labels[b]] -= inv_batch;
  }

  for (int i = num_layers() - 1; i >= 0; --i) {
    const int in = layer_sizes_[i], out = layer_sizes_[i + 1];
    const float* input =
        i == 0 ? images : scratch_.activations[i].data();
    float* weight_grad = (*grads)[2 * i].data();
    float* bias_grad = (*grads)[2 * i + 1].data();
    // dW (out x in) = delta^T (out x B) * input (B x in).
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch_size,
                1.0f, delta, out, input, in, 0.0f, weight_grad, in);
    std::fill(bias_grad, bias_grad + out, 0.0f);
    for (int b = 0; b < batch_size; ++b) {
      const float* d = delta + static_cast<size_t>(b) * out;
      for (int j = 0; j < out; ++j) bias_grad[j] += d[j];
    }
    if (i == 0) break;  // no gradient w.r.t. the images is needed
    // d(input) (B x in) = delta (B x out) * W (out x in), then through the
    // ReLU that produced the input: zero where it was clamped.
    float* delta_prev = scratch_.delta_prev.data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch_size, in, out,
                1.0f, delta, out, params_[2 * i].values.data(), in, 0.0f,
                delta_prev, in);
    const size_t n = static_cast<size_t>(batch_size) * in;
    for (size_t k = 0; k < n; ++k) {
      if (input[k] <= 0.0f) delta_prev[k] = 0.0f;
    }
    std::swap(scratch_.delta, scratch_.delta_prev);
    delta = scratch_.delta.data();
  }
  return static_cast<float>(loss_sum / batch_size);
}

absl::StatusOr<float> Mlp::Loss(const float* images, const uint8_t* labels,
                                int batch_size) const {
  absl::Status status = CheckBatch(images, labels, batch_size);
  if (!status.ok()) return status;
  Scratch scratch;
  const int chunk = std::min(batch_size, kEvalBatch);
  Reserve(chunk, &scratch);
  const int classes = num_classes();
  double loss_sum = 0.0;
  for (int start = 0; start < batch_size; start += chunk) {
    const int n = std::min(chunk, batch_size - start);
    const float* logits = Forward(
        images + static_cast<size_t>(start) * input_size(), n, &scratch);
    for (int b = 0; b < n; ++b) {
      const float* z = logits + static_cast<size_t>(b) * classes;
      loss_sum += LogSumExp(z, classes) - z[labels[start + b]];
    }
  }
  return static_cast<float>(loss_sum / batch_size);
}

absl::StatusOr<double> Mlp::Evaluate(const Dataset& data) const {
  absl::Status status = CheckMlpEvalData(data, input_size());
  if (!status.ok()) return status;
  Scratch scratch;
  const int chunk = std::min(data.num_examples, kEvalBatch);
  Reserve(chunk, &scratch);
  const int classes = num_classes();
  int64_t correct = 0;
  for (int start = 0; start < data.num_examples; start += chunk) {
    const int n = std::min(chunk, data.num_examples - start);
    status = CheckBatch(data.image(start), &data.labels[start], n);
    if (!status.ok()) return status;
    const float* logits = Forward(data.image(start), n, &scratch);
    for (int b = 0; b < n; ++b) {
      const float* z = logits + static_cast<size_t>(b) * classes;
      const int predicted =
          static_cast<int>(std::max_element(z, z + classes) - z);
      if (predicted == data.labels[start + b]) ++correct;
    }
  }
  return static_cast<double>(correct) / data.num_examples;
}

absl::Status Mlp::SgdStep(const Gradients& grads, float lr) {
  if (grads.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", grads.size(), " gradient tensors for ",
                     params_.size(), " parameters"));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (grads[i].size() != params_[i].values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient for ", params_[i].name, " has ", grads[i].size(),
          " values, expected ", params_[i].values.size()));
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    cblas_saxpy(static_cast<int>(grads[i].size()), -lr, grads[i].data(), 1,
                params_[i].values.data(), 1);
  }
  return absl::OkStatus();
}

}  // namespace harrier::workload
