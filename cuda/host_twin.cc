#include "cuda/host_twin.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace harrier {
namespace cuda {
namespace host {
namespace {

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

absl::Status CheckBodySize(CodecId id, size_t actual, size_t expected) {
  if (actual < expected) {
    return Invalid(id, absl::StrCat("payload truncated: body has ", actual,
                                    " bytes, expected ", expected));
  }
  if (actual > expected) {
    return Invalid(id, absl::StrCat("payload has ", actual - expected,
                                    " trailing bytes (body ", actual,
                                    ", expected ", expected, ")"));
  }
  return absl::OkStatus();
}

bool AllFinite(const char* p, size_t count) {
  float acc = 0.0f;
  for (size_t i = 0; i < count; ++i) {
    float v = Load<float>(p + 4 * i);
    acc += v - v;
  }
  return acc == 0.0f;
}

bool MaskPaddingIsZero(const char* mask, size_t n) {
  if (n % 8 == 0) return true;
  return (static_cast<uint8_t>(mask[n / 8]) >> (n % 8)) == 0;
}

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

absl::Status CheckIndexValue(CodecId id, absl::string_view body, size_t k,
                             size_t d) {
  const char* idx = body.data();
  const char* val = idx + 4 * k;
  uint64_t prev = 0;
  for (size_t j = 0; j < k; ++j) {
    uint32_t i = Load<uint32_t>(idx + 4 * j);
    if (i >= d) {
      return Invalid(id, absl::StrCat("index ", i, " at position ", j,
                                      " out of range [0, ", d, ")"));
    }
    if (j > 0 && i <= prev) {
      return Invalid(id, absl::StrCat("index ", i, " at position ", j,
                                      " repeated or not increasing (previous ",
                                      prev, ")"));
    }
    prev = i;
    float v = Load<float>(val + 4 * j);
    if (!std::isfinite(v)) {
      return Invalid(id, absl::StrCat("value at position ", j, " (index ", i,
                                      ") is ", v));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Mix64(uint64_t a, uint64_t b) {
  uint64_t state = a ^ (b * 0x9e3779b97f4a7c15ULL);
  SplitMix64(&state);
  return SplitMix64(&state);
}

Rng::Rng(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t& s : s_) s = SplitMix64(&state);
}

uint64_t Rng::Next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::Below(uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

double Rng::Normal() {
  double u1 = (static_cast<double>(Next() >> 11) + 1.0) * 0x1p-53;
  double u2 = static_cast<double>(Next() >> 11) * 0x1p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

size_t KFromRatio(double ratio, size_t d) {
  if (d == 0) return 0;
  double k = std::llround(ratio * static_cast<double>(d));
  return std::min<size_t>(d, std::max<size_t>(1, static_cast<size_t>(k)));
}

void RandomKIndices(uint64_t seed, size_t d, size_t k,
                    std::vector<uint32_t>* indices) {
  indices->clear();
  indices->reserve(k);
  if (k == d) {
    for (size_t i = 0; i < d; ++i) indices->push_back(static_cast<uint32_t>(i));
    return;
  }
  std::vector<uint64_t> bits((d + 63) / 64, 0);
  Rng rng(seed);
  for (size_t j = d - k; j < d; ++j) {
    uint64_t t = rng.Below(j + 1);
    if (bits[t / 64] >> (t % 64) & 1) t = j;
    bits[t / 64] |= uint64_t{1} << (t % 64);
  }
  for (size_t w = 0; w < bits.size(); ++w) {
    uint64_t word = bits[w];
    while (word != 0) {
      indices->push_back(static_cast<uint32_t>(w * 64 + __builtin_ctzll(word)));
      word &= word - 1;
    }
  }
}

MatrixShape ChoosePowerSgdShape(size_t d, uint32_t rank, uint64_t cols) {
  MatrixShape s;
  if (d == 0) return s;
  size_t m = 0;
  if (cols > 0) {
    if (d % cols == 0) m = d / cols;
  } else {
    for (size_t c = 1; c * c <= d; ++c) {
      if (d % c == 0) m = c;
    }
  }
  if (m < 2 || d / m < 2) return s;
  size_t n = d / m;
  size_t r = std::min<size_t>(rank, std::min(m, n));
  if (r * (m + n) >= d) return s;
  s.m = m;
  s.n = n;
  s.r = r;
  return s;
}

int BitWidth(uint32_t v) { return v == 0 ? 0 : 32 - __builtin_clz(v); }

size_t PackedBytes(size_t n, int bits) {
  return static_cast<size_t>((static_cast<unsigned __int128>(n) * bits + 7) / 8);
}

char* StartPayload(CodecId id, uint64_t num_elements, uint32_t param0,
                   uint32_t param1, size_t body_bytes, std::string* payload) {
  payload->resize(kCodecHeaderBytes + body_bytes);
  char* p = &(*payload)[0];
  Store<uint32_t>(p, kCodecWireMagic);
  Store<uint8_t>(p + 4, static_cast<uint8_t>(id));
  Store<uint8_t>(p + 5, kCodecWireVersion);
  Store<uint16_t>(p + 6, 0);
  Store<uint64_t>(p + 8, num_elements);
  Store<uint32_t>(p + 16, param0);
  Store<uint32_t>(p + 20, param1);
  return p + kCodecHeaderBytes;
}

absl::Status Invalid(CodecId id, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("codec ", CodecName(id), ": ", message));
}

absl::StatusOr<CheckedPayload> CheckPayload(absl::string_view payload,
                                            CodecId expected, bool expected_any,
                                            size_t d) {
  absl::StatusOr<PayloadHeader> h = PeekPayloadHeader(payload);
  if (!h.ok()) return Invalid(expected, h.status().message());
  if (expected_any) expected = h->codec;
  const CodecId id = expected;
  if (h->codec != expected) {
    return Invalid(id, absl::StrCat("payload was encoded by codec ",
                                    CodecName(h->codec), " (id ",
                                    static_cast<uint32_t>(h->codec), ")"));
  }
  if (h->num_elements != d) {
    return Invalid(id, absl::StrCat("payload has ", h->num_elements,
                                    " elements, output has ", d));
  }
  CheckedPayload c;
  c.header = *h;
  c.body = payload.substr(kCodecHeaderBytes);
  const absl::string_view body = c.body;
  absl::Status st;
  switch (id) {
    case CodecId::kNone: {
      st = CheckBodySize(id, body.size(), 4 * d);
      if (st.ok() && !AllFinite(body.data(), d)) {
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
    case CodecId::kThreshold: {
      c.k = h->param0;
      if (h->param1 != 0) return Invalid(id, "header param1 must be 0");
      if (c.k > d) {
        return Invalid(id, absl::StrCat("k = ", c.k, " exceeds element count ", d));
      }
      if (id == CodecId::kTopK && d > 0 && c.k == 0) {
        return Invalid(id, "k = 0 for a non-empty tensor");
      }
      st = CheckBodySize(id, body.size(), 8 * c.k);
      if (st.ok()) st = CheckIndexValue(id, body, c.k, d);
      break;
    }
    case CodecId::kRandomK: {
      c.k = h->param0;
      if (h->param1 != 0) return Invalid(id, "header param1 must be 0");
      if (c.k > d) {
        return Invalid(id, absl::StrCat("k = ", c.k, " exceeds element count ", d));
      }
      if (d > 0 && c.k == 0) return Invalid(id, "k = 0 for a non-empty tensor");
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
      const size_t r = h->param0, m = h->param1;
      size_t n = 0;
      if (r == 0) {
        if (m != 0) return Invalid(id, "uncompressed payload with m != 0");
      } else {
        if (m < 2 || d % m != 0 || d / m < 2) {
          return Invalid(id, absl::StrCat("m = ", m, " does not divide ", d,
                                          " into a matrix"));
        }
        n = d / m;
        if (r > std::min(m, n) || r > 64) {
          return Invalid(id, absl::StrCat("rank ", r, " too large for ", m,
                                          " x ", n));
        }
      }
      const size_t floats = r == 0 ? d : r * (m + n);
      st = CheckBodySize(id, body.size(), 4 * floats);
      if (st.ok() && !AllFinite(body.data(), floats)) {
        st = Invalid(id, "payload holds NaN or Inf");
      }
      c.m = m;
      c.n = n;
      c.r = r;
      break;
    }
  }
  if (!st.ok()) return st;
  return c;
}

}  // namespace host
}  // namespace cuda
}  // namespace harrier
