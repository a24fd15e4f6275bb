// Element-wise, reduction, quantizer, sign and PowerSGD kernels plus the
// CUDA runtime wrappers of kernels.h. Sorting and selection (CUB) live in
// select_kernels.cu so that each nvcc job stays small.
//
// Bit-exactness with the CPU codecs rests on three rules: the same
// arithmetic in the same precision (IEEE division and sqrt are correctly
// rounded on the device by default), the same summation order wherever a
// sum feeds a payload byte (one thread walks the CPU's loop), and no FMA
// contraction (the genrule passes -fmad=false; LowRankDecode also uses
// explicit _rn intrinsics).

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace harrier {
namespace cuda {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kStatsBlocks = 256;
constexpr int kStats = 6;

// Small-workspace offsets (bytes).
constexpr size_t kFlagOffset = 0;
constexpr size_t kPartialsOffset = 256;
constexpr size_t kStatsOutOffset = kPartialsOffset + 8 * kStats * kStatsBlocks;
static_assert(kStatsOutOffset + 8 * kStats <= kSmallWorkspaceBytes, "layout");

int Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return static_cast<int>(b);
}

int LastError() { return static_cast<int>(cudaGetLastError()); }

unsigned long long* Flag(void* ws) {
  return reinterpret_cast<unsigned long long*>(static_cast<char*>(ws) +
                                               kFlagOffset);
}

// Reads the u64 flag (initialised to all ones) back as an index, n if unset.
int ReadFlag(void* ws, size_t n, uint64_t* out) {
  int err = LastError();
  if (err != 0) return err;
  unsigned long long v = 0;
  err = static_cast<int>(
      cudaMemcpy(&v, Flag(ws), sizeof(v), cudaMemcpyDeviceToHost));
  if (err != 0) return err;
  *out = v == ~0ull ? n : static_cast<uint64_t>(v);
  return 0;
}

int ResetFlag(void* ws) {
  return static_cast<int>(cudaMemset(Flag(ws), 0xff, 8));
}

// ---- The CPU's PRNG pieces (common/codec/codec.cc), device side ----

__device__ inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__device__ inline uint64_t Mix64(uint64_t a, uint64_t b) {
  uint64_t state = a ^ (b * 0x9e3779b97f4a7c15ULL);
  SplitMix64(&state);
  return SplitMix64(&state);
}

// Uniform in [0, 1) with 24 bits, a pure function of (seed, i).
__device__ inline float CounterUniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(Mix64(seed, i) >> 40) * 0x1p-24f;
}

// ---- Half precision, bit-for-bit the CPU's FloatToHalf / FloatToBf16 ----

