#ifndef HARRIER_WORKER_COMM_SCHEDULER_H_
#define HARRIER_WORKER_COMM_SCHEDULER_H_

// The comm scheduler: overlaps a step's communication with its computation.
// Training code tells it two things, "the gradient of tensor i is ready"
// (from backward, last layer first) and "I need tensor i now" (from
// forward, first layer first); the scheduler decides what goes on the wire
// when. Each technique of the survey's fourth dimension is switchable alone:
//
//   wait-free backprop  push tensor i as soon as its gradient is ready
//                       (off: push everything at EndBackward, "plain")
//   fusion              small tensors of one shard (the shard each would
//                       live on unfused), collected in backward order,
//                       merged into one wire tensor of at most fusion_bytes
//   partitioning        tensors above partition_bytes split into pieces
//                       spread round-robin over the shards, one call each
//   priority            queued pushes and pulls dispatched front tensor
//                       first (P3, ByteScheduler), preempting at piece
//                       granularity, so forward of the next step starts as
//                       soon as tensor 0 is back; under BSP with several
//                       workers only with priority_across_workers
//   credits             at most max_inflight_bytes of pushes in flight,
//                       and under BSP at most round_window_bytes pushed
//                       whose rounds have not come back
//
// Pushes and pulls are separate calls: a pull of step t+1 waits (on the
// shard, under BSP) for every worker's push of step t, and pushes never
// wait on other workers, so the credit cap (which counts pushes only)
// cannot deadlock workers whose queues are in different orders.
//
// One training thread calls, per step:
//   for i in forward order:  WaitParameters(i); compute layer i
//   for i in backward order: compute; GradientReady(i, gradient_i)
//   EndBackward()
// and Drain() after the last step. This is also what the Python binding's
// forward and backward hooks call.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/partitioner.h"
#include "worker/client.h"
#include "worker/timeline.h"

