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
