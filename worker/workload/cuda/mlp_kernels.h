// Internal interface between device_mlp.cc (ordinary C++ toolchain) and
// mlp_kernels.cu (nvcc): the MLP's element-wise kernels and the cuBLAS
// calls. Plain C++ only: no CUDA types, no Abseil.
//
// Functions return a cudaError_t as int (0 = success;
// cuda::kernels::ErrorString in cuda/kernels.h) except the Blas* functions,
// which return a cublasStatus_t as int (0 = success; BlasStatusString). Everything runs on the legacy
// default stream; d_* pointers are device memory. Matrices are row-major,
// as in Mlp (mlp.h).

#ifndef HARRIER_WORKER_WORKLOAD_CUDA_MLP_KERNELS_H_
#define HARRIER_WORKER_WORKLOAD_CUDA_MLP_KERNELS_H_

#include <cstdint>

namespace harrier {
namespace workload {
namespace mlp_kernels {

// ---- cuBLAS ----
const char* BlasStatusString(int status);
// A cuBLAS handle on the current device, plain fp32 math (no TF32).
int BlasCreate(void** handle);
int BlasDestroy(void* handle);

// d_y (rows x out) = d_x (rows x in) * d_w^T, d_w (out x in).
int ForwardGemm(void* handle, const float* d_x, const float* d_w, int rows,
                int in, int out, float* d_y);
// d_dw (out x in) = d_delta^T * d_x, d_delta (rows x out), d_x (rows x in).
int WeightGradGemm(void* handle, const float* d_delta, const float* d_x,
                   int rows, int in, int out, float* d_dw);
// d_dx (rows x in) = d_delta (rows x out) * d_w (out x in).
int InputGradGemm(void* handle, const float* d_delta, const float* d_w,
                  int rows, int in, int out, float* d_dx);

// ---- Kernels ----
// d_y[r][j] += d_bias[j]; then max(., 0) when relu.
int BiasAdd(float* d_y, const float* d_bias, int rows, int cols, bool relu);
// d_dx[k] = 0 where d_activation[k] <= 0 (the ReLU clamped it), n values.
int ReluBackward(float* d_dx, const float* d_activation, int64_t n);
// Per row r of the logits (rows x classes): d_loss[r] = logsumexp(z) -
// z[label], d_delta[r][j] = (softmax(z)_j - [j == label]) * inv_rows,
// computed by one thread per row in the CPU's order. Labels must be in
// range (checked on the host).
int SoftmaxCrossEntropy(const float* d_logits, const uint8_t* d_labels,
                        int rows, int classes, float inv_rows, float* d_loss,
                        float* d_delta);
// d_sums[j] = sum over r of d_x[r][j], rows in order (the CPU's order).
int ColumnSums(const float* d_x, int rows, int cols, float* d_sums);
// d_argmax[r] = first index of the largest logit of row r.
int ArgMax(const float* d_logits, int rows, int classes, int32_t* d_argmax);
// d_param[i] -= lr * d_grad[i], n values.
int SgdStep(float* d_param, const float* d_grad, int64_t n, float lr);
// d_y[i] = a * d_x[i] + b * d_y[i] (two roundings, then the sum; no FMA);
// d_y[i] = a * d_x[i] when b == 0, so a NaN in d_y does not survive.
int Axpby(float a, const float* d_x, float b, float* d_y, int64_t n);

}  // namespace mlp_kernels
}  // namespace workload
}  // namespace harrier

#endif  // HARRIER_WORKER_WORKLOAD_CUDA_MLP_KERNELS_H_
