#include "common/chunk_wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace harrier {
namespace {

constexpr uint32_t kPayloadField = 11;  // TensorChunk.payload
constexpr uint32_t kWireVarint = 0, kWireFixed64 = 1, kWireLengthDelimited = 2, kWireFixed32 = 5;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Reads the message's bytes across slice boundaries. Header fields are a few
// dozen bytes and are copied; the payload is only ever skipped over.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool done() const { return slice_ == slices_.size(); }

  bool ReadByte(uint8_t* byte) {
    if (done()) return false;
    *byte = slices_[slice_].begin()[offset_];
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // Consumes `n` bytes; `copy` (if set) receives them, `view` (if set) the
  // ranges they occupy. False if fewer than `n` remain.
  bool Take(uint64_t n, std::string* copy, PayloadView* view) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& slice = slices_[slice_];
      const size_t step = static_cast<size_t>(std::min<uint64_t>(n, slice.size() - offset_));
      const char* start = reinterpret_cast<const char*>(slice.begin()) + offset_;
      if (copy != nullptr) copy->append(start, step);
      if (view != nullptr) view->Append(absl::string_view(start, step));
      Advance(step);
      n -= step;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    if (offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

}  // namespace

std::string EncodeChunkPrefix(const proto::TensorChunk& header, size_t payload_size) {
  std::string prefix;
  header.AppendToString(&prefix);
  AppendVarint((kPayloadField << 3) | kWireLengthDelimited, &prefix);
  AppendVarint(payload_size, &prefix);
  return prefix;
}

absl::Status DecodeChunk(const std::vector<grpc::Slice>& slices, proto::TensorChunk* header,
                         PayloadView* payload) {
  const auto malformed = [] { return absl::InvalidArgumentError("malformed TensorChunk message"); };
  // Every field but the payload is copied, re-encoded as it came, into a
  // small buffer that protobuf then parses, so every header field keeps
  // protobuf's exact semantics (unknown fields, repeated occurrences).
  std::string header_bytes;
  payload->Clear();
  SliceCursor cursor(slices);
  while (!cursor.done()) {
    uint64_t tag;
    if (!cursor.ReadVarint(&tag) || tag > UINT32_MAX || (tag >> 3) == 0) return malformed();
    const uint32_t field = static_cast<uint32_t>(tag >> 3);
    const uint32_t wire_type = static_cast<uint32_t>(tag & 7);
    if (field == kPayloadField && wire_type == kWireLengthDelimited) {
      uint64_t length;
      if (!cursor.ReadVarint(&length)) return malformed();
      payload->Clear();  // a repeated occurrence replaces the earlier one, as protobuf does
      if (!cursor.Take(length, nullptr, payload)) return malformed();
      continue;
    }
    AppendVarint(tag, &header_bytes);
    uint64_t value;
    switch (wire_type) {
      case kWireVarint:
        if (!cursor.ReadVarint(&value)) return malformed();
        AppendVarint(value, &header_bytes);
        break;
      case kWireFixed64:
        if (!cursor.Take(8, &header_bytes, nullptr)) return malformed();
        break;
      case kWireFixed32:
        if (!cursor.Take(4, &header_bytes, nullptr)) return malformed();
        break;
      case kWireLengthDelimited:
        if (!cursor.ReadVarint(&value)) return malformed();
        AppendVarint(value, &header_bytes);
        if (!cursor.Take(value, &header_bytes, nullptr)) return malformed();
        break;
      default:  // groups are not used by TensorChunk
        return malformed();
    }
  }
  if (!header->ParseFromString(header_bytes)) return malformed();
  return absl::OkStatus();
}

}  // namespace harrier
