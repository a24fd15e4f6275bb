#ifndef HARRIER_SERVER_SHARD_STORE_H_
#define HARRIER_SERVER_SHARD_STORE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cancellation.h"
#include "common/codec/codec.h"
#include "common/partitioner.h"
#include "proto/harrier.pb.h"
#include "server/checkpoint.h"
#include "server/consistency.h"
#include "server/optimizer.h"

namespace harrier {

struct ShardStoreOptions {
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  SyncPolicy sync;
  // SSP/ASP: divide each push's step by the staleness it arrives with
  // (Zhang et al. 2016), i.e. by max(1, fastest rank's clock - push clock).
  bool staleness_aware_lr = false;
};

// What a shard does when a worker stops heartbeating.
enum class WorkerLossPolicy {
  kFail,      // every later call fails with ABORTED naming the lost rank
  kContinue,  // the rank leaves: dropped from min_clock and from averages
};

// Counters a shard exposes (monotonic; read without locks).
struct ShardCounters {
  // Staleness of answered pulls: pull clock minus min clock.
  std::atomic<int64_t> max_staleness{0};
  std::atomic<uint64_t> pushes{0};
  std::atomic<uint64_t> pulls{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> optimizer_steps{0};
};

// The parameters one shard owns, keyed by (tensor key, chunk). Applies
// pushes and answers pulls as its ConsistencyController says. Every public
// method is thread-safe; each chunk has its own lock, so pushes and pulls of
// different chunks run in parallel. Bad input is refused before anything
// changes: a refused call leaves every chunk as it was.
class ShardStore {
 public:
  using Clock = std::chrono::steady_clock;

  ShardStore(ShardStoreOptions options, std::unique_ptr<Optimizer> optimizer);
  ~ShardStore();

  const ShardStoreOptions& options() const { return options_; }
  const ConsistencyController& controller() const { return controller_; }
  const ShardCounters& counters() const { return counters_; }

  // Creates the chunk with the given values (returns true), or checks the
  // request against the existing chunk (returns false, values kept).
  absl::StatusOr<bool> Init(const proto::InitRequest& request);

  // One worker's gradients for one clock, any number of chunks. All chunks
  // are validated first; then all are applied. INVALID_ARGUMENT for a
  // malformed chunk, NOT_FOUND for an unknown key, FAILED_PRECONDITION for a
  // clock other than the rank's next one.
  absl::Status Push(const std::vector<proto::TensorChunk>& chunks);

  // A pushed chunk whose payload is not in the message: `header`'s payload
  // field is ignored and `payload` is used instead. Both are borrowed for the
  // call only. `payload.data()` must be aligned for float (dense payloads
  // are read in place as the gradient).
  struct PushChunkView {
    const proto::TensorChunk* header = nullptr;
    absl::string_view payload;
  };
  // As Push above (same validation, same errors), without copying payloads.
  absl::Status Push(const std::vector<PushChunkView>& chunks);

  // Writes the chunk's parameters into `out` once a pull at `clock` may be
  // answered. Waits until `deadline` or until `cancellation` (may be null) is
  // cancelled, whichever comes first; either wakes the wait at once (no
  // polling). DEADLINE_EXCEEDED names the clock waited for and the slowest
  // worker; CANCELLED says the client cancelled.
  absl::Status Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                    Clock::time_point deadline, Cancellation* cancellation,
                    proto::TensorChunk* out);

  // The pull half of a push-pull: the pushed chunk at clock + 1 (returned
  // in `clock`), with the pull codec the push asked for. Every transport's
  // PushPull uses it, so they answer alike.
  static proto::ChunkRef PushPullRef(const proto::TensorChunk& pushed, int64_t* clock);

  // Returns where the store writes `bytes` payload bytes; the memory is the
  // caller's and must stay valid until Pull returns.
  using PayloadAllocator = std::function<char*(size_t bytes)>;
  // As Pull above, but the payload goes to memory from `allocate` (called
  // once, with the chunk's lock held) rather than into `out`, whose payload
  // field is left untouched; `out->checksum()` covers the written bytes.
  absl::Status Pull(uint32_t rank, int64_t clock, const proto::ChunkRef& ref,
                    Clock::time_point deadline, Cancellation* cancellation,
                    proto::TensorChunk* out, const PayloadAllocator& allocate);

  // The rank pushed its last clock (its total is `clock`): pulls and BSP
  // rounds stop waiting for it. Idempotent.
  absl::Status Leave(uint32_t rank, int64_t clock);

  // Records that the rank is alive. Pushes count as heartbeats too.
  absl::Status Heartbeat(uint32_t rank);

