// Host-side pieces of the CUDA codecs that need no GPU: the CPU codec's
// PRNG and index draws (random-k, DGC sampling, PowerSGD init), shape and k
// rules, and payload validation. They restate common/codec's private
// helpers (internal.h is not visible outside common/codec) and must stay
// in step with them; //tests/cuda:host_twin_test checks that on any
// machine. Plain C++; thread-compatible (no shared state).

#ifndef HARRIER_CUDA_HOST_TWIN_H_
#define HARRIER_CUDA_HOST_TWIN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codec/codec.h"

namespace harrier {
namespace cuda {
namespace host {

uint64_t SplitMix64(uint64_t* state);
uint64_t Mix64(uint64_t a, uint64_t b);

// xoshiro256** seeded through splitmix64, as codec_internal::Rng.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  uint64_t Below(uint64_t n);
  double Normal();

 private:
  uint64_t s_[4];
};

// k = max(1, round(ratio d)) capped at d; 0 for d = 0.
size_t KFromRatio(double ratio, size_t d);

// Random-k's k distinct indices of [0, d), increasing (Floyd's algorithm).
void RandomKIndices(uint64_t seed, size_t d, size_t k,
                    std::vector<uint32_t>* indices);

struct MatrixShape {
  size_t m = 0, n = 0, r = 0;  // r == 0: uncompressed
};
MatrixShape ChoosePowerSgdShape(size_t d, uint32_t rank, uint64_t cols);

int BitWidth(uint32_t v);
size_t PackedBytes(size_t n, int bits);
inline size_t MaskBytes(size_t n) { return (n + 7) / 8; }

// Writes the 24-byte header, resizes *payload to header + body_bytes and
// returns the body.
char* StartPayload(CodecId id, uint64_t num_elements, uint32_t param0,
                   uint32_t param1, size_t body_bytes, std::string* payload);

// InvalidArgument("codec <name>: <message>").
absl::Status Invalid(CodecId id, absl::string_view message);

// A payload that passed every check of the CPU decoder for `expected`
// (or, if expected_any, for the codec its header names) and d elements.
struct CheckedPayload {
  PayloadHeader header;
  absl::string_view body;
  size_t k = 0;              // topk, randomk, threshold
  uint64_t seed = 0;         // randomk
  int bits = 0;              // qsgd
  size_t buckets = 0;        // qsgd
  float negative = -1.0f;    // sign family: value of a clear bit
  float positive = 1.0f;     // sign family: value of a set bit; terngrad scale
  size_t mask_offset = 0;    // sign family: mask position in body
  size_t m = 0, n = 0, r = 0;  // powersgd (r = 0: uncompressed)
};

// Validates the whole payload as the CPU decoder does (same checks, same
// messages), reading only host memory.
absl::StatusOr<CheckedPayload> CheckPayload(absl::string_view payload,
                                            CodecId expected, bool expected_any,
                                            size_t d);

}  // namespace host
}  // namespace cuda
}  // namespace harrier

#endif  // HARRIER_CUDA_HOST_TWIN_H_
