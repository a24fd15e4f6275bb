#include "common/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>

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

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = MakeTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  // ISA-L's crc32_iscsi picks the CPU's fastest path when first called
  // (folding with carry-less multiplies, 512 bits at a time where the CPU
  // has VPCLMULQDQ). It keeps the CRC register as it is, without the
  // standard's inversions before and after, and takes an int length and a
  // pointer that is not const (it only reads).
  constexpr size_t kMaxCall = size_t{1} << 30;
  static_assert(kMaxCall <= INT_MAX);
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t reg = ~crc;
  while (size > 0) {
    const size_t n = std::min(size, kMaxCall);
    reg = crc32_iscsi(p, static_cast<int>(n), reg);
    p += n;
    size -= n;
  }
  return ~reg;
}

uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

uint32_t Crc32cCopy(uint32_t crc, void* dest, const void* src, size_t size) {
  // Copy a block, then take its CRC from the copy while it is in L1: the
  // copy pays for the one read from memory and the CRC runs at its
  // in-cache rate, several times its rate from memory here (16 KiB
  // blocks were the fastest of 8-48 KiB, docs/performance.md).
  constexpr size_t kBlockBytes = 16 << 10;
  auto* out = static_cast<unsigned char*>(dest);
  const auto* in = static_cast<const unsigned char*>(src);
  for (size_t at = 0; at < size; at += kBlockBytes) {
    const size_t n = std::min(kBlockBytes, size - at);
    std::memcpy(out + at, in + at, n);
    crc = Crc32cExtend(crc, out + at, n);
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
