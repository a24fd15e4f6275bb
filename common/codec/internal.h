// Shared pieces of the codec implementations: payload header I/O, the
// portable PRNG, half-precision conversion, the per-codec rules (k, random-k
// draw, PowerSGD shape, bit packing), the vote interface and the per-family
// factories. Not part of the public API: //common/codec:codec_internal
// exposes it only to the CUDA twins (//cuda), which must produce and accept
// exactly the CPU's payloads. Thread-compatible: no shared state.

#ifndef HARRIER_COMMON_CODEC_INTERNAL_H_
#define HARRIER_COMMON_CODEC_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/codec/codec.h"
#include "common/parallel_for.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "The codec wire format is little-endian and copies memory directly."
#endif

namespace harrier {
namespace codec_internal {

// ---- Raw little-endian loads and stores (the host is little-endian). ----

template <typename T>
inline T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
inline void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Resizes *payload to header + body_bytes and writes the header. Returns a
// pointer to the body.
char* StartPayload(CodecId id, uint64_t num_elements, uint32_t param0,
                   uint32_t param1, size_t body_bytes, std::string* payload);

// Checks header fields (magic, version, codec id, element count) against
// what the decoder expects and returns the header. The body is
// payload.substr(kCodecHeaderBytes).
absl::StatusOr<PayloadHeader> CheckHeader(absl::string_view payload,
                                          CodecId expected,
                                          size_t expected_elements);

// InvalidArgument("codec <name>: <message>").
absl::Status Invalid(CodecId id, absl::string_view message);

// Body size must equal expected exactly (no truncation, no trailing bytes).
absl::Status CheckBodySize(CodecId id, size_t actual, size_t expected);

// InvalidArgument naming the first non-finite element, or OK.
absl::Status CheckFiniteInput(CodecId id, absl::Span<const float> input);

// True if every float in the span is finite.
bool AllFinite(const float* data, size_t n);

// AllFinite over n floats at p, which may be unaligned (a payload body).
inline bool AllFiniteUnaligned(const char* p, size_t n) {
  // x - x is NaN exactly when x is NaN or Inf; no branch in the loop.
  float probe = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float v = Load<float>(p + 4 * i);
    probe += v - v;
  }
  return probe == 0.0f;
}

// Writes value*scale (or adds it) at out[i].
inline void Emit(float* out, size_t i, float value, float scale,
                 bool accumulate) {
  if (accumulate) {
    out[i] += scale * value;
  } else {
    out[i] = scale * value;
  }
}

// ---- Random numbers ----
//
// xoshiro256** seeded through splitmix64: small, fast, identical on every
// platform and easy to twin in CUDA. absl/std distributions are not used
// because their output may change between library versions.
uint64_t SplitMix64(uint64_t* state);

// A 64-bit hash of (a, b): splitmix64's finaliser of a ^ (b * golden ratio)
// after two increments (the first output is discarded). Inline: QSGD and
// TernGrad call it once per element.
inline uint64_t Mix64(uint64_t a, uint64_t b) {
  uint64_t z = (a ^ (b * 0x9e3779b97f4a7c15ULL)) + 2 * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// QSGD's and TernGrad's uniform for element i: counter-based, so any
// element range can be drawn on its own (threads, the CUDA twins' one
// thread per element) and the result is the same bits everywhere.
inline float CounterUniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(Mix64(seed, i) >> 40) * 0x1p-24f;
}

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  // Uniform integer in [0, n), n >= 1, unbiased (Lemire's method).
  uint64_t Below(uint64_t n);
  // Uniform float in [0, 1) with 24 random bits.
  float Uniform() { return static_cast<float>(Next() >> 40) * 0x1p-24f; }
  // Standard normal (Box-Muller, double precision).
  double Normal();

 private:
  uint64_t s_[4];
};

// ---- Threads ----

constexpr int kMaxCodecThreads = 8;

// True where the CPU has AVX2 (__builtin_cpu_supports) and
// SetCodecScalarForTesting has not forced the baseline loops. The AVX2
// variants are the same source compiled with target("avx2") (no FMA, so
// the same roundings): GCC vectorises their 64-bit multiplies only there.
bool UseAvx2();

// Parts of a call over n elements: 1 below kCodecParallelMinElements,
// else min(hardware_concurrency, 8) or SetCodecThreadsForTesting's count.
int CodecThreads(size_t n);

