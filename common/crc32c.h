#ifndef HARRIER_COMMON_CRC32C_H_
#define HARRIER_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace harrier {

// CRC-32C (Castagnoli) of `size` bytes, by Intel's ISA-L (libisal), which
// uses the CPU's carry-less multiply or crc32 instructions where it has
// them. Thread-safe.
uint32_t Crc32c(const void* data, size_t size);

// Continues a CRC over more bytes: Crc32c(a+b) == Crc32cExtend(Crc32c(a), b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

// Copies `size` bytes from `src` to `dest` and continues `crc` over them,
// a block small enough to stay in cache at a time, so each byte is read
// from memory once rather than once for the copy and once for the CRC.
// The CRC is taken from `dest`, of the bytes as written.
uint32_t Crc32cCopy(uint32_t crc, void* dest, const void* src, size_t size);

// CRC32C of the concatenation A || B from crc_a = Crc32c(A),
// crc_b = Crc32c(B) and len_b = |B|, without the bytes: what lets CRCs of
// segments computed in parallel (e.g. on a GPU) be joined. O(log len_b).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The same in two steps, for joining many segments of one length: the
// operator for len_b bytes is computed once (O(log len_b)), each combine
// is then a 32-step GF(2) multiply.
uint32_t Crc32cShiftOperator(uint64_t len_b);
uint32_t Crc32cCombineWithOperator(uint32_t crc_a, uint32_t crc_b, uint32_t shift_b);

// A table-driven implementation, one byte at a time: the reference the
// tests compare Crc32c with.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);

}  // namespace harrier

#endif  // HARRIER_COMMON_CRC32C_H_
