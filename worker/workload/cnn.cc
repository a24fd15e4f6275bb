#include "worker/workload/cnn.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/workload/mlp.h"

namespace harrier::workload {
namespace {

// The net's dimensions (see cnn.h). Convolutions are 5x5, stride 1,
// padding 2, so they keep the spatial size; pools halve it.
constexpr int kSide = Cnn::kImageSide;      // 28
constexpr int kKernel = 5;
constexpr int kPad = 2;
constexpr int kC1 = 16;
constexpr int kC2 = 32;
constexpr int kHw1 = kSide * kSide;              // conv1 output plane, 784
constexpr int kSide2 = kSide / 2;                // 14
constexpr int kHw2 = kSide2 * kSide2;            // conv2 output plane, 196
constexpr int kSide3 = kSide2 / 2;               // 7
constexpr int kPool1 = kC1 * kHw2;               // pool1 output per example, 3136
constexpr int kFlat = kC2 * kSide3 * kSide3;     // pool2 output per example, 1568
constexpr int kHidden = 128;
constexpr int kClasses = Cnn::kClasses;
constexpr int kK1 = 1 * kKernel * kKernel;       // conv1 im2col rows, 25
constexpr int kK2 = kC1 * kKernel * kKernel;     // conv2 im2col rows, 400
constexpr int kCols = kK2 * kHw2;                // the larger column matrix, 78400
static_assert(kK2 * kHw2 >= kK1 * kHw1, "column buffer sized for conv2");

// Fashion-MNIST training pixels' mean and standard deviation, as
// examples/torch_fashion_mnist.py standardises them.
constexpr double kPixelMean = 0.2860;
constexpr double kPixelStd = 0.3530;

// Evaluate's and Loss's batch: bounded scratch (about 7 MiB).
constexpr int kEvalBatch = 256;

// Tensor indices in params() order.
enum : int { kW1, kB1, kW2, kB2, kW3, kB3, kW4, kB4, kNumTensors };

// As in mlp.cc: uniform in [-limit, limit) from the top 24 bits, the same
// on every standard library.
float UniformSymmetric(std::mt19937_64& rng, float limit) {
  const float unit = static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * limit;
}

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}
void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const double* a, int lda,
          const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

// Padded planes: a convolution's input with its 2-pixel zero border, so
// im2col rows are plain fixed-length copies. The border is never written
// (the arena starts zeroed), only the interior.
template <int Side>
constexpr int kPadded = Side + 2 * kPad;

// Writes channels x Side x Side values into the interior of `padded`
// (channels x kPadded x kPadded), as value * scale + shift.
template <int Side, typename T, typename Src>
void PadInto(const Src* in, int channels, T scale, T shift, T* padded) {
  constexpr int P = kPadded<Side>;
  for (int c = 0; c < channels; ++c) {
    for (int y = 0; y < Side; ++y) {
      const Src* src = in + (c * Side + y) * Side;
      T* dst = padded + (c * P + y + kPad) * P + kPad;
      for (int x = 0; x < Side; ++x) dst[x] = static_cast<T>(src[x]) * scale + shift;
    }
  }
}

// Column matrix of a 5x5 convolution of one padded example: row
// (c, ky, kx) of `cols` (channels*25 rows of Side*Side) holds
// padded[c][y + ky][x + kx].
template <int Side, typename T>
void Im2Col(const T* padded, int channels, T* cols) {
  constexpr int P = kPadded<Side>;
  for (int c = 0; c < channels; ++c) {
    for (int ky = 0; ky < kKernel; ++ky) {
      for (int kx = 0; kx < kKernel; ++kx) {
        T* row = cols + static_cast<size_t>((c * kKernel + ky) * kKernel + kx) * Side * Side;
        const T* src = padded + (c * P + ky) * P + kx;
        for (int y = 0; y < Side; ++y) {
          std::copy(src + y * P, src + y * P + Side, row + y * Side);
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds each column entry into the padded position
// it was read from, then writes the interior to `grad_in` (channels x
// Side x Side). `padded` is scratch of channels x kPadded^2 values.
template <int Side, typename T>
void Col2Im(const T* cols, int channels, T* padded, T* grad_in) {
  constexpr int P = kPadded<Side>;
  std::fill(padded, padded + channels * P * P, T(0));
  for (int c = 0; c < channels; ++c) {
    for (int ky = 0; ky < kKernel; ++ky) {
      for (int kx = 0; kx < kKernel; ++kx) {
        const T* row = cols + static_cast<size_t>((c * kKernel + ky) * kKernel + kx) * Side * Side;
        T* dst = padded + (c * P + ky) * P + kx;
        for (int y = 0; y < Side; ++y) {
          for (int x = 0; x < Side; ++x) dst[y * P + x] += row[y * Side + x];
        }
      }
    }
  }
  for (int c = 0; c < channels; ++c) {
    for (int y = 0; y < Side; ++y) {
      const T* src = padded + (c * P + y + kPad) * P + kPad;
      std::copy(src, src + Side, grad_in + (c * Side + y) * Side);
    }
  }
}

// out (cout x hw) = ReLU(w (cout x k) * cols (k x hw) + bias).
template <typename T>
void ConvRelu(const T* cols, const T* w, const T* bias, int cout, int k, int hw, T* out) {
  for (int o = 0; o < cout; ++o) std::fill(out + o * hw, out + (o + 1) * hw, bias[o]);
  Gemm(CblasNoTrans, CblasNoTrans, cout, hw, k, w, k, cols, hw, T(1), out, hw);
  for (int i = 0; i < cout * hw; ++i) out[i] = std::max(out[i], T(0));
}

// 2x2, stride 2 max-pool of channels x side x side; `argmax` gets each
// output's input index (the first maximum in row-major order).
template <typename T>
void MaxPool2(const T* in, int channels, int side, T* out, int32_t* argmax) {
  const int half = side / 2;
  for (int c = 0; c < channels; ++c) {
    for (int oy = 0; oy < half; ++oy) {
      for (int ox = 0; ox < half; ++ox) {
        const int base = (c * side + 2 * oy) * side + 2 * ox;
        int best = base;
        for (int candidate : {base + 1, base + side, base + side + 1}) {
          if (in[candidate] > in[best]) best = candidate;
        }
        const int j = (c * half + oy) * half + ox;
        out[j] = in[best];
        argmax[j] = best;
      }
    }
  }
}

// Backward through ReLU then max-pool: the pooled output's gradient goes to
// its argmax input, unless the pooled value (a ReLU output) was clamped to
// zero. `grad_in` (n_in values) is overwritten.
template <typename T>
void PoolReluBackward(const T* grad_out, const T* pooled, const int32_t* argmax, int n_out,
                      T* grad_in, int n_in) {
  std::fill(grad_in, grad_in + n_in, T(0));
  for (int j = 0; j < n_out; ++j) {
    if (pooled[j] > T(0)) grad_in[argmax[j]] = grad_out[j];
  }
}

// y (batch x out) = x (batch x in) * w^T + bias, ReLU'd when `relu`.
template <typename T>
void Dense(const T* x, const T* w, const T* bias, int batch, int in, int out, bool relu, T* y) {
  for (int b = 0; b < batch; ++b) std::copy(bias, bias + out, y + static_cast<size_t>(b) * out);
  Gemm(CblasNoTrans, CblasTrans, batch, out, in, x, in, w, in, T(1), y, out);
  if (relu) {
    for (size_t i = 0; i < static_cast<size_t>(batch) * out; ++i) y[i] = std::max(y[i], T(0));
  }
}

// Row sums of a rows x cols matrix added into `sums`.
template <typename T>
void AddRowSums(const T* m, int rows, int cols, T* sums) {
  for (int r = 0; r < rows; ++r) {
    T sum = 0;
    for (int c = 0; c < cols; ++c) sum += m[static_cast<size_t>(r) * cols + c];
    sums[r] += sum;
  }
}

// Column sums of a rows x cols matrix written into `sums`.
template <typename T>
void ColumnSums(const T* m, int rows, int cols, T* sums) {
  std::fill(sums, sums + cols, T(0));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) sums[c] += m[static_cast<size_t>(r) * cols + c];
  }
}

// Pointers into one arena for a batch of `batch` examples. Batch-wide
// buffers hold every example's values (pool outputs are needed again in
// backward); per-example ones are reused example after example.
template <typename T>
struct Buffers {
  T* p1;       // batch x 3136, pool1 output (conv2's input)
  T* p2;       // batch x 1568, pool2 output, flattened C,H,W (fc1's input)
  T* h;        // batch x 128, fc1 output after ReLU
  T* logits;   // batch x 10
  T* dlogits;  // batch x 10
  T* dh;       // batch x 128
  T* dp2;      // batch x 1568
  T* a1;       // 16 x 784, one example's conv1 output (after ReLU)
  T* a2;       // 32 x 196, one example's conv2 output (after ReLU)
  T* cols;     // im2col columns, conv2's 400 x 196 at most
  T* dcols;    // their gradient
  T* da1;      // 16 x 784
  T* da2;      // 32 x 196
  T* dp1;      // 3136
  T* pad1;     // 1 x 32 x 32, conv1's padded input
  T* pad2;     // 16 x 18 x 18, conv2's padded input
  T* dpad2;    // 16 x 18 x 18, its gradient
  int32_t* idx1;  // batch x 3136 pool1 argmax
  int32_t* idx2;  // batch x 1568 pool2 argmax
};

constexpr size_t kPerExample = kPool1 + kFlat + kHidden + kClasses + kClasses + kHidden + kFlat;
constexpr size_t kShared = kC1 * kHw1 + kC2 * kHw2 + 2 * kCols + kC1 * kHw1 + kC2 * kHw2 + kPool1 +
                           kPadded<kSide> * kPadded<kSide> +
                           2 * kC1 * kPadded<kSide2> * kPadded<kSide2>;

// Grows the arena to `batch` examples when it is smaller (the only
// allocation), then carves it.
template <typename T>
Buffers<T> Carve(int batch, std::vector<T>* arena, std::vector<int32_t>* argmax, int* capacity) {
  if (*capacity < batch) {
    arena->assign(kShared + kPerExample * batch, T(0));
    argmax->assign(static_cast<size_t>(kPool1 + kFlat) * batch, 0);
    *capacity = batch;
  }
  Buffers<T> buf;
  T* next = arena->data();
  auto take = [&next](size_t n) {
    T* p = next;
    next += n;
    return p;
  };
  const size_t cap = static_cast<size_t>(*capacity);
  buf.p1 = take(kPool1 * cap);
  buf.p2 = take(kFlat * cap);
  buf.h = take(kHidden * cap);
  buf.logits = take(kClasses * cap);
  buf.dlogits = take(kClasses * cap);
  buf.dh = take(kHidden * cap);
  buf.dp2 = take(kFlat * cap);
  buf.a1 = take(kC1 * kHw1);
  buf.a2 = take(kC2 * kHw2);
  buf.cols = take(kCols);
  buf.dcols = take(kCols);
  buf.da1 = take(kC1 * kHw1);
  buf.da2 = take(kC2 * kHw2);
  buf.dp1 = take(kPool1);
  buf.pad1 = take(kPadded<kSide> * kPadded<kSide>);
  buf.pad2 = take(kC1 * kPadded<kSide2> * kPadded<kSide2>);
  buf.dpad2 = take(kC1 * kPadded<kSide2> * kPadded<kSide2>);
  buf.idx1 = argmax->data();
  buf.idx2 = argmax->data() + kPool1 * cap;
  return buf;
}

template <typename T>
using Tensors = std::array<const T*, kNumTensors>;

// Forward pass of a batch; returns the logits (in `buf`).
template <typename T>
const T* Forward(const Tensors<T>& p, const float* images, int batch, const Buffers<T>& buf) {
  const T scale = static_cast<T>(1.0 / kPixelStd);
  const T shift = static_cast<T>(-kPixelMean / kPixelStd);
  for (int b = 0; b < batch; ++b) {
    T* p1 = buf.p1 + static_cast<size_t>(b) * kPool1;
    PadInto<kSide>(images + static_cast<size_t>(b) * kHw1, 1, scale, shift, buf.pad1);
    Im2Col<kSide>(buf.pad1, 1, buf.cols);
    ConvRelu(buf.cols, p[kW1], p[kB1], kC1, kK1, kHw1, buf.a1);
    MaxPool2(buf.a1, kC1, kSide, p1, buf.idx1 + static_cast<size_t>(b) * kPool1);
    PadInto<kSide2>(p1, kC1, T(1), T(0), buf.pad2);
    Im2Col<kSide2>(buf.pad2, kC1, buf.cols);
    ConvRelu(buf.cols, p[kW2], p[kB2], kC2, kK2, kHw2, buf.a2);
    MaxPool2(buf.a2, kC2, kSide2, buf.p2 + static_cast<size_t>(b) * kFlat,
             buf.idx2 + static_cast<size_t>(b) * kFlat);
  }
  Dense(buf.p2, p[kW3], p[kB3], batch, kFlat, kHidden, /*relu=*/true, buf.h);
  Dense(buf.h, p[kW4], p[kB4], batch, kHidden, kClasses, /*relu=*/false, buf.logits);
  return buf.logits;
}

// Summed cross-entropy of the logits; with `dlogits`, also
// d(mean loss)/d(logits) = (softmax - one_hot) / batch.
template <typename T>
double CrossEntropy(const T* logits, const uint8_t* labels, int batch, T* dlogits) {
  double total = 0;
  for (int b = 0; b < batch; ++b) {
    const T* z = logits + static_cast<size_t>(b) * kClasses;
    const T max = *std::max_element(z, z + kClasses);
    double sum = 0;
    for (int j = 0; j < kClasses; ++j) sum += std::exp(static_cast<double>(z[j] - max));
    const double lse = static_cast<double>(max) + std::log(sum);
    total += lse - static_cast<double>(z[labels[b]]);
    if (dlogits != nullptr) {
      T* d = dlogits + static_cast<size_t>(b) * kClasses;
      for (int j = 0; j < kClasses; ++j) {
        d[j] = static_cast<T>(std::exp(static_cast<double>(z[j]) - lse) / batch);
      }
      d[labels[b]] -= static_cast<T>(1.0 / batch);
    }
  }
  return total;
}

// Forward and backward of a batch: returns the mean loss and overwrites
// the gradient tensors `g` (params() order and sizes).
template <typename T>
double LossAndGradients(const Tensors<T>& p, const float* images, const uint8_t* labels,
                        int batch, const Buffers<T>& buf, const std::array<T*, kNumTensors>& g) {
  const T* logits = Forward(p, images, batch, buf);
  const double loss = CrossEntropy(logits, labels, batch, buf.dlogits) / batch;

  // fc2: dW4 (10 x 128) = dlogits^T h; dh = dlogits W4, through fc1's ReLU.
  Gemm(CblasTrans, CblasNoTrans, kClasses, kHidden, batch, buf.dlogits, kClasses, buf.h, kHidden,
       T(0), g[kW4], kHidden);
  ColumnSums(buf.dlogits, batch, kClasses, g[kB4]);
  Gemm(CblasNoTrans, CblasNoTrans, batch, kHidden, kClasses, buf.dlogits, kClasses, p[kW4],
       kHidden, T(0), buf.dh, kHidden);
  for (size_t i = 0; i < static_cast<size_t>(batch) * kHidden; ++i) {
    if (buf.h[i] <= T(0)) buf.dh[i] = T(0);
  }
  // fc1: dW3 (128 x 1568) = dh^T p2; dp2 = dh W3.
  Gemm(CblasTrans, CblasNoTrans, kHidden, kFlat, batch, buf.dh, kHidden, buf.p2, kFlat, T(0),
       g[kW3], kFlat);
  ColumnSums(buf.dh, batch, kHidden, g[kB3]);
  Gemm(CblasNoTrans, CblasNoTrans, batch, kFlat, kHidden, buf.dh, kHidden, p[kW3], kFlat, T(0),
       buf.dp2, kFlat);

  std::fill(g[kW1], g[kW1] + kC1 * kK1, T(0));
  std::fill(g[kB1], g[kB1] + kC1, T(0));
  std::fill(g[kW2], g[kW2] + kC2 * kK2, T(0));
  std::fill(g[kB2], g[kB2] + kC2, T(0));
  const T scale = static_cast<T>(1.0 / kPixelStd);
  const T shift = static_cast<T>(-kPixelMean / kPixelStd);
  for (int b = 0; b < batch; ++b) {
    const T* p1 = buf.p1 + static_cast<size_t>(b) * kPool1;
    // conv2: the gradient at its pre-activation, then dW2 += da2 cols^T
    // (columns recomputed: cheaper than keeping a batch of them) and
    // dcols = W2^T da2, folded back onto pool1's output.
    PoolReluBackward(buf.dp2 + static_cast<size_t>(b) * kFlat,
                     buf.p2 + static_cast<size_t>(b) * kFlat,
                     buf.idx2 + static_cast<size_t>(b) * kFlat, kFlat, buf.da2, kC2 * kHw2);
    AddRowSums(buf.da2, kC2, kHw2, g[kB2]);
    PadInto<kSide2>(p1, kC1, T(1), T(0), buf.pad2);
    Im2Col<kSide2>(buf.pad2, kC1, buf.cols);
    Gemm(CblasNoTrans, CblasTrans, kC2, kK2, kHw2, buf.da2, kHw2, buf.cols, kHw2, T(1), g[kW2],
         kK2);
    Gemm(CblasTrans, CblasNoTrans, kK2, kHw2, kC2, p[kW2], kK2, buf.da2, kHw2, T(0), buf.dcols,
         kHw2);
    Col2Im<kSide2>(buf.dcols, kC1, buf.dpad2, buf.dp1);
    // conv1: no gradient w.r.t. the images is needed.
    PoolReluBackward(buf.dp1, p1, buf.idx1 + static_cast<size_t>(b) * kPool1, kPool1, buf.da1,
                     kC1 * kHw1);
    AddRowSums(buf.da1, kC1, kHw1, g[kB1]);
    PadInto<kSide>(images + static_cast<size_t>(b) * kHw1, 1, scale, shift, buf.pad1);
    Im2Col<kSide>(buf.pad1, 1, buf.cols);
    Gemm(CblasNoTrans, CblasTrans, kC1, kK1, kHw1, buf.da1, kHw1, buf.cols, kHw1, T(1), g[kW1],
         kK1);
  }
  return loss;
}

absl::Status CheckEvalData(const Dataset& data) {
  if (data.rows != kSide || data.cols != kSide) {
    return absl::InvalidArgumentError(absl::StrCat("data set examples are ", data.rows, "x",
                                                   data.cols, "; the CNN takes 28x28"));
  }
  return CheckMlpEvalData(data, kHw1);
}

template <typename Tensor>
absl::Status CheckLayout(const std::vector<Tensor>& tensors, const char* what,
                         size_t (*size_of)(const Tensor&)) {
  static const std::vector<ParamTensor> layout = CnnParamLayout();
  if (tensors.size() != layout.size()) {
    return absl::InvalidArgumentError(absl::StrCat("got ", tensors.size(), " ", what,
                                                   " tensors; the CNN has ", layout.size()));
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    if (size_of(tensors[i]) != layout[i].values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " tensor ", layout[i].name, " has ",
                                                     size_of(tensors[i]), " values, expected ",
                                                     layout[i].values.size()));
    }
  }
  return absl::OkStatus();
}

size_t ParamSize(const ParamTensor& t) { return t.values.size(); }
size_t FloatsSize(const std::vector<float>& v) { return v.size(); }
size_t DoublesSize(const std::vector<double>& v) { return v.size(); }

}  // namespace

std::vector<ParamTensor> CnnParamLayout() {
  auto tensor = [](const char* name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return ParamTensor{name, std::move(shape), std::vector<float>(static_cast<size_t>(n), 0.0f)};
  };
  std::vector<ParamTensor> params;
  params.push_back(tensor("conv1.weight", {kC1, 1, kKernel, kKernel}));
  params.push_back(tensor("conv1.bias", {kC1}));
  params.push_back(tensor("conv2.weight", {kC2, kC1, kKernel, kKernel}));
  params.push_back(tensor("conv2.bias", {kC2}));
  params.push_back(tensor("fc1.weight", {kHidden, kFlat}));
  params.push_back(tensor("fc1.bias", {kHidden}));
  params.push_back(tensor("fc2.weight", {kClasses, kHidden}));
  params.push_back(tensor("fc2.bias", {kClasses}));
  return params;
}

absl::StatusOr<Cnn> Cnn::Create(const CnnOptions& options) {
  Cnn cnn;
  cnn.params_ = CnnParamLayout();
  std::mt19937_64 rng(options.seed);
  // Uniform with variance 1 / fan_in (He's with gain 1) for the layers that
  // feed a ReLU, Glorot-uniform for the logits, drawn in params() order from
  // one generator. Not He's gain of 2: each 2x2 max-pool raises the second
  // moment, and with it the initial loss was 4.7 instead of 2.4 at batch
  // 256, and a 2-worker BSP run at the quickstart's nesterov lr 0.05
  // killed every ReLU within 10 steps (test accuracy 0.10); with gain 1,
  // 80 such steps reach 0.83 on held-out test examples (0.75 with He's).
  const std::array<std::pair<int, float>, 4> weights = {{
      {kW1, std::sqrt(3.0f / kK1)},
      {kW2, std::sqrt(3.0f / kK2)},
      {kW3, std::sqrt(3.0f / kFlat)},
      {kW4, std::sqrt(6.0f / (kHidden + kClasses))},
  }};
  for (const auto& [index, limit] : weights) {
    for (float& w : cnn.params_[index].values) w = UniformSymmetric(rng, limit);
  }
  return cnn;
}

int64_t Cnn::num_parameters() const {
  int64_t total = 0;
  for (const ParamTensor& p : params_) total += static_cast<int64_t>(p.values.size());
  return total;
}

Gradients Cnn::ZeroGradients() const {
  Gradients grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) grads[i].assign(params_[i].values.size(), 0.0f);
  return grads;
}

