// Stochastic quantizers: QSGD and TernGrad. Both are unbiased (TernGrad
// only without clipping) and draw fresh random numbers from
// CodecContext::seed on every call.
//
// QSGD body (header param0 = levels s, param1 = bucket B):
//   ceil(d / B) fp32 bucket norms, then d codes of b = 1 + bit_width(s) bits
//   packed LSB-first: code = (level << 1) | negative, level in [0, s].
// TernGrad body: fp32 scale (max abs after clipping), then d 2-bit codes
//   packed LSB-first, 4 per byte: 0 -> 0, 1 -> +scale, 2 -> -scale.
// Padding bits in the last byte are zero and the sign bit is clear for
// level 0, so each tensor has exactly one encoding.

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {
namespace {

class BitWriter {
 public:
  explicit BitWriter(char* out) : out_(out) {}
  void Put(uint32_t value, int bits) {
    acc_ |= static_cast<uint64_t>(value) << n_;
    n_ += bits;
    while (n_ >= 8) {
      *out_++ = static_cast<char>(acc_ & 0xff);
      acc_ >>= 8;
      n_ -= 8;
    }
  }
  void Flush() {
    if (n_ > 0) *out_++ = static_cast<char>(acc_ & 0xff);
    acc_ = 0;
    n_ = 0;
  }

 private:
  char* out_;
  uint64_t acc_ = 0;
  int n_ = 0;
};

// Reads only the bytes it needs, so reading exactly the declared number of
// codes never runs past a correctly sized body.
class BitReader {
 public:
  explicit BitReader(const char* in) : in_(in) {}
  uint32_t Get(int bits) {
    while (n_ < bits) {
      acc_ |= static_cast<uint64_t>(static_cast<uint8_t>(*in_++)) << n_;
      n_ += 8;
    }
    uint32_t v = static_cast<uint32_t>(acc_ & ((uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    n_ -= bits;
    return v;
  }
  // The unread bits of the last byte consumed.
  uint64_t Leftover() const { return acc_; }

 private:
  const char* in_;
  uint64_t acc_ = 0;
  int n_ = 0;
};

class QsgdCodec : public Codec {
 public:
  explicit QsgdCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext& ctx,
                      std::string* payload) override {
    const size_t d = input.size();
    const uint32_t s = spec().levels;
    const size_t bucket = spec().bucket;
    const int bits = 1 + BitWidth(s);
    const size_t buckets = (d + bucket - 1) / bucket;
    char* body = StartPayload(id(), d, s, static_cast<uint32_t>(bucket),
                              4 * buckets + PackedBytes(d, bits), payload);
    BitWriter writer(body + 4 * buckets);
    Rng rng(ctx.seed);
    for (size_t b = 0; b < buckets; ++b) {
      const size_t begin = b * bucket, end = std::min(d, begin + bucket);
      double sq = 0.0;
      for (size_t i = begin; i < end; ++i) {
        sq += static_cast<double>(input[i]) * input[i];
      }
      const float norm = static_cast<float>(std::sqrt(sq));
      Store<float>(body + 4 * b, norm);
      // The decoder multiplies by unit = norm / s in fp32; rounding against
      // the same unit keeps E[decode] = abs(g_i).
      const float unit = norm / static_cast<float>(s);
      for (size_t i = begin; i < end; ++i) {
        uint32_t level = 0;
        if (unit > 0.0f) {
          double r = std::fabs(static_cast<double>(input[i])) / unit;
          double floor_r = std::floor(r);
          level = static_cast<uint32_t>(std::min<double>(floor_r, s));
          if (level < s && rng.Uniform() < r - floor_r) ++level;
        }
        uint32_t negative = (level > 0 && input[i] < 0.0f) ? 1 : 0;
        writer.Put((level << 1) | negative, bits);
      }
    }
    writer.Flush();
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id(), out.size());
    if (!h.ok()) return h.status();
    const size_t d = out.size();
    const uint32_t s = h->param0;
    const size_t bucket = h->param1;
    if (s < 1 || s > 65535) {
      return Invalid(id(), absl::StrCat("levels ", s, " out of range [1, 65535]"));
    }
    if (bucket < 1) return Invalid(id(), "bucket size 0");
    const int bits = 1 + BitWidth(s);
    const size_t buckets = (d + bucket - 1) / bucket;
    absl::string_view body = payload.substr(kCodecHeaderBytes);
    absl::Status st =
        CheckBodySize(id(), body.size(), 4 * buckets + PackedBytes(d, bits));
    if (!st.ok()) return st;
    for (size_t b = 0; b < buckets; ++b) {
      float norm = Load<float>(body.data() + 4 * b);
      if (!std::isfinite(norm) || norm < 0.0f) {
        return Invalid(id(), absl::StrCat("bucket ", b, " norm is ", norm));
      }
    }
    {
      BitReader reader(body.data() + 4 * buckets);
      for (size_t i = 0; i < d; ++i) {
        uint32_t code = reader.Get(bits);
        uint32_t level = code >> 1;
        if (level > s || (level == 0 && (code & 1))) {
          return Invalid(id(), absl::StrCat("element ", i, " has code ", code,
                                            ", not valid for ", s, " levels"));
        }
      }
      if (reader.Leftover() != 0) return Invalid(id(), "padding bits not zero");
    }
    BitReader reader(body.data() + 4 * buckets);
    for (size_t b = 0; b < buckets; ++b) {
      const float unit =
          Load<float>(body.data() + 4 * b) / static_cast<float>(s);
      const size_t begin = b * bucket, end = std::min(d, begin + bucket);
      for (size_t i = begin; i < end; ++i) {
        uint32_t code = reader.Get(bits);
        float v = unit * static_cast<float>(code >> 1);
        Emit(out.data(), i, (code & 1) ? -v : v, scale, accumulate);
      }
    }
    return absl::OkStatus();
  }
};

class TernGradCodec : public Codec {
 public:
  explicit TernGradCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext& ctx,
                      std::string* payload) override {
    const size_t d = input.size();
    // Optional clipping to clip * sigma (TernGrad's 2.5 sigma) trades a
    // small bias for a smaller scale, hence lower variance.
    float limit = std::numeric_limits<float>::infinity();
    if (spec().clip > 0.0 && d > 0) {
      double sum = 0.0, sq = 0.0;
      for (float v : input) {
        sum += v;
        sq += static_cast<double>(v) * v;
      }
      double mean = sum / d;
      double var = std::max(0.0, sq / d - mean * mean);
      limit = static_cast<float>(spec().clip * std::sqrt(var));
    }
    float max_abs = 0.0f;
    for (float v : input) max_abs = std::max(max_abs, std::min(std::fabs(v), limit));
    char* body = StartPayload(id(), d, 0, 0, 4 + (d + 3) / 4, payload);
    Store<float>(body, max_abs);
    BitWriter writer(body + 4);
    Rng rng(ctx.seed);
    for (size_t i = 0; i < d; ++i) {
      uint32_t code = 0;
      if (max_abs > 0.0f) {
        float p = std::min(std::fabs(input[i]), limit) / max_abs;
        if (rng.Uniform() < p) code = input[i] < 0.0f ? 2 : 1;
      }
      writer.Put(code, 2);
    }
    writer.Flush();
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id(), out.size());
    if (!h.ok()) return h.status();
    if (h->param0 != 0 || h->param1 != 0) {
      return Invalid(id(), "header params must be 0");
    }
    const size_t d = out.size();
    absl::string_view body = payload.substr(kCodecHeaderBytes);
    absl::Status st = CheckBodySize(id(), body.size(), 4 + (d + 3) / 4);
    if (!st.ok()) return st;
    const float s = Load<float>(body.data());
    if (!std::isfinite(s) || s < 0.0f) {
      return Invalid(id(), absl::StrCat("scale is ", s));
    }
    {
      BitReader reader(body.data() + 4);
      for (size_t i = 0; i < d; ++i) {
        if (reader.Get(2) == 3) {
          return Invalid(id(), absl::StrCat("element ", i, " has invalid code 3"));
        }
      }
      if (reader.Leftover() != 0) return Invalid(id(), "padding bits not zero");
    }
    BitReader reader(body.data() + 4);
    const float values[3] = {0.0f, s, -s};
    for (size_t i = 0; i < d; ++i) {
      Emit(out.data(), i, values[reader.Get(2)], scale, accumulate);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Codec> CreateQuantizedCodec(const CodecSpec& spec) {
  switch (spec.id) {
    case CodecId::kQsgd:
      return std::make_unique<QsgdCodec>(spec);
    case CodecId::kTernGrad:
      return std::make_unique<TernGradCodec>(spec);
    default:
      return nullptr;
  }
}

}  // namespace codec_internal
}  // namespace harrier
