// The pull codec that goes with each push codec, so that one setting
// compresses both directions of a link: a client whose pull codec is
// "paired" pulls with PairedPullSpec(its push codec).
//
// The shard applies the pull codec to the change since the worker's view
// (server/pull_views.h) and the view advances by what the worker decodes,
// so what the codec drops is error feedback for the next pull. Error
// feedback converges only through a contraction, a codec whose error
// ||x - D(C(x))|| stays below ||x||. Deterministic sparsifiers, scaled signs,
// fp16 and PowerSGD's projection are contractions; the unbiased random
// codecs are not: QSGD's error per element is up to a level step of its
// bucket's norm, so with a bucket of B elements and S levels the error can
// be sqrt(B) / (2 S) times the input (1.6x at qsgd:levels=7,bucket=512)
// and the view runs away. Random codecs therefore pair with a deterministic
// codec of about their bytes, and QSGD keeps its levels over buckets small
// enough (B <= S^2) that its error is at most half its input.
#ifndef HARRIER_COMMON_CODEC_PULL_PAIRING_H_
#define HARRIER_COMMON_CODEC_PULL_PAIRING_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codec/codec.h"

namespace harrier {

// The pull codec setting that names the pair of the push codec.
inline constexpr absl::string_view kPairedPullCodec = "paired";

// The pair of `push`:
//   none -> none (dense)          fp16 -> fp16, bf16 -> bf16
//   topk:ratio=R, randomk:ratio=R, threshold:sample=F,ratio=R -> topk:ratio=R
//   threshold:tau=T -> topk:ratio=0.01 (a fixed tau has no ratio, and a
//                      gradient's tau says nothing of a parameter change)
//   qsgd:levels=S,bucket=B -> qsgd:levels=S,bucket=min(B, S^2)
//   terngrad:clip=C, sign:scale=B, efsign, signum -> efsign (a parameter
//                      change needs its magnitude: the scaled sign)
//   onebit -> onebit;  powersgd:rank=R -> powersgd:rank=R (the shard factors
//                      each layer as its own matrix)
CodecSpec PairedPullSpec(const CodecSpec& push);

// The pull codec spec to use: the pair of `push_codec` when `pull_codec` is
// "paired", else `pull_codec` as given. INVALID_ARGUMENT when "paired" meets
// a push codec that does not parse.
absl::StatusOr<std::string> ResolvePullCodec(absl::string_view push_codec,
                                             absl::string_view pull_codec);

}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_PULL_PAIRING_H_
