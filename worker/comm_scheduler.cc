#include "worker/comm_scheduler.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/partitioner.h"
#include "common/thread_pool.h"
#include "spdlog/spdlog.h"

namespace harrier {

absl::StatusOr<CommSchedulerOptions> ParseTechniques(absl::string_view techniques,
                                                     size_t fusion_bytes, size_t partition_bytes,
                                                     size_t max_inflight_bytes) {
  bool wfbp = false, fusion = false, partition = false, priority = false, credits = false;
  if (techniques.empty()) {
    return absl::InvalidArgumentError("--techniques is empty: expected plain, wfbp, fusion, "
                                      "priority, partition, credits or all, joined by '+'");
  }
  for (absl::string_view part : absl::StrSplit(techniques, '+')) {
    if (part == "plain") {
    } else if (part == "wfbp") {
      wfbp = true;
    } else if (part == "fusion") {
      wfbp = fusion = true;
    } else if (part == "partition") {
      partition = true;
    } else if (part == "credits") {
      credits = true;
    } else if (part == "priority") {
      wfbp = priority = partition = credits = true;
    } else if (part == "all") {
      wfbp = fusion = partition = priority = credits = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown technique '", part, "' in --techniques=", techniques,
          ": expected plain, wfbp, fusion, priority, partition, credits or all, joined by '+' "
          "(none, without a scheduler, is the worker's own choice)"));
    }
  }
  CommSchedulerOptions options;
  options.wait_free_backprop = wfbp;
  options.priority = priority;
  if (fusion) options.fusion_bytes = fusion_bytes > 0 ? fusion_bytes : kDefaultFusionBytes;
  if (partition) {
    options.partition_bytes = partition_bytes > 0 ? partition_bytes : kDefaultPartitionBytes;
  }
  if (credits) {
    options.round_window_bytes = kDefaultRoundWindowBytes;
    if (max_inflight_bytes > 0) {
      options.max_inflight_bytes = max_inflight_bytes;
    } else {
      options.max_inflight_bytes = kDefaultMaxInflightBytes;
      options.inflight_pieces_per_shard = kDefaultInflightPiecesPerShard;
    }
  }
  return options;
}

size_t CreditCap(const CommSchedulerOptions& options, int num_shards) {
  if (options.max_inflight_bytes == 0) return 0;
  const size_t piece =
      options.partition_bytes > 0 ? options.partition_bytes : kDefaultPartitionBytes;
  const size_t per_shards =
      options.inflight_pieces_per_shard * piece * static_cast<size_t>(std::max(num_shards, 1));
  return std::max(options.max_inflight_bytes, per_shards);
}

namespace {

// How long the round window may hold pushes while no round comes back
// before it turns itself off (CommSchedulerOptions::round_window_bytes), at
// most a quarter of the scheduler's wait_timeout. Long: a worker ahead also
// waits that way for workers still far behind (at the first step, VGG-16's
// workers began backward up to 4 s apart while their initial parameters
// came in over 2 shards), and turning the window off costs it for the rest
// of the job; a job whose workers push in different orders loses this
// once.
constexpr absl::Duration kRoundWindowStall = absl::Seconds(30);

// A range of the wire tensor's client chunks: one call.
struct Piece {
  uint32_t first_chunk = 0;
  uint32_t num_chunks = 0;
  int shard = 0;  // of its first chunk
  size_t bytes = 0;
};

// What goes on the wire as one Client tensor: a model tensor, or a bucket
// of consecutive small ones.
struct Wire {
  std::string name;
  std::vector<int> members;  // model tensors, ascending; laid out in this order
  bool fused = false;
  size_t elements = 0;
  int front = 0;             // members' smallest index: the wire's priority
  std::vector<Piece> pieces;
  // Fused only: gradients are copied in at GradientReady (so the caller's
  // buffers are free at once), pulls land here and are copied out to the
  // members at WaitParameters.
  std::vector<float> grad_staging;
  std::vector<float> param_staging;
  const float* gradient = nullptr;  // what pushes read
  float* parameters = nullptr;      // where pulls write

  // Per step. A push round is queued once every member's gradient of the
  // step is in; the pull of piece p for step s + 1 is queued when its push
  // of step s is acknowledged, so a round of pulls starts with the first.
  int64_t ready_step = -1;
  size_t ready_members = 0;
  int64_t push_step = -1;      // the latest round queued
  int pushes_remaining = 0;    // of that round
  int64_t pull_step = -1;      // the latest round of pulls begun
  int pulls_remaining = 0;     // of that round
};

struct Member {
  int wire = 0;
  size_t offset = 0;           // in the wire's elements
  size_t elements = 0;
  absl::Span<float> parameters;
  int64_t gradient_step = -1;  // the step whose gradient was given last
  int64_t copied_step = -1;    // fused: the step copied out last
};

enum class Kind { kPush, kPull };

struct Call {
  Kind kind = Kind::kPush;
  int wire = 0;
  int piece = 0;
  int64_t step = 0;
  // A pull that brings back the round of this worker's push (its bytes
  // count in the round window until it completes).
  bool returns_push = false;
  // With a timeline only.
  absl::Time queued;
  absl::Time sent;
  int lane = 0;  // the timeline track the call is on
};

// Queue order: under priority (step, front tensor, piece), else the order
// calls became ready; the sequence number breaks ties and keeps FIFO.
// Pushes in a planned order: (step, position in the plan).
using QueueKey = std::tuple<int64_t, int, int, uint64_t>;

}  // namespace

class CommScheduler::Impl {
 public:
  Impl(Client& client, std::vector<ScheduledTensor> tensors, const CommSchedulerOptions& options)
      : client_(client),
        options_(Resolve(options, client.num_shards())),
        tensors_(std::move(tensors)) {}
  ~Impl();

  absl::Status Plan();
  void Start();

