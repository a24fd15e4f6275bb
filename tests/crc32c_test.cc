#include "common/crc32c.h"

#include <algorithm>
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

TEST_CASE("crc32c agrees with the table-driven reference at every short length and larger ones") {
  // A folding implementation takes short inputs, whole folds and the tail
  // by different loops: every length to 1100 at each offset within a word,
  // then lengths on both sides of larger multiples, a non-zero starting CRC
  // and extension across splits.
  constexpr size_t kBlock = 8 << 10;
  std::vector<unsigned char> bytes(6 * kBlock + 64);
  uint32_t state = 12345;
  for (auto& b : bytes) {
    state = state * 1103515245u + 12345u;
    b = static_cast<unsigned char>(state >> 16);
  }
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t length = 0; length <= 1100; ++length) {
      const unsigned char* data = bytes.data() + offset;
      INFO("length " << length << " offset " << offset);
      REQUIRE(harrier::Crc32cExtend(0x5A5A5A5Au, data, length) ==
              harrier::Crc32cPortable(0x5A5A5A5Au, data, length));
    }
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
  // Extending across a split gives the CRC of the whole.
  const size_t total = 5 * kBlock + 17;
  const uint32_t whole = harrier::Crc32c(bytes.data(), total);
  for (size_t split : {size_t{1}, kBlock, 3 * kBlock - 1, 3 * kBlock, 3 * kBlock + 1}) {
    const uint32_t first = harrier::Crc32c(bytes.data(), split);
    REQUIRE(harrier::Crc32cExtend(first, bytes.data() + split, total - split) == whole);
  }
  // A flipped bit anywhere changes the CRC.
  for (size_t flip : {size_t{5}, kBlock + 5, 2 * kBlock + 5}) {
    std::vector<unsigned char> copy(bytes.begin(), bytes.begin() + 3 * kBlock);
    const uint32_t before = harrier::Crc32c(copy.data(), copy.size());
    copy[flip] ^= 0x10;
    REQUIRE(harrier::Crc32c(copy.data(), copy.size()) != before);
  }
}

TEST_CASE("crc32c combine equals the CRC of the concatenation") {
  std::vector<unsigned char> bytes(70000);
  uint32_t state = 987654321u;
  for (auto& b : bytes) {
    state = state * 1103515245u + 12345u;
    b = static_cast<unsigned char>(state >> 16);
  }
  const size_t lengths[] = {0, 1, 2, 3, 7, 8, 63, 255, 4096, 4097, 24577, 33333};
  for (size_t len_a : lengths) {
    for (size_t len_b : lengths) {
      INFO("len_a " << len_a << " len_b " << len_b);
      const unsigned char* a = bytes.data() + 5;  // odd offsets: no alignment assumed
      const unsigned char* b = a + len_a;
      const uint32_t crc_a = harrier::Crc32c(a, len_a);
      const uint32_t crc_b = harrier::Crc32c(b, len_b);
      const uint32_t whole = harrier::Crc32c(a, len_a + len_b);
      REQUIRE(harrier::Crc32cCombine(crc_a, crc_b, len_b) == whole);
      REQUIRE(harrier::Crc32cCombineWithOperator(crc_a, crc_b,
                                                 harrier::Crc32cShiftOperator(len_b)) == whole);
    }
  }
  // Many equal segments and a short tail, joined left to right with one
  // operator, as the device CRC does.
  for (size_t segment : {size_t{1}, size_t{16}, size_t{1000}, size_t{4099}}) {
    for (size_t total : {size_t{0}, size_t{1}, segment, 3 * segment + 1, size_t{69999}}) {
      INFO("segment " << segment << " total " << total);
      const uint32_t shift = harrier::Crc32cShiftOperator(segment);
      uint32_t crc = 0;
      for (size_t start = 0; start < total; start += segment) {
        const size_t len = std::min(segment, total - start);
        const uint32_t part = harrier::Crc32c(bytes.data() + start, len);
        crc = len == segment ? harrier::Crc32cCombineWithOperator(crc, part, shift)
                             : harrier::Crc32cCombine(crc, part, len);
      }
      REQUIRE(crc == harrier::Crc32c(bytes.data(), total));
    }
  }
  // A wrong length gives a wrong CRC (the combine really shifts).
  const uint32_t crc_a = harrier::Crc32c(bytes.data(), 100);
  const uint32_t crc_b = harrier::Crc32c(bytes.data() + 100, 50);
  REQUIRE(harrier::Crc32cCombine(crc_a, crc_b, 49) != harrier::Crc32c(bytes.data(), 150));
}

TEST_CASE("crc32c copy gives the copy and the CRC of the bytes, continued") {
  std::vector<unsigned char> bytes((1 << 20) + 13);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  // Around and far from its 16 KiB blocks.
  for (size_t size : {size_t{0}, size_t{7}, size_t{(16 << 10) - 1}, size_t{16 << 10},
                      size_t{(16 << 10) + 1}, size_t{(32 << 10) + 5}, bytes.size()}) {
    INFO("size " << size);
    std::vector<unsigned char> out(size + 1, 0xAB);
    REQUIRE(harrier::Crc32cCopy(0, out.data(), bytes.data(), size) ==
            harrier::Crc32cPortable(0, bytes.data(), size));
    REQUIRE(std::equal(bytes.begin(), bytes.begin() + size, out.begin()));
    REQUIRE(out[size] == 0xAB);  // nothing past the end
    // Continued from the CRC of the bytes before.
    if (size < 5) continue;
    const uint32_t head = harrier::Crc32c(bytes.data(), 5);
    REQUIRE(harrier::Crc32cCopy(head, out.data(), bytes.data() + 5, size - 5) ==
            harrier::Crc32c(bytes.data(), size));
  }
}
