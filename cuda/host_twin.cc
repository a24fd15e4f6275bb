#include "cuda/host_twin.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/codec/internal.h"

namespace harrier {
namespace cuda {
namespace host {
namespace {

using codec_internal::AllFiniteUnaligned;
using codec_internal::BitWidth;
using codec_internal::CheckBodySize;
using codec_internal::Invalid;
using codec_internal::Load;
using codec_internal::MaskBytes;
using codec_internal::MaskPaddingIsZero;
using codec_internal::PackedBytes;

// Bits [pos, pos + bits) of an LSB-first stream, bits <= 17.
uint32_t BitsAt(const char* p, uint64_t pos, int bits) {
  uint32_t acc = 0;
  const size_t byte = pos / 8;
  const int need = static_cast<int>((pos % 8 + bits + 7) / 8);
  for (int t = 0; t < need; ++t) {
    acc |= static_cast<uint32_t>(static_cast<uint8_t>(p[byte + t])) << (8 * t);
  }
  return (acc >> (pos % 8)) & ((1u << bits) - 1);
}

// The unused high bits of the last byte of an n * bits stream are zero.
bool PackedPaddingIsZero(const char* p, size_t n, int bits) {
  const uint64_t used = static_cast<uint64_t>(n) * bits;
  if (used % 8 == 0) return true;
  return (static_cast<uint8_t>(p[used / 8]) >> (used % 8)) == 0;
}

}  // namespace

absl::StatusOr<CheckedPayload> CheckPayload(absl::string_view payload,
                                            CodecId expected, bool expected_any,
                                            size_t d) {
  if (expected_any) {
    absl::StatusOr<PayloadHeader> peek = PeekPayloadHeader(payload);
    if (peek.ok()) expected = peek->codec;
  }
  const CodecId id = expected;
  absl::StatusOr<PayloadHeader> h = codec_internal::CheckHeader(payload, id, d);
  if (!h.ok()) return h.status();
  CheckedPayload c;
  c.header = *h;
  c.body = payload.substr(kCodecHeaderBytes);
  const absl::string_view body = c.body;
  absl::Status st;
  switch (id) {
    case CodecId::kNone: {
      st = CheckBodySize(id, body.size(), 4 * d);
      if (st.ok() && !AllFiniteUnaligned(body.data(), d)) {
        st = Invalid(id, "payload holds NaN or Inf");
      }
      break;
    }
    case CodecId::kFp16:
    case CodecId::kBf16: {
      st = CheckBodySize(id, body.size(), 2 * d);
      if (!st.ok()) break;
      const uint16_t exp_mask = id == CodecId::kFp16 ? 0x7c00 : 0x7f80;
      for (size_t i = 0; i < d; ++i) {
        if ((Load<uint16_t>(body.data() + 2 * i) & exp_mask) == exp_mask) {
          st = Invalid(id, absl::StrCat("payload element ", i, " is NaN or Inf"));
          break;
        }
      }
      break;
    }
    case CodecId::kTopK:
    case CodecId::kThreshold:
    case CodecId::kRandomK: {
      absl::StatusOr<size_t> k = codec_internal::CheckSparseK(id, *h, d);
      if (!k.ok()) return k.status();
      c.k = *k;
      if (id != CodecId::kRandomK) {
        st = CheckBodySize(id, body.size(), 8 * c.k);
        if (st.ok()) st = codec_internal::CheckIndexValueBody(id, body, c.k, d);
        break;
      }
      st = CheckBodySize(id, body.size(), 8 + 4 * c.k);
      if (!st.ok()) break;
      for (size_t j = 0; j < c.k; ++j) {
        if (!std::isfinite(Load<float>(body.data() + 8 + 4 * j))) {
          return Invalid(id, absl::StrCat("value at position ", j,
                                          " is not finite"));
        }
      }
      c.seed = Load<uint64_t>(body.data());
      break;
    }
    case CodecId::kQsgd: {
      const uint32_t s = h->param0;
      const size_t bucket = h->param1;
      if (s < 1 || s > 65535) {
        return Invalid(id, absl::StrCat("levels ", s, " out of range [1, 65535]"));
      }
      if (bucket < 1) return Invalid(id, "bucket size 0");
      c.bits = 1 + BitWidth(s);
      c.buckets = (d + bucket - 1) / bucket;
      st = CheckBodySize(id, body.size(),
                         4 * c.buckets + PackedBytes(d, c.bits));
      if (!st.ok()) break;
      for (size_t b = 0; b < c.buckets; ++b) {
        float norm = Load<float>(body.data() + 4 * b);
        if (!std::isfinite(norm) || norm < 0.0f) {
          return Invalid(id, absl::StrCat("bucket ", b, " norm is ", norm));
        }
      }
      const char* packed = body.data() + 4 * c.buckets;
      for (size_t i = 0; i < d; ++i) {
        uint32_t code = BitsAt(packed, static_cast<uint64_t>(i) * c.bits, c.bits);
        uint32_t level = code >> 1;
        if (level > s || (level == 0 && (code & 1))) {
          return Invalid(id, absl::StrCat("element ", i, " has code ", code,
                                          ", not valid for ", s, " levels"));
        }
      }
      if (!PackedPaddingIsZero(packed, d, c.bits)) {
        return Invalid(id, "padding bits not zero");
      }
      break;
    }
    case CodecId::kTernGrad: {
      if (h->param0 != 0 || h->param1 != 0) {
        return Invalid(id, "header params must be 0");
      }
      st = CheckBodySize(id, body.size(), 4 + (d + 3) / 4);
      if (!st.ok()) break;
      const float s = Load<float>(body.data());
      if (!std::isfinite(s) || s < 0.0f) {
        return Invalid(id, absl::StrCat("scale is ", s));
      }
      c.positive = s;
      c.negative = -s;
      for (size_t i = 0; i < d; ++i) {
        if (BitsAt(body.data() + 4, 2 * static_cast<uint64_t>(i), 2) == 3) {
          return Invalid(id, absl::StrCat("element ", i, " has invalid code 3"));
        }
      }
      if (!PackedPaddingIsZero(body.data() + 4, d, 2)) {
        return Invalid(id, "padding bits not zero");
      }
      break;
    }
    case CodecId::kSign:
    case CodecId::kEfSign:
    case CodecId::kSignum:
    case CodecId::kOneBit: {
      if (h->param1 != 0 || h->param0 > (id == CodecId::kSign ? 1u : 0u)) {
        return Invalid(id, absl::StrCat("bad header params ", h->param0, ", ",
                                        h->param1));
      }
      size_t floats = id == CodecId::kSign     ? h->param0
                      : id == CodecId::kEfSign ? 1
                      : id == CodecId::kOneBit ? 2
                                               : 0;
      st = CheckBodySize(id, body.size(), 4 * floats + MaskBytes(d));
      if (!st.ok()) break;
      if (id == CodecId::kOneBit) {
        c.negative = Load<float>(body.data());
        c.positive = Load<float>(body.data() + 4);
        if (!std::isfinite(c.negative) || !std::isfinite(c.positive)) {
          return Invalid(id, absl::StrCat("side means ", c.negative, ", ",
                                          c.positive, " not finite"));
        }
      } else if (floats == 1) {
        float s = Load<float>(body.data());
        if (!std::isfinite(s) || s < 0.0f) {
          return Invalid(id, absl::StrCat("scale is ", s));
        }
        c.positive = s;
        c.negative = -s;
      }
      c.mask_offset = 4 * floats;
      if (!MaskPaddingIsZero(body.data() + c.mask_offset, d)) {
        return Invalid(id, "mask padding bits not zero");
      }
      break;
    }
    case CodecId::kPowerSgd: {
      absl::StatusOr<codec_internal::PowerSgdShape> shape =
          codec_internal::CheckPowerSgdHeader(*h, d);
      if (!shape.ok()) return shape.status();
      c.m = shape->m;
      c.n = shape->n;
      c.r = shape->r;
      const size_t floats = c.r == 0 ? d : c.r * (c.m + c.n);
      st = CheckBodySize(id, body.size(), 4 * floats);
      if (st.ok() && !AllFiniteUnaligned(body.data(), floats)) {
        st = Invalid(id, "payload holds NaN or Inf");
      }
      break;
    }
  }
  if (!st.ok()) return st;
  return c;
}

}  // namespace host
}  // namespace cuda
}  // namespace harrier