// Calls fn(part, begin, end) for contiguous ranges covering [0, n), part =
// 0, 1, ... < kMaxCodecThreads in order; every boundary but n is a multiple
// of align. work_elements (default n) is the tensor size the part count is
// chosen for, when the n items are buckets or bytes of it. The split
// depends only on n, align and the part count (CodecThreads), never on
// which threads run the parts: the caller and the shared pool
// (common/parallel_for.h). fn must only write what its range owns.
template <typename Fn>
void ParallelRanges(size_t n, size_t align, Fn&& fn, size_t work_elements = 0) {
  const size_t parts = std::min(
      n, static_cast<size_t>(CodecThreads(work_elements ? work_elements : n)));
  if (parts <= 1 || n == 0) {
    fn(size_t{0}, size_t{0}, n);
    return;
  }
  size_t step = (n + parts - 1) / parts;
  step = (step + align - 1) / align * align;
  // Rounding the step up to align may leave fewer than `parts` ranges.
  const size_t ranges = (n + step - 1) / step;
  ::harrier::ParallelFor(ranges, [&fn, n, step](size_t part) {
    const size_t begin = part * step;
    fn(part, begin, std::min(n, begin + step));
  });
}

// ---- Per-codec rules shared with the CUDA twins ----

// Sparse codecs: k = max(1, round(ratio d)) capped at d; 0 for d = 0.
size_t KFromRatio(double ratio, size_t d);

// Random-k: k distinct indices of [0, d), increasing, drawn with Floyd's
// algorithm from Rng(seed). Encoder and decoder call this with the same
// seed. *bitmap is scratch.
void RandomKIndices(uint64_t seed, size_t d, size_t k,
                    std::vector<uint64_t>* bitmap,
                    std::vector<uint32_t>* indices);

// Header of top-k, random-k and threshold: param1 = 0 and k = param0 <= d,
// k >= 1 for a non-empty tensor except under threshold. Returns k.
absl::StatusOr<size_t> CheckSparseK(CodecId id, const PayloadHeader& header,
                                    size_t d);

// Top-k and threshold bodies: k uint32 indices, strictly increasing and
// below d, then k finite fp32 values. body holds at least 8k bytes.
absl::Status CheckIndexValueBody(CodecId id, absl::string_view body, size_t k,
                                 size_t d);

// PowerSGD views d elements as an m x n matrix compressed to rank r: with
// cols > 0, n = cols and m = d / cols (when cols divides d); otherwise m is
// the largest divisor of d not above sqrt(d). r == 0 (send uncompressed)
// when the shape does not factor usefully (m < 2, n < 2 or r (m + n) >= d).
struct PowerSgdShape {
  size_t m = 0, n = 0, r = 0;
};
PowerSgdShape ChoosePowerSgdShape(size_t d, uint32_t rank, uint64_t cols);

// PowerSGD's orthonormalisation of P (m x r, row-major) in place: modified
// Gram-Schmidt over the columns; a (numerically) zero column stays zero.
void OrthonormalizeColumns(size_t m, size_t r, double* p);

// PowerSGD header (param0 = r, param1 = m) for d elements: r == 0 with
// m == 0, or an m x (d / m) matrix with m, n >= 2 and r <= min(m, n, 64).
absl::StatusOr<PowerSgdShape> CheckPowerSgdHeader(const PayloadHeader& header,
                                                  size_t d);

// QSGD and TernGrad bit packing: codes of `bits` bits, LSB-first.
inline int BitWidth(uint32_t v) { return v == 0 ? 0 : 32 - __builtin_clz(v); }
inline size_t PackedBytes(size_t n, int bits) {
  return static_cast<size_t>((static_cast<unsigned __int128>(n) * bits + 7) / 8);
}

// ---- Half precision ----

// Round to nearest even. Overflow yields +-Inf (0x7c00) which callers refuse.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
inline float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// ---- Bit masks: element i is bit (i % 8) of byte i / 8. ----

inline size_t MaskBytes(size_t n) { return (n + 7) / 8; }

// Padding bits past element n in the last byte must be zero so that every
// tensor has exactly one encoding.
bool MaskPaddingIsZero(const char* mask, size_t n);

// ---- Majority vote ----

// Implemented by sign and signum: adds +1 / -1 per element to votes and
// reports the payload's scale (1 if unscaled) after validating everything.
class VoteCodec : public Codec {
 public:
  virtual absl::Status AddVotes(absl::string_view payload,
                                absl::Span<int32_t> votes,
                                float* scale) const = 0;
  bool IsMajorityVote() const override { return true; }

 protected:
  explicit VoteCodec(const CodecSpec& spec) : Codec(spec) {}
};

// ---- Factories, one per source file ----

std::unique_ptr<Codec> CreateDenseCodec(const CodecSpec& spec);      // none fp16 bf16
std::unique_ptr<Codec> CreateSparseCodec(const CodecSpec& spec);     // topk randomk threshold
std::unique_ptr<Codec> CreateQuantizedCodec(const CodecSpec& spec);  // qsgd terngrad
std::unique_ptr<Codec> CreateSignCodec(const CodecSpec& spec);       // sign efsign signum onebit
std::unique_ptr<Codec> CreatePowerSgdCodec(const CodecSpec& spec);   // powersgd

}  // namespace codec_internal
}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_INTERNAL_H_