namespace harrier {

struct CommSchedulerOptions {
  bool wait_free_backprop = false;
  size_t fusion_bytes = 0;        // 0: no fusion
  size_t partition_bytes = 0;     // 0: no partitioning
  bool priority = false;
  // Under BSP with more than one worker, priority leaves both queues in the
  // order calls became ready unless this is set. A pull is answered only
  // once every worker has pushed its piece, and workers that reorder their
  // pushes by when credit frees up send the same pieces in different
  // orders: rounds then complete long after most workers' pushes, and the
  // pulls waiting on them hold the pull slots. In the order of backward
  // every worker sends the same pieces in the same order. Replayed with 4
  // workers and 4 shards at 1 Gbit/s (docs/performance.md, "Where a 4 x 4
  // step goes"): ResNet-50 1119-1152 ms per step in readiness order
  // against 1282-1341 reordered, BERT-base 4408-4561 against 5459-5763,
  // VGG-16 alike. The pull queue keeps that order too: by priority, a
  // worker ahead of the others fills its pull slots with front pieces,
  // whose rounds the late workers complete last, while pulls of complete
  // rounds queue behind them (1652-1659 against 1117-1119 ms).
  bool priority_across_workers = false;
  // With priority where pushes keep the order of backward (above): the
  // last forward_order_tail of a step's push bytes, the front of the
  // model, go in forward order instead, after the rest in the order of
  // backward; 0: off. Every worker plans the same order from the same
  // tensor list and keeps it strictly (a piece waits for the one planned
  // before it), so rounds still complete as pushes arrive, and the next
  // forward starts once the front tensor is back instead of after the
  // whole backlog. About the share of a step's communication that does not
  // fit under backward: 1 - backward time / communication time (the
  // overlap bench sets it so). Replayed at 1 Gbit/s with 4 workers and 4
  // shards, compute equal to communication, tail 1/3: VGG-16 5298-5336 ms
  // per step against 6505-6672 without, ResNet-50 1143-1251 against
  // 1286-1403 (docs/performance.md, "The front of the model last, in
  // forward order"). Workers planning different tails lose more than the
  // plan gains. Must be in [0, 1].
  double forward_order_tail = 0.0;
  // Measure the tail instead (forward_order_tail must then be 0), where a
  // plan applies (above). Every worker times its step 1: backward, from
  // its first gradient to EndBackward, and its pushes, from that first
  // gradient until the last is acknowledged. The workers average their
  // 1 - backward / push time, clamped to [0, 1], through the shards (a
  // one-float average tensor, kForwardOrderTailTensor), so each plans the
  // same tail from step 2 on. A worker's own estimate alone would not do:
  // four workers planning tails 0.27-0.39 stepped 1295-1362 ms against
  // 1144-1172 with all at 0.33 (ResNet-50; docs/performance.md, "The tail
  // measured by the workers"). Every worker must be given this too.
  bool measure_forward_order_tail = false;
  // 0: no cap. Counts pushes only; a piece above the cap goes alone when
  // no other push is in flight.
  size_t max_inflight_bytes = 0;
  // Under BSP with more than one worker and pushes in the order of
  // backward: at most this many bytes pushed whose rounds have not come
  // back (the piece's pull, which a shard answers once every worker pushed
  // the piece, has not completed). 0: no window. A piece above it goes
  // alone. See kDefaultRoundWindowBytes.
  size_t round_window_bytes = 0;
  // With the cap at its default: the cap grows to at least this many
  // pieces (partition_bytes, or the default piece without partitioning)
  // per shard, so that every shard's link has a piece arriving while the
  // one before it is acknowledged. 0: the cap is max_inflight_bytes
  // exactly. See CreditCap.
  size_t inflight_pieces_per_shard = 0;
  // Bound of every wait inside the scheduler (WaitParameters,
  // GradientReady, Drain, and each call's Wait, so a BSP pull waiting longer
  // for a slow worker fails the scheduler).
  absl::Duration wait_timeout = absl::Seconds(120);
  // Record the latest calls for dispatch_log_for_testing(); off in training
  // runs, which need no record (a name and a member list) per call.
  bool keep_dispatch_log = false;
  // Where fused buckets live: the shard a bucket's members would live on
  // unfused. Null: the client's own (Client::partitioner()); otherwise it
  // must place chunks as the client does.
  std::shared_ptr<const Partitioner> partitioner;
  // Null: nothing recorded. Otherwise each call (from dispatch to
  // completion, with how long it was queued), each wait of the training
  // loop and each step go to this timeline, which must outlive the
  // scheduler.
  Timeline* timeline = nullptr;
};

// Defaults of the techniques when named without a size. Pieces of 1 MiB
// with a few MiB of pushes in flight: the pushes in flight share the uplink
// (HTTP/2 interleaves them), so each is acknowledged, and its pull can
// start, only about a window's time after it began; a step ends with the
// pulls of the last window alone on the downlink. Smaller windows shorten
// that tail: a replayed ResNet-50 step with no compute at 1 Gbit/s took
// 1.10 link-times with 1 MiB pieces and 4 MiB in flight against 1.20 with
// 4 MiB pieces and 16 MiB in flight, and 4 workers with 4 shards 0.56 of
// the cost model against 0.49; at 10 Gbit/s and above, where this
// machine's CPU is the limit, the smaller pieces cost about 5 %
// (docs/performance.md, "Both directions at once").
inline constexpr size_t kDefaultFusionBytes = 4u << 20;
inline constexpr size_t kDefaultPartitionBytes = 1u << 20;
//
// The cap is 8 MiB, or two pieces per shard when that is more. A push is
// acknowledged only once its shard has all of it, so with one piece per
// shard in flight (4 MiB over 4 shards) each shard's link idles for an
// acknowledgement's round trip between pieces, and the pieces, sent
// together, finish together. Replayed at 1 Gbit/s with 4 workers and
// compute (docs/performance.md, "The credit cap"): with 4 shards BERT-base
// took 6265-6546 ms per step with 8 MiB against 7538-8629 with 4 MiB,
// ResNet-50 1364-1444 against 1430-1491, VGG-16 alike, and 16 MiB or no
// cap was worse than 8 MiB for both; with 2 shards BERT-base 9162-9240
// against 9799-9909, the others alike; 1 worker and 1 shard alike. Two
// pieces per shard above 4 shards follows the same reasoning, unmeasured.
inline constexpr size_t kDefaultMaxInflightBytes = 8u << 20;
inline constexpr size_t kDefaultInflightPiecesPerShard = 2;
//
// The round window is 32 MiB. A shard answers a piece's pull once every
// worker pushed it, so rounds complete at the pace of the worker furthest
// behind. Without a window a worker whose pushes are ahead goes on taking
// the shards' links from the workers whose pushes would complete rounds:
// with fewer shards than workers the pulls then wait, and the links carry
// them only once the pushes are done. Replayed at 1 Gbit/s with 4 workers
// and 2 shards, VGG-16 took 9761 ms per step against 12078 without it (its
// cost model 9264; docs/performance.md, "The round window"). A window
// that holds pushes for 30 s (at most a quarter of wait_timeout) with no
// round coming back, as workers that push in different orders would, turns
// itself off.
inline constexpr size_t kDefaultRoundWindowBytes = 32u << 20;

// measure_forward_order_tail: the step each worker times, and the prefix
// of the average tensor the workers agree the tail through (registered by
// the scheduler as this, '/' and the name of the model's tensor 0).
inline constexpr int64_t kForwardOrderTailMeasuredStep = 1;
inline constexpr char kForwardOrderTailTensor[] = "harrier.scheduler/forward_order_tail";

// `techniques`: "plain", "wfbp", "fusion", "priority", "all", or several
// joined by '+' ("wfbp+fusion"). "fusion" and "priority" imply wfbp;
// "priority" implies partitioning and the credit cap (preemption needs
// pieces and a queue); "all" is every technique. Also "partition" and
// "credits" alone. "none" is not a technique (no scheduler at all is the
// caller's choice). A size of 0 for an enabled technique takes its
// default (the credit cap's grows with the shards, CreditCap); the size of
// a technique that is off is ignored.
// INVALID_ARGUMENT names an unknown technique.
absl::StatusOr<CommSchedulerOptions> ParseTechniques(absl::string_view techniques,
                                                     size_t fusion_bytes = 0,
                                                     size_t partition_bytes = 0,
                                                     size_t max_inflight_bytes = 0);

// The credit cap a scheduler with `options` keeps over `num_shards` shards:
// max_inflight_bytes, raised to inflight_pieces_per_shard pieces per shard
// when that is more. 0: no cap.
size_t CreditCap(const CommSchedulerOptions& options, int num_shards);

// One model tensor. Its index in the list given to Create is its priority:
// tensor 0 is the front of the model (the first forward uses it).
struct ScheduledTensor {
  std::string name;
  std::vector<int64_t> shape;
  // The model's parameter buffer: its values at Create are the initial
  // values (the first worker's win on the shards); pulled parameters are
  // written here. Must outlive the scheduler.
  absl::Span<float> parameters;
  // kDevice: `parameters` and the gradients given to GradientReady are
  // device memory (Client::RegisterTensor with kDevice: compressed on the
  // device), and the initial values come from `initial_values`, in host
  // memory (empty: zeros). Device tensors are never fused: a bucket is
  // filled by copies through host memory. Partitioning, priority, credits
  // and wait-free backprop apply as to host tensors.
  MemoryKind memory = MemoryKind::kHost;
  absl::Span<const float> initial_values;
};

struct CommSchedulerStats {
  int64_t push_calls = 0;
  int64_t pull_calls = 0;
  int64_t bytes_pushed = 0;
  int64_t bytes_pulled = 0;
  int64_t peak_inflight_push_bytes = 0;
  // The most bytes pushed at once whose rounds had not come back.
  int64_t peak_unreturned_push_bytes = 0;
  // The forward-order tail planned: the option's, or with
  // measure_forward_order_tail the workers' average once agreed (0 before).
  double forward_order_tail = 0;
  // measure_forward_order_tail: this worker's own estimate from step 1,
  // and the step the agreed plan starts from; -1 until then.
  double measured_forward_order_tail = -1;
  int64_t forward_order_tail_from_step = -1;
};

// One dispatched call, in dispatch order (tests check order and shape).
struct DispatchRecord {
  enum Kind { kPush, kPull } kind = kPush;
  // A push: the step whose gradient it carries; a pull: the step whose
  // parameters it fetches (t + 1 after step t's push). Its clock is the
  // client's clock at Create plus this.
  int64_t step = 0;
  std::string wire_name;       // the Client tensor (a model tensor, a fused bucket)
  uint32_t first_chunk = 0;    // the piece
  uint32_t num_chunks = 0;
  int shard = 0;               // of the piece's first chunk
  size_t bytes = 0;
  std::vector<int> tensors;    // model tensors it carries
};

class CommScheduler {
 public:
  // Registers the wire tensors (model tensors, fused buckets) with `client`
  // and plans pieces. `client` must outlive the scheduler.
  static absl::StatusOr<std::unique_ptr<CommScheduler>> Create(
      Client& client, std::vector<ScheduledTensor> tensors, const CommSchedulerOptions& options);
  // Cancels what is still queued and waits (bounded) for calls in flight.
  ~CommScheduler();
  CommScheduler(const CommScheduler&) = delete;
  CommScheduler& operator=(const CommScheduler&) = delete;

