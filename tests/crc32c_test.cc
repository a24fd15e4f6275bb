#include "common/crc32c.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

TEST_CASE("crc32c matches the published check value") {
  const std::string text = "123456789";
  REQUIRE(harrier::Crc32c(text.data(), text.size()) == 0xE3069283u);
  REQUIRE(harrier::Crc32cPortable(0, text.data(), text.size()) == 0xE3069283u);
}

TEST_CASE("crc32c hardware and portable paths agree and extend") {
  std::vector<unsigned char> bytes(10007);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  const uint32_t whole = harrier::Crc32c(bytes.data(), bytes.size());
  REQUIRE(whole == harrier::Crc32cPortable(0, bytes.data(), bytes.size()));
  const uint32_t first = harrier::Crc32c(bytes.data(), 4001);
  REQUIRE(harrier::Crc32cExtend(first, bytes.data() + 4001, bytes.size() - 4001) == whole);
  bytes[5000] ^= 1;
  REQUIRE(harrier::Crc32c(bytes.data(), bytes.size()) != whole);
}

TEST_CASE("crc32c three-stream path agrees with the portable one around stripe boundaries") {
  // The hardware path splits inputs of at least 3 x 8 KiB into stripes of
  // three 8 KiB blocks; check lengths on both sides of one and two stripes,
  // odd lengths (a tail shorter than a word), a non-zero starting CRC and an
  // unaligned start.
  constexpr size_t kBlock = 8 << 10;
  std::vector<unsigned char> bytes(6 * kBlock + 64);
  uint32_t state = 12345;
  for (auto& b : bytes) {
    state = state * 1103515245u + 12345u;
    b = static_cast<unsigned char>(state >> 16);
  }
  for (size_t base : {3 * kBlock, 6 * kBlock}) {
    for (size_t length = base - 9; length <= base + 9; ++length) {
      for (size_t offset : {size_t{0}, size_t{3}}) {
        if (offset + length > bytes.size()) continue;
        const unsigned char* data = bytes.data() + offset;
        INFO("length " << length << " offset " << offset);
        REQUIRE(harrier::Crc32c(data, length) == harrier::Crc32cPortable(0, data, length));
        const uint32_t seed = 0xDEADBEEFu;
        REQUIRE(harrier::Crc32cExtend(seed, data, length) ==
                harrier::Crc32cPortable(seed, data, length));
      }
    }
  }
  // Extending across a stripe split gives the CRC of the whole.
  const size_t total = 5 * kBlock + 17;
  const uint32_t whole = harrier::Crc32c(bytes.data(), total);
  for (size_t split : {size_t{1}, kBlock, 3 * kBlock - 1, 3 * kBlock, 3 * kBlock + 1}) {
    const uint32_t first = harrier::Crc32c(bytes.data(), split);
    REQUIRE(harrier::Crc32cExtend(first, bytes.data() + split, total - split) == whole);
  }
  // A flipped bit in any block of a stripe changes the CRC.
  for (size_t flip : {size_t{5}, kBlock + 5, 2 * kBlock + 5}) {
    std::vector<unsigned char> copy(bytes.begin(), bytes.begin() + 3 * kBlock);
    const uint32_t before = harrier::Crc32c(copy.data(), copy.size());
    copy[flip] ^= 0x10;
    REQUIRE(harrier::Crc32c(copy.data(), copy.size()) != before);
  }
}
