// The MLP's device half (see mlp_kernels.h): cuBLAS GEMMs for the layers and
// small element-wise kernels for what sits between them. Simple one-thread-
// per-element (or per-row) kernels: the MLP's matrices are small, the GEMMs
// dominate.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/workload/cuda/mlp_kernels.h"

namespace harrier {
namespace workload {
namespace mlp_kernels {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  // Grid-stride loops cover the rest.
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

int LaunchStatus() { return static_cast<int>(cudaGetLastError()); }

__global__ void BiasAddKernel(float* y, const float* bias, int rows, int cols,
                              bool relu) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = y[k] + bias[k % cols];
    y[k] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void ReluBackwardKernel(float* dx, const float* activation,
                                   int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (activation[k] <= 0.0f) dx[k] = 0.0f;
  }
}

// One thread per row: the same sequence of fp32 operations as the CPU Mlp
// (max, sum of exp, max + log(sum), then exp(z - lse) * inv_rows).
__global__ void SoftmaxCrossEntropyKernel(const float* logits,
                                          const uint8_t* labels, int rows,
                                          int classes, float inv_rows,
                                          float* loss, float* delta) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       r < rows; r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* z = logits + r * classes;
    float* d = delta + r * classes;
    float max = z[0];
    for (int j = 1; j < classes; ++j) max = z[j] > max ? z[j] : max;
    float sum = 0.0f;
    for (int j = 0; j < classes; ++j) sum += expf(z[j] - max);
    const float lse = max + logf(sum);
    const int label = labels[r];
    loss[r] = lse - z[label];
    for (int j = 0; j < classes; ++j) d[j] = expf(z[j] - lse) * inv_rows;
    d[label] -= inv_rows;
  }
}

__global__ void ColumnSumsKernel(const float* x, int rows, int cols,
                                 float* sums) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       j < cols; j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t r = 0; r < rows; ++r) sum += x[r * cols + j];
    sums[j] = sum;
  }
}

__global__ void ArgMaxKernel(const float* logits, int rows, int classes,
                             int32_t* argmax) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       r < rows; r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* z = logits + r * classes;
    int best = 0;
    for (int j = 1; j < classes; ++j) {
      if (z[j] > z[best]) best = j;  // strict: the first maximum wins
    }
    argmax[r] = best;
  }
}

__global__ void SgdStepKernel(float* param, const float* grad, int64_t n,
                              float lr) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    param[k] -= lr * grad[k];
  }
}

__global__ void AxpbyKernel(float a, const float* x, float b, float* y,
                            int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float ax = __fmul_rn(a, x[k]);
    y[k] = b == 0.0f ? ax : __fadd_rn(ax, __fmul_rn(b, y[k]));
  }
}

}  // namespace

const char* BlasStatusString(int status) {
  return cublasGetStatusString(static_cast<cublasStatus_t>(status));
}

int BlasCreate(void** handle) {
  cublasHandle_t h = nullptr;
  cublasStatus_t status = cublasCreate(&h);
  if (status != CUBLAS_STATUS_SUCCESS) return static_cast<int>(status);
  // Plain fp32 GEMMs: no TF32 tensor-core math, so results stay within fp32
  // rounding of the CPU's.
  status = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
  if (status != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    return static_cast<int>(status);
  }
  *handle = h;
  return 0;
}

int BlasDestroy(void* handle) {
  return static_cast<int>(cublasDestroy(static_cast<cublasHandle_t>(handle)));
}

// cuBLAS is column-major: a row-major (r x c) matrix is its (c x r)
// transpose there, so each row-major product below is computed as the
// transposed product with operands swapped.

int ForwardGemm(void* handle, const float* d_x, const float* d_w, int rows,
                int in, int out, float* d_y) {
  // Y^T (out x rows) = W (out x in) * X^T (in x rows); W seen column-major
  // is W^T (in x out), hence op T.
  const float one = 1.0f, zero = 0.0f;
  return static_cast<int>(cublasSgemm(static_cast<cublasHandle_t>(handle),
                                      CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in,
                                      &one, d_w, in, d_x, in, &zero, d_y, out));
}

int WeightGradGemm(void* handle, const float* d_delta, const float* d_x,
                   int rows, int in, int out, float* d_dw) {
  // dW^T (in x out) = X^T (in x rows) * delta (rows x out).
  const float one = 1.0f, zero = 0.0f;
  return static_cast<int>(cublasSgemm(static_cast<cublasHandle_t>(handle),
                                      CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows,
                                      &one, d_x, in, d_delta, out, &zero, d_dw,
                                      in));
}

int InputGradGemm(void* handle, const float* d_delta, const float* d_w,
                  int rows, int in, int out, float* d_dx) {
  // dX^T (in x rows) = W^T (in x out) * delta^T (out x rows).
  const float one = 1.0f, zero = 0.0f;
  return static_cast<int>(cublasSgemm(static_cast<cublasHandle_t>(handle),
                                      CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out,
                                      &one, d_w, in, d_delta, out, &zero, d_dx,
                                      in));
}

int BiasAdd(float* d_y, const float* d_bias, int rows, int cols, bool relu) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  BiasAddKernel<<<Blocks(n), kThreads>>>(d_y, d_bias, rows, cols, relu);
  return LaunchStatus();
}

int ReluBackward(float* d_dx, const float* d_activation, int64_t n) {
  ReluBackwardKernel<<<Blocks(n), kThreads>>>(d_dx, d_activation, n);
  return LaunchStatus();
}

int SoftmaxCrossEntropy(const float* d_logits, const uint8_t* d_labels,
                        int rows, int classes, float inv_rows, float* d_loss,
                        float* d_delta) {
  SoftmaxCrossEntropyKernel<<<Blocks(rows), kThreads>>>(
      d_logits, d_labels, rows, classes, inv_rows, d_loss, d_delta);
  return LaunchStatus();
}

int ColumnSums(const float* d_x, int rows, int cols, float* d_sums) {
  ColumnSumsKernel<<<Blocks(cols), kThreads>>>(d_x, rows, cols, d_sums);
  return LaunchStatus();
}

int ArgMax(const float* d_logits, int rows, int classes, int32_t* d_argmax) {
  ArgMaxKernel<<<Blocks(rows), kThreads>>>(d_logits, rows, classes, d_argmax);
  return LaunchStatus();
}

int Axpby(float a, const float* d_x, float b, float* d_y, int64_t n) {
  AxpbyKernel<<<Blocks(n), kThreads>>>(a, d_x, b, d_y, n);
  return LaunchStatus();
}

int SgdStep(float* d_param, const float* d_grad, int64_t n, float lr) {
  SgdStepKernel<<<Blocks(n), kThreads>>>(d_param, d_grad, n, lr);
  return LaunchStatus();
}

}  // namespace mlp_kernels
}  // namespace workload
}  // namespace harrier