  absl::Status WaitParameters(int tensor);
  absl::Status GradientReady(int tensor, absl::Span<const float> gradient);
  absl::Status EndBackward();
  absl::Status Drain();
  absl::Status Refresh();

  const CommSchedulerOptions& options() const { return options_; }
  CommSchedulerStats stats() const {
    absl::MutexLock lock(&mutex_);
    return stats_;
  }
  std::vector<DispatchRecord> log() const {
    absl::MutexLock lock(&mutex_);
    return std::vector<DispatchRecord>(log_.begin(), log_.end());
  }
  size_t queued_pulls() const {
    absl::MutexLock lock(&mutex_);
    return queue_[static_cast<int>(Kind::kPull)].size();
  }

 private:
  // Starts every call that may go now, in queue order: each completes
  // through Client::WhenDone, which hands it to executor_.
  void Dispatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Send(Kind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool Dispatchable(Kind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Turns the round window off when it held pushes for kRoundWindowStall
  // with no round coming back; dispatches what it held.
  void TurnOffStalledWindow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The push order every step from plan_from_step_ on follows: the back
  // of the model in the order of backward, then its front, the last `tail`
  // of the bytes, in forward order.
  void PlanPushOrder(double tail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // measure_forward_order_tail: called when step 1's backward ends and when
  // its last push is acknowledged; the later of the two (each happens once)
  // sends this worker's estimate to the workers' average, whose reply plans
  // the tail.
  void MaybeAgreeTail() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void TailAgreed(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Before a step from plan_from_step_ queues pushes: waits for the
  // agreed tail.
  absl::Status AwaitTail() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Enqueue(Kind kind, int wire, int piece, int64_t step, bool returns_push = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void QueuePushes(int wire) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void BeginPulls(int wire, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Complete(const Call& call, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Timeline only: the completed call on its lane.
  void Record(const Call& call, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Timeline only: a wait of the training loop that began at `start`, for
  // `tensor` (empty: for no one tensor).
  void RecordWait(absl::string_view what, const std::string& tensor, absl::Time start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool Pulled(const Wire& wire, int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return wire.pull_step >= step && wire.pulls_remaining == 0;
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return queue_[0].empty() && queue_[1].empty() && inflight_calls_ == 0;
  }
  // Waits for `ready` (or an error) until the wait_timeout; the error, or
  // DEADLINE_EXCEEDED with `what`.
  template <typename Ready>
  absl::Status AwaitOrFail(const Ready& ready, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void CopyOut(Member& member) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  std::string Describe(const Wire& wire) const;
  // `options` with the credit cap CreditCap gives for `num_shards`.
  static CommSchedulerOptions Resolve(CommSchedulerOptions options, int num_shards) {
    options.max_inflight_bytes = CreditCap(options, num_shards);
    options.inflight_pieces_per_shard = 0;
    return options;
  }

  Client& client_;
  const CommSchedulerOptions options_;
  std::vector<ScheduledTensor> tensors_;
  int64_t base_clock_ = 0;  // the client's clock at step 0
  std::vector<Wire> wires_;  // in backward order (as fusion walks)
  std::vector<int> wires_front_first_;
  std::vector<Member> members_;
  // Calls in flight per kind at most: enough to keep every shard busy, few
  // enough that queued calls stay here, where priority can still reorder
  // them, rather than queue inside the client in FIFO order.
  int max_inflight_per_kind_ = 1;
  // Whether the queues are in priority order (CommSchedulerOptions::
  // priority_across_workers): set by Plan, before the first call is queued.
  bool reorders_ = false;
  // How many pieces a step pushes.
  int pieces_per_step_ = 0;
  // measure_forward_order_tail where a plan applies: the average tensor.
  std::string tail_tensor_;

  mutable absl::Mutex mutex_;
  // The planned push order (PlanPushOrder; 0 pieces: none) of the steps
  // from plan_from_step_ on: each piece's position, by wire and piece.
  int planned_pieces_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<std::vector<int>> planned_position_ ABSL_GUARDED_BY(mutex_);
  int64_t plan_from_step_ ABSL_GUARDED_BY(mutex_) = 0;
  // Measuring the tail: step 1's first gradient, its EndBackward, its
  // pushes acknowledged so far and when the last was; this worker's
  // estimate sent to the average and the average that comes back.
  absl::Time backward_began_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  absl::Time backward_ended_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  int measured_pushes_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Time pushes_ended_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  bool tail_agreed_ ABSL_GUARDED_BY(mutex_) = true;
  float tail_estimate_[1] ABSL_GUARDED_BY(mutex_) = {0};
  float tail_average_[1] ABSL_GUARDED_BY(mutex_) = {0};
  int64_t step_ ABSL_GUARDED_BY(mutex_) = 0;
  std::map<QueueKey, Call> queue_[2] ABSL_GUARDED_BY(mutex_);  // by Kind
  uint64_t sequence_ ABSL_GUARDED_BY(mutex_) = 0;
  // The planned push order: the step and position of the next push.
  int64_t planned_step_ ABSL_GUARDED_BY(mutex_) = 0;
  int planned_next_ ABSL_GUARDED_BY(mutex_) = 0;
  size_t inflight_push_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  // The round window (options_.round_window_bytes where it applies, else
  // 0) and the bytes pushed whose pulls have not completed.
  size_t round_window_ ABSL_GUARDED_BY(mutex_) = 0;
  size_t unreturned_push_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  // Since when the window holds the push queue's head back, and when a
  // round last came back. A window that held pushes for kRoundWindowStall
  // with no round coming back is turned off: workers whose pushes go in
  // different orders (a tensor whose gradient one worker makes late) could
  // otherwise each wait for the others' pushes for good.
  absl::Time window_held_since_ ABSL_GUARDED_BY(mutex_) = absl::InfiniteFuture();
  const absl::Duration window_stall_ = std::min(kRoundWindowStall, options_.wait_timeout / 4);
  absl::Time round_returned_ ABSL_GUARDED_BY(mutex_);
  int inflight_calls_ ABSL_GUARDED_BY(mutex_) = 0;
  int inflight_[2] ABSL_GUARDED_BY(mutex_) = {0, 0};  // by Kind
  absl::Status error_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  CommSchedulerStats stats_ ABSL_GUARDED_BY(mutex_);
  // The latest kLogLimit calls: a long job must not grow it without bound.
  static constexpr size_t kLogLimit = 1 << 16;
  std::deque<DispatchRecord> log_ ABSL_GUARDED_BY(mutex_);
  int loop_track_ = 0;
  int step_track_ = 0;
  absl::Time step_began_ ABSL_GUARDED_BY(mutex_);
  // Last: its threads run completions until it is gone. One thread: a
  // completion only updates the plan and starts the calls it frees.
  ThreadPool executor_{1, ThreadPool::kUnbounded, "the comm scheduler's executor"};
};

std::string CommScheduler::Impl::Describe(const Wire& wire) const {
  if (!wire.fused) return absl::StrCat("'", wire.name, "'");
  return absl::StrCat("'", wire.name, "' (tensors '", tensors_[wire.members.front()].name,
                      "' .. '", tensors_[wire.members.back()].name, "')");
}

absl::Status CommScheduler::Impl::Plan() {
  const size_t n = tensors_.size();
  if (n == 0) return absl::InvalidArgumentError("comm scheduler: no tensors");
  std::set<std::string> names;
  members_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const ScheduledTensor& tensor = tensors_[i];
    if (tensor.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("comm scheduler: tensor ", i, " has no name"));
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("comm scheduler: tensor '", tensor.name, "' given twice"));
    }
    size_t elements = 1;
    for (int64_t dim : tensor.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("comm scheduler: tensor '", tensor.name, "' has a negative dimension"));
      }
      elements *= static_cast<size_t>(dim);
    }
    if (elements != tensor.parameters.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("comm scheduler: tensor '", tensor.name, "' has ", elements,
                       " elements, its parameter buffer ", tensor.parameters.size()));
    }
    if (tensor.memory == MemoryKind::kDevice && !tensor.initial_values.empty() &&
        tensor.initial_values.size() != elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("comm scheduler: tensor '", tensor.name, "' has ", elements, " elements, ",
                       tensor.initial_values.size(), " initial values"));
    }
    members_[i].elements = elements;
    members_[i].parameters = tensor.parameters;
  }

  // Fusion walks in backward order (the order gradients appear) and keeps
  // one open bucket per shard: a small tensor joins the bucket of the shard
  // that carries the fewest bytes so far (the tensors that are not fused
  // counted first, each where its chunks live), so the shards' links carry
  // even loads (one bucket for a whole small model would put all of its
  // traffic on one shard's link, and small tensors hashed to shards leave
  // them uneven). Every worker plans from the same tensor list and so picks
  // the same shards. A bucket closes when the next tensor would take it
  // past fusion_bytes.
  const Partitioner& partitioner =
      options_.partitioner != nullptr ? *options_.partitioner : client_.partitioner();
  const size_t chunk_bytes = client_.chunk_bytes();
  const size_t chunk_elements = std::max<size_t>(1, chunk_bytes / sizeof(float));
  auto fusable = [&](int i) {
    const size_t bytes = members_[i].elements * sizeof(float);
    return options_.fusion_bytes > 0 && bytes <= options_.fusion_bytes &&
           tensors_[i].memory != MemoryKind::kDevice;
  };
  std::vector<size_t> shard_load(client_.num_shards(), 0);
  for (size_t i = 0; i < n; ++i) {
    if (fusable(static_cast<int>(i))) continue;
    for (const ChunkSpan& span :
         SplitIntoChunks(tensors_[i].name, members_[i].elements, chunk_elements, partitioner)) {
      shard_load[span.shard] += span.num_elements * sizeof(float);
    }
  }
  std::vector<std::vector<int>> groups;
  std::vector<int> group_shard;  // the shard a fused group's name must map to; -1 unfused
  std::vector<std::vector<int>> open(client_.num_shards());
  std::vector<size_t> open_bytes(client_.num_shards(), 0);
  auto close = [&](int shard) {
    if (!open[shard].empty()) {
      groups.push_back(open[shard]);
      group_shard.push_back(open[shard].size() > 1 ? shard : -1);
    }
    open[shard].clear();
    open_bytes[shard] = 0;
  };
  for (int i = static_cast<int>(n) - 1; i >= 0; --i) {
    const size_t bytes = members_[i].elements * sizeof(float);
    if (!fusable(i)) {
      groups.push_back({i});
      group_shard.push_back(-1);
      continue;
    }
    const int shard = static_cast<int>(
        std::min_element(shard_load.begin(), shard_load.end()) - shard_load.begin());
    shard_load[shard] += bytes;
    if (open_bytes[shard] + bytes > options_.fusion_bytes) close(shard);
    open[shard].push_back(i);
    open_bytes[shard] += bytes;
  }
  for (int shard = 0; shard < client_.num_shards(); ++shard) close(shard);
  // A bucket's name picks its shard: the partitioner names the keys it
  // places there; the first one no model tensor has.
  std::set<std::string> taken = names;
  auto fused_name = [&](int shard) {
    const std::string stem = absl::StrCat("harrier.fused/", shard, "/");
    for (int index = 0;; ++index) {
      std::string name = partitioner.KeyOnShard(stem, shard, index);
      if (taken.insert(name).second) return name;
    }
  };

  // A piece covers partition_bytes of client chunks (the worker makes the
  // client's chunk_bytes the partition size, so usually one chunk).
  const size_t chunks_per_piece =
      options_.partition_bytes == 0
          ? 0
          : std::max<size_t>(1, options_.partition_bytes / chunk_bytes);
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int>& group = groups[g];
    std::sort(group.begin(), group.end());
    Wire wire;
    wire.members = group;
    wire.front = group.front();
    wire.fused = group.size() > 1;
    wire.name = wire.fused ? fused_name(group_shard[g]) : tensors_[group[0]].name;
    const int index = static_cast<int>(wires_.size());
    for (int member : group) {
      members_[member].wire = index;
      members_[member].offset = wire.elements;
      wire.elements += members_[member].elements;
    }
    const std::vector<ChunkSpan> spans =
        SplitIntoChunks(wire.name, wire.elements, chunk_elements, partitioner);
    const size_t step = chunks_per_piece == 0 ? spans.size() : chunks_per_piece;
    for (size_t first = 0; first < spans.size(); first += step) {
      Piece piece;
      piece.first_chunk = static_cast<uint32_t>(first);
      piece.num_chunks = static_cast<uint32_t>(std::min(step, spans.size() - first));
      piece.shard = spans[first].shard;
      for (size_t c = first; c < first + piece.num_chunks; ++c) {
        piece.bytes += spans[c].num_elements * sizeof(float);
      }
      wire.pieces.push_back(piece);
    }
    if (wire.fused) {
      wire.grad_staging.assign(wire.elements, 0.0f);
      wire.param_staging.assign(wire.elements, 0.0f);
      for (int member : group) {
        std::copy(members_[member].parameters.begin(), members_[member].parameters.end(),
                  wire.param_staging.begin() + members_[member].offset);
      }
      wire.gradient = wire.grad_staging.data();
      wire.parameters = wire.param_staging.data();
      // Both stagings are the scheduler's own: the gradients' is written
      // just before its pushes and not again until they complete
      // (GradientReady waits for them), the parameters' is copied out only
      // from pulls that succeeded (CopyOut after Pulled).
      TensorOptions options;
      options.staging_buffers = true;
      if (auto status = client_.RegisterTensor(wire.name, {static_cast<int64_t>(wire.elements)},
                                               wire.param_staging, options);
          !status.ok()) {
        return status;
      }
    } else {
      const ScheduledTensor& tensor = tensors_[group[0]];
      wire.parameters = tensor.parameters.data();
      const bool on_device = tensor.memory == MemoryKind::kDevice;
      TensorOptions options;
      options.memory = tensor.memory;
      // The model's host buffers are staging buffers under this class's
      // contract: a gradient stays unchanged until its push is done (until
      // the next WaitParameters), and parameters are read only after
      // WaitParameters, once their pull succeeded (a failed pull fails the
      // scheduler). So pushes go from where they are and pulls land there.
      options.staging_buffers = !on_device;
      if (auto status = client_.RegisterTensor(
              tensor.name, tensor.shape,
              on_device ? tensor.initial_values : absl::Span<const float>(tensor.parameters),
              options);
          !status.ok()) {
        return status;
      }
    }
    wires_.push_back(std::move(wire));
  }
  for (size_t w = 0; w < wires_.size(); ++w) wires_front_first_.push_back(static_cast<int>(w));
  std::sort(wires_front_first_.begin(), wires_front_first_.end(),
            [&](int a, int b) { return wires_[a].front < wires_[b].front; });
  base_clock_ = client_.clock();
  reorders_ = options_.priority && (options_.priority_across_workers ||
                                    client_.num_workers() <= 1 || client_.sync().mode != "bsp");
  for (const Wire& wire : wires_) pieces_per_step_ += static_cast<int>(wire.pieces.size());
  const bool plans = options_.priority && !reorders_;
  if (plans && options_.measure_forward_order_tail) {
    // Dense both ways whatever the client's codecs: every worker must read
    // the same average.
    tail_tensor_ = absl::StrCat(kForwardOrderTailTensor, "/", tensors_[0].name);
    TensorOptions average;
    average.kind = TensorKind::kAverage;
    average.codec = "none";
    average.pull_codec = "none";
    if (auto status = client_.RegisterTensor(tail_tensor_, {1}, {}, average); !status.ok()) {
      return status;
    }
  }
  absl::MutexLock lock(&mutex_);
  if (plans && options_.forward_order_tail > 0) PlanPushOrder(options_.forward_order_tail);
  if (!tail_tensor_.empty()) {
    tail_agreed_ = false;
    plan_from_step_ = kForwardOrderTailMeasuredStep + 1;
  }
  // Only BSP's pulls wait for other workers' pushes, and only pushes in the
  // same order on every worker complete rounds in the order they were sent.
  if (client_.num_workers() > 1 && client_.sync().mode == "bsp" && !reorders_) {
    round_window_ = options_.round_window_bytes;
  }
  round_returned_ = absl::Now();
  // Step 0's parameters: the shards' initial values, front tensor first.
  for (int w : wires_front_first_) BeginPulls(w, 0);
  return absl::OkStatus();
}

void CommScheduler::Impl::PlanPushOrder(double tail) {
  // Wires become ready back to front: a wire (a fused bucket too) is ready
  // with its front member. The split falls between pieces, so that one
  // large tensor (VGG-16's first fully connected layer is three quarters of
  // the model) can lie on both sides of it.
  std::vector<int> backward(wires_.size());
  size_t total = 0;
  for (size_t w = 0; w < wires_.size(); ++w) {
    backward[w] = static_cast<int>(w);
    for (const Piece& piece : wires_[w].pieces) total += piece.bytes;
  }
  std::sort(backward.begin(), backward.end(),
            [&](int a, int b) { return wires_[a].front > wires_[b].front; });
  const double head_bytes = static_cast<double>(total) * (1.0 - tail);
  planned_position_.assign(wires_.size(), {});
  for (size_t w = 0; w < wires_.size(); ++w) {
    planned_position_[w].assign(wires_[w].pieces.size(), -1);
  }
  size_t head = 0;
  for (int w : backward) {
    for (size_t p = 0; p < wires_[w].pieces.size() && static_cast<double>(head) < head_bytes; ++p) {
      planned_position_[w][p] = planned_pieces_++;
      head += wires_[w].pieces[p].bytes;
    }
  }
  for (auto w = backward.rbegin(); w != backward.rend(); ++w) {
    for (int& position : planned_position_[*w]) {
      if (position < 0) position = planned_pieces_++;
    }
  }
  planned_step_ = plan_from_step_;
  planned_next_ = 0;
  stats_.forward_order_tail = tail;
}

void CommScheduler::Impl::MaybeAgreeTail() {
  if (tail_tensor_.empty() || backward_ended_ == absl::InfinitePast() ||
      pushes_ended_ == absl::InfinitePast()) {
    return;
  }
  const double backward = absl::ToDoubleSeconds(backward_ended_ - backward_began_);
  const double pushes = absl::ToDoubleSeconds(pushes_ended_ - backward_began_);
  const double estimate = pushes > 0 ? std::clamp(1.0 - backward / pushes, 0.0, 1.0) : 0.0;
  tail_estimate_[0] = static_cast<float>(estimate);
  stats_.measured_forward_order_tail = estimate;
  spdlog::info(
      "comm scheduler: step {} took {:.1f} ms of backward and {:.1f} ms until its last push was "
      "acknowledged: a forward-order tail of {:.3f} here; averaging it with the other workers'",
      kForwardOrderTailMeasuredStep, backward * 1e3, pushes * 1e3, estimate);
  ++inflight_calls_;
  Client::Handle handle = client_.PushPullAsync(tail_tensor_, absl::MakeConstSpan(tail_estimate_),
                                                absl::MakeSpan(tail_average_));
  client_.WhenDone(handle, absl::Now() + options_.wait_timeout, [this](absl::Status status) {
    absl::Status submitted = executor_.Submit([this, status] {
      absl::MutexLock lock(&mutex_);
      TailAgreed(status);
      Dispatch();
    });
    submitted.IgnoreError();  // unbounded: refused only while stopping (see Send)
  });
}

void CommScheduler::Impl::TailAgreed(const absl::Status& status) {
  --inflight_calls_;
  if (!status.ok()) {
    Fail(absl::Status(status.code(), absl::StrCat("comm scheduler: averaging the workers' "
                                                  "forward-order tail: ",
                                                  status.message())));
    return;
  }
  const double tail = std::clamp(static_cast<double>(tail_average_[0]), 0.0, 1.0);
  if (tail > 0) PlanPushOrder(tail);
  stats_.forward_order_tail = tail;
  stats_.forward_order_tail_from_step = plan_from_step_;
  tail_agreed_ = true;
  spdlog::info("comm scheduler: the workers' forward-order tail is {:.3f}, planned from step {}",
               tail, plan_from_step_);
}

absl::Status CommScheduler::Impl::AwaitTail() {
  if (tail_agreed_ || step_ < plan_from_step_) return absl::OkStatus();
  auto agreed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return tail_agreed_; };
  return AwaitOrFail(agreed, "the workers' forward-order tail");
}

void CommScheduler::Impl::Start() {
  max_inflight_per_kind_ = 2 * client_.num_shards() + 2;
  if (options_.timeline != nullptr) {
    step_track_ = options_.timeline->Track("steps");
    loop_track_ = options_.timeline->Track("training loop waits");
  }
  absl::MutexLock lock(&mutex_);
  step_began_ = absl::Now();
  Dispatch();
}

CommScheduler::Impl::~Impl() {
  absl::MutexLock lock(&mutex_);
  stopping_ = true;
  queue_[0].clear();
  queue_[1].clear();
  // A call in flight ends by its WhenDone deadline (wait_timeout; the
  // client then cancels it); its completion comes through the executor.
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return inflight_calls_ == 0; };
  mutex_.Await(absl::Condition(&ended));
}

