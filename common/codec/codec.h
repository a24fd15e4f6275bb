// Gradient codecs: the CPU reference implementation of every compressor that
// Harrier can put on the wire, plus the server-side Aggregator.
//
// A worker encodes one tensor chunk (a flat span of fp32) into a
// self-describing payload; a server shard validates and sums payloads from
// several workers with an Aggregator. Error feedback lives in
// error_feedback.h; this header is all that transport and server code needs.
//
// Wire format (all integers and floats little-endian, see README.md):
//   offset  size  field
//        0     4  magic 0x44435248 ("HRCD" read as bytes)
//        4     1  codec id (CodecId)
//        5     1  format version (kCodecWireVersion)
//        6     2  reserved, must be zero
//        8     8  element count d of the decoded tensor
//       16     4  param0 (codec specific: k, levels, rank, flags)
//       20     4  param1 (codec specific: bucket, m)
//       24     -  body (codec specific)
// so every payload is HeaderBytes() + body bytes; README.md lists the bodies.
//
// Decoding validates the whole payload before writing any output, so a
// refused payload leaves the output buffer untouched.

#ifndef HARRIER_COMMON_CODEC_CODEC_H_
#define HARRIER_COMMON_CODEC_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace harrier {

enum class CodecId : uint32_t {
  kNone = 0,
  kFp16 = 1,
  kBf16 = 2,
  kTopK = 3,
  kRandomK = 4,
  kThreshold = 5,
  kQsgd = 6,
  kTernGrad = 7,
  kSign = 8,
  kEfSign = 9,
  kSignum = 10,
  kOneBit = 11,
  kPowerSgd = 12,
};

// Lower-case name used in spec strings ("topk"); "unknown" for bad values.
absl::string_view CodecName(CodecId id);

// A codec and its parameters, parsed from the spec string shared by command
// line flags and the API: "name" or "name:key=value,key=value".
//
//   none, fp16, bf16, efsign, signum, onebit   no parameters
//   topk:ratio=R                 k = max(1, round(R d)), 0 < R <= 1
//   randomk:ratio=R,seed=S,scale=B
//                                scale=1 (default) multiplies by d/k so the
//                                codec is unbiased; use scale=0 with error
//                                feedback. seed (default 0) is mixed into
//                                CodecContext::seed.
//   threshold:tau=T              send abs(g_i) > T, T >= 0
//   threshold:sample=F,ratio=R   DGC: tau estimated from a random F-fraction
//                                sample so that about R d elements pass
//   qsgd:levels=S,bucket=B       1 <= S <= 65535, B >= 1
//   terngrad:clip=C              C = 0 (default) is unbiased; C > 0 clips
//                                to C standard deviations (biased)
//   sign:scale=B                 B = 1 sends mean(abs(g)) as a scale
//   powersgd:rank=R,cols=N       1 <= R <= 64; N = 0 (default) picks the
//                                matrix shape from d (see README.md)
//
// Defaults: ratio 0.01, sample 0.01, levels 16, bucket 512, rank 1.
struct CodecSpec {
  CodecId id = CodecId::kNone;
  double ratio = 0.01;      // topk, randomk, threshold (estimated tau)
  bool fixed_tau = false;   // threshold: true if tau was given
  double tau = 0.0;         // threshold
  double sample = 0.01;     // threshold (estimated tau)
  // threshold (estimated tau, DGC): the worker's momentum correction,
  // u = momentum * u + g (DgcMomentumCorrection); 0 = plain error feedback.
  // The payload does not depend on it: workers may differ.
  double momentum = 0.0;
  uint64_t seed = 0;        // randomk
  bool scaled = false;      // randomk (default true), sign (default false)
  uint32_t levels = 16;     // qsgd
  uint32_t bucket = 512;    // qsgd
  double clip = 0.0;        // terngrad
  uint32_t rank = 1;        // powersgd
  uint64_t cols = 0;        // powersgd

  // Unknown codec, unknown or repeated parameter, malformed or out-of-range
  // value -> InvalidArgument naming the offending part.
  static absl::StatusOr<CodecSpec> Parse(absl::string_view text);

  // Canonical spec string; Parse(ToString()) == *this.
  std::string ToString() const;

  bool operator==(const CodecSpec& other) const;
  bool operator!=(const CodecSpec& other) const { return !(*this == other); }
};

// Per-call randomness. Random codecs (randomk, threshold sampling, qsgd,
// terngrad, powersgd init) are reproducible from this seed alone, so a worker
// and a shard that derive it the same way see the same random numbers.
struct CodecContext {
  uint64_t seed = 0;
};

// Mixes (key, chunk, clock, rank, base_seed) into a seed. Portable and
// stable across builds (no std::hash), so CPU, CUDA and every process agree.
uint64_t DeriveSeed(absl::string_view key, uint32_t chunk, int64_t clock,
                    uint32_t rank, uint64_t base_seed);

inline constexpr uint32_t kCodecWireMagic = 0x44435248;
inline constexpr uint8_t kCodecWireVersion = 1;
inline constexpr size_t kCodecHeaderBytes = 24;

// Size of the fixed payload header in bytes (kCodecHeaderBytes).
size_t HeaderBytes();

