// Stochastic quantizers: QSGD and TernGrad. Both are unbiased (TernGrad
// only without clipping) and draw fresh random numbers from
// CodecContext::seed on every call: element i's uniform is
// CounterUniform(seed, i), as on the CUDA twins, so payloads are the same
// bits on CPU and GPU and for any number of threads.
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
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {
namespace {

// Appends codes of up to 17 bits LSB-first into whole 32-bit words; Flush
// writes the last partial word's bytes. Starts on a byte boundary.
class BitWriter {
 public:
  explicit BitWriter(char* out) : out_(out) {}
  void Put(uint32_t value, int bits) {
    acc_ |= static_cast<uint64_t>(value) << n_;
    n_ += bits;
    if (n_ >= 32) {
      Store<uint32_t>(out_, static_cast<uint32_t>(acc_));
      out_ += 4;
      acc_ >>= 32;
      n_ -= 32;
    }
  }
  void Flush() {
    for (; n_ > 0; n_ -= 8) {
      *out_++ = static_cast<char>(acc_ & 0xff);
      acc_ >>= 8;
    }
    acc_ = 0;
    n_ = 0;
  }

 private:
  char* out_;
  uint64_t acc_ = 0;
  int n_ = 0;
};

// Code i (bits <= 17 wide) of a packed body of `bytes` bytes: one unaligned
// 8-byte load where it fits, else the remaining bytes one by one, so
// reading exactly the declared codes never runs past a correctly sized body.
inline uint32_t GetCode(const char* packed, size_t bytes, size_t i, int bits) {
  const uint64_t off = static_cast<uint64_t>(i) * bits;
  const size_t byte = off / 8;
  uint64_t window;
  if (byte + 8 <= bytes) {
    window = Load<uint64_t>(packed + byte);
  } else {
    window = 0;
    for (size_t t = 0; byte + t < bytes && t < 8; ++t) {
      window |= static_cast<uint64_t>(static_cast<uint8_t>(packed[byte + t]))
                << (8 * t);
    }
  }
  return static_cast<uint32_t>(window >> (off % 8)) & ((1u << bits) - 1);
}

// The bits of the last byte past `used_bits` (padding), which must be zero.
inline bool PaddingIsZero(const char* packed, size_t bytes, uint64_t used_bits) {
  if (used_bits % 8 == 0 || bytes == 0) return true;
  return (static_cast<uint8_t>(packed[bytes - 1]) >> (used_bits % 8)) == 0;
}

// Groups of 8 codes of BITS bits are exactly BITS bytes: packed and
// unpacked with constant shifts and one fixed-size copy (BITS <= 16, so a
// group fits 128 bits). Group g starts at byte BITS * g.
template <int BITS>
using GroupWord = std::conditional_t<(BITS <= 8), uint64_t, unsigned __int128>;

template <int BITS>
inline void PackGroup(const uint32_t* codes, char* out) {
  GroupWord<BITS> w = 0;
  for (int t = 0; t < 8; ++t) w |= static_cast<GroupWord<BITS>>(codes[t]) << (BITS * t);
  std::memcpy(out, &w, BITS);
}

// wide: sizeof(GroupWord) bytes are readable at in. Then one whole-word
// load: a BITS-byte copy into a zeroed word compiles to partial stores and
// a reload, which stalls on store forwarding (most of the decode's time).
template <int BITS>
inline void UnpackGroup(const char* in, bool wide, uint32_t* codes) {
  GroupWord<BITS> w = 0;
  if (wide) {
    std::memcpy(&w, in, sizeof(w));
    if constexpr (8 * BITS < 8 * sizeof(GroupWord<BITS>)) {
      w &= (GroupWord<BITS>{1} << (8 * BITS)) - 1;
    }
  } else {
    std::memcpy(&w, in, BITS);
  }
  for (int t = 0; t < 8; ++t) {
    codes[t] = static_cast<uint32_t>(w >> (BITS * t)) & ((1u << BITS) - 1);
  }
}

// Calls f(std::integral_constant<int, BITS>) for BITS in [2, 16], else
// f(std::integral_constant<int, 0>) (the generic bit-by-bit path).
template <typename F>
void WithBits(int bits, F&& f) {
  switch (bits) {
#define HARRIER_BITS_CASE(B) \
  case B:                    \
    f(std::integral_constant<int, B>());  \
    return;
    HARRIER_BITS_CASE(2) HARRIER_BITS_CASE(3) HARRIER_BITS_CASE(4)
    HARRIER_BITS_CASE(5) HARRIER_BITS_CASE(6) HARRIER_BITS_CASE(7)
    HARRIER_BITS_CASE(8) HARRIER_BITS_CASE(9) HARRIER_BITS_CASE(10)
    HARRIER_BITS_CASE(11) HARRIER_BITS_CASE(12) HARRIER_BITS_CASE(13)
    HARRIER_BITS_CASE(14) HARRIER_BITS_CASE(15) HARRIER_BITS_CASE(16)
#undef HARRIER_BITS_CASE
    default:
      f(std::integral_constant<int, 0>());
  }
}

// u[t] = CounterUniform(seed, first + t). The loop vectorises only with
// AVX2 (64-bit multiplies), hence two compilations of the same body; the
// 24-bit value goes to float through int32 (same value; AVX2 has no
// uint64 -> float conversion).
#define HARRIER_UNIFORMS_BODY                                   \
  for (size_t t = 0; t < n; ++t) {                              \
    u[t] = static_cast<float>(static_cast<int32_t>(             \
               Mix64(seed, first + t) >> 40)) * 0x1p-24f;       \
  }
void UniformsBaseline(uint64_t seed, uint64_t first, size_t n,
                      float* __restrict u) {
  HARRIER_UNIFORMS_BODY
}
__attribute__((target("avx2"))) void UniformsAvx2(uint64_t seed, uint64_t first,
                                                  size_t n, float* __restrict u) {
  HARRIER_UNIFORMS_BODY
}
#undef HARRIER_UNIFORMS_BODY
inline void Uniforms(bool avx2, uint64_t seed, uint64_t first, size_t n,
                     float* u) {
  if (avx2) {
    UniformsAvx2(seed, first, n, u);
  } else {
    UniformsBaseline(seed, first, n, u);
  }
}

// QSGD codes of n elements of one bucket (unit > 0) from their uniforms:
// the CUDA twin's arithmetic (QsgdEncodeKernel), r = abs(x) / unit in
// double, level = min(floor r, s), +1 with probability r - floor r, so
// E[level] = r. floor is an int32 truncation (r >= 0 and r is at most about
// 2 s < 2^31: exact, no libm call, and it vectorises).
#define HARRIER_QSGD_CODES_BODY                                            \
  const double sd = s, du = unit;                                          \
  for (size_t t = 0; t < n; ++t) {                                         \
    const double r = std::fabs(static_cast<double>(x[t])) / du;            \
    const double rc = r < sd ? r : sd;                                     \
    const int32_t floor_r = static_cast<int32_t>(rc);                      \
    const double frac = r - static_cast<double>(floor_r);                  \
    const int32_t level =                                                  \
        floor_r + ((floor_r < static_cast<int32_t>(s)) &                   \
                   (static_cast<double>(u[t]) < frac));                    \
    const int32_t negative = (level > 0) & (x[t] < 0.0f);                  \
    codes[t] = static_cast<uint32_t>((level << 1) | negative);             \
  }
void QsgdCodesBaseline(const float* __restrict x, const float* __restrict u,
                       size_t n, float unit, uint32_t s,
                       uint32_t* __restrict codes) {
  HARRIER_QSGD_CODES_BODY
}
__attribute__((target("avx2"))) void QsgdCodesAvx2(
    const float* __restrict x, const float* __restrict u, size_t n, float unit,
    uint32_t s, uint32_t* __restrict codes) {
  HARRIER_QSGD_CODES_BODY
}
#undef HARRIER_QSGD_CODES_BODY

// TernGrad codes of n elements from their uniforms.
#define HARRIER_TERN_CODES_BODY                                   \
  for (size_t t = 0; t < n; ++t) {                                \
    const float p = std::min(std::fabs(x[t]), limit) / max_abs;   \
    const uint32_t sent = u[t] < p;                               \
    codes[t] = sent << (x[t] < 0.0f);                             \
  }
void TernCodesBaseline(const float* __restrict x, const float* __restrict u,
                       size_t n, float limit, float max_abs,
                       uint8_t* __restrict codes) {
  HARRIER_TERN_CODES_BODY
}
__attribute__((target("avx2"))) void TernCodesAvx2(
    const float* __restrict x, const float* __restrict u, size_t n,
    float limit, float max_abs, uint8_t* __restrict codes) {
  HARRIER_TERN_CODES_BODY
}
#undef HARRIER_TERN_CODES_BODY

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
    const float* x = input.data();
    units_.resize(buckets);
    // Norms: each bucket's sum of squares in index order (the CUDA twin's
    // order, so the norms are bit-exact); buckets split over threads.
    // One bucket's sum is a chain of dependent adds (3 to 4 cycles per
    // element); eight full buckets side by side make eight chains.
    ParallelRanges(buckets, 8, [&](size_t, size_t b0, size_t b1) {
      size_t b = b0;
      for (; b + 8 <= b1 && (b + 8) * bucket <= d; b += 8) {
        double sq[8] = {};
        const float* base = x + b * bucket;
        for (size_t i = 0; i < bucket; ++i) {
          for (int l = 0; l < 8; ++l) {
            const double v = base[l * bucket + i];
            sq[l] += v * v;
          }
        }
        for (int l = 0; l < 8; ++l) {
          const float norm = static_cast<float>(std::sqrt(sq[l]));
          Store<float>(body + 4 * (b + l), norm);
          units_[b + l] = norm / static_cast<float>(s);
        }
      }
      for (; b < b1; ++b) {
        const size_t begin = b * bucket, end = std::min(d, begin + bucket);
        double sq = 0.0;
        for (size_t i = begin; i < end; ++i) {
          sq += static_cast<double>(x[i]) * x[i];
        }
        const float norm = static_cast<float>(std::sqrt(sq));
        Store<float>(body + 4 * b, norm);
        // The decoder multiplies by unit = norm / s in fp32; rounding
        // against the same unit keeps E[decode] = abs(g_i).
        units_[b] = norm / static_cast<float>(s);
      }
    }, d);
    // Codes: element ranges starting at multiples of 8 start on a byte.
    char* packed = body + 4 * buckets;
    const uint64_t seed = ctx.seed;
    // Blocks of 256: codes first (a branch-free loop per bucket piece),
    // then whole groups of 8 packed at once; only the tensor's last
    // d % 8 codes go bit by bit.
    const bool avx2 = UseAvx2();
    ParallelRanges(d, 256, [&](size_t, size_t begin, size_t end) {
      uint32_t codes[256];
      float u[256];
      WithBits(bits, [&](auto bits_constant) {
        constexpr int kBits = decltype(bits_constant)::value;
        for (size_t block = begin; block < end; block += 256) {
          const size_t block_end = std::min(end, block + 256);
          size_t i = block;
          while (i < block_end) {
            const size_t b = i / bucket;
            const size_t stop = std::min(block_end, (b + 1) * bucket);
            const float unit = units_[b];
            uint32_t* c = codes + (i - block);
            if (unit > 0.0f) {
              Uniforms(avx2, seed, i, stop - i, u);
              if (avx2) {
                QsgdCodesAvx2(x + i, u, stop - i, unit, s, c);
              } else {
                QsgdCodesBaseline(x + i, u, stop - i, unit, s, c);
              }
            } else {
              std::fill(c, c + (stop - i), 0u);
            }
            i = stop;
          }
          const size_t count = block_end - block;
          char* out = packed + static_cast<uint64_t>(block) * bits / 8;
          size_t g = 0;
          if constexpr (kBits != 0) {
            for (; g + 8 <= count; g += 8) {
              PackGroup<kBits>(codes + g, out + kBits * (g / 8));
            }
          }
          BitWriter writer(out + static_cast<uint64_t>(g) * bits / 8);
          for (; g < count; ++g) writer.Put(codes[g], bits);
          writer.Flush();
        }
      });
    });
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
    const size_t packed_bytes = PackedBytes(d, bits);
    absl::Status st = CheckBodySize(id(), body.size(), 4 * buckets + packed_bytes);
    if (!st.ok()) return st;
    for (size_t b = 0; b < buckets; ++b) {
      float norm = Load<float>(body.data() + 4 * b);
      if (!std::isfinite(norm) || norm < 0.0f) {
        return Invalid(id(), absl::StrCat("bucket ", b, " norm is ", norm));
      }
    }
    const char* packed = body.data() + 4 * buckets;
    // Validate every code before writing anything; the first bad element
    // (lowest index over all ranges) is the one reported.
    size_t first_bad[kMaxCodecThreads];
    std::fill(first_bad, first_bad + kMaxCodecThreads, d);
    // Codes are read in blocks of 256 (groups of 8 unpacked at once where
    // the width allows); the tail past the last whole group bit by bit.
    auto read_block = [&](size_t block, size_t count, uint32_t* codes) {
      size_t g = 0;
      WithBits(bits, [&](auto bits_constant) {
        constexpr int kBits = decltype(bits_constant)::value;
        if constexpr (kBits != 0) {
          const char* in = packed + static_cast<uint64_t>(block) * kBits / 8;
          const char* packed_end = packed + packed_bytes;
          for (; g + 8 <= count; g += 8) {
            const char* at = in + kBits * (g / 8);
            UnpackGroup<kBits>(
                at, packed_end - at >= static_cast<ptrdiff_t>(sizeof(GroupWord<kBits>)),
                codes + g);
          }
        }
      });
      for (; g < count; ++g) codes[g] = GetCode(packed, packed_bytes, block + g, bits);
    };
    ParallelRanges(d, 256, [&](size_t part, size_t begin, size_t end) {
      uint32_t codes[256];
      for (size_t block = begin; block < end; block += 256) {
        const size_t count = std::min(end - block, size_t{256});
        read_block(block, count, codes);
        bool bad = false;
        for (size_t t = 0; t < count; ++t) {
          const uint32_t level = codes[t] >> 1;
          bad |= (level > s) | ((level == 0) & (codes[t] & 1));
        }
        if (!bad) continue;
        for (size_t t = 0;; ++t) {
          const uint32_t level = codes[t] >> 1;
          if (level > s || (level == 0 && (codes[t] & 1))) {
            first_bad[part] = block + t;
            return;
          }
        }
      }
    }, d);
    const size_t bad = *std::min_element(first_bad, first_bad + kMaxCodecThreads);
    if (bad < d) {
      const uint32_t code = GetCode(packed, packed_bytes, bad, bits);
      return Invalid(id(), absl::StrCat("element ", bad, " has code ", code,
                                        ", not valid for ", s, " levels"));
    }
    if (!PaddingIsZero(packed, packed_bytes, static_cast<uint64_t>(d) * bits)) {
      return Invalid(id(), "padding bits not zero");
    }
    const float fs = static_cast<float>(s);
    ParallelRanges(d, 256, [&](size_t, size_t begin, size_t end) {
      uint32_t codes[256];
      for (size_t block = begin; block < end; block += 256) {
        const size_t count = std::min(end - block, size_t{256});
        read_block(block, count, codes);
        size_t i = block;
        const size_t block_end = block + count;
        while (i < block_end) {
          const size_t b = i / bucket;
          const size_t stop = std::min(block_end, (b + 1) * bucket);
          const float unit = Load<float>(body.data() + 4 * b) / fs;
          // Emit's arithmetic with the branches out of the loop (it
          // vectorises); the sign is the code's low bit moved to bit 31.
          const uint32_t* c = codes + (i - block);
          float* o = out.data() + i;
          const size_t n = stop - i;
          auto value = [unit, c](size_t t) {
            const float v = unit * static_cast<float>(static_cast<int32_t>(c[t] >> 1));
            uint32_t bits;
            std::memcpy(&bits, &v, sizeof(bits));
            bits ^= (c[t] & 1u) << 31;
            float signed_v;
            std::memcpy(&signed_v, &bits, sizeof(bits));
            return signed_v;
          };
          if (accumulate) {
            for (size_t t = 0; t < n; ++t) o[t] += scale * value(t);
          } else {
            for (size_t t = 0; t < n; ++t) o[t] = scale * value(t);
          }
          i = stop;
        }
      }
    }, d);
    return absl::OkStatus();
  }

 private:
  std::vector<float> units_;  // per-bucket norm / s, scratch of Encode
};

