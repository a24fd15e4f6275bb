// A received payload's copy with its checksum taken on the way
// (PayloadView::CopyToWithCrc32c): the same bytes and the same CRC32C as
// the plain copy and a CRC of the whole, for pieces that straddle its
// 16 KiB blocks; the CRC of all the bytes, the transport's where it took
// one (PayloadView::Crc32cOfBytes).
#include "common/payload_view.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/crc32c.h"

namespace harrier {
namespace {

std::string Bytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  return bytes;
}

TEST_CASE("a copy with its checksum matches the plain copy and the whole's CRC32C") {
  // 16 KiB blocks: sizes on, around and far from them.
  for (size_t total : {size_t{0}, size_t{1}, size_t{4096}, size_t{(16 << 10) - 1}, size_t{16 << 10},
                       size_t{(16 << 10) + 1}, size_t{(48 << 10) + 1}, size_t{(1 << 20) + 13}}) {
    const std::string bytes = Bytes(total);
    for (size_t pieces : {size_t{1}, size_t{2}, size_t{7}}) {
      PayloadView view;
      const size_t step = total / pieces + 1;
      for (size_t at = 0; at < total; at += step) {
        view.Append(absl::string_view(bytes).substr(at, step));
      }
      REQUIRE(view.size() == total);
      std::string copied(total, 'x');
      const uint32_t crc = view.CopyToWithCrc32c(copied.data());
      INFO("total " << total << ", pieces " << pieces);
      CHECK(crc == Crc32cPortable(0, bytes.data(), bytes.size()));
      CHECK(copied == bytes);
      CHECK(view.Crc32cOfBytes() == crc);
    }
  }
}

TEST_CASE("a copy with its checksum sees one flipped bit") {
  std::string bytes = Bytes((1 << 20) + 5);
  const uint32_t before = Crc32c(bytes.data(), bytes.size());
  bytes[700001] ^= 0x10;
  std::string copied(bytes.size(), '\0');
  PayloadView view;
  view.Append(absl::string_view(bytes).substr(0, 500000));
  view.Append(absl::string_view(bytes).substr(500000));
  CHECK(view.CopyToWithCrc32c(copied.data()) != before);
  CHECK(copied == bytes);
}

TEST_CASE("the CRC of all the bytes is the transport's where it took one") {
  const std::string bytes = Bytes(100000);
  const uint32_t whole = Crc32c(bytes.data(), bytes.size());
  PayloadView view;
  view.Append(absl::string_view(bytes).substr(0, 30000));
  view.Append(absl::string_view(bytes).substr(30000));
  CHECK(view.Crc32cOfBytes() == whole);
  // The bytes are not read again: a CRC that disagrees with them is what
  // a reader is given.
  view.set_crc32c(whole ^ 1);
  CHECK(view.Crc32cOfBytes() == (whole ^ 1));
  // A piece appended after the CRC was set: taken over the bytes again.
  view.Append("tail");
  const std::string all = bytes + "tail";
  CHECK(view.Crc32cOfBytes() == Crc32c(all.data(), all.size()));
}

}  // namespace
}  // namespace harrier
