#include "common/payload_view.h"

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

uint32_t PayloadView::Crc32cOfBytes() const {
  if (crc32c_.has_value()) return *crc32c_;
  uint32_t crc = 0;
  for (absl::string_view piece : pieces_) crc = Crc32cExtend(crc, piece.data(), piece.size());
  return crc;
}

uint32_t PayloadView::CopyToWithCrc32c(void* dest) const {
  char* out = static_cast<char*>(dest);
  uint32_t crc = 0;
  for (absl::string_view piece : pieces_) {
    crc = Crc32cCopy(crc, out, piece.data(), piece.size());
    out += piece.size();
  }
  return crc;
}

}  // namespace harrier