class TernGradCodec : public Codec {
 public:
  explicit TernGradCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext& ctx,
                      std::string* payload) override {
    const size_t d = input.size();
    const float* x = input.data();
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
    // max is exact in any order: per-range, per-lane maxima.
    float part_max[kMaxCodecThreads] = {};
    ParallelRanges(d, 16, [&](size_t part, size_t begin, size_t end) {
      float lane[16] = {};
      size_t i = begin;
      for (; i + 16 <= end; i += 16) {
        for (int j = 0; j < 16; ++j) {
          lane[j] = std::max(lane[j], std::min(std::fabs(x[i + j]), limit));
        }
      }
      for (; i < end; ++i) lane[0] = std::max(lane[0], std::min(std::fabs(x[i]), limit));
      part_max[part] = *std::max_element(lane, lane + 16);
    });
    const float max_abs = *std::max_element(part_max, part_max + kMaxCodecThreads);
    char* body = StartPayload(id(), d, 0, 0, 4 + (d + 3) / 4, payload);
    Store<float>(body, max_abs);
    uint8_t* codes = reinterpret_cast<uint8_t*>(body + 4);
    const uint64_t seed = ctx.seed;
    if (max_abs > 0.0f) {
      const bool avx2 = UseAvx2();
      ParallelRanges(d, 256, [&](size_t, size_t begin, size_t end) {
        float u[256];
        uint8_t c[256];
        for (size_t block = begin; block < end; block += 256) {
          const size_t n = std::min(end - block, size_t{256});
          Uniforms(avx2, seed, block, n, u);
          if (avx2) {
            TernCodesAvx2(x + block, u, n, limit, max_abs, c);
          } else {
            TernCodesBaseline(x + block, u, n, limit, max_abs, c);
          }
          std::fill(c + n, c + ((n + 3) & ~size_t{3}), uint8_t{0});
          for (size_t t = 0; t < n; t += 4) {
            codes[(block + t) / 4] = static_cast<uint8_t>(
                c[t] | (c[t + 1] << 2) | (c[t + 2] << 4) | (c[t + 3] << 6));
          }
        }
      });
    } else if (d > 0) {
      std::memset(codes, 0, (d + 3) / 4);
    }
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
    const size_t bytes = (d + 3) / 4;
    absl::Status st = CheckBodySize(id(), body.size(), 4 + bytes);
    if (!st.ok()) return st;
    const float s = Load<float>(body.data());
    if (!std::isfinite(s) || s < 0.0f) {
      return Invalid(id(), absl::StrCat("scale is ", s));
    }
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(body.data() + 4);
    // Code 3 is both bits of a pair set: any (c & c >> 1 & 0x55) flags the
    // byte; 8 bytes at a time, then the exact element.
    // Only the d codes count: the last byte's padding pairs are checked as
    // padding (their own message), so the whole bytes are scanned here and
    // the partial last byte below.
    const size_t full = d / 4;
    size_t first_bad[kMaxCodecThreads];
    std::fill(first_bad, first_bad + kMaxCodecThreads, full);
    ParallelRanges(full, 64, [&](size_t part, size_t begin, size_t end) {
      size_t j = begin;
      for (; j + 8 <= end; j += 8) {
        const uint64_t w = Load<uint64_t>(reinterpret_cast<const char*>(codes + j));
        if ((w & (w >> 1) & 0x5555555555555555ULL) != 0) break;
      }
      for (; j < end; ++j) {
        if ((codes[j] & (codes[j] >> 1) & 0x55) != 0) {
          first_bad[part] = j;
          return;
        }
      }
    }, d);
    size_t bad = *std::min_element(first_bad, first_bad + kMaxCodecThreads);
    uint32_t bad_byte = bad < full ? codes[bad] : 0;
    if (bad == full && d % 4 != 0) {
      bad_byte = codes[full] & ((1u << (2 * (d % 4))) - 1);
      if ((bad_byte & (bad_byte >> 1) & 0x55) == 0) bad = bytes;
    } else if (bad == full) {
      bad = bytes;
    }
    if (bad < bytes) {
      size_t t = 0;
      while (((bad_byte >> (2 * t)) & 3) != 3) ++t;
      return Invalid(id(), absl::StrCat("element ", 4 * bad + t, " has invalid code 3"));
    }
    if (!PaddingIsZero(body.data() + 4, bytes, 2 * static_cast<uint64_t>(d))) {
      return Invalid(id(), "padding bits not zero");
    }
    const float values[4] = {0.0f, s, -s, 0.0f};
    ParallelRanges(d, 64, [&](size_t, size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        Emit(out.data(), i, values[(codes[i / 4] >> (2 * (i % 4))) & 3], scale,
             accumulate);
      }
    });
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
