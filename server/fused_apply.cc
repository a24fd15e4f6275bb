#include "server/fused_apply.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/parallel_for.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace harrier {
namespace {

// 24 KiB: the block's payload, base and output (72 KiB) stay in L2
// between the CRC and the step.
constexpr size_t kBlockFloats = 3 * (8 << 10) / sizeof(float);

std::atomic<bool> force_scalar{false};

// Returns 1 when some element of [begin, end) is at or past the limit.
// The expressions are Sgd::Step's and the round sum's (server/optimizer.cc,
// server/shard_store.cc), so the results agree bit for bit.
template <FusedStep kStep>
uint32_t ScalarBlock(const FusedArgs& a, size_t begin, size_t end) {
  uint32_t bad = 0;
  const float lr = a.lr, scale = a.scale, wd = a.weight_decay;
  for (size_t i = begin; i < end; ++i) {
    // Read through memcpy: a payload read where it arrived may put the
    // gradient at any address (the vector kernel loads unaligned too).
    uint32_t bits;
    std::memcpy(&bits, a.gradient + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) >= a.limit_bits);
    float g;
    std::memcpy(&g, &bits, sizeof(g));
    if constexpr (kStep == FusedStep::kCopy) a.out[i] = g;
    if constexpr (kStep == FusedStep::kAdd) a.out[i] = a.base[i] + g;
    if constexpr (kStep == FusedStep::kSgd) {
      const float w = a.base[i];
      a.out[i] = w - lr * (scale * g + wd * w);
    }
  }
  return bad;
}

#if defined(__x86_64__)
// Multiplies and adds stay separate (no "fma" in the target): a fused
// multiply-add rounds once and would differ from the scalar reference.
template <FusedStep kStep>
__attribute__((target("avx2"))) uint32_t Avx2Block(const FusedArgs& a, size_t begin, size_t end) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  // Exponent bits are at most 0x7f800000, so a signed compare is exact.
  const __m256i below = _mm256_set1_epi32(static_cast<int>(a.limit_bits - 1));
  const __m256 lr = _mm256_set1_ps(a.lr), scale = _mm256_set1_ps(a.scale),
               wd = _mm256_set1_ps(a.weight_decay);
  __m256i bad = _mm256_setzero_si256();
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_loadu_ps(a.gradient + i);
    bad = _mm256_or_si256(
        bad, _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(g), exponent), below));
    if constexpr (kStep == FusedStep::kCopy) _mm256_storeu_ps(a.out + i, g);
    if constexpr (kStep == FusedStep::kAdd) {
      _mm256_storeu_ps(a.out + i, _mm256_add_ps(_mm256_loadu_ps(a.base + i), g));
    }
    if constexpr (kStep == FusedStep::kSgd) {
      const __m256 w = _mm256_loadu_ps(a.base + i);
      const __m256 t = _mm256_add_ps(_mm256_mul_ps(scale, g), _mm256_mul_ps(wd, w));
      _mm256_storeu_ps(a.out + i, _mm256_sub_ps(w, _mm256_mul_ps(lr, t)));
    }
  }
  const uint32_t vector_bad = _mm256_movemask_epi8(bad) != 0 ? 1u : 0u;
  return vector_bad | ScalarBlock<kStep>(a, i, end);
}

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif

using BlockFn = uint32_t (*)(const FusedArgs&, size_t, size_t);

template <FusedStep kStep>
BlockFn PickBlock() {
#if defined(__x86_64__)
  static const bool has_avx2 = CpuHasAvx2();
  if (has_avx2 && !force_scalar.load(std::memory_order_relaxed)) return &Avx2Block<kStep>;
#endif
  return &ScalarBlock<kStep>;
}

BlockFn PickBlock(FusedStep step) {
  switch (step) {
    case FusedStep::kCheck:
      return PickBlock<FusedStep::kCheck>();
    case FusedStep::kCopy:
      return PickBlock<FusedStep::kCopy>();
    case FusedStep::kAdd:
      return PickBlock<FusedStep::kAdd>();
    case FusedStep::kSgd:
      return PickBlock<FusedStep::kSgd>();
  }
  return &ScalarBlock<FusedStep::kCheck>;
}

// Reads a split payload's bytes in order from a byte offset on.
class PieceReader {
 public:
  PieceReader(absl::Span<const absl::string_view> pieces, size_t skip) : pieces_(pieces) {
    while (piece_ < pieces_.size() && skip >= pieces_[piece_].size()) {
      skip -= pieces_[piece_].size();
      ++piece_;
    }
    offset_ = skip;
  }

  // The next `bytes` bytes where they lie, when the current piece holds
  // them all, and moves past them; null otherwise (nothing moves).
  const float* InPlace(size_t bytes) {
    if (piece_ == pieces_.size() || pieces_[piece_].size() - offset_ < bytes) return nullptr;
    const char* at = pieces_[piece_].data() + offset_;
    offset_ += bytes;
    if (offset_ == pieces_[piece_].size()) {
      ++piece_;
      offset_ = 0;
    }
    return reinterpret_cast<const float*>(at);
  }