void CommScheduler::Impl::Enqueue(Kind kind, int wire, int piece, int64_t step, bool returns_push) {
  const QueueKey key = kind == Kind::kPush && planned_pieces_ > 0 && step >= plan_from_step_
                           ? QueueKey{step, planned_position_[wire][piece], 0, sequence_++}
                       : reorders_ ? QueueKey{step, wires_[wire].front, piece, sequence_++}
                                   : QueueKey{0, 0, 0, sequence_++};
  Call call{kind, wire, piece, step, returns_push};
  if (options_.timeline != nullptr) call.queued = absl::Now();
  queue_[static_cast<int>(kind)][key] = call;
}

void CommScheduler::Impl::QueuePushes(int wire) {
  Wire& w = wires_[wire];
  w.push_step = step_;
  w.pushes_remaining = static_cast<int>(w.pieces.size());
  for (size_t p = 0; p < w.pieces.size(); ++p) {
    Enqueue(Kind::kPush, wire, static_cast<int>(p), step_);
  }
}

void CommScheduler::Impl::BeginPulls(int wire, int64_t step) {
  Wire& w = wires_[wire];
  w.pull_step = step;
  w.pulls_remaining = static_cast<int>(w.pieces.size());
  for (size_t p = 0; p < w.pieces.size(); ++p) {
    Enqueue(Kind::kPull, wire, static_cast<int>(p), step);
  }
}

