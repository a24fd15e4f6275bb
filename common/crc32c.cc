#include "common/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace harrier {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    table[i] = c;
  }
  return table;
}

// GF(2) polynomial arithmetic modulo the CRC polynomial, in the reflected
// bit order the CRC uses (bit 31 is x^0); as zlib's crc32_combine.
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, product = 0;
  for (;;) {
    if (a & m) {
      product ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 * bytes) mod P: multiplying a CRC by it appends `bytes` zero bytes.
uint32_t ZeroBytesOperator(uint64_t bytes) {
  uint32_t power = 1u << 30;  // x^1
  uint32_t result = 1u << 31;  // x^0
  uint64_t n = bytes * 8;
  while (n != 0) {
    if (n & 1) result = MultModP(power, result);
    power = MultModP(power, power);
    n >>= 1;
  }
  return result;
}

// CRC(A || B) from CRC(A), CRC(B) and the operator for |B|: the CRC is
// linear, so A's contribution is shifted past |B| zero bytes.
uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint32_t shift_b) {
  return MultModP(shift_b, crc_a) ^ crc_b;
}

#if defined(__x86_64__)
bool CpuHasSse42() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_SSE4_2) != 0;
}

// Each stripe of three blocks is one CRC per block, computed in one loop:
// the crc32 instruction has a latency of 3 cycles but issues every cycle, so
// one dependency chain runs at a third of its throughput (~11 GB/s here)
// and three independent chains come close to all of it (~30 GB/s). The
// three CRCs are then combined by shifting (a 32-step GF(2) multiply each),
// which is small against a block. Shorter inputs, and the tail, use one
// chain.
constexpr size_t kStripeBlock = 8 << 10;

// Multiplication by one fixed operator (a shift by kStripeBlock zero
// bytes) as four byte-indexed tables: the product is linear in the CRC's
// bits, so it is the XOR of each byte's product. About ten instructions
// where MultModP takes up to 32 data-dependent branches, twice per stripe.
struct ShiftTables {
  explicit ShiftTables(uint32_t shift) {
    for (uint32_t byte = 0; byte < 4; ++byte) {
      for (uint32_t v = 0; v < 256; ++v) table[byte][v] = MultModP(shift, v << (8 * byte));
    }
  }
  uint32_t Apply(uint32_t crc) const {
    return table[0][crc & 0xFF] ^ table[1][(crc >> 8) & 0xFF] ^ table[2][(crc >> 16) & 0xFF] ^
           table[3][crc >> 24];
  }
  uint32_t table[4][256];
};

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const void* data,
                                                       size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (size >= 3 * kStripeBlock) {
    static const ShiftTables* const shift_block = new ShiftTables(ZeroBytesOperator(kStripeBlock));
    do {
      uint64_t c0 = static_cast<uint32_t>(~crc), c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu;
      const unsigned char* b0 = p;
      const unsigned char* b1 = p + kStripeBlock;
      const unsigned char* b2 = p + 2 * kStripeBlock;
      for (size_t i = 0; i < kStripeBlock; i += 8) {
        uint64_t w0, w1, w2;
        std::memcpy(&w0, b0 + i, 8);
        std::memcpy(&w1, b1 + i, 8);
        std::memcpy(&w2, b2 + i, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
      }
      const uint32_t crc0 = ~static_cast<uint32_t>(c0);
      const uint32_t crc1 = ~static_cast<uint32_t>(c1);
      const uint32_t crc2 = ~static_cast<uint32_t>(c2);
      crc = shift_block->Apply(shift_block->Apply(crc0) ^ crc1) ^ crc2;
      p += 3 * kStripeBlock;
      size -= 3 * kStripeBlock;
    } while (size >= 3 * kStripeBlock);
  }
  uint64_t c = static_cast<uint32_t>(~crc);
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    size -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (size > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --size;
  }
  return ~c32;
}
#endif

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = MakeTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  static const bool has_sse42 = CpuHasSse42();
  if (has_sse42) return Crc32cSse42(crc, data, size);
#endif
  return Crc32cPortable(crc, data, size);
}

uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

uint32_t Crc32cCopy(uint32_t crc, void* dest, const void* src, size_t size) {
  // Stays in L1/L2 between the two passes; two of the hardware path's
  // 3 x 8 KiB stripes, so each whole block runs its fastest loop.
  constexpr size_t kBlockBytes = 48 << 10;
  auto* out = static_cast<unsigned char*>(dest);
  const auto* in = static_cast<const unsigned char*>(src);
  for (size_t at = 0; at < size; at += kBlockBytes) {
    const size_t n = std::min(kBlockBytes, size - at);
    crc = Crc32cExtend(crc, in + at, n);
    std::memcpy(out + at, in + at, n);
  }
  return crc;
}

uint32_t Crc32cShiftOperator(uint64_t len_b) { return ZeroBytesOperator(len_b); }

uint32_t Crc32cCombineWithOperator(uint32_t crc_a, uint32_t crc_b, uint32_t shift_b) {
  return Combine(crc_a, crc_b, shift_b);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return Combine(crc_a, crc_b, ZeroBytesOperator(len_b));
}

}  // namespace harrier