  // Copies the next `bytes` bytes to `dest`; false when the pieces end
  // first.
  bool Read(void* dest, size_t bytes) {
    auto* out = static_cast<char*>(dest);
    while (bytes > 0) {
      if (piece_ == pieces_.size()) return false;
      const absl::string_view piece = pieces_[piece_];
      const size_t take = std::min(bytes, piece.size() - offset_);
      std::memcpy(out, piece.data() + offset_, take);
      out += take;
      bytes -= take;
      offset_ += take;
      if (offset_ == piece.size()) {
        ++piece_;
        offset_ = 0;
      }
    }
    return true;
  }

 private:
  const absl::Span<const absl::string_view> pieces_;
  size_t piece_ = 0;
  size_t offset_ = 0;
};

// RunRange for a split payload. A block that lies within one piece is
// read where it is, as RunRange reads a contiguous payload; one that
// crosses pieces (over gRPC about one block in three: its read slices are
// 64 KiB, a block 24 KiB) is gathered into `staged` (which one block fills
// exactly) and CRC'd, checked and stepped from there. Either way the payload is read from memory
// once.
FusedResult RunPiecesRange(const FusedArgs& a, size_t begin, size_t end) {
  const BlockFn block = PickBlock(a.step);
  std::unique_ptr<float[]> staged;  // allocated for the first block that crosses pieces
  PieceReader reader(a.gradient_pieces, begin * sizeof(float));
  uint32_t crc = 0, bad = 0;
  for (size_t b = begin; b < end; b += kBlockFloats) {
    const size_t len = std::min(end, b + kBlockFloats) - b;
    const float* gradient = reader.InPlace(len * sizeof(float));
    if (gradient == nullptr) {
      // Pieces shorter than n * 4 bytes: the caller checked the size, so
      // this is a broken caller; refused rather than read past the end.
      if (staged == nullptr) staged.reset(new float[kBlockFloats]);
      if (!reader.Read(staged.get(), len * sizeof(float))) return {crc, false};
      gradient = staged.get();
    }
    crc = Crc32cExtend(crc, gradient, len * sizeof(float));
    FusedArgs block_args = a;
    block_args.gradient = gradient;
    block_args.base = a.base == nullptr ? nullptr : a.base + b;
    block_args.out = a.out == nullptr ? nullptr : a.out + b;
    bad |= block(block_args, 0, len);
  }
  return {crc, bad == 0};
}

FusedResult RunRange(const FusedArgs& a, size_t begin, size_t end) {
  if (!a.gradient_pieces.empty()) return RunPiecesRange(a, begin, end);
  const BlockFn block = PickBlock(a.step);
  uint32_t crc = 0, bad = 0;
  for (size_t b = begin; b < end; b += kBlockFloats) {
    const size_t e = std::min(end, b + kBlockFloats);
    crc = Crc32cExtend(crc, a.gradient + b, (e - b) * sizeof(float));
    bad |= block(a, b, e);
  }
  return {crc, bad == 0};
}

}  // namespace

FusedResult FusedApply(const FusedArgs& args) { return RunRange(args, 0, args.n); }

FusedResult FusedApplyParallel(const FusedArgs& args, ParallelForPool* pool, int threads,
                               size_t min_parallel_bytes) {
  if (pool == nullptr || threads <= 1 || args.n * sizeof(float) < min_parallel_bytes ||
      args.n <= kBlockFloats) {
    return FusedApply(args);
  }
  // The split depends on `threads` only, never on the pool: the part CRCs
  // joined in part order give the same bits for every pool size.
  const size_t per_thread = (args.n + threads - 1) / threads;
  const size_t part_floats = (per_thread + kBlockFloats - 1) / kBlockFloats * kBlockFloats;
  std::vector<FusedResult> results((args.n + part_floats - 1) / part_floats);
  pool->RunRanges(args.n, part_floats, [&](size_t part, size_t begin, size_t end) {
    results[part] = RunRange(args, begin, end);
  });
  FusedResult total = results[0];
  for (size_t part = 1; part < results.size(); ++part) {
    const size_t begin = part * part_floats;
    const size_t len = std::min(args.n, begin + part_floats) - begin;
    total.crc = Crc32cCombine(total.crc, results[part].crc, len * sizeof(float));
    total.within = total.within && results[part].within;
  }
  return total;
}

void SetFusedScalarForTesting(bool scalar) { force_scalar.store(scalar); }

bool FusedUsesAvx2() {
#if defined(__x86_64__)
  return CpuHasAvx2() && !force_scalar.load();
#else
  return false;
#endif
}

}  // namespace harrier