// The fixed header of a payload, for routing and logging before decoding.
struct PayloadHeader {
  CodecId codec = CodecId::kNone;
  uint8_t version = 0;
  uint64_t num_elements = 0;
  uint32_t param0 = 0;
  uint32_t param1 = 0;
};

// Parses and checks magic, version and reserved bits; the body is not looked
// at. Returns InvalidArgument for anything malformed.
absl::StatusOr<PayloadHeader> PeekPayloadHeader(absl::string_view payload);

// One codec instance per tensor-chunk stream.
//
// Thread-safety: Encode mutates state (PowerSGD warm start, scratch), so an
// object must not be shared across threads without external locking. Decode
// and DecodeAdd are const and touch no mutable state, so concurrent decodes
// on one object are safe as long as no Encode runs at the same time.
class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  CodecId id() const { return spec_.id; }
  const CodecSpec& spec() const { return spec_; }

  // Overwrites *payload with the encoding of input. NaN or Inf input (and for
  // fp16/bf16 a finite value that would round to Inf) -> InvalidArgument and
  // *payload is left empty.
  absl::Status Encode(absl::Span<const float> input, const CodecContext& ctx,
                      std::string* payload);

  // out = D(payload). out.size() must equal the payload's element count.
  absl::Status Decode(absl::string_view payload, absl::Span<float> out) const;

  // accum += scale * D(payload). Sparse codecs scatter-add their k entries
  // without densifying. scale must be finite.
  absl::Status DecodeAdd(absl::string_view payload, float scale,
                         absl::Span<float> accum) const;

  // True for codecs whose server aggregate is a majority vote (sign, signum)
  // rather than an average of decodes.
  virtual bool IsMajorityVote() const { return false; }

  // Bytes the object keeps between Encode calls: PowerSGD's warm-start
  // factor, the sparse codecs' reused scratch (capacity, not size). 0 for
  // codecs that keep nothing. A holder that must count its memory (the
  // shard's pull encoders) asks after each Encode.
  virtual uint64_t RetainedBytes() const { return 0; }

 protected:
  explicit Codec(const CodecSpec& spec) : spec_(spec) {}

  // Validates the whole payload against out.size(), then writes
  // out = scale * D(p) (accumulate = false) or out += scale * D(p).
  // Must not write to out unless it returns OK.
  // The codec's encoder, called by Encode() with finite input and an empty
  // *payload; Encode() empties *payload again if it fails.
  virtual absl::Status EncodeImpl(absl::Span<const float> input,
                                  const CodecContext& ctx,
                                  std::string* payload) = 0;
  virtual absl::Status DecodeImpl(absl::string_view payload, float scale,
                                  bool accumulate,
                                  absl::Span<float> out) const = 0;

 private:
  CodecSpec spec_;
};

absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(const CodecSpec& spec);

// Server-side sum of payloads for one tensor chunk.
//
// Finish writes the average of the decoded contributions for every codec
// except sign and signum, for which it writes the majority vote
// sign(sum of signs) * (mean of the payloads' scales, or 1 if unscaled); an
// element whose votes tie is 0. Not thread-safe; one per chunk and clock.
// The average of `count` workers' summed gradients, in place: each element
// divided by count (a division rather than a multiplication by 1/count, so
// the average of integer gradients whose sum count divides is exact). The
// one place a round's average is taken: the shard's BSP rounds and
// Aggregator both use it.
void AverageInPlace(absl::Span<float> sum, int count);

class Aggregator {
 public:
  static absl::StatusOr<std::unique_ptr<Aggregator>> Create(
      const CodecSpec& spec, size_t num_elements);

  // Validates and adds one worker's payload. On error nothing changes.
  absl::Status Add(absl::string_view payload);

  // out.size() must be num_elements and count() >= 1 (else
  // InvalidArgument / FailedPrecondition). Does not reset.
  absl::Status Finish(absl::Span<float> out) const;

  int count() const { return count_; }
  size_t num_elements() const { return num_elements_; }
  void Reset();

 private:
  Aggregator(std::unique_ptr<Codec> codec, size_t num_elements);

  std::unique_ptr<Codec> codec_;
  size_t num_elements_;
  int count_ = 0;
  std::vector<float> sum_;       // average codecs
  std::vector<int32_t> votes_;   // majority-vote codecs
  double scale_sum_ = 0.0;       // majority-vote codecs
};

// ---- Threads of the CPU codecs ----
//
// Encode and decode of a tensor of at least kCodecParallelMinElements split
// the work into min(hardware_concurrency, 8) parts that the calling thread
// and the process's shared parallel-for pool run (common/parallel_for.h;
// below that size, handing parts over costs more than it saves). Payloads
// and decoded values are the same for every thread count.
inline constexpr size_t kCodecParallelMinElements = 1000000;

// Tests only: n >= 1 splits the work into exactly n parts above the
// threshold (1 = the single-threaded path), 0 restores the default. Process-wide; set it
// before encoding, not while other threads encode.
void SetCodecThreadsForTesting(int threads);

// Tests only: true makes the CPU codecs take their baseline (SSE2) loops
// even where the CPU has AVX2; false restores the runtime choice. Both
// produce the same bytes.
void SetCodecScalarForTesting(bool scalar);

}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_CODEC_H_
