#ifndef HARRIER_WORKER_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_TCP_TCP_TRANSPORT_H_

// A shard's data path over plain TCP: framing.h's messages on stream
// sockets (common/transport/stream.h), for hosts where UCX is absent or
// unwanted and gRPC's copies cost too much. Payloads go out from the
// chunks' own bytes (sendmsg with an iovec) and replies come in straight
// into the caller's host landings (recv into them), so neither direction
// copies a payload in user space.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/framing.h"
#include "common/transport/stream.h"
#include "worker/transport/timer_thread.h"
#include "worker/transport/transport.h"

namespace harrier {

class TcpConnection;

// Fetches a shard's "host:port" data address and a fresh hello secret,
// giving up by `deadline`. A secret serves one hello, so the transport asks
// again for every connection it opens, reconnects included.
using TcpAddressProvider =
    std::function<absl::StatusOr<transport::PeerAddress>(absl::Time deadline)>;

// One shard's data path over two TCP connections: one carries pushes, the
// other pulls and push-pulls, so a push's bytes never queue behind a pull's
// reply and both directions of the link carry bytes at once.
//
// Threads. Each connection has a writer thread, which writes whole calls
// one after another from a queue, and a reader thread, which reads replies
// and dispatches them by request id (replies of different calls may
// interleave; one for a call that already ended is read and dropped). A
// Start method never waits on the network, except to reconnect (below): it
// queues the call, registers it with the canceller, arms its deadline on
// the shared timer and returns. The chooser, the sink and done run on the
// connection's reader thread (a call answered), its writer thread (a call
// that ended while it was being written), the timer thread (expired or
// cancelled), or the starting thread (refused, or its connection failed
// before it was queued).
//
// Completion vs. caller memory: a call's done never runs while the writer
// still reads its payloads or the reader still receives into one of its
// landings. A call that ends (deadline, cancel, failed connection) before
// the writer took it is dropped from the queue and completes at once; one
// the writer is writing, or whose landing the reader is filling, completes
// when that write or read returns. Such a write or read is bounded: by the
// call's deadline plus a grace of 2 s, and, once the call has ended, by the
// same grace, after which the connection is shut down (which makes the
// write or read return; a stream cut mid-message cannot be resumed).
// Cancelling or expiring a call that was (partly) sent also sends a
// best-effort kCancel. All of a connection's bookkeeping is under one mutex.
//
// Failures. A connection that fails (peer closed, read or write error,
// malformed reply: a header over kMaxStreamHeaderBytes, a payload over
// 64 MiB) fails every call on it with UNAVAILABLE naming the shard. The
// next call on that connection reconnects it on the starting thread (the
// other connection is left alone): it asks the address provider for an
// address and secret and says hello, bounded by its deadline and at most
// 5 s; if that fails, the call completes UNAVAILABLE at once and the next
// call tries again. One call reconnects a connection at a time; calls
// that arrive meanwhile wait for it (until their deadline).
//
// Host memory only: chunks in device memory are refused with
// FAILED_PRECONDITION before anything is sent, and kDevice landings are
// not used (the sink gets a host view of a transport buffer). Thread-safe.
class TcpShardTransport final : public ShardTransport {
 public:
  // Opens the push and the pull connection (each asking `address_provider`
  // for an address and a fresh secret), says hello on both, by `deadline`.
  // `peer_name` names the shard in error messages. `timer` runs deadlines
  // and is shared by a client's transports; it must outlive the calls'
  // completions (holding it here keeps it alive while the transport is).
  // A shard that refuses the hello fails this with its status (e.g.
  // PERMISSION_DENIED for a wrong secret); a shard that cannot be reached
  // or answers anything else, with UNAVAILABLE. `congestion_control`: the
  // preference list set on both connections (transport::
  // SetCongestionControl; "" keeps the kernel's default).
  static absl::StatusOr<std::unique_ptr<TcpShardTransport>> Connect(
      const std::string& peer_name, TcpAddressProvider address_provider,
      std::shared_ptr<TimerThread> timer, absl::Time deadline,
      std::string congestion_control = std::string(transport::kDefaultCongestionControl));

  // Shuts down both connections, joins their threads and completes every
  // call still open with CANCELLED (or UNAVAILABLE, for calls whose
  // connection had already failed), each exactly once, before returning.
  // Must not run from a call's done.
  ~TcpShardTransport() override;

  void StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                 CallCanceller& canceller, CallDone done) override;
  // Reply chunks reach the sink in order (index 0, 1, ...) once the shard's
  // status for the call has arrived, then done runs with that status (or
  // the sink's error).
  void StartPull(const proto::PullRequest& request, const ReplyLandingChooser* choose,
                 const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                 CallDone done) override;
  void StartPushPull(const std::vector<OutgoingChunk>& chunks, const ReplyLandingChooser* choose,
                     const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                     CallDone done) override;

 private:
  enum Lane { kPushLane = 0, kPullLane = 1 };
  struct Slot {
    absl::Mutex mutex;
    std::shared_ptr<TcpConnection> connection ABSL_GUARDED_BY(mutex);
    bool reconnecting ABSL_GUARDED_BY(mutex) = false;
    absl::Status last_reconnect_failure ABSL_GUARDED_BY(mutex);
  };

  TcpShardTransport(std::string peer_name, TcpAddressProvider address_provider,
                    std::shared_ptr<TimerThread> timer, std::string congestion_control);

  // Asks for an address, connects and says hello, by `deadline`.
  absl::StatusOr<std::shared_ptr<TcpConnection>> Open(Lane lane, absl::Time deadline);
  // The lane's connection, reconnected first when it has failed.
  absl::StatusOr<std::shared_ptr<TcpConnection>> CurrentConnection(Lane lane, absl::Time deadline);
  void SendChunks(const std::vector<OutgoingChunk>& chunks, bool then_pull,
                  const ReplyLandingChooser* choose, const LandedChunkSink* sink,
                  absl::Time deadline, CallCanceller& canceller, CallDone done);

  // First: destroyed last, after the connections.
  const std::shared_ptr<TimerThread> timer_;
  const std::string peer_name_;
  const TcpAddressProvider address_provider_;
  const std::string congestion_control_;
  std::atomic<uint64_t> next_request_id_{1};
  Slot slots_[2];
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_TCP_TCP_TRANSPORT_H_
