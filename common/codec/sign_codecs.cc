// One-bit codecs: signSGD, EF-signSGD, signum and 1-bit SGD.
//
// All send a mask of d bits, element i in bit i % 8 of byte i / 8, set when
// g_i >= 0: sign(0) is defined as +1 so that every element carries a vote.
// Bodies (header param0 = 1 for scaled sign, else 0; param1 = 0):
//   sign      [fp32 scale if scaled] mask     scale = mean abs(g)
//   efsign    fp32 scale, mask                scale = norm1(p) / d
//   signum    mask                            input is the worker's momentum
//   onebit    fp32 mean of negatives, fp32 mean of non-negatives, mask

#include <cmath>
#include <cstring>
#include <vector>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {
namespace {

void WriteMaskRange(const float* g, size_t begin, size_t end, char* mask) {
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    uint32_t byte = 0;
    for (int j = 0; j < 8; ++j) byte |= static_cast<uint32_t>(g[i + j] >= 0.0f) << j;
    mask[i / 8] = static_cast<char>(byte);
  }
  if (i < end) {
    uint32_t byte = 0;
    for (size_t t = i; t < end; ++t) {
      byte |= static_cast<uint32_t>(g[t] >= 0.0f) << (t % 8);
    }
    mask[i / 8] = static_cast<char>(byte);
  }
}

// Ranges start at multiples of 8 elements, so each writes whole bytes.
void WriteMask(absl::Span<const float> g, char* mask) {
  ParallelRanges(g.size(), 64, [&](size_t, size_t begin, size_t end) {
    WriteMaskRange(g.data(), begin, end, mask);
  });
}

inline bool Bit(const char* mask, size_t i) {
  return (static_cast<uint8_t>(mask[i / 8]) >> (i % 8)) & 1;
}

// The parsed body of any of the four codecs.
struct SignBody {
  float positive = 1.0f;  // value for a set bit
  float negative = -1.0f; // value for a clear bit
  const char* mask = nullptr;
};

class SignFamilyCodec : public VoteCodec {
 public:
  explicit SignFamilyCodec(const CodecSpec& spec) : VoteCodec(spec) {}

  bool IsMajorityVote() const override {
    return id() == CodecId::kSign || id() == CodecId::kSignum;
  }

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext&,
                      std::string* payload) override {
    const size_t d = input.size();
    const size_t floats = ScaleFloats();
    char* body = StartPayload(id(), d, ScaledFlag(), 0,
                              4 * floats + MaskBytes(d), payload);
    if (id() == CodecId::kOneBit) {
      // Means of each side are what 1-bit SGD reconstructs to, which
      // minimises the squared error for a given mask.
      // Two running double sums in index order (the payload's bits depend
      // on the order), branch-free: adding +0.0 leaves a sum unchanged, and
      // a random sign is a branch mispredicted half the time.
      double neg_sum = 0.0, pos_sum = 0.0;
      size_t neg_count = 0;
      // (GCC turns a ?: select back into that branch, hence bit masks.)
      for (float v : input) {
        const uint64_t neg = v < 0.0f;
        uint64_t bits;
        const double dv = v;
        std::memcpy(&bits, &dv, sizeof(bits));
        const uint64_t m = 0 - neg;  // all ones for a negative v
        const uint64_t nbits = bits & m, pbits = bits & ~m;
        double nv, pv;  // v or +0.0
        std::memcpy(&nv, &nbits, sizeof(nv));
        std::memcpy(&pv, &pbits, sizeof(pv));
        neg_sum += nv;
        pos_sum += pv;
        neg_count += neg;
      }
      size_t pos_count = d - neg_count;
      Store<float>(body, neg_count ? static_cast<float>(neg_sum / neg_count) : 0.0f);
      Store<float>(body + 4, pos_count ? static_cast<float>(pos_sum / pos_count) : 0.0f);
    } else if (floats == 1) {
      double norm1 = 0.0;
      for (float v : input) norm1 += std::fabs(v);
      Store<float>(body, d ? static_cast<float>(norm1 / d) : 0.0f);
    }
    WriteMask(input, body + 4 * floats);
    return absl::OkStatus();
  }

  absl::Status AddVotes(absl::string_view payload, absl::Span<int32_t> votes,
                        float* scale) const override {
    absl::StatusOr<SignBody> body = Parse(payload, votes.size());
    if (!body.ok()) return body.status();
    const char* mask = body->mask;
    ParallelRanges(votes.size(), 64, [&](size_t, size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        votes[i] += 2 * static_cast<int32_t>(Bit(mask, i)) - 1;
      }
    });
    *scale = body->positive;
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    absl::StatusOr<SignBody> body = Parse(payload, out.size());
    if (!body.ok()) return body.status();
    const float values[2] = {body->negative, body->positive};
    const char* mask = body->mask;
    ParallelRanges(out.size(), 64, [&](size_t, size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        Emit(out.data(), i, values[Bit(mask, i)], scale, accumulate);
      }
    });
    return absl::OkStatus();
  }

 private:
  uint32_t ScaledFlag() const {
    return id() == CodecId::kSign && spec().scaled ? 1 : 0;
  }

  size_t ScaleFloats() const {
    switch (id()) {
      case CodecId::kSign:
        return ScaledFlag();
      case CodecId::kEfSign:
        return 1;
      case CodecId::kOneBit:
        return 2;
      default:
        return 0;
    }
  }

  absl::StatusOr<SignBody> Parse(absl::string_view payload, size_t d) const {
    absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id(), d);
    if (!h.ok()) return h.status();
    if (h->param1 != 0 || h->param0 > (id() == CodecId::kSign ? 1u : 0u)) {
      return Invalid(id(), absl::StrCat("bad header params ", h->param0, ", ",
                                        h->param1));
    }
    size_t floats = id() == CodecId::kSign ? h->param0 : ScaleFloats();
    absl::string_view raw = payload.substr(kCodecHeaderBytes);
    absl::Status st = CheckBodySize(id(), raw.size(), 4 * floats + MaskBytes(d));
    if (!st.ok()) return st;
    SignBody body;
    if (id() == CodecId::kOneBit) {
      body.negative = Load<float>(raw.data());
      body.positive = Load<float>(raw.data() + 4);
      if (!std::isfinite(body.negative) || !std::isfinite(body.positive)) {
        return Invalid(id(), absl::StrCat("side means ", body.negative, ", ",
                                          body.positive, " not finite"));
      }
    } else if (floats == 1) {
      float s = Load<float>(raw.data());
      if (!std::isfinite(s) || s < 0.0f) {
        return Invalid(id(), absl::StrCat("scale is ", s));
      }
      body.positive = s;
      body.negative = -s;
    }
    body.mask = raw.data() + 4 * floats;
    if (!MaskPaddingIsZero(body.mask, d)) {
      return Invalid(id(), "mask padding bits not zero");
    }
    return body;
  }
};

}  // namespace

std::unique_ptr<Codec> CreateSignCodec(const CodecSpec& spec) {
  switch (spec.id) {
    case CodecId::kSign:
    case CodecId::kEfSign:
    case CodecId::kSignum:
    case CodecId::kOneBit:
      return std::make_unique<SignFamilyCodec>(spec);
    default:
      return nullptr;
  }
}

}  // namespace codec_internal
}  // namespace harrier