bool CommScheduler::Impl::Dispatchable(Kind kind) {
  const auto& queue = queue_[static_cast<int>(kind)];
  if (queue.empty() || !error_.ok() || stopping_) return false;
  if (inflight_[static_cast<int>(kind)] >= max_inflight_per_kind_) return false;
  if (kind == Kind::kPull) return true;
  // Only the queue's head may go, so priority order holds under the caps.
  const Call& head = queue.begin()->second;
  // A planned order is kept strictly: a piece waits for the one planned
  // before it even when that one's gradient is not ready yet.
  if (planned_pieces_ > 0 && head.step >= plan_from_step_) {
    const QueueKey& key = queue.begin()->first;
    if (std::get<0>(key) != planned_step_ || std::get<1>(key) != planned_next_) return false;
  }
  const size_t bytes = wires_[head.wire].pieces[head.piece].bytes;
  // The round window, like the credits, lets one piece go alone.
  if (round_window_ > 0 && unreturned_push_bytes_ > 0 &&
      unreturned_push_bytes_ + bytes > round_window_) {
    if (window_held_since_ == absl::InfiniteFuture()) window_held_since_ = absl::Now();
    return false;
  }
  // Credits: a piece larger than the cap goes alone, else a cap below one
  // piece would stop the scheduler for good.
  if (options_.max_inflight_bytes == 0) return true;
  return inflight_push_bytes_ == 0 || inflight_push_bytes_ + bytes <= options_.max_inflight_bytes;
}