__device__ inline uint16_t FloatToHalfBits(float f) {
  uint32_t x = __float_as_uint(f);
  uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t out;
  if (x >= (143u << 23)) {
    out = x > (255u << 23) ? 0x7e00 : 0x7c00;
  } else if (x < (113u << 23)) {
    const uint32_t magic_bits = 126u << 23;
    float v = __fadd_rn(__uint_as_float(x), __uint_as_float(magic_bits));
    out = static_cast<uint16_t>(__float_as_uint(v) - magic_bits);
  } else {
    uint32_t mant_odd = (x >> 13) & 1;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff;
    x += mant_odd;
    out = static_cast<uint16_t>(x >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

__device__ inline float HalfBitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    float f = __fmul_rn(static_cast<float>(mant), 0x1p-24f);
    return sign ? -f : f;
  }
  uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                            : (sign | ((exp + 112) << 23) | (mant << 13));
  return __uint_as_float(bits);
}

__device__ inline uint16_t FloatToBf16Bits(float f) {
  uint32_t x = __float_as_uint(f);
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// ---- Kernels ----

#define GRID_STRIDE(i, n)                                                   \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void FirstNonFiniteKernel(const float* x, size_t n,
                                     unsigned long long* flag) {
  GRID_STRIDE(i, n) {
    if (!isfinite(x[i])) atomicMin(flag, static_cast<unsigned long long>(i));
  }
}

__global__ void AddKernel(const float* a, const float* b, float* out,
                          size_t n) {
  GRID_STRIDE(i, n) { out[i] = __fadd_rn(a[i], b[i]); }
}

__global__ void SubtractKernel(const float* a, const float* b, float* out,
                               size_t n) {
  GRID_STRIDE(i, n) { out[i] = __fsub_rn(a[i], b[i]); }
}

__global__ void ToHalfKernel(const float* x, size_t n, bool fp16,
                             uint16_t* out, unsigned long long* flag) {
  const uint16_t exp_mask = fp16 ? 0x7c00 : 0x7f80;
  GRID_STRIDE(i, n) {
    uint16_t h = fp16 ? FloatToHalfBits(x[i]) : FloatToBf16Bits(x[i]);
    if ((h & exp_mask) == exp_mask) {
      atomicMin(flag, static_cast<unsigned long long>(i));
    }
    out[i] = h;
  }
}

__global__ void FromHalfKernel(const uint16_t* in, size_t n, bool fp16,
                               float* out) {
  GRID_STRIDE(i, n) {
    uint16_t h = in[i];
    out[i] = fp16 ? HalfBitsToFloat(h)
                  : __uint_as_float(static_cast<uint32_t>(h) << 16);
  }
}

// Fixed grid, fixed per-thread order, fixed tree: deterministic sums.
__global__ void StatsKernel(const float* x, size_t n, double* partials) {
  double acc[kStats] = {0, 0, 0, 0, 0, 0};
  GRID_STRIDE(i, n) {
    double v = x[i];
    acc[0] += v;
    acc[1] += v * v;
    acc[2] += fabs(v);
    if (x[i] < 0.0f) {
      acc[3] += v;
      acc[5] += 1.0;
    } else {
      acc[4] += v;
    }
  }
  __shared__ double sh[kStats][kThreads];
  for (int q = 0; q < kStats; ++q) sh[q][threadIdx.x] = acc[q];
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      for (int q = 0; q < kStats; ++q) {
        sh[q][threadIdx.x] += sh[q][threadIdx.x + stride];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    for (int q = 0; q < kStats; ++q) partials[q * kStatsBlocks + blockIdx.x] = sh[q][0];
  }
}

__global__ void StatsFinishKernel(const double* partials, double* out) {
  __shared__ double sh[kStats][kStatsBlocks];
  for (int q = 0; q < kStats; ++q) {
    sh[q][threadIdx.x] = partials[q * kStatsBlocks + threadIdx.x];
  }
  __syncthreads();
  for (int stride = kStatsBlocks / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      for (int q = 0; q < kStats; ++q) {
        sh[q][threadIdx.x] += sh[q][threadIdx.x + stride];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    for (int q = 0; q < kStats; ++q) out[q] = sh[q][0];
  }
}

__global__ void AbsMaxKernel(const float* x, size_t n, float limit,
                             unsigned int* out) {
  // Non-negative floats order like their bit patterns.
  unsigned int best = 0;
  GRID_STRIDE(i, n) {
    unsigned int b = __float_as_uint(fminf(fabsf(x[i]), limit));
    best = b > best ? b : best;
  }
  atomicMax(out, best);
}

__global__ void QsgdNormsKernel(const float* x, size_t n, size_t bucket,
                                size_t buckets, float* norms) {
  GRID_STRIDE(b, buckets) {
    const size_t begin = b * bucket;
    const size_t end = begin + bucket < n ? begin + bucket : n;
    double sq = 0.0;
    for (size_t i = begin; i < end; ++i) {
      sq = __dadd_rn(sq, __dmul_rn(static_cast<double>(x[i]), x[i]));
    }
    norms[b] = static_cast<float>(sqrt(sq));
  }
}

__global__ void QsgdEncodeKernel(const float* x, size_t n, size_t bucket,
                                 const float* norms, uint32_t s, int bits,
                                 uint64_t seed, uint32_t* packed) {
  GRID_STRIDE(i, n) {
    const float unit = __fdiv_rn(norms[i / bucket], static_cast<float>(s));
    uint32_t level = 0;
    if (unit > 0.0f) {
      double r = __ddiv_rn(fabs(static_cast<double>(x[i])),
                           static_cast<double>(unit));
      double floor_r = floor(r);
      level = static_cast<uint32_t>(floor_r < s ? floor_r : s);
      if (level < s &&
          static_cast<double>(CounterUniform(seed, i)) < r - floor_r) {
        ++level;
      }
    }
    uint32_t negative = (level > 0 && x[i] < 0.0f) ? 1 : 0;
    uint32_t code = (level << 1) | negative;
    if (code == 0) continue;
    uint64_t off = static_cast<uint64_t>(i) * bits;
    uint32_t shift = off % 32;
    atomicOr(&packed[off / 32], code << shift);
    if (shift + bits > 32) atomicOr(&packed[off / 32 + 1], code >> (32 - shift));
  }
}

__global__ void QsgdDecodeKernel(const float* norms, const uint8_t* packed,
                                 size_t packed_bytes, size_t n, size_t bucket,
                                 uint32_t s, int bits, float* out) {
  GRID_STRIDE(i, n) {
    uint64_t off = static_cast<uint64_t>(i) * bits;
    size_t byte = off / 8;
    uint32_t acc = 0;
    for (int t = 0; t < 3 && byte + t < packed_bytes; ++t) {
      acc |= static_cast<uint32_t>(packed[byte + t]) << (8 * t);
    }
    uint32_t code = (acc >> (off % 8)) & ((1u << bits) - 1);
    const float unit = __fdiv_rn(norms[i / bucket], static_cast<float>(s));
    float v = __fmul_rn(unit, static_cast<float>(code >> 1));
    out[i] = (code & 1) ? -v : v;
  }
}

__global__ void TernEncodeKernel(const float* x, size_t n, float limit,
                                 float max_abs, uint64_t seed, uint8_t* codes) {
  const size_t bytes = (n + 3) / 4;
  GRID_STRIDE(b, bytes) {
    uint32_t byte = 0;
    for (int t = 0; t < 4; ++t) {
      size_t i = 4 * b + t;
      if (i >= n) break;
      uint32_t code = 0;
      if (max_abs > 0.0f) {
        float p = __fdiv_rn(fminf(fabsf(x[i]), limit), max_abs);
        if (CounterUniform(seed, i) < p) code = x[i] < 0.0f ? 2 : 1;
      }
      byte |= code << (2 * t);
    }
    codes[b] = static_cast<uint8_t>(byte);
  }
}

__global__ void TernDecodeKernel(const uint8_t* codes, size_t n, float scale,
                                 float* out) {
  GRID_STRIDE(i, n) {
    uint32_t code = (codes[i / 4] >> (2 * (i % 4))) & 3;
    out[i] = code == 0 ? 0.0f : (code == 1 ? scale : -scale);
  }
}

__global__ void SignMaskKernel(const float* x, size_t n, uint8_t* mask) {
  const size_t bytes = (n + 7) / 8;
  GRID_STRIDE(b, bytes) {
    uint32_t byte = 0;
    for (int t = 0; t < 8; ++t) {
      size_t i = 8 * b + t;
      if (i >= n) break;
      byte |= static_cast<uint32_t>(x[i] >= 0.0f) << t;
    }
    mask[b] = static_cast<uint8_t>(byte);
  }
}

__global__ void SignDecodeKernel(const uint8_t* mask, size_t n, float negative,
                                 float positive, float* out) {
  GRID_STRIDE(i, n) {
    out[i] = (mask[i / 8] >> (i % 8)) & 1 ? positive : negative;
  }
}

__global__ void MatMulQKernel(const float* a, size_t m, size_t n, size_t r,
                              const float* q, double* p) {
  GRID_STRIDE(t, m * r) {
    const size_t i = t / r, c = t % r;
    const float* row = a + i * n;
    double acc = 0.0;
    for (size_t j = 0; j < n; ++j) {
      acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(row[j]),
                                     static_cast<double>(q[j * r + c])));
    }
    p[t] = acc;
  }
}

