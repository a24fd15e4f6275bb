// Shared pieces of the codec implementations: payload header I/O, the
// portable PRNG, half-precision conversion, the vote interface and the
// per-family factories. Not part of the public API (visibility private).

#ifndef HARRIER_COMMON_CODEC_INTERNAL_H_
#define HARRIER_COMMON_CODEC_INTERNAL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/codec/codec.h"

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
uint64_t Mix64(uint64_t a, uint64_t b);

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