void CommScheduler::Impl::Dispatch() {
  for (;;) {
    const bool push = Dispatchable(Kind::kPush);
    const bool pull = Dispatchable(Kind::kPull);
    if (!push && !pull) return;
    if (push) Send(Kind::kPush);
    if (pull) Send(Kind::kPull);
  }
}

void CommScheduler::Impl::Send(Kind kind) {
  auto& queue = queue_[static_cast<int>(kind)];
  Call call = queue.begin()->second;
  queue.erase(queue.begin());
  if (options_.timeline != nullptr) {
    call.sent = absl::Now();
    call.lane = options_.timeline->TakeLane(kind == Kind::kPush ? "push" : "pull");
  }
  const Wire& wire = wires_[call.wire];
  const Piece& piece = wire.pieces[call.piece];
  ++inflight_calls_;
  ++inflight_[static_cast<int>(kind)];
  if (options_.keep_dispatch_log) {
    DispatchRecord record;
    record.kind = kind == Kind::kPush ? DispatchRecord::kPush : DispatchRecord::kPull;
    record.step = call.step;
    record.wire_name = wire.name;
    record.first_chunk = piece.first_chunk;
    record.num_chunks = piece.num_chunks;
    record.shard = piece.shard;
    record.bytes = piece.bytes;
    record.tensors = wire.members;
    log_.push_back(std::move(record));
    if (log_.size() > kLogLimit) log_.pop_front();
  }
  if (kind == Kind::kPush) {
    if (planned_pieces_ > 0 && call.step >= plan_from_step_ && ++planned_next_ == planned_pieces_) {
      planned_next_ = 0;
      ++planned_step_;
    }
    inflight_push_bytes_ += piece.bytes;
    unreturned_push_bytes_ += piece.bytes;
    window_held_since_ = absl::InfiniteFuture();
    stats_.peak_unreturned_push_bytes =
        std::max(stats_.peak_unreturned_push_bytes, static_cast<int64_t>(unreturned_push_bytes_));
    stats_.push_calls++;
    stats_.bytes_pushed += static_cast<int64_t>(piece.bytes);
    stats_.peak_inflight_push_bytes =
        std::max(stats_.peak_inflight_push_bytes, static_cast<int64_t>(inflight_push_bytes_));
  } else {
    stats_.pull_calls++;
    stats_.bytes_pulled += static_cast<int64_t>(piece.bytes);
  }
  CallScope scope;
  scope.clock = base_clock_ + call.step;
  scope.first_chunk = piece.first_chunk;
  scope.num_chunks = piece.num_chunks;
  // With a timeline of its own the scheduler records the call (with its
  // step and time queued); the client's timeline would hold it twice.
  scope.on_timeline = options_.timeline == nullptr;
  // Starting a call only queues its shard calls in the client (nothing
  // calls back into the scheduler meanwhile), so it happens under the lock
  // and calls start in dispatch order.
  Client::Handle handle =
      kind == Kind::kPush
          ? client_.PushAsync(wire.name, absl::MakeConstSpan(wire.gradient, wire.elements), scope)
          : client_.PullAsync(wire.name, absl::MakeSpan(wire.parameters, wire.elements), scope);
  // The completion runs on a client thread: it only hands over.
  client_.WhenDone(handle, absl::Now() + options_.wait_timeout,
                   [this, call](absl::Status status) {
                     absl::Status submitted = executor_.Submit([this, call, status] {
                       absl::MutexLock lock(&mutex_);
                       Complete(call, status);
                       Dispatch();
                     });
                     // Unbounded: refused only while the executor stops,
                     // which waits for every call first.
                     submitted.IgnoreError();
                   });
}

