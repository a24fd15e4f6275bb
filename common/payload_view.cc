#include "common/payload_view.h"

#include <cstring>

namespace harrier {

void PayloadView::CopyTo(void* dest) const {
  char* out = static_cast<char*>(dest);
  for (absl::string_view piece : pieces_) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

}  // namespace harrier
