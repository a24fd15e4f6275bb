#ifndef HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "proto/harrier.grpc.pb.h"
#include "worker/transport/grpc/client_call_queue.h"
#include "worker/transport/timer_thread.h"
#include "worker/transport/transport.h"

namespace harrier {

// The portable data path: ParameterService streams over one channel, or
// for large calls several.
//
// Messages are ByteBuffers, not generated types, so payloads are neither
// copied into protos nor serialised: each pushed chunk is a small header
// slice plus a slice over the payload's own bytes (common/chunk_wire.h), and
// reply payloads are handed to the sink as views of the received slices.
// The bytes on the wire are ordinary TensorChunk messages, so any typed
// ParameterService client or server interoperates.
class GrpcShardTransport : public ShardTransport {
 public:
  // Calls whose payloads add up to less than this stay on the first
  // channel even when there are more (see the constructor).
  static constexpr size_t kDefaultSpreadMinBytes = size_t{8} << 20;

  explicit GrpcShardTransport(std::shared_ptr<grpc::Channel> channel);
  // Over several channels to one shard, each its own TCP connection (the
  // channels must differ in their arguments, or gRPC shares one
  // subchannel). A call of several chunks and at least `spread_min_bytes`
  // payload bytes is split into one call per channel, run in parallel:
  // each part is all-or-nothing on the shard, the whole is not (a refused
  // part leaves the parts that were applied; a retry of the whole is then
  // acknowledged as a duplicate for those, see ShardStore::Push).
  // `timer` (null: one of its own) keeps the calls' slice-release graces;
  // `calls` (null: one of its own) is the completion queue whose thread
  // runs the calls' reactions. A client's transports share both.
  //
  // `pull_channel` (null: none) is a connection for pulls alone. A pull
  // then never queues behind push data on its way up, and a push's
  // acknowledgement never behind pull replies on its way down, so a
  // step's pushes and pulls keep both directions of a link busy at once
  // (on a shared connection each direction's small messages wait behind
  // the other's bulk, and a 1 Gbit/s link moved about 0.85 of its rate
  // each way instead of 1). A pull split over channels uses the pull
  // channel in place of the first. Pushes and push-pulls stay on
  // `channels`.
  GrpcShardTransport(std::vector<std::shared_ptr<grpc::Channel>> channels,
                     size_t spread_min_bytes = kDefaultSpreadMinBytes,
                     std::shared_ptr<TimerThread> timer = nullptr,
                     std::shared_ptr<grpc::Channel> pull_channel = nullptr,
                     std::shared_ptr<ClientCallQueue> calls = nullptr);
  ~GrpcShardTransport() override;

  // Host memory only: a chunk in device memory is refused with
  // FAILED_PRECONDITION before anything is sent (RefuseDeviceChunks).
  // Replies are host views (a landing chooser is not used).
  //
  // Each call is a stream of gRPC's asynchronous API on the calls' queue:
  // its sink and its done run on that queue's thread (with several
  // channels, the parts' sinks one call at a time); a call that ends
  // before its Start returns (cancelled, or answered, already) completes on the
  // calling thread. The first one-channel call of a
  // CallerWaitsScope runs on the calling thread instead (gRPC's synchronous
  // API) and completes before Start returns. A call completes once gRPC has released
  // every borrowed payload, so the caller may reuse its buffers as soon as
  // done runs; the wait for the release is bounded (kSliceReleaseGrace
  // after the stream ended, on the transport's timer thread), see
  // grpc_transport.cc.
  void StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                 CallCanceller& canceller, CallDone done) override;
  void StartPull(const proto::PullRequest& request, const ReplyLandingChooser* choose,
                 const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                 CallDone done) override;
  void StartPushPull(const std::vector<OutgoingChunk>& chunks, const ReplyLandingChooser* choose,
                     const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                     CallDone done) override;

  size_t num_channels() const { return links_.size(); }
  bool has_pull_channel() const { return pull_link_ != nullptr; }

 private:
  struct Link;  // one channel and its methods

  // How a call of `count` chunks of `bytes` payload bytes is split: the
  // number of channels it uses (1: not split).
  size_t PartsFor(size_t count, uint64_t bytes) const;
  // The link that carries part `part` of a pull.
  const Link& PullLink(size_t part) const;

  std::vector<std::unique_ptr<Link>> links_;
  std::unique_ptr<Link> pull_link_;  // null: pulls share links_
  const size_t spread_min_bytes_;
  // Slice-release graces.
  std::shared_ptr<TimerThread> timer_;
  // Last: destroyed first, it ends the calls still open (cancelled) while
  // the channels are still here.
  std::shared_ptr<ClientCallQueue> calls_;
};

// What the process's gRPC transports did with the payloads of pushed
// chunks of at least 32 KiB (smaller ones travel inside their header's
// slice): copied into a send buffer of the transport's own, or lent to
// gRPC as they are (a caller's staging, a compressed or device-staged
// payload, or any payload while the send buffers are all in use). Totals
// since the process started; tests read the difference across a call.
struct GrpcSendCounters {
  int64_t copied_bytes = 0;
  int64_t lent_bytes = 0;
};
GrpcSendCounters GrpcSendCountersNow();

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
