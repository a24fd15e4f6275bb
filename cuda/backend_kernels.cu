// Kernels behind DecodeAdd, DGC's momentum correction and the device
// CRC32C (kernels.h). Kept out of codec_kernels.cu so that file's nvcc job
// does not grow; the same rules hold: explicit _rn intrinsics (and
// -fmad=false) so every fp32 operation rounds as the CPU's does.

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace harrier {
namespace cuda {
namespace kernels {
namespace {

constexpr int kThreads = 256;

int Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return static_cast<int>(b);
}

int Launched() { return static_cast<int>(cudaGetLastError()); }

#define GRID_STRIDE(i, n)                                                   \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<size_t>(gridDim.x) * blockDim.x)

// y += scale * x: the CPU's Emit(accumulate) (out[i] += scale * value).
__global__ void AxpyKernel(const float* x, float scale, float* y, size_t n) {
  GRID_STRIDE(i, n) { y[i] = __fadd_rn(y[i], __fmul_rn(scale, x[i])); }
}

// Indices are distinct (validated increasing, or random-k's draw), so no
// two threads touch one element and plain read-modify-write is exact.
__global__ void ScatterAddKernel(const uint32_t* idx, const float* val,
                                 size_t k, float scale, float* out) {
  GRID_STRIDE(j, k) {
    const uint32_t i = idx[j];
    out[i] = __fadd_rn(out[i], __fmul_rn(scale, val[j]));
  }
}

// next_u = momentum * u + g;  next_v = v + next_u (CPU's order and roundings).
__global__ void DgcPrepareKernel(const float* g, const float* u, const float* v,
                                 float momentum, float* next_u, float* next_v,
                                 size_t n) {
  GRID_STRIDE(i, n) {
    const float nu = __fadd_rn(__fmul_rn(momentum, u[i]), g[i]);
    next_u[i] = nu;
    next_v[i] = __fadd_rn(v[i], nu);
  }
}

// v = next_v - D(p);  u = 0 where D(p) != 0, else next_u.
__global__ void DgcCommitKernel(const float* next_u, const float* next_v,
                                const float* decoded, float* u, float* v,
                                size_t n) {
  GRID_STRIDE(i, n) {
    const float dec = decoded[i];
    v[i] = __fsub_rn(next_v[i], dec);
    u[i] = dec != 0.0f ? 0.0f : next_u[i];
  }
}

// One thread per segment, the byte-at-a-time table CRC of common/crc32c.cc
// (Crc32cPortable from a zero CRC); the table lives in shared memory, built
// by the block. The host joins the segments with Crc32cCombine.
__global__ void Crc32cSegmentsKernel(const uint8_t* data, size_t bytes,
                                     size_t segment, size_t segments,
                                     uint32_t* crcs) {
  __shared__ uint32_t table[256];
  for (int t = threadIdx.x; t < 256; t += blockDim.x) {
    uint32_t c = static_cast<uint32_t>(t);
    for (int b = 0; b < 8; ++b) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[t] = c;
  }
  __syncthreads();
  GRID_STRIDE(s, segments) {
    const size_t begin = s * segment;
    const size_t end = begin + segment < bytes ? begin + segment : bytes;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = begin; i < end; ++i) {
      c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
    }
    crcs[s] = ~c;
  }
}

}  // namespace

int Axpy(const float* d_x, float scale, float* d_y, size_t n) {
  if (n == 0) return 0;
  AxpyKernel<<<Blocks(n), kThreads>>>(d_x, scale, d_y, n);
  return Launched();
}

int ScatterAdd(const uint32_t* d_idx, const float* d_val, size_t k, float scale,
               float* d_out) {
  if (k == 0) return 0;
  ScatterAddKernel<<<Blocks(k), kThreads>>>(d_idx, d_val, k, scale, d_out);
  return Launched();
}

int DgcPrepare(const float* d_g, const float* d_u, const float* d_v,
               float momentum, float* d_next_u, float* d_next_v, size_t n) {
  if (n == 0) return 0;
  DgcPrepareKernel<<<Blocks(n), kThreads>>>(d_g, d_u, d_v, momentum, d_next_u,
                                            d_next_v, n);
  return Launched();
}

int DgcCommit(const float* d_next_u, const float* d_next_v,
              const float* d_decoded, float* d_u, float* d_v, size_t n) {
  if (n == 0) return 0;
  DgcCommitKernel<<<Blocks(n), kThreads>>>(d_next_u, d_next_v, d_decoded, d_u,
                                           d_v, n);
  return Launched();
}

int Crc32cSegments(const void* d_data, size_t bytes, size_t segment,
                   uint32_t* d_crcs) {
  if (bytes == 0 || segment == 0) return 0;
  const size_t segments = (bytes + segment - 1) / segment;
  Crc32cSegmentsKernel<<<Blocks(segments), kThreads>>>(
      static_cast<const uint8_t*>(d_data), bytes, segment, segments, d_crcs);
  return Launched();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace harrier
