#ifndef HARRIER_COMMON_TRANSPORT_FRAMING_H_
#define HARRIER_COMMON_TRANSPORT_FRAMING_H_

// The framing of Harrier's UCX data path. Every message is one UCP active
// message whose header is a fixed 48-byte frame followed by a body
// (a serialized proto without its payload, or a status message), and whose
// data is the payload bytes, if any. Requests go to kRequestAmId on the
// shard, replies to kReplyAmId on the client.
//
//   client                               shard
//   kHello(conn, body = hello secret,   ->  checks the secret, creates an
//          data = worker address)            endpoint back
//                                       <-  kStatus(count = 0)
//   kPush / kPushPull frame i of n      ->  (one per chunk; body = chunk
//                                            header, data = payload)
//   kPull (body = PullRequest)          ->
//                                       <-  kReplyChunk i (body = chunk
//                                            header, data = payload)
//                                       <-  kStatus(code, count, message)
//   kCancel                             ->  (best effort: stops waiting)
//
// A request whose body is over kMaxHeaderBodyBytes (a sparse push's or
// pull's row ids) sends it as AM data ahead of the payload instead
// (Frame::body_in_data): UCX refuses large AM headers (about 8 KiB over
// shared memory) and aborts the sender. Replies never do.
//
// Messages of one request may be delivered out of order (rendezvous data
// completes later than eager frames), so receivers count frames: a request
// is complete once all `count` chunk frames arrived; a reply once its status
// and the `count` reply chunks it announces arrived.
//
// Pure functions; thread-safe.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/request_limits.h"
#include "proto/harrier.pb.h"

namespace harrier::transport {

constexpr unsigned kRequestAmId = 17;
constexpr unsigned kReplyAmId = 18;
constexpr uint32_t kFrameMagic = 0x31585248;  // "HRX1" little-endian
constexpr size_t kFrameBytes = 48;
// Most chunks one call may carry (common/request_limits.h).
constexpr uint32_t kMaxChunksPerCall = static_cast<uint32_t>(harrier::kMaxChunksPerCall);
// Request bodies over this go ahead of the payload in the AM data.
constexpr size_t kMaxHeaderBodyBytes = 4096;
// The most body bytes a request may carry in its data (a sparse call's ids
// at the client's limit of 2^20 rows a call are 8 MiB).
constexpr size_t kMaxDataBodyBytes = size_t{64} << 20;

// What a client needs to connect to a shard's UCX worker, from
// GetTransportAddress over the (authenticated) gRPC channel.
struct PeerAddress {
  std::string address;       // the shard's UCP worker address (bytes)
  std::string hello_secret;  // goes in the hello's body; empty: none asked
};

enum class Op : uint16_t {
  kHello = 1,
  kPush = 2,
  kPull = 3,
  kPushPull = 4,
  kCancel = 5,
  kReplyChunk = 6,
  kStatus = 7,
};

// A hello's `count`: the error mode of the client's endpoint, which the
// shard's endpoint back must match. kUnstated (older clients): the shard
// chooses as for any peer.
enum class HelloErrorMode : uint32_t { kUnstated = 0, kNone = 1, kPeer = 2 };

struct Frame {
  Op op = Op::kStatus;
  uint64_t connection_id = 0;  // chosen by the client, names its endpoint
  uint64_t request_id = 0;     // unique per client context
  uint32_t index = 0;          // this chunk's place in the request / reply
  uint32_t count = 0;          // chunks in the request / reply; kHello: HelloErrorMode
  uint64_t payload_bytes = 0;  // AM data bytes that come with this frame
  // Requests: the client's remaining time in milliseconds (-1: none).
  // kStatus: the absl::StatusCode.
  int64_t arg = 0;
  // The body is not in the header but the first (data length -
  // payload_bytes) bytes of the AM data, the payload after it.
  bool body_in_data = false;
};

// A payload buffer left uninitialised (new char[]): multi-MiB payloads are
// not zero-filled before UCX overwrites them. Aligned for float (16 bytes).
// Or, made by Borrow, someone else's bytes: a UCX receive buffer kept past
// its callback, given back when the last copy of `keeper` goes.
struct PayloadBuffer {
  std::unique_ptr<char[]> bytes;
  size_t size = 0;
  char* borrowed = nullptr;  // used instead of `bytes` when set
  std::shared_ptr<void> keeper;

  static PayloadBuffer Allocate(size_t size) {
    PayloadBuffer buffer;
    buffer.bytes.reset(new char[size == 0 ? 1 : size]);
    buffer.size = size;
    return buffer;
  }
  // `size` bytes at `data`, valid while `keeper` lives.
  static PayloadBuffer Borrow(char* data, size_t size, std::shared_ptr<void> keeper) {
    PayloadBuffer buffer;
    buffer.borrowed = data;
    buffer.size = size;
    buffer.keeper = std::move(keeper);
    return buffer;
  }
  char* data() { return borrowed != nullptr ? borrowed : bytes.get(); }
  absl::string_view view() const {
    return absl::string_view(borrowed != nullptr ? borrowed : bytes.get(), size);
  }
};

// Header bytes: the frame, then `body`.
std::string EncodeHeader(const Frame& frame, absl::string_view body);

// A request's header and the bytes to send ahead of its payload in the AM
// data: `body` goes in the header when it is at most kMaxHeaderBodyBytes,
// else in `data_prefix` (and the frame says body_in_data).
struct EncodedRequest {
  std::string header;
  std::string data_prefix;
};
EncodedRequest EncodeRequest(Frame frame, std::string body);

// How many of a received message's `data_length` data bytes are its body
// (0 unless frame.body_in_data); INVALID_ARGUMENT when they disagree with
// the frame's payload_bytes or the body is out of (kMaxHeaderBodyBytes,
// kMaxDataBodyBytes].
absl::StatusOr<size_t> BodyBytesInData(const Frame& frame, size_t data_length);

// Splits a received header. INVALID_ARGUMENT if it is shorter than a frame
// or has the wrong magic or an unknown op; `body` points into `header`.
absl::Status DecodeHeader(const void* header, size_t length, Frame* frame,
                          absl::string_view* body);

// A chunk's fields except its payload, serialized (the payload travels as
// AM data). Free when the payload field is empty, as on the data path;
// otherwise it copies the payload once (tests).
std::string EncodeChunkHeader(const proto::TensorChunk& chunk);

// kStatus header for `status` closing a reply of `count` chunks.
std::string EncodeStatus(uint64_t connection_id, uint64_t request_id, uint32_t count,
                         const absl::Status& status);
// The status a kStatus frame carries.
absl::Status DecodeStatus(const Frame& frame, absl::string_view body);

}  // namespace harrier::transport

#endif  // HARRIER_COMMON_TRANSPORT_FRAMING_H_
