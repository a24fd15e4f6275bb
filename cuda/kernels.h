// Internal interface between the host logic (device_codec.cc, compiled by
// the ordinary C++ toolchain) and the CUDA translation units (*.cu, compiled
// by nvcc through a genrule). Plain C++ only: no CUDA types, no Abseil, so
// both compilers can read it.
//
// Every function returns a cudaError_t value as int (0 = success; see
// ErrorString). Kernels are launched on the legacy default stream; every
// function that returns a host value (counts, flags) synchronises. Pointers
// named d_* are device memory; workspace pointers come from the matching
// *WorkspaceBytes function and are owned by the caller.

#ifndef HARRIER_CUDA_KERNELS_H_
#define HARRIER_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace harrier {
namespace cuda {
namespace kernels {

// ---- Runtime wrappers ----
const char* ErrorString(int error);
int DeviceCount(int* count);
// *is_device = true for device or managed memory usable by kernels.
int IsDevicePointer(const void* p, bool* is_device);
int Malloc(void** d_p, size_t bytes);
int Free(void* d_p);
int ToDevice(void* d_dst, const void* src, size_t bytes);
int ToHost(void* dst, const void* d_src, size_t bytes);
int DeviceToDevice(void* d_dst, const void* d_src, size_t bytes);
int Memset(void* d_p, int value, size_t bytes);
int Synchronize();

// Bytes of device scratch every function below may need for n elements
// (k <= n selected); a single allocation of this size serves them all. The
// first kSmallWorkspaceBytes hold flags and reduction partials; the rest
// holds the sort/select buffers.
inline constexpr size_t kSmallWorkspaceBytes = 65536;
size_t WorkspaceBytes(size_t n);

// ---- Element-wise ----
// *first_bad = index of the first non-finite x_i, or n if none.
int FirstNonFinite(const float* d_x, size_t n, void* d_ws, uint64_t* first_bad);
// d_out = d_a + d_b  /  d_out = d_a - d_b, element-wise in fp32.
int Add(const float* d_a, const float* d_b, float* d_out, size_t n);
int Subtract(const float* d_a, const float* d_b, float* d_out, size_t n);

// fp16 (RNE, the CPU's FloatToHalf) or bf16; *first_overflow = first index
// that rounds to Inf, or n.
int ToHalf(const float* d_x, size_t n, bool fp16, uint16_t* d_out, void* d_ws,
           uint64_t* first_overflow);
int FromHalf(const uint16_t* d_in, size_t n, bool fp16, float* d_out);

// Reductions in double with a fixed (run-to-run deterministic) order:
// stats[0] sum, [1] sum of squares, [2] sum of abs, [3] sum of negatives,
// [4] sum of non-negatives, [5] count of negatives.
int Stats(const float* d_x, size_t n, void* d_ws, double stats[6]);
// max over i of min(abs(x_i), limit).
int AbsMaxClipped(const float* d_x, size_t n, float limit, void* d_ws,
                  float* result);

// ---- Sparse ----
// The k indices of largest abs value (ties: lower index), ascending.
// n < 2^31.
int TopKIndices(const float* d_x, size_t n, size_t k, uint32_t* d_indices,
                void* d_ws);
// Increasing indices with abs(x) > tau (mode 0) or abs(x) >= tau and
// abs(x) > 0 (mode 1); *count selected. n < 2^31.
int SelectIndices(const float* d_x, size_t n, int mode, float tau,
                  uint32_t* d_indices, void* d_ws, size_t* count);
// d_out[j] = d_x[d_idx[j]] * scale; *first_bad = first j whose result is
// not finite, or k.
int Gather(const float* d_x, const uint32_t* d_idx, size_t k, float scale,
           float* d_out, void* d_ws, uint64_t* first_bad);
// d_out[d_idx[j]] = d_val[j] (d_out zeroed by the caller).
int Scatter(const uint32_t* d_idx, const float* d_val, size_t k, float* d_out);

// ---- Quantizers ----
// One fp32 L2 norm per bucket, summed in double in index order (the CPU's
// order), so the norms are bit-identical to the CPU codec's.
int QsgdNorms(const float* d_x, size_t n, size_t bucket, float* d_norms);
// Codes (level << 1 | negative) of `bits` bits, packed LSB-first into
// d_packed (zeroed by the caller, rounded up to 4-byte words). Uniforms are
// counter-based: CounterUniform(seed, i).
int QsgdEncode(const float* d_x, size_t n, size_t bucket, const float* d_norms,
               uint32_t levels, int bits, uint64_t seed, uint32_t* d_packed);
int QsgdDecode(const float* d_norms, const uint8_t* d_packed,
               size_t packed_bytes, size_t n, size_t bucket, uint32_t levels,
               int bits, float* d_out);
// 2-bit codes, 4 per byte: 0, 1 (+), 2 (-).
int TernEncode(const float* d_x, size_t n, float limit, float max_abs,
               uint64_t seed, uint8_t* d_codes);
int TernDecode(const uint8_t* d_codes, size_t n, float scale, float* d_out);

// ---- Sign family ----
// Bit i % 8 of byte i / 8 set when x_i >= 0; padding bits zero.
int SignMask(const float* d_x, size_t n, uint8_t* d_mask);
int SignDecode(const uint8_t* d_mask, size_t n, float negative, float positive,
               float* d_out);

// ---- PowerSGD (row-major m x n matrix A, r columns) ----
// d_p (m x r, double) = A Q, each entry summed over j in order (CPU order).
int MatMulQ(const float* d_a, size_t m, size_t n, size_t r, const float* d_q,
            double* d_p);
// d_q (n x r, double) = A^T P, each entry summed over i in order.
int MatMulTP(const float* d_a, size_t m, size_t n, size_t r, const float* d_p,
             double* d_q);
// d_out = P Q^T in fp32, each entry summed over c in order without FMA.
int LowRankDecode(const float* d_p, const float* d_q, size_t m, size_t n,
                  size_t r, float* d_out);

// ---- Accumulation, DGC and CRC (backend_kernels.cu) ----
// d_y += scale * d_x element-wise in fp32 (the CPU's DecodeAdd of a dense
// decode).
int Axpy(const float* d_x, float scale, float* d_y, size_t n);
// d_out[d_idx[j]] += scale * d_val[j]; indices distinct.
int ScatterAdd(const uint32_t* d_idx, const float* d_val, size_t k, float scale,
               float* d_out);
// DGC: next_u = momentum u + g, next_v = v + next_u.
int DgcPrepare(const float* d_g, const float* d_u, const float* d_v,
               float momentum, float* d_next_u, float* d_next_v, size_t n);
// DGC: v = next_v - decoded, u = (decoded != 0 ? 0 : next_u).
int DgcCommit(const float* d_next_u, const float* d_next_v,
              const float* d_decoded, float* d_u, float* d_v, size_t n);
// d_crcs[s] = CRC32C of bytes [s * segment, min((s + 1) * segment, bytes)),
// ceil(bytes / segment) entries.
int Crc32cSegments(const void* d_data, size_t bytes, size_t segment,
                   uint32_t* d_crcs);

}  // namespace kernels
}  // namespace cuda
}  // namespace harrier

#endif  // HARRIER_CUDA_KERNELS_H_
