#ifndef HARRIER_COMMON_CRC32C_H_
#define HARRIER_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace harrier {

// CRC-32C (Castagnoli) of `size` bytes, hardware-accelerated with SSE4.2
// when the CPU has it, a table otherwise. Both give identical results.
// Thread-safe.
uint32_t Crc32c(const void* data, size_t size);

// Continues a CRC over more bytes: Crc32c(a+b) == Crc32cExtend(Crc32c(a), b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

// The portable implementation, exposed so tests can compare both paths.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);

}  // namespace harrier

#endif  // HARRIER_COMMON_CRC32C_H_
