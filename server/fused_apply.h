#ifndef HARRIER_SERVER_FUSED_APPLY_H_
#define HARRIER_SERVER_FUSED_APPLY_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace harrier {

class ParallelForPool;

// What the pass writes besides checking the payload. Every expression is
// the one the reference path computes, element for element, so the results
// are bit-identical to it (no FMA contraction: the AVX2 kernels multiply
// and add separately, as the scalar code does without -mfma).
enum class FusedStep {
  kCheck,  // nothing: CRC and limit only (`base`, `out` unused)
  kCopy,   // out = g (the first push of a BSP round)
  kAdd,    // out = base + g (a BSP round's sum)
  kSgd,    // out = base - lr * (scale * g + weight_decay * base): Sgd::Step
};

// One pass over a dense float32 payload. `gradient` is the payload as
// received (its bytes are what the CRC covers); `base` and `out` hold `n`
// floats each and must not overlap `gradient`; `out` may equal `base` only
// for kAdd and kSgd. Alignment: none required.
struct FusedArgs {
  FusedStep step = FusedStep::kCheck;
  const float* gradient = nullptr;
  // When not empty, the payload as the transport received it, in place of
  // `gradient`: its pieces in order, n * 4 bytes in all, a float possibly
  // split over two of them. A block within one piece is read where it
  // lies; one that crosses pieces is gathered into a buffer that stays in
  // L1 and checked and stepped there. So a split payload is read from
  // memory once, as a contiguous one is, and never copied whole.
  absl::Span<const absl::string_view> gradient_pieces;
  size_t n = 0;
  const float* base = nullptr;
  float* out = nullptr;
  float lr = 0.0f;
  float scale = 1.0f;
  float weight_decay = 0.0f;
  // An element is refused when its biased exponent bits are at least these
  // (0x7f800000: Inf and NaN only).
  uint32_t limit_bits = 0x7f800000u;
};

struct FusedResult {
  uint32_t crc = 0;     // CRC32C of the n * 4 payload bytes
  bool within = true;   // every element finite and below the limit
};

// The pass, block by block: a block (24 KiB) is CRC'd, checked and stepped while
// it is in L1/L2, so the payload is read from memory once. `out` is written
// whatever the outcome: the caller writes into memory nobody reads until it
// has seen `within` and compared `crc` (a shadow buffer). Thread-safe (no
// state). The kernel is AVX2 when the CPU has it, scalar otherwise.
FusedResult FusedApply(const FusedArgs& args);

// The same over `threads` contiguous parts (sizes multiples of the block,
// the part CRCs joined with Crc32cCombine): results bit-identical to
// FusedApply for every thread count. The parts run on the caller and the
// idle threads of `pool` (may be null: the caller does all; common/
// parallel_for.h), so a busy pool slows a call down but never blocks it.
// Payloads below `min_parallel_bytes` run on the caller alone.
FusedResult FusedApplyParallel(const FusedArgs& args, ParallelForPool* pool, int threads,
                               size_t min_parallel_bytes = size_t{1} << 20);

// Tests: true forces the scalar kernel even on an AVX2 CPU. Process-wide.
void SetFusedScalarForTesting(bool scalar);
// Whether the AVX2 kernel is in use now.
bool FusedUsesAvx2();

}  // namespace harrier

#endif  // HARRIER_SERVER_FUSED_APPLY_H_
