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
#include <vector>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {
namespace {

void WriteMask(absl::Span<const float> g, char* mask) {
  const size_t d = g.size();
  const size_t full = d / 8;
  for (size_t b = 0; b < full; ++b) {
    const float* p = g.data() + 8 * b;
    uint32_t byte = 0;
    for (int j = 0; j < 8; ++j) byte |= static_cast<uint32_t>(p[j] >= 0.0f) << j;
    mask[b] = static_cast<char>(byte);
  }
  if (d % 8 != 0) {
    uint32_t byte = 0;
    for (size_t i = 8 * full; i < d; ++i) {
      byte |= static_cast<uint32_t>(g[i] >= 0.0f) << (i % 8);
    }
    mask[full] = static_cast<char>(byte);
  }
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
      double neg_sum = 0.0, pos_sum = 0.0;
      size_t neg_count = 0;
      for (float v : input) {
        if (v < 0.0f) {
          neg_sum += v;
          ++neg_count;
        } else {
          pos_sum += v;
        }
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
    for (size_t i = 0; i < votes.size(); ++i) {
      votes[i] += Bit(body->mask, i) ? 1 : -1;
    }
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
    for (size_t i = 0; i < out.size(); ++i) {
      Emit(out.data(), i, values[Bit(body->mask, i)], scale, accumulate);
    }
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
