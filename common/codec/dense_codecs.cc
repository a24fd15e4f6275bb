// none (fp32), fp16 and bf16: element-wise casts, 4d / 2d / 2d body bytes.

#include <cstring>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {
namespace {

class NoneCodec : public Codec {
 public:
  explicit NoneCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext&,
                      std::string* payload) override {
    char* body = StartPayload(id(), input.size(), 0, 0, 4 * input.size(),
                              payload);
    if (!input.empty()) std::memcpy(body, input.data(), 4 * input.size());
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id(), out.size());
    if (!h.ok()) return h.status();
    absl::string_view body = payload.substr(kCodecHeaderBytes);
    absl::Status st = CheckBodySize(id(), body.size(), 4 * out.size());
    if (!st.ok()) return st;
    // The body may be unaligned inside the string; copy through memcpy.
    const char* p = body.data();
    if (!AllFiniteUnaligned(p, out.size())) {
      return Invalid(id(), "payload holds NaN or Inf");
    }
    if (!accumulate && scale == 1.0f) {
      if (!out.empty()) std::memcpy(out.data(), p, 4 * out.size());
      return absl::OkStatus();
    }
    for (size_t i = 0; i < out.size(); ++i) {
      Emit(out.data(), i, Load<float>(p + 4 * i), scale, accumulate);
    }
    return absl::OkStatus();
  }
};

// fp16 and bf16 differ only in the conversion functions.
class HalfCodec : public Codec {
 public:
  explicit HalfCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext&,
                      std::string* payload) override {
    char* body = StartPayload(id(), input.size(), 0, 0, 2 * input.size(),
                              payload);
    const bool fp16 = id() == CodecId::kFp16;
    uint16_t overflow = 0;
    for (size_t i = 0; i < input.size(); ++i) {
      uint16_t h = fp16 ? FloatToHalf(input[i]) : FloatToBf16(input[i]);
      // Exponent all ones means the finite input rounded to Inf.
      uint16_t exp_mask = fp16 ? 0x7c00 : 0x7f80;
      overflow |= static_cast<uint16_t>((h & exp_mask) == exp_mask);
      Store<uint16_t>(body + 2 * i, h);
    }
    if (overflow) {
      for (size_t i = 0; i < input.size(); ++i) {
        uint16_t h = Load<uint16_t>(body + 2 * i);
        uint16_t exp_mask = fp16 ? 0x7c00 : 0x7f80;
        if ((h & exp_mask) == exp_mask) {
          return Invalid(id(), absl::StrCat("input element ", i, " = ",
                                            input[i], " overflows ",
                                            CodecName(id()), " to Inf"));
        }
      }
    }
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id(), out.size());
    if (!h.ok()) return h.status();
    absl::string_view body = payload.substr(kCodecHeaderBytes);
    absl::Status st = CheckBodySize(id(), body.size(), 2 * out.size());
    if (!st.ok()) return st;
    const char* p = body.data();
    const bool fp16 = id() == CodecId::kFp16;
    const uint16_t exp_mask = fp16 ? 0x7c00 : 0x7f80;
    for (size_t i = 0; i < out.size(); ++i) {
      if ((Load<uint16_t>(p + 2 * i) & exp_mask) == exp_mask) {
        return Invalid(id(), absl::StrCat("payload element ", i,
                                          " is NaN or Inf"));
      }
    }
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t v = Load<uint16_t>(p + 2 * i);
      Emit(out.data(), i, fp16 ? HalfToFloat(v) : Bf16ToFloat(v), scale,
           accumulate);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Codec> CreateDenseCodec(const CodecSpec& spec) {
  switch (spec.id) {
    case CodecId::kNone:
      return std::make_unique<NoneCodec>(spec);
    case CodecId::kFp16:
    case CodecId::kBf16:
      return std::make_unique<HalfCodec>(spec);
    default:
      return nullptr;
  }
}

}  // namespace codec_internal
}  // namespace harrier
