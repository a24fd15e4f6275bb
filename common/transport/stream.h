#ifndef HARRIER_COMMON_TRANSPORT_STREAM_H_
#define HARRIER_COMMON_TRANSPORT_STREAM_H_

// The framing of Harrier's "tcp" data path: the messages of framing.h (the
// 48-byte frame, its body, then its payload) over one stream socket, each
// preceded by its header's length:
//
//   u32 header_bytes (little-endian) | frame + body (header_bytes) | payload (frame.payload_bytes)
//
// A body always travels in the header here (Frame::body_in_data is never
// set): a stream has no size limit on a header the way UCX's active
// messages have. The conversation is framing.h's: the client's first
// message is kHello (body = the hello secret), answered by kStatus; then
// kPush / kPushPull chunk frames, kPull and kCancel go one way and
// kReplyChunk and kStatus come back. A stream delivers in order, so a
// request's chunk frames arrive one after another, but the replies of
// different requests on one connection may interleave (whole messages
// each).
//
// Sockets are non-blocking; every read and write here waits in poll(2)
// until its deadline.

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transport/framing.h"

namespace harrier::transport {

constexpr size_t kStreamPrefixBytes = sizeof(uint32_t);
// The largest header a stream message may carry: the frame and a body of
// up to kMaxDataBodyBytes (a sparse call's row ids).
constexpr size_t kMaxStreamHeaderBytes = kFrameBytes + kMaxDataBodyBytes;
// The largest header a connection may send before its hello is accepted.
constexpr size_t kMaxHelloHeaderBytes = kFrameBytes + kMaxHeaderBodyBytes;

// The prefix and header of a message (payload not included).
std::string EncodeStreamHeader(const Frame& frame, absl::string_view body);
// A header already encoded by framing.h (EncodeHeader, EncodeStatus, ...)
// with its stream prefix in front.
std::string PrefixStreamHeader(absl::string_view header);
// The header length a prefix announces; INVALID_ARGUMENT when it is shorter
// than a frame or longer than `max_header_bytes`.
absl::StatusOr<size_t> DecodeStreamPrefix(const char prefix[kStreamPrefixBytes],
                                          size_t max_header_bytes);

// Writes every byte of `parts` (modified as it goes) to the non-blocking
// socket `fd`. DEADLINE_EXCEEDED when `deadline` passes first, UNAVAILABLE
// when the connection fails or was shut down.
absl::Status WriteFully(int fd, struct iovec* parts, size_t count, absl::Time deadline);
// Reads exactly `bytes` bytes into `data`. UNAVAILABLE when the peer
// closes (also before the first byte) or the connection fails,
// DEADLINE_EXCEEDED when `deadline` passes first.
absl::Status ReadFully(int fd, void* data, size_t bytes, absl::Time deadline);
// ReadFully, setting `*crc` to the CRC32C of the bytes read, taken after
// each recv while those bytes are in cache. On an error `*crc` covers only
// what arrived.
absl::Status ReadFullyWithCrc32c(int fd, void* data, size_t bytes, absl::Time deadline,
                                 uint32_t* crc);

// Reads one message's prefix and header; `max_header_bytes` bounds what
// the peer may announce. The payload (frame->payload_bytes) is still
// unread.
absl::Status ReadHeader(int fd, size_t max_header_bytes, absl::Time deadline, Frame* frame,
                        std::string* header);

// A connected non-blocking TCP socket to "host:port" (IPv4 or IPv6 names),
// with TCP_NODELAY, by `deadline`; UNAVAILABLE naming the address when it
// cannot be reached. Every address the name resolves to is tried in turn.
absl::StatusOr<int> ConnectStream(const std::string& address, absl::Time deadline);

// One resolved socket address.
struct StreamAddress {
  struct sockaddr_storage address = {};
  socklen_t length = 0;
};
// ConnectStream's part after resolution: the first of `addresses` that
// accepts, each given an equal share of the time left before `deadline`
// (so one that never answers leaves time for the next). `name` is for
// errors.
absl::StatusOr<int> ConnectToAny(const std::vector<StreamAddress>& addresses,
                                 const std::string& name, absl::Time deadline);
// Socket options both ends use: no Nagle delay (a small request or status
// goes out at once). Buffer sizes stay the kernel's, which tunes them per
// connection.
void TuneStreamSocket(int fd);

// The congestion control both ends of the data path set on their sockets
// by default: cubic where the process may choose it, else reno. The
// kernel's default on many hosts is BBR, which takes a link that passes a
// short burst faster than its rate (a token bucket) for a much faster one;
// the parameter server's short flows from many hosts into one then lose
// about a third of their bytes (docs/performance.md, "Congestion control").
inline constexpr absl::string_view kDefaultCongestionControl = "cubic,reno";
// Sets the first of `preference` (names separated by commas, as in
// /proc/sys/net/ipv4/tcp_available_congestion_control) that the kernel
// lets this process choose on `fd` (TCP_CONGESTION); "" leaves the
// kernel's default. Returns the one set, or "" when none was.
std::string SetCongestionControl(int fd, absl::string_view preference);

}  // namespace harrier::transport

#endif  // HARRIER_COMMON_TRANSPORT_STREAM_H_
