// Raw loopback TCP, measured in the same run as gRPC so every transport
// figure comes with its physical reference (these machines are noisy).

#ifndef HARRIER_BENCH_TCP_BASELINE_H_
#define HARRIER_BENCH_TCP_BASELINE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace harrier::bench {

enum class TcpPattern {
  // The sender writes a length-prefixed message, the receiver reads all of
  // it into memory and answers with a one-byte ack; the sender waits for
  // the ack before the next message. The request/response shape of a push
  // (or, mirrored, a pull). For large messages the ack is noise and this is
  // streaming throughput.
  kOneWay,
  // As kOneWay, but the receiver echoes the whole message back once it has
  // read it: the shape of a push-pull.
  kEcho,
};

struct TcpPoint {
  TcpPattern pattern = TcpPattern::kOneWay;
  size_t message_bytes = 4096;
  // Independent connections, each with a sender thread and a receiver
  // thread, all timed together.
  int connections = 1;
  int iterations = 100;  // timed messages per connection
  int warmup = 2;        // untimed messages per connection first
};

struct TcpResult {
  double seconds = 0;           // wall time of the timed region
  uint64_t payload_bytes = 0;   // message bytes moved, echoes included
  std::vector<double> round_trip_us;  // one per timed message
  double gbps() const { return seconds > 0 ? payload_bytes / seconds / 1e9 : 0; }
};

// Runs `point` over 127.0.0.1 with TCP_NODELAY on both ends. Every socket
// call has a 30 s timeout, so a stuck peer yields DEADLINE_EXCEEDED rather
// than a hang. Thread-safe (each call has its own sockets and threads).
absl::StatusOr<TcpResult> MeasureLoopbackTcp(const TcpPoint& point);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_TCP_BASELINE_H_