void CommScheduler::Impl::Complete(const Call& call, const absl::Status& status) {
  Wire& wire = wires_[call.wire];
  if (options_.timeline != nullptr) Record(call, status);
  --inflight_calls_;
  --inflight_[static_cast<int>(call.kind)];
  if (call.kind == Kind::kPush) inflight_push_bytes_ -= wire.pieces[call.piece].bytes;
  if (!status.ok()) {
    Fail(absl::Status(status.code(),
                      absl::StrCat("comm scheduler: ", call.kind == Kind::kPush ? "push" : "pull",
                                   " of ", Describe(wire), " piece ", call.piece, " at step ",
                                   call.step, ": ", status.message())));
    return;
  }
  if (call.kind == Kind::kPull) {
    --wire.pulls_remaining;
    if (call.returns_push) {
      unreturned_push_bytes_ -= wire.pieces[call.piece].bytes;
      round_returned_ = absl::Now();
    }
    return;
  }
  --wire.pushes_remaining;
  if (stopping_) return;
  if (!tail_tensor_.empty() && call.step == kForwardOrderTailMeasuredStep &&
      ++measured_pushes_ == pieces_per_step_) {
    pushes_ended_ = absl::Now();
    MaybeAgreeTail();
  }
  // Step s + 1's pull of this piece waits on the shard for every worker's
  // push of step s; a pull round begins with its first piece.
  if (wire.pull_step < call.step + 1) {
    wire.pull_step = call.step + 1;
    wire.pulls_remaining = static_cast<int>(wire.pieces.size());
  }
  Enqueue(Kind::kPull, call.wire, call.piece, call.step + 1, /*returns_push=*/true);
}