__global__ void MatMulTPKernel(const float* a, size_t m, size_t n, size_t r,
                               const float* p, double* q) {
  GRID_STRIDE(t, n * r) {
    const size_t j = t / r, c = t % r;
    double acc = 0.0;
    for (size_t i = 0; i < m; ++i) {
      acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(a[i * n + j]),
                                     static_cast<double>(p[i * r + c])));
    }
    q[t] = acc;
  }
}

__global__ void LowRankDecodeKernel(const float* p, const float* q, size_t m,
                                    size_t n, size_t r, float* out) {
  GRID_STRIDE(t, m * n) {
    const size_t i = t / n, j = t % n;
    float v = 0.0f;
    for (size_t c = 0; c < r; ++c) {
      v = __fadd_rn(v, __fmul_rn(p[i * r + c], q[j * r + c]));
    }
    out[t] = v;
  }
}

}  // namespace

// ---- Runtime wrappers ----

const char* ErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

int DeviceCount(int* count) {
  *count = 0;
  cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    cudaGetLastError();  // clear the sticky "no device" error
  }
  return static_cast<int>(err);
}

int IsDevicePointer(const void* p, bool* is_device) {
  cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *is_device = false;
    return static_cast<int>(err);
  }
  *is_device = attr.type == cudaMemoryTypeDevice ||
               attr.type == cudaMemoryTypeManaged;
  return 0;
}

