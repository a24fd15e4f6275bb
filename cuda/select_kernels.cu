// Top-k, threshold selection, gather and scatter, built on CUB.
//
// Top-k: a stable radix sort of (abs bits, index) pairs in descending key
// order puts equal abs values in increasing index order, so its first k
// entries are exactly the CPU's "larger abs, then lower index" selection;
// a second radix sort puts those k indices in increasing order.

#include <cuda_runtime.h>

#include <cstdint>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "cuda/kernels.h"

namespace harrier {
namespace cuda {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr size_t kCountOffset = 64;  // in the small workspace

int Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return static_cast<int>(b);
}

size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Carves the large workspace: four n-element u32 arrays and CUB's storage.
struct Layout {
  uint32_t* keys_in;
  uint32_t* keys_out;
  uint32_t* vals_in;
  uint32_t* vals_out;
  void* temp;
  long long* count;  // in the small area
};

Layout Carve(void* ws, size_t n) {
  char* base = static_cast<char*>(ws);
  char* p = base + kSmallWorkspaceBytes;
  const size_t array = Align(4 * (n == 0 ? 1 : n));
  Layout l;
  l.keys_in = reinterpret_cast<uint32_t*>(p);
  l.keys_out = reinterpret_cast<uint32_t*>(p + array);
  l.vals_in = reinterpret_cast<uint32_t*>(p + 2 * array);
  l.vals_out = reinterpret_cast<uint32_t*>(p + 3 * array);
  l.temp = p + 4 * array;
  l.count = reinterpret_cast<long long*>(base + kCountOffset);
  return l;
}

struct AbovePredicate {
  const float* x;
  int mode;
  float tau;
  __device__ bool operator()(uint32_t i) const {
    float a = fabsf(x[i]);
    return mode == 0 ? a > tau : (a >= tau && a > 0.0f);
  }
};

size_t TempBytes(size_t n) {
  const int items = static_cast<int>(n == 0 ? 1 : n);
  size_t sort_pairs = 0, sort_keys = 0, select = 0;
  uint32_t* p = nullptr;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, sort_pairs, p, p, p, p,
                                            items, 0, 31);
  cub::DeviceRadixSort::SortKeys(nullptr, sort_keys, p, p, items);
  cub::DeviceSelect::If(nullptr, select, p, p, static_cast<long long*>(nullptr),
                        items, AbovePredicate{nullptr, 0, 0.0f});
  size_t m = sort_pairs > sort_keys ? sort_pairs : sort_keys;
  return m > select ? m : select;
}

__global__ void AbsKeysKernel(const float* x, size_t n, uint32_t* keys,
                              uint32_t* vals) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    keys[i] = __float_as_uint(fabsf(x[i]));
    vals[i] = static_cast<uint32_t>(i);
  }
}

__global__ void IotaKernel(size_t n, uint32_t* vals) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    vals[i] = static_cast<uint32_t>(i);
  }
}

__global__ void GatherKernel(const float* x, const uint32_t* idx, size_t k,
                             float scale, float* out,
                             unsigned long long* flag) {
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       j < k; j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = __fmul_rn(x[idx[j]], scale);
    if (!isfinite(v)) atomicMin(flag, static_cast<unsigned long long>(j));
    out[j] = v;
  }
}

__global__ void ScatterKernel(const uint32_t* idx, const float* val, size_t k,
                              float* out) {
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       j < k; j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[idx[j]] = val[j];
  }
}

}  // namespace

size_t WorkspaceBytes(size_t n) {
  return kSmallWorkspaceBytes + 4 * Align(4 * (n == 0 ? 1 : n)) +
         Align(TempBytes(n));
}

int TopKIndices(const float* d_x, size_t n, size_t k, uint32_t* d_indices,
                void* d_ws) {
  if (k == 0) return 0;
  Layout l = Carve(d_ws, n);
  size_t temp_bytes = Align(TempBytes(n));
  AbsKeysKernel<<<Blocks(n), kThreads>>>(d_x, n, l.keys_in, l.vals_in);
  cudaError_t err = cub::DeviceRadixSort::SortPairsDescending(
      l.temp, temp_bytes, l.keys_in, l.keys_out, l.vals_in, l.vals_out,
      static_cast<int>(n), 0, 31);
  if (err != cudaSuccess) return static_cast<int>(err);
  temp_bytes = Align(TempBytes(n));
  err = cub::DeviceRadixSort::SortKeys(l.temp, temp_bytes, l.vals_out,
                                       d_indices, static_cast<int>(k));
  if (err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaGetLastError());
}

int SelectIndices(const float* d_x, size_t n, int mode, float tau,
                  uint32_t* d_indices, void* d_ws, size_t* count) {
  *count = 0;
  if (n == 0) return 0;
  Layout l = Carve(d_ws, n);
  size_t temp_bytes = Align(TempBytes(n));
  IotaKernel<<<Blocks(n), kThreads>>>(n, l.vals_in);
  cudaError_t err = cub::DeviceSelect::If(
      l.temp, temp_bytes, l.vals_in, d_indices, l.count, static_cast<int>(n),
      AbovePredicate{d_x, mode, tau});
  if (err != cudaSuccess) return static_cast<int>(err);
  long long selected = 0;
  err = cudaMemcpy(&selected, l.count, sizeof(selected), cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return static_cast<int>(err);
  *count = static_cast<size_t>(selected);
  return 0;
}

int Gather(const float* d_x, const uint32_t* d_idx, size_t k, float scale,
           float* d_out, void* d_ws, uint64_t* first_bad) {
  *first_bad = k;
  if (k == 0) return 0;
  unsigned long long* flag = static_cast<unsigned long long*>(d_ws);
  cudaError_t err = cudaMemset(flag, 0xff, 8);
  if (err != cudaSuccess) return static_cast<int>(err);
  GatherKernel<<<Blocks(k), kThreads>>>(d_x, d_idx, k, scale, d_out, flag);
  err = cudaGetLastError();
  if (err != cudaSuccess) return static_cast<int>(err);
  unsigned long long v = 0;
  err = cudaMemcpy(&v, flag, 8, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return static_cast<int>(err);
  *first_bad = v == ~0ull ? k : static_cast<uint64_t>(v);
  return 0;
}

int Scatter(const uint32_t* d_idx, const float* d_val, size_t k, float* d_out) {
  if (k == 0) return 0;
  ScatterKernel<<<Blocks(k), kThreads>>>(d_idx, d_val, k, d_out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels
}  // namespace cuda
}  // namespace harrier