void CommScheduler::Impl::Record(const Call& call, const absl::Status& status) {
  options_.timeline->ReleaseLane(call.lane);
  const Wire& wire = wires_[call.wire];
  const Piece& piece = wire.pieces[call.piece];
  Json args{{"step", call.step},
            {"piece", call.piece},
            {"of", wire.pieces.size()},
            {"shard", piece.shard},
            {"bytes", piece.bytes},
            {"queued_ms", absl::ToDoubleMilliseconds(call.sent - call.queued)}};
  if (wire.fused) {
    args["tensors"] = absl::StrCat(tensors_[wire.members.front()].name, " .. ",
                                   tensors_[wire.members.back()].name);
  }
  if (!status.ok()) args["error"] = std::string(status.message());
  options_.timeline->Span(
      call.lane,
      wire.pieces.size() > 1 ? absl::StrCat(wire.name, " ", call.piece + 1, "/", wire.pieces.size())
                             : wire.name,
      call.kind == Kind::kPush ? "push" : "pull", call.sent, absl::Now(), args);
}

void CommScheduler::Impl::RecordWait(absl::string_view what, const std::string& tensor,
                                     absl::Time start) {
  Json args{{"step", step_}};
  if (!tensor.empty()) args["tensor"] = tensor;
  options_.timeline->Span(loop_track_,
                          tensor.empty() ? std::string(what) : absl::StrCat(what, " ", tensor),
                          "wait", start, absl::Now(), args);
}

void CommScheduler::Impl::Fail(absl::Status status) {
  if (error_.ok()) error_ = std::move(status);
  // Nothing queued goes out after an error; calls in flight end by their
  // deadlines.
  queue_[0].clear();
  queue_[1].clear();
}

void CommScheduler::Impl::TurnOffStalledWindow() {
  if (round_window_ == 0 || window_held_since_ == absl::InfiniteFuture()) return;
  if (absl::Now() - std::max(window_held_since_, round_returned_) < window_stall_) return;
  round_window_ = 0;
  spdlog::warn(
      "comm scheduler: the round window held pushes for {} while no round came back (do the "
      "workers push their tensors in different orders?); it is off from now on",
      absl::FormatDuration(window_stall_));
  Dispatch();
}

template <typename Ready>
absl::Status CommScheduler::Impl::AwaitOrFail(const Ready& ready, const std::string& what) {
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return !error_.ok() || ready(); };
  const absl::Time deadline = absl::Now() + options_.wait_timeout;
  // While the round window applies, the waiting caller also looks for a
  // window that stalls, a few times per window_stall_: nothing else would
  // wake the scheduler then.
  bool in_time;
  while (
      !(in_time = mutex_.AwaitWithDeadline(
            absl::Condition(&done),
            round_window_ > 0 ? std::min(deadline, absl::Now() + window_stall_ / 4) : deadline)) &&
      absl::Now() < deadline) {
    TurnOffStalledWindow();
  }
  if (!error_.ok()) return error_;
  if (!in_time) {
    return absl::DeadlineExceededError(absl::StrCat(
        "comm scheduler: ", what, " not done within ", absl::FormatDuration(options_.wait_timeout)));
  }
  return absl::OkStatus();
}

void CommScheduler::Impl::CopyOut(Member& member) {
  const Wire& wire = wires_[member.wire];
  if (!wire.fused || member.copied_step == wire.pull_step) return;
  std::memcpy(member.parameters.data(), wire.param_staging.data() + member.offset,
              member.elements * sizeof(float));
  member.copied_step = wire.pull_step;
}

absl::Status CommScheduler::Impl::WaitParameters(int tensor) {
  if (tensor < 0 || static_cast<size_t>(tensor) >= members_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("comm scheduler: no tensor ", tensor));
  }
  absl::MutexLock lock(&mutex_);
  Member& member = members_[tensor];
  const int64_t step = step_;
  // Plain: every tensor is pulled before forward starts.
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (!options_.wait_free_backprop) {
      for (const Wire& wire : wires_) {
        if (!Pulled(wire, step)) return false;
      }
      return true;
    }
    return Pulled(wires_[member.wire], step);
  };
  const bool waits = options_.timeline != nullptr && !ready();
  const absl::Time wait_began = waits ? absl::Now() : absl::Time();
  if (auto status = AwaitOrFail(ready, absl::StrCat("the parameters of '", tensors_[tensor].name,
                                                    "' for step ", step));
      !status.ok()) {
    return status;
  }
  if (waits) RecordWait("parameters of", tensors_[tensor].name, wait_began);
  CopyOut(member);
  return absl::OkStatus();
}

