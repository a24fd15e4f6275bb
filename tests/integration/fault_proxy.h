#ifndef HARRIER_TESTS_INTEGRATION_FAULT_PROXY_H_
#define HARRIER_TESTS_INTEGRATION_FAULT_PROXY_H_

// A test-only TCP proxy between clients and one shard on 127.0.0.1 that
// loses replies and cuts connections in the middle of calls, for the
// exactly-once tests (tests/integration/exactly_once_test.cc). It forwards
// bytes both ways, one thread per connection, and on each read decides (a
// seeded PRNG) whether to fault:
//   - a read from the shard (reply bytes: the request was delivered whole
//     and acted on) is dropped and the connection cut: the reply is lost;
//   - a read from the client is forwarded up to a random point and the
//     connection cut: the request is cut short;
//   - with DropReplies on, everything the shard sends is read and dropped
//     (the connection stays up): calls hang until the shard side closes;
//   - with FlipReplyByte set, one byte of each connection's reply stream
//     is damaged (not decided by the PRNG).
// The client sees UNAVAILABLE and retries on a new connection. Works for
// any protocol on TCP (gRPC's HTTP/2 here). Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace harrier::testing {

class FaultProxy {
 public:
  // Listens on an ephemeral port of 127.0.0.1 and forwards every connection
  // to 127.0.0.1:`target_port` (connected when the client connects: the
  // target may be down, the client then sees the connection close).
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(int target_port, uint64_t seed);
  // Closes every connection and joins every thread.
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  int port() const { return port_; }
  std::string address() const;

  // Per read, the probability of a fault (see the file comment); 0: none.
  void SetCutProbability(double reply, double request);
  void SetDropReplies(bool drop);
  // While set, the byte at `offset` of what the shard sends on a connection
  // (counted from the connection's start) is flipped, its lowest bit, on
  // the way: a reply damaged on the wire. Negative: none.
  void SetFlipReplyByte(int64_t offset);

  // Faults made so far.
  uint64_t reply_cuts() const { return reply_cuts_; }
  uint64_t request_cuts() const { return request_cuts_; }
  uint64_t connections() const { return connections_; }
  uint64_t reply_flips() const { return reply_flips_; }

 private:
  FaultProxy() = default;
  void AcceptLoop();
  void Pump(int client, int upstream, uint64_t seed);

  int listen_fd_ = -1;
  int port_ = 0;
  int target_port_ = 0;
  uint64_t seed_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<double> reply_cut_{0.0};
  std::atomic<double> request_cut_{0.0};
  std::atomic<bool> drop_replies_{false};
  std::atomic<int64_t> flip_reply_byte_{-1};
  std::atomic<uint64_t> reply_flips_{0};
  std::atomic<uint64_t> reply_cuts_{0};
  std::atomic<uint64_t> request_cuts_{0};
  std::atomic<uint64_t> connections_{0};
  std::thread acceptor_;
  absl::Mutex mutex_;
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier::testing

#endif  // HARRIER_TESTS_INTEGRATION_FAULT_PROXY_H_