  // Applies `policy` to every rank that heartbeated once but not within
  // `timeout`. Called periodically by the server's liveness monitor.
  void CheckLiveness(std::chrono::milliseconds timeout, WorkerLossPolicy policy);

  // Number of ranks that have not left.
  int active_workers() const;

  // Wakes every waiting pull, which then fails with UNAVAILABLE; later calls
  // fail the same way.
  void Close();

  // A consistent copy of every chunk for a checkpoint: values, optimizer
  // state and, per rank, the iterations applied. Pushes buffered in an
  // incomplete BSP round are not included; their ranks' clocks are rolled
  // back to that round, so a restored shard simply waits for it again.
  ShardCheckpoint Export() const;

  // Loads a checkpoint into an empty store (before serving). Each rank's
  // first push afterwards may be for a later clock than the checkpoint's
  // (the worker ran on while the shard was down): the shard re-bases that
  // rank's clock once instead of refusing the push.
  absl::Status Import(const ShardCheckpoint& checkpoint);

  // Pulls currently waiting for the consistency model (a queue depth).
  int blocked_pulls() const { return blocked_pulls_; }

  // Test and checkpoint access: a copy of a chunk's parameters.
  absl::StatusOr<std::vector<float>> Snapshot(const std::string& key, uint32_t chunk) const;

 private:
  struct PendingRound {
    std::vector<float> sum;
    std::vector<bool> from_rank;
    int count = 0;
    std::string codec_params;           // every push of a round uses one codec
    std::unique_ptr<Aggregator> vote;   // sign codecs: majority vote, never an average
  };
  struct Slot {
    std::mutex mutex;
    std::condition_variable changed;
    std::string key;
    uint32_t chunk = 0;
    std::vector<uint64_t> shape;
    std::vector<float> values;
    OptimizerState optimizer_state;
    std::vector<int64_t> pushed;  // iterations pushed, per rank
    std::map<int64_t, PendingRound> pending;  // BSP/local rounds not yet complete
    // Compressed pulls: per rank, the parameters as that rank has rebuilt
    // them from the replies so far (empty until its first compressed pull).
    std::vector<std::vector<float>> pulled_views;
  };

  // A push chunk that passed validation, ready to apply.
  struct ValidatedChunk {
    Slot* slot = nullptr;
    const float* gradient = nullptr;  // dense: into the payload or `decoded`
    std::vector<float> decoded;       // compressed pushes, decoded
    bool majority_vote = false;
  };

  static std::string SlotName(const std::string& key, uint32_t chunk);
  Slot* FindSlot(const std::string& key, uint32_t chunk) const;
  absl::Status CheckOwnership(const std::string& key, uint32_t chunk) const;
  absl::Status ValidateChunk(const proto::TensorChunk& chunk, absl::string_view payload,
                             ValidatedChunk* out) const;
  // Caller holds slot->mutex.
  void ApplyLocked(Slot& slot, const proto::TensorChunk& chunk, absl::string_view payload,
                   const ValidatedChunk& valid);
  void StepLocked(Slot& slot, const float* gradient, float scale);
  void CompleteRoundsLocked(Slot& slot);
  bool RoundCompleteLocked(const Slot& slot, int64_t clock, const PendingRound& round) const;
  int64_t MinClockLocked(const Slot& slot, int* slowest_rank) const;
  // Encodes the difference between the slot's values and the rank's view
  // into `payload` and advances the view; sets the reply's codec fields.
  absl::Status CompressPullLocked(Slot& slot, uint32_t rank, const std::string& codec_params,
                                  proto::TensorChunk* out, std::string* payload);
  // OK, or the status every call gets once a lost worker failed the job.
  absl::Status FailureStatus() const;
  void ForEachSlot(const std::function<void(Slot&)>& visit);

  const ShardStoreOptions options_;
  const ConsistencyController controller_;
  const std::unique_ptr<Optimizer> optimizer_;
  const HashPartitioner partitioner_;
  ShardCounters counters_;
  std::atomic<bool> closed_{false};
  std::atomic<int> blocked_pulls_{0};
  // Set by Import(): the rank's next push may re-base its clock once.
  const std::unique_ptr<std::atomic<bool>[]> may_rebase_;

  // Membership: which ranks left, when each was last heard from.
  const std::unique_ptr<std::atomic<bool>[]> departed_;
  std::atomic<bool> failed_{false};
  mutable std::mutex membership_mutex_;
  absl::Status failure_;  // guarded by membership_mutex_
  std::vector<Clock::time_point> last_seen_;  // guarded by membership_mutex_
  std::vector<bool> seen_;  // guarded by membership_mutex_

  mutable std::shared_mutex slots_mutex_;
  std::unordered_map<std::string, std::unique_ptr<Slot>> slots_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_STORE_H_