absl::Status Cnn::CheckParams() const {
  return CheckLayout<ParamTensor>(params_, "parameter", &ParamSize);
}

namespace {
Tensors<float> FloatTensors(const std::vector<ParamTensor>& params) {
  Tensors<float> p;
  for (int i = 0; i < kNumTensors; ++i) p[i] = params[i].values.data();
  return p;
}
}  // namespace

absl::StatusOr<float> Cnn::ComputeGradients(const float* images, const uint8_t* labels,
                                            int batch_size, Gradients* grads) {
  if (auto status = CheckMlpBatch(images, labels, batch_size, kClasses); !status.ok()) {
    return status;
  }
  if (grads == nullptr) return absl::InvalidArgumentError("null gradients");
  if (auto status = CheckParams(); !status.ok()) return status;
  const Buffers<float> buf = Carve(batch_size, &arena_, &argmax_, &capacity_);
  grads->resize(params_.size());
  std::array<float*, kNumTensors> g;
  for (int i = 0; i < kNumTensors; ++i) {
    (*grads)[i].resize(params_[i].values.size());
    g[i] = (*grads)[i].data();
  }
  return static_cast<float>(
      LossAndGradients(FloatTensors(params_), images, labels, batch_size, buf, g));
}

absl::StatusOr<float> Cnn::Loss(const float* images, const uint8_t* labels,
                                int batch_size) const {
  if (auto status = CheckMlpBatch(images, labels, batch_size, kClasses); !status.ok()) {
    return status;
  }
  if (auto status = CheckParams(); !status.ok()) return status;
  std::vector<float> arena;
  std::vector<int32_t> argmax;
  int capacity = 0;
  const int chunk = std::min(batch_size, kEvalBatch);
  const Buffers<float> buf = Carve(chunk, &arena, &argmax, &capacity);
  const Tensors<float> p = FloatTensors(params_);
  double total = 0;
  for (int start = 0; start < batch_size; start += chunk) {
    const int n = std::min(chunk, batch_size - start);
    const float* logits = Forward(p, images + static_cast<size_t>(start) * kHw1, n, buf);
    total += CrossEntropy<float>(logits, labels + start, n, nullptr);
  }
  return static_cast<float>(total / batch_size);
}

