#include "common/payload_view.h"

#include <algorithm>
#include <cstring>

#include "common/crc32c.h"

namespace harrier {

void CopyPieces(absl::Span<const absl::string_view> pieces, void* dest) {
  char* out = static_cast<char*>(dest);
  for (absl::string_view piece : pieces) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

void PayloadView::CopyTo(void* dest) const { CopyPieces(pieces_, dest); }

uint32_t PayloadView::CopyToWithCrc32c(void* dest) const {
  // Small enough to stay in L1/L2 between the two passes; a multiple of the
  // CRC's 3 x 8 KiB stripe (common/crc32c.cc).
  constexpr size_t kBlockBytes = 48 << 10;
  char* out = static_cast<char*>(dest);
  uint32_t crc = 0;
  for (absl::string_view piece : pieces_) {
    for (size_t at = 0; at < piece.size(); at += kBlockBytes) {
      const size_t n = std::min(kBlockBytes, piece.size() - at);
      crc = Crc32cExtend(crc, piece.data() + at, n);
      std::memcpy(out, piece.data() + at, n);
      out += n;
    }
  }
  return crc;
}

}  // namespace harrier