int Malloc(void** d_p, size_t bytes) {
  return static_cast<int>(cudaMalloc(d_p, bytes == 0 ? 1 : bytes));
}
int Free(void* d_p) { return static_cast<int>(cudaFree(d_p)); }
int ToDevice(void* d_dst, const void* src, size_t bytes) {
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemcpy(d_dst, src, bytes, cudaMemcpyHostToDevice));
}
int ToHost(void* dst, const void* d_src, size_t bytes) {
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemcpy(dst, d_src, bytes, cudaMemcpyDeviceToHost));
}
int DeviceToDevice(void* d_dst, const void* d_src, size_t bytes) {
  if (bytes == 0) return 0;
  return static_cast<int>(
      cudaMemcpy(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice));
}
int Memset(void* d_p, int value, size_t bytes) {
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemset(d_p, value, bytes));
}
int Synchronize() {
  int err = LastError();
  if (err != 0) return err;
  return static_cast<int>(cudaDeviceSynchronize());
}

// ---- Launchers ----

int FirstNonFinite(const float* d_x, size_t n, void* d_ws, uint64_t* first_bad) {
  *first_bad = n;
  if (n == 0) return 0;
  int err = ResetFlag(d_ws);
  if (err != 0) return err;
  FirstNonFiniteKernel<<<Blocks(n), kThreads>>>(d_x, n, Flag(d_ws));
  return ReadFlag(d_ws, n, first_bad);
}

int Add(const float* d_a, const float* d_b, float* d_out, size_t n) {
  if (n == 0) return 0;
  AddKernel<<<Blocks(n), kThreads>>>(d_a, d_b, d_out, n);
  return LastError();
}

int Subtract(const float* d_a, const float* d_b, float* d_out, size_t n) {
  if (n == 0) return 0;
  SubtractKernel<<<Blocks(n), kThreads>>>(d_a, d_b, d_out, n);
  return LastError();
}

int ToHalf(const float* d_x, size_t n, bool fp16, uint16_t* d_out, void* d_ws,
           uint64_t* first_overflow) {
  *first_overflow = n;
  if (n == 0) return 0;
  int err = ResetFlag(d_ws);
  if (err != 0) return err;
  ToHalfKernel<<<Blocks(n), kThreads>>>(d_x, n, fp16, d_out, Flag(d_ws));
  return ReadFlag(d_ws, n, first_overflow);
}

int FromHalf(const uint16_t* d_in, size_t n, bool fp16, float* d_out) {
  if (n == 0) return 0;
  FromHalfKernel<<<Blocks(n), kThreads>>>(d_in, n, fp16, d_out);
  return LastError();
}

int Stats(const float* d_x, size_t n, void* d_ws, double stats[6]) {
  char* ws = static_cast<char*>(d_ws);
  double* partials = reinterpret_cast<double*>(ws + kPartialsOffset);
  double* out = reinterpret_cast<double*>(ws + kStatsOutOffset);
  StatsKernel<<<kStatsBlocks, kThreads>>>(d_x, n, partials);
  StatsFinishKernel<<<1, kStatsBlocks>>>(partials, out);
  int err = LastError();
  if (err != 0) return err;
  return static_cast<int>(
      cudaMemcpy(stats, out, 8 * kStats, cudaMemcpyDeviceToHost));
}