  // "I need tensor i now": returns once the tensor's parameters for the
  // current step are in its buffer (step 0: the shards' initial values).
  absl::Status WaitParameters(int tensor);
  // "The gradient of tensor i is ready". The buffer is borrowed: it must
  // stay unchanged until the next WaitParameters(tensor) returns.
  absl::Status GradientReady(int tensor, absl::Span<const float> gradient);
  // Every gradient of this step was given: what is not yet pushed is
  // queued now, and the step (the client's clock) advances.
  absl::Status EndBackward();
  // Waits for every call in flight (after the last step): the pushes of
  // the last step and the pulls after them, so every tensor's buffer then
  // holds the parameters of the step after the last.
  absl::Status Drain();
  // Pulls every tensor again at the current step, after Drain (e.g. after
  // the job's final barrier, so evaluation sees every worker's updates under
  // SSP and ASP too). Used by the trainer and harrier.torch.
  absl::Status Refresh();

  // The options it runs with: the credit cap resolved (CreditCap) and
  // inflight_pieces_per_shard then 0.
  const CommSchedulerOptions& options() const;
  CommSchedulerStats stats() const;
  // The latest 65536 calls, with keep_dispatch_log (else empty).
  std::vector<DispatchRecord> dispatch_log_for_testing() const;
  // Pulls waiting in the queue for a slot.
  size_t queued_pulls_for_testing() const;

 private:
  class Impl;
  explicit CommScheduler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_COMM_SCHEDULER_H_
