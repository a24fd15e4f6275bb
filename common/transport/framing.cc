#include "common/transport/framing.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace harrier::transport {
namespace {

// Fixed little-endian layout; x86-64 and aarch64 are both little-endian,
// so memcpy is the encoding.
template <typename T>
void Put(char*& out, T value) {
  std::memcpy(out, &value, sizeof(T));
  out += sizeof(T);
}

template <typename T>
T Get(const char*& in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  in += sizeof(T);
  return value;
}

constexpr uint16_t kBodyInDataFlag = 1;

}  // namespace

EncodedRequest EncodeRequest(Frame frame, std::string body) {
  EncodedRequest request;
  frame.body_in_data = body.size() > kMaxHeaderBodyBytes;
  if (frame.body_in_data) {
    request.header = EncodeHeader(frame, {});
    request.data_prefix = std::move(body);
  } else {
    request.header = EncodeHeader(frame, body);
  }
  return request;
}

absl::StatusOr<size_t> BodyBytesInData(const Frame& frame, size_t data_length) {
  if (!frame.body_in_data) {
    if (frame.payload_bytes != data_length) {
      return absl::InvalidArgumentError(absl::StrCat("payload length ", data_length,
                                                     " disagrees with the frame's ",
                                                     frame.payload_bytes, " bytes"));
    }
    return 0;
  }
  if (frame.payload_bytes > data_length) {
    return absl::InvalidArgumentError(absl::StrCat("data of ", data_length,
                                                   " bytes is shorter than the frame's payload of ",
                                                   frame.payload_bytes, " bytes"));
  }
  const size_t body = data_length - frame.payload_bytes;
  if (body <= kMaxHeaderBodyBytes || body > kMaxDataBodyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a body of ", body,
                                                   " bytes in the data, outside (",
                                                   kMaxHeaderBodyBytes, ", ", kMaxDataBodyBytes,
                                                   "]"));
  }
  return body;
}

std::string EncodeHeader(const Frame& frame, absl::string_view body) {
  std::string header(kFrameBytes + body.size(), '\0');
  char* out = header.data();
  Put<uint32_t>(out, kFrameMagic);
  Put<uint16_t>(out, static_cast<uint16_t>(frame.op));
  Put<uint16_t>(out, frame.body_in_data ? kBodyInDataFlag : 0);
  Put<uint64_t>(out, frame.connection_id);
  Put<uint64_t>(out, frame.request_id);
  Put<uint32_t>(out, frame.index);
  Put<uint32_t>(out, frame.count);
  Put<uint64_t>(out, frame.payload_bytes);
  Put<int64_t>(out, frame.arg);
  // An empty body may be a default string_view, whose data() is null:
  // memcpy from null is undefined even for 0 bytes (UBSan, the UCX tests).
  if (!body.empty()) std::memcpy(out, body.data(), body.size());
  return header;
}

absl::Status DecodeHeader(const void* header, size_t length, Frame* frame,
                          absl::string_view* body) {
  if (header == nullptr || length < kFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed frame: header of ", length, " bytes, expected >= ", kFrameBytes));
  }
  const char* in = static_cast<const char*>(header);
  if (Get<uint32_t>(in) != kFrameMagic) {
    return absl::InvalidArgumentError("malformed frame: bad magic");
  }
  const uint16_t op = Get<uint16_t>(in);
  if (op < static_cast<uint16_t>(Op::kHello) || op > static_cast<uint16_t>(Op::kStatus)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed frame: unknown op ", op));
  }
  const uint16_t flags = Get<uint16_t>(in);
  if ((flags & ~kBodyInDataFlag) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("malformed frame: unknown flags ", flags));
  }
  frame->op = static_cast<Op>(op);
  frame->body_in_data = (flags & kBodyInDataFlag) != 0;
  frame->connection_id = Get<uint64_t>(in);
  frame->request_id = Get<uint64_t>(in);
  frame->index = Get<uint32_t>(in);
  frame->count = Get<uint32_t>(in);
  frame->payload_bytes = Get<uint64_t>(in);
  frame->arg = Get<int64_t>(in);
  *body = absl::string_view(static_cast<const char*>(header) + kFrameBytes, length - kFrameBytes);
  return absl::OkStatus();
}

std::string EncodeChunkHeader(const proto::TensorChunk& chunk) {
  // The data path passes headers whose payload is empty: no copy. Otherwise
  // copy and clear, which keeps every field (including ones added later to
  // the proto) at the cost of copying the payload once.
  if (chunk.payload().empty()) return chunk.SerializeAsString();
  proto::TensorChunk meta = chunk;
  meta.clear_payload();
  return meta.SerializeAsString();
}

std::string EncodeStatus(uint64_t connection_id, uint64_t request_id, uint32_t count,
                         const absl::Status& status) {
  Frame frame;
  frame.op = Op::kStatus;
  frame.connection_id = connection_id;
  frame.request_id = request_id;
  frame.count = count;
  frame.arg = static_cast<int64_t>(status.code());
  return EncodeHeader(frame, status.message());
}

absl::Status DecodeStatus(const Frame& frame, absl::string_view body) {
  if (frame.arg < 0 || frame.arg > static_cast<int64_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(absl::StrCat("reply carries unknown status code ", frame.arg));
  }
  return absl::Status(static_cast<absl::StatusCode>(frame.arg), body);
}

}  // namespace harrier::transport
