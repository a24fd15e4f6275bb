#ifndef HARRIER_WORKER_SHARD_CALLS_H_
#define HARRIER_WORKER_SHARD_CALLS_H_

// One operation's work on one shard group (the chunks of one tensor on one
// shard): build the chunks (identity fields here, codec fields by the
// ChunkCodec), make the transport call with the engine's retries and the
// rpc_timeout deadline, and read the reply chunks into the caller's tensor.
// Errors carry the shard's name.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/chunk_codec.h"
#include "worker/operation_engine.h"
#include "worker/tensor_table.h"
#include "worker/transport/transport.h"

namespace harrier {

struct ShardCallsConfig {
  std::string job;
  uint32_t rank = 0;
  // The rank's session from Register: every pushed chunk and pull carries it.
  proto::Session session;
  absl::Duration rpc_timeout = absl::Seconds(60);  // each transport call's deadline
  // Names shard i in errors ("shard i (host:port)").
  std::function<std::string(int shard)> shard_name;
};

// Thread-safe; the transports, codec and engine must outlive it. Buffers
// are the caller's: gradients are read (dense chunks are sent from them),
// outputs written only by verified reply chunks.
class ShardCalls {
 public:
  ShardCalls(ShardCallsConfig config, std::vector<ShardTransport*> transports, ChunkCodec& codec,
             OperationEngine& engine);

  // Each starts the group's call (with retries) and returns; `done` ends
  // it, on a transport or timer thread. `group` and the buffers must stay
  // valid until then.
  using Done = OperationEngine::TaskDone;
  void Push(Operation& op, const std::string& name, const ShardGroup& group,
            const float* gradient, int64_t clock, Done done);
  void Pull(Operation& op, const std::string& name, const ShardGroup& group, float* out,
            int64_t clock, Done done);
  void PushPull(Operation& op, const std::string& name, const ShardGroup& group,
                const float* gradient, float* out, int64_t clock, Done done);

  // Payload bytes sent and received, and the min clock the latest reply
  // carried.
  uint64_t bytes_pushed() const { return bytes_pushed_; }
  uint64_t bytes_pulled() const { return bytes_pulled_; }
  // The same per shard (dense chunks), in shard order.
  std::vector<uint64_t> bytes_pushed_per_shard() const;
  std::vector<uint64_t> bytes_pulled_per_shard() const;
  // Dense device chunks copied to host memory before a send.
  uint64_t bytes_staged() const { return codec_.staged_bytes(); }
  // Pull replies received straight into device memory (landings).
  uint64_t bytes_landed() const { return codec_.landed_bytes(); }
  uint64_t bytes_landed_in_staging() const { return codec_.landed_in_staging_bytes(); }
  int64_t last_min_clock() const { return last_min_clock_; }

  // One past the last clock `shard` acknowledged for each chunk pushed
  // there, for that shard's heartbeats (HeartbeatRequest.pushed).
  void AddAcknowledgedClocks(int shard, proto::HeartbeatRequest* request) const;

 private:
  // Dense chunks borrow `gradient` (a device tensor's only when the
  // transport sends from device memory): it must outlive the transport call.
  absl::StatusOr<std::vector<OutgoingChunk>> BuildChunks(const std::string& name,
                                                         const ShardGroup& group,
                                                         const float* gradient, int64_t clock);
  // Retries, then the shard's name in front of any error.
  void OnShard(Operation& op, int shard, OperationEngine::Attempt attempt, Done done);
  // Runs a pull-like call with retries, reading every reply chunk into
  // `out`; DATA_LOSS if a chunk did not arrive. `call` starts one try with
  // a landing chooser (device tensors over a transport that receives into
  // device memory; host staging buffers) or null. `pushed_from`: a
  // push-pull's gradient buffer, null for a pull.
  using ReceivingCall = std::function<void(const ReplyLandingChooser* choose,
                                           const LandedChunkSink& sink, CallDone done)>;
  void ReceiveInto(Operation& op, const std::string& name, const ShardGroup& group, float* out,
                   const float* pushed_from, ReceivingCall call, Done done);
  absl::Time Deadline() const { return absl::Now() + config_.rpc_timeout; }
  // The group's push of `clock` was acknowledged.
  void Acknowledged(const std::string& name, const ShardGroup& group, int64_t clock);

  const ShardCallsConfig config_;
  const std::vector<ShardTransport*> transports_;
  ChunkCodec& codec_;
  OperationEngine& engine_;
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  // Per shard, as the two above.
  std::unique_ptr<std::atomic<uint64_t>[]> shard_bytes_pushed_;
  std::unique_ptr<std::atomic<uint64_t>[]> shard_bytes_pulled_;
  std::atomic<int64_t> last_min_clock_{0};
  mutable absl::Mutex acknowledged_mutex_;
  // Per shard: (key, chunk) -> next clock.
  std::vector<std::map<std::pair<std::string, uint32_t>, int64_t>> acknowledged_
      ABSL_GUARDED_BY(acknowledged_mutex_);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_SHARD_CALLS_H_