int AbsMaxClipped(const float* d_x, size_t n, float limit, void* d_ws,
                  float* result) {
  *result = 0.0f;
  if (n == 0) return 0;
  unsigned int* out = reinterpret_cast<unsigned int*>(Flag(d_ws));
  int err = static_cast<int>(cudaMemset(out, 0, 4));
  if (err != 0) return err;
  AbsMaxKernel<<<Blocks(n), kThreads>>>(d_x, n, limit, out);
  err = LastError();
  if (err != 0) return err;
  return static_cast<int>(cudaMemcpy(result, out, 4, cudaMemcpyDeviceToHost));
}

int QsgdNorms(const float* d_x, size_t n, size_t bucket, float* d_norms) {
  const size_t buckets = (n + bucket - 1) / bucket;
  if (buckets == 0) return 0;
  // One thread per bucket walks it in index order, as the CPU does.
  QsgdNormsKernel<<<Blocks(buckets), kThreads>>>(d_x, n, bucket, buckets,
                                                 d_norms);
  return LastError();
}

int QsgdEncode(const float* d_x, size_t n, size_t bucket, const float* d_norms,
               uint32_t levels, int bits, uint64_t seed, uint32_t* d_packed) {
  if (n == 0) return 0;
  QsgdEncodeKernel<<<Blocks(n), kThreads>>>(d_x, n, bucket, d_norms, levels,
                                            bits, seed, d_packed);
  return LastError();
}

int QsgdDecode(const float* d_norms, const uint8_t* d_packed,
               size_t packed_bytes, size_t n, size_t bucket, uint32_t levels,
               int bits, float* d_out) {
  if (n == 0) return 0;
  QsgdDecodeKernel<<<Blocks(n), kThreads>>>(d_norms, d_packed, packed_bytes, n,
                                            bucket, levels, bits, d_out);
  return LastError();
}

int TernEncode(const float* d_x, size_t n, float limit, float max_abs,
               uint64_t seed, uint8_t* d_codes) {
  if (n == 0) return 0;
  TernEncodeKernel<<<Blocks((n + 3) / 4), kThreads>>>(d_x, n, limit, max_abs,
                                                      seed, d_codes);
  return LastError();
}

int TernDecode(const uint8_t* d_codes, size_t n, float scale, float* d_out) {
  if (n == 0) return 0;
  TernDecodeKernel<<<Blocks(n), kThreads>>>(d_codes, n, scale, d_out);
  return LastError();
}

int SignMask(const float* d_x, size_t n, uint8_t* d_mask) {
  if (n == 0) return 0;
  SignMaskKernel<<<Blocks((n + 7) / 8), kThreads>>>(d_x, n, d_mask);
  return LastError();
}

int SignDecode(const uint8_t* d_mask, size_t n, float negative, float positive,
               float* d_out) {
  if (n == 0) return 0;
  SignDecodeKernel<<<Blocks(n), kThreads>>>(d_mask, n, negative, positive,
                                            d_out);
  return LastError();
}

int MatMulQ(const float* d_a, size_t m, size_t n, size_t r, const float* d_q,
            double* d_p) {
  MatMulQKernel<<<Blocks(m * r), kThreads>>>(d_a, m, n, r, d_q, d_p);
  return LastError();
}

int MatMulTP(const float* d_a, size_t m, size_t n, size_t r, const float* d_p,
             double* d_q) {
  MatMulTPKernel<<<Blocks(n * r), kThreads>>>(d_a, m, n, r, d_p, d_q);
  return LastError();
}

int LowRankDecode(const float* d_p, const float* d_q, size_t m, size_t n,
                  size_t r, float* d_out) {
  if (m * n == 0) return 0;
  LowRankDecodeKernel<<<Blocks(m * n), kThreads>>>(d_p, d_q, m, n, r, d_out);
  return LastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace harrier
