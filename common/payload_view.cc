#include "common/payload_view.h"

#include <cstring>

namespace harrier {

void CopyPieces(absl::Span<const absl::string_view> pieces, void* dest) {
  char* out = static_cast<char*>(dest);
  for (absl::string_view piece : pieces) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

void PayloadView::CopyTo(void* dest) const { CopyPieces(pieces_, dest); }

}  // namespace harrier