absl::Status CommScheduler::Impl::GradientReady(int tensor, absl::Span<const float> gradient) {
  if (tensor < 0 || static_cast<size_t>(tensor) >= members_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("comm scheduler: no tensor ", tensor));
  }
  absl::MutexLock lock(&mutex_);
  if (!error_.ok()) return error_;
  if (auto status = AwaitTail(); !status.ok()) return status;
  if (!tail_tensor_.empty() && step_ == kForwardOrderTailMeasuredStep &&
      backward_began_ == absl::InfinitePast()) {
    backward_began_ = absl::Now();
  }
  Member& member = members_[tensor];
  const std::string& name = tensors_[tensor].name;
  if (gradient.size() != member.elements) {
    return absl::InvalidArgumentError(absl::StrCat("comm scheduler: gradient of '", name, "' has ",
                                                   gradient.size(), " elements, the tensor ",
                                                   member.elements));
  }
  if (member.gradient_step == step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("comm scheduler: gradient of '", name, "' given twice in step ", step_));
  }
  Wire& wire = wires_[member.wire];
  // The previous step's push must be off the staging buffer (it is, unless
  // WaitParameters was skipped: that waits for it).
  auto pushed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return wire.pushes_remaining == 0; };
  const bool waits = options_.timeline != nullptr && !pushed();
  const absl::Time wait_began = waits ? absl::Now() : absl::Time();
  if (auto status = AwaitOrFail(pushed, absl::StrCat("the previous push of ", Describe(wire)));
      !status.ok()) {
    return status;
  }
  if (waits) RecordWait("previous push of", name, wait_began);
  member.gradient_step = step_;
  if (wire.fused) {
    std::memcpy(wire.grad_staging.data() + member.offset, gradient.data(),
                member.elements * sizeof(float));
  } else {
    wire.gradient = gradient.data();
  }
  if (wire.ready_step != step_) {
    wire.ready_step = step_;
    wire.ready_members = 0;
  }
  ++wire.ready_members;
  if (options_.wait_free_backprop && wire.ready_members == wire.members.size()) {
    QueuePushes(member.wire);
    Dispatch();
  }
  return absl::OkStatus();
}

absl::Status CommScheduler::Impl::EndBackward() {
  {
    absl::MutexLock lock(&mutex_);
    if (!error_.ok()) return error_;
    if (auto status = AwaitTail(); !status.ok()) return status;
    for (int w : wires_front_first_) {
      Wire& wire = wires_[w];
      if (wire.push_step == step_) continue;
      if (wire.ready_step != step_ || wire.ready_members != wire.members.size()) {
        for (int member : wire.members) {
          if (members_[member].gradient_step != step_) {
            Fail(absl::FailedPreconditionError(
                absl::StrCat("comm scheduler: EndBackward of step ", step_, " without the gradient of '",
                             tensors_[member].name, "'")));
            return error_;
          }
        }
      }
      QueuePushes(w);
    }
    if (options_.timeline != nullptr) {
      const absl::Time now = absl::Now();
      options_.timeline->Span(step_track_, absl::StrCat("step ", step_), "step", step_began_, now,
                              Json{{"step", step_}});
      step_began_ = now;
    }
    if (!tail_tensor_.empty() && step_ == kForwardOrderTailMeasuredStep) {
      backward_ended_ = absl::Now();
      MaybeAgreeTail();
    }
    ++step_;
    Dispatch();
  }
  // The calls carry explicit clocks; the client's own clock follows the
  // steps for what reads it (heartbeats, Leave).
  client_.Clock();
  return absl::OkStatus();
}

absl::Status CommScheduler::Impl::Drain() {
  absl::MutexLock lock(&mutex_);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return Idle(); };
  const bool waits = options_.timeline != nullptr && !idle();
  const absl::Time wait_began = waits ? absl::Now() : absl::Time();
  if (auto status = AwaitOrFail(idle, "draining the calls in flight"); !status.ok()) {
    return status;
  }
  if (waits) RecordWait("drain: every call in flight", "", wait_began);
  for (Member& member : members_) CopyOut(member);
  return absl::OkStatus();
}

absl::Status CommScheduler::Impl::Refresh() {
  absl::MutexLock lock(&mutex_);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return Idle(); };
  if (auto status = AwaitOrFail(idle, "draining before a refresh"); !status.ok()) return status;
  for (int w : wires_front_first_) BeginPulls(w, step_);
  Dispatch();
  if (auto status = AwaitOrFail(idle, "refreshing every tensor"); !status.ok()) return status;
  for (Member& member : members_) {
    member.copied_step = -1;
    CopyOut(member);
  }
  return absl::OkStatus();
}

CommScheduler::CommScheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CommScheduler::~CommScheduler() = default;

absl::StatusOr<std::unique_ptr<CommScheduler>> CommScheduler::Create(
    Client& client, std::vector<ScheduledTensor> tensors, const CommSchedulerOptions& options) {
  if (options.wait_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("comm scheduler: wait_timeout must be positive");
  }
  if (!(options.forward_order_tail >= 0.0 && options.forward_order_tail <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "comm scheduler: forward_order_tail must be in [0, 1], not ", options.forward_order_tail));
  }
  if (options.measure_forward_order_tail && options.forward_order_tail > 0) {
    return absl::InvalidArgumentError(
        "comm scheduler: a forward_order_tail is given and measure_forward_order_tail is set: "
        "give one or the other");
  }
  if (options.partitioner != nullptr && options.partitioner->num_shards() != client.num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm scheduler: the partitioner places chunks on ",
                     options.partitioner->num_shards(), " shards, the client has ",
                     client.num_shards()));
  }
  auto impl = std::make_unique<Impl>(client, std::move(tensors), options);
  if (auto status = impl->Plan(); !status.ok()) return status;
  impl->Start();
  return std::unique_ptr<CommScheduler>(new CommScheduler(std::move(impl)));
}

absl::Status CommScheduler::WaitParameters(int tensor) { return impl_->WaitParameters(tensor); }
absl::Status CommScheduler::GradientReady(int tensor, absl::Span<const float> gradient) {
  return impl_->GradientReady(tensor, gradient);
}
absl::Status CommScheduler::EndBackward() { return impl_->EndBackward(); }
absl::Status CommScheduler::Drain() { return impl_->Drain(); }
absl::Status CommScheduler::Refresh() { return impl_->Refresh(); }
const CommSchedulerOptions& CommScheduler::options() const { return impl_->options(); }
CommSchedulerStats CommScheduler::stats() const { return impl_->stats(); }
std::vector<DispatchRecord> CommScheduler::dispatch_log_for_testing() const {
  return impl_->log();
}
size_t CommScheduler::queued_pulls_for_testing() const { return impl_->queued_pulls(); }

}  // namespace harrier
