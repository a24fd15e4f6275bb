// Host-side payload validation for the CUDA codecs: one pass over a whole
// payload, in host memory, before anything is copied to the device. The
// checks and messages are those of the CPU decoders, which validate while
// they decode; the per-codec rules themselves (k, PowerSGD shape, index
// bodies, bit packing) come from common/codec/internal.h, shared through
// //common/codec:codec_internal. //tests/cuda:host_twin_test checks that
// CheckPayload and the CPU decoders agree. Plain C++; thread-compatible (no
// shared state).

#ifndef HARRIER_CUDA_HOST_TWIN_H_
#define HARRIER_CUDA_HOST_TWIN_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codec/codec.h"

namespace harrier {
namespace cuda {
namespace host {

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