absl::StatusOr<double> Cnn::Evaluate(const Dataset& data) const {
  if (auto status = CheckEvalData(data); !status.ok()) return status;
  if (auto status = CheckParams(); !status.ok()) return status;
  std::vector<float> arena;
  std::vector<int32_t> argmax;
  int capacity = 0;
  const int chunk = std::min(data.num_examples, kEvalBatch);
  const Buffers<float> buf = Carve(chunk, &arena, &argmax, &capacity);
  const Tensors<float> p = FloatTensors(params_);
  int64_t correct = 0;
  for (int start = 0; start < data.num_examples; start += chunk) {
    const int n = std::min(chunk, data.num_examples - start);
    if (auto status = CheckMlpBatch(data.image(start), &data.labels[start], n, kClasses);
        !status.ok()) {
      return status;
    }
    const float* logits = Forward(p, data.image(start), n, buf);
    for (int b = 0; b < n; ++b) {
      const float* z = logits + static_cast<size_t>(b) * kClasses;
      if (std::max_element(z, z + kClasses) - z == data.labels[start + b]) ++correct;
    }
  }
  return static_cast<double>(correct) / data.num_examples;
}

absl::Status Cnn::SgdStep(const Gradients& grads, float lr) {
  if (auto status = CheckLayout<std::vector<float>>(grads, "gradient", &FloatsSize);
      !status.ok()) {
    return status;
  }
  if (auto status = CheckParams(); !status.ok()) return status;
  for (size_t i = 0; i < params_.size(); ++i) {
    cblas_saxpy(static_cast<int>(grads[i].size()), -lr, grads[i].data(), 1,
                params_[i].values.data(), 1);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CnnLossAndGradientsDouble(const std::vector<std::vector<double>>& params,
                                                 const float* images, const uint8_t* labels,
                                                 int batch_size,
                                                 std::vector<std::vector<double>>* grads) {
  if (auto status = CheckMlpBatch(images, labels, batch_size, kClasses); !status.ok()) {
    return status;
  }
  if (auto status = CheckLayout<std::vector<double>>(params, "parameter", &DoublesSize);
      !status.ok()) {
    return status;
  }
  std::vector<double> arena;
  std::vector<int32_t> argmax;
  int capacity = 0;
  const Buffers<double> buf = Carve(batch_size, &arena, &argmax, &capacity);
  Tensors<double> p;
  for (int i = 0; i < kNumTensors; ++i) p[i] = params[i].data();
  if (grads == nullptr) {
    const double* logits = Forward(p, images, batch_size, buf);
    return CrossEntropy<double>(logits, labels, batch_size, nullptr) / batch_size;
  }
  grads->resize(kNumTensors);
  std::array<double*, kNumTensors> g;
  for (int i = 0; i < kNumTensors; ++i) {
    (*grads)[i].assign(params[i].size(), 0.0);
    g[i] = (*grads)[i].data();
  }
  return LossAndGradients(p, images, labels, batch_size, buf, g);
}

}  // namespace harrier::workload
