#ifndef HARRIER_COMMON_PAYLOAD_VIEW_H_
#define HARRIER_COMMON_PAYLOAD_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace harrier {

// A payload as it arrived: byte ranges in order, borrowed from buffers the
// caller keeps alive (received gRPC slices, a string). Not owning.
class PayloadView {
 public:
  PayloadView() = default;
  explicit PayloadView(absl::string_view contiguous) { Append(contiguous); }

  void Append(absl::string_view piece) {
    if (!piece.empty()) pieces_.push_back(piece);
    size_ += piece.size();
    crc32c_.reset();  // no longer of all the bytes
  }
  void Clear() {
    pieces_.clear();
    size_ = 0;
    crc32c_.reset();
  }
  // The CRC32C of all the payload's bytes where the transport took it as
  // they arrived (while they were in cache); a reader then checks this
  // instead of reading the bytes again. Unset: the reader takes it.
  void set_crc32c(uint32_t crc) { crc32c_ = crc; }
  std::optional<uint32_t> crc32c() const { return crc32c_; }
  // The CRC32C of all the bytes: the one the transport took where it took
  // one, else taken now over the pieces.
  uint32_t Crc32cOfBytes() const;

  size_t size() const { return size_; }
  const std::vector<absl::string_view>& pieces() const { return pieces_; }
  // True when the payload is one piece (or empty): first() is all of it.
  // Otherwise callers that need contiguous bytes CopyTo() a buffer of theirs.
  bool contiguous() const { return pieces_.size() <= 1; }
  absl::string_view first() const { return pieces_.empty() ? absl::string_view() : pieces_[0]; }
  // Copies all size() bytes to `dest`.
  void CopyTo(void* dest) const;
  // The same, returning the CRC32C of the bytes, taken while they are
  // copied (Crc32cCopy): each byte is read from memory once.
  uint32_t CopyToWithCrc32c(void* dest) const;

 private:
  std::vector<absl::string_view> pieces_;
  size_t size_ = 0;
  std::optional<uint32_t> crc32c_;
};

// Copies `pieces` end to end to `dest`, which holds their total size.
void CopyPieces(absl::Span<const absl::string_view> pieces, void* dest);

}  // namespace harrier

#endif  // HARRIER_COMMON_PAYLOAD_VIEW_H_
