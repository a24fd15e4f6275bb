#ifndef HARRIER_COMMON_TRANSPORT_CONGESTION_H_
#define HARRIER_COMMON_TRANSPORT_CONGESTION_H_

#include "absl/strings/string_view.h"

namespace harrier::transport {

// The congestion control both ends of the data path set on their sockets
// by default: cubic where the process may choose it, else reno. The
// kernel's default on many hosts is BBR, which takes a link that passes a
// short burst faster than its rate (a token bucket) for a much faster one;
// the parameter server's short flows from many hosts into one then lose
// about a third of their bytes (docs/performance.md, "Congestion control").
// Its own header, so that the client's options take it without the stream.
inline constexpr absl::string_view kDefaultCongestionControl = "cubic,reno";

}  // namespace harrier::transport

#endif  // HARRIER_COMMON_TRANSPORT_CONGESTION_H_
