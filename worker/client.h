#ifndef HARRIER_WORKER_CLIENT_H_
#define HARRIER_WORKER_CLIENT_H_

// The Harrier client library: what training code links to talk to the
// parameter servers. No globals: several Clients may live in one process,
// each with its own connections, threads and clock.
//
//   harrier::ClientOptions options;
//   options.servers = {"127.0.0.1:5000", "127.0.0.1:5001"};
//   auto client = harrier::Client::Create(options);      // registers, gets a rank
//   (*client)->RegisterTensor("w", {256, 784}, initial);  // first registration wins
//   for (int step = 0; step < steps; ++step) {
//     (*client)->Pull("w", weights);   // waits as the consistency model says
//     ... compute gradient ...
//     (*client)->Push("w", gradient);  // for the current clock
//     (*client)->Clock();              // next iteration
//   }

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/codec/codec_backend.h"
#include "worker/operation_handle.h"

namespace harrier {

class Partitioner;  // common/partitioner.h

struct ClientOptions {
  // host:port of every shard, shard 0 (which also serves the control plane)
  // first. The order defines shard indices and must be the same everywhere.
  std::vector<std::string> servers;
  std::string job = "harrier";
  // -1: the control plane assigns the lowest free rank.
  int rank = -1;
  std::string worker_name;
  // Deadline of every RPC, including pulls blocked by the consistency model.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // How long Create() waits for every shard to accept a connection.
  absl::Duration connect_timeout = absl::Seconds(30);
  // Tensors above this many bytes are split into chunks spread over shards.
  size_t chunk_bytes = 4u << 20;
  // How often a background thread tells every shard this worker is alive;
  // zero disables it (the shards' --heartbeat_timeout_ms must then not be
  // reached between pushes).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Start the clock where the shards have this rank (the lowest over the
  // shards of HeartbeatResponse.next_clock, asked right after Register):
  // a worker restarted mid-run, or one of a resumed run, goes on from its
  // clock. harrier-worker sets it; false starts at 0 (a program that keeps
  // its own clocks).
  bool resume_clock = false;
  // Gradient compression of pushes, a codec spec such as "topk:ratio=0.01",
  // "qsgd:levels=16,bucket=512", "efsign" or "powersgd:rank=2" (see
  // common/codec/README.md). Error feedback is kept per tensor chunk for the
  // biased codecs (topk, threshold, efsign, onebit, powersgd, unscaled
  // randomk). Chunks smaller than compress_min_bytes travel uncompressed.
  std::string codec = "none";
  // A push or pull that finds its shard UNAVAILABLE (restarting, say) is
  // retried with exponential backoff for this long; zero disables retries.
  absl::Duration retry_timeout = absl::Seconds(30);
  size_t compress_min_bytes = 16u << 10;
  // Compression of pulls (same specs as `codec`): the shard sends each chunk
  // as C(parameters - this worker's view) and keeps what C dropped for later
  // pulls; the client rebuilds the parameters in a mirror of each chunk.
  // "paired": the pull codec that goes with each tensor's push codec, so
  // `codec` alone compresses both directions (fp16 with fp16, top-k with a
  // top-k of its ratio, PowerSGD with PowerSGD, sign codecs with EF-sign;
  // the table is in common/codec/pull_pairing.h). "none": dense pulls.
  std::string pull_codec = "none";
  // Data path of pushes and pulls:
  //   "auto": per shard, "tcp" where the shard serves it (harrier-server
  //     --tcp, on by default) and this client has no TLS; "grpc" otherwise
  //     (tcp is not encrypted);
  //   "tcp": framed messages over plain TCP streams, no HTTP/2;
  //   "grpc": the gRPC streams (TLS when the channel has it);
  //   "ucx": UCX (the shards must run with --ucx; UCX_TLS picks tcp,
  //     shared memory or RDMA).
  // Control, Init, heartbeats and Leave always use gRPC. data_paths() says
  // what each shard got.
  std::string transport = "auto";
  // TCP congestion control of the tcp data path's connections: the first
  // of these names the kernel lets this process set; "" keeps the kernel's
  // default (common/transport/stream.h, SetCongestionControl: not BBR by
  // default, whose bursts overrun the shards' links from many workers).
  std::string tcp_congestion_control = "cubic,reno";
  // gRPC data connections per shard (transport "grpc"): a call of several
  // chunks and at least 8 MiB is split into one call per connection, run
  // in parallel (worker/transport/grpc/grpc_transport.h). In [1, 16].
  int grpc_connections = 1;
  // Transport "grpc": pulls travel on a TCP connection of their own per
  // shard, so pushes and pulls keep both directions of a link busy at once
  // (worker/transport/grpc/grpc_transport.h; docs/performance.md, "Both
  // directions at once").
  bool pull_connection = true;
  // Shard calls queued behind the calls in flight (max_calls_in_flight)
  // before an async operation is refused: its Wait() returns
  // RESOURCE_EXHAUSTED.
  size_t max_queued_calls = 4096;
  // Shard calls in flight at once, for pushes and for pulls and push-pulls
  // each (pulls parked by the consistency model never hold up pushes);
  // more wait in the queue above. A call holds no thread, but a few at a
  // time keep both directions of a link busy: with every call of a step in
  // flight at once, HTTP/2 shares the uplink among them all, so no reply
  // starts before nearly every push has arrived and a step costs a push
  // time plus a pull time (measured: 1.8 s against 1.5 s per replayed
  // ResNet-50 step at 1 Gbit/s with 161 push-pulls in flight, `harrier-bench
  // overlap --techniques=none`).
  // Sparse tables: a step pulls and pushes each table on each shard, small
  // calls that gain from being in flight together; with many tables raise
  // this to about tables x shards (docs/performance.md, "Sparse embedding
  // tables": +23-28 % pulled rows a second at 8 tables x 2 shards).
  int max_calls_in_flight = 4;
  // Transport security of every gRPC channel (control and gRPC data), PEM
  // file paths: tls_ca_file alone = TLS, the shards' certificates must chain
  // to it and name the host dialled; with tls_cert_file and tls_key_file
  // the worker also presents its certificate (shards with --tls_ca require
  // one). All empty: plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // The job token (the contents of --auth_token_file), sent on every call;
  // empty: none.
  std::string auth_token;
  // Compression of tensors registered with MemoryKind::kDevice: encode,
  // error feedback and pull mirrors on the device (cuda::NewCudaCodecBackend
  // in --config=cuda builds). Null: registering a device tensor fails with
  // FAILED_PRECONDITION.
  std::shared_ptr<CodecBackend> device_backend;
  // Compression of host tensors; null: the CPU codecs
  // (NewHostCodecBackend). Tests put a counting one here.
  std::shared_ptr<CodecBackend> host_backend;
  // Which shard each tensor chunk lives on. It must be the shards' own
  // placement (the servers place with HashPartitioner). Null: a
  // HashPartitioner over `servers`; otherwise its num_shards() must equal
  // servers.size().
  std::shared_ptr<const Partitioner> partitioner;
};

// Which part of a tensor a call covers, and at which clock (the comm
// scheduler's calls: worker/comm_scheduler.h). Chunks are the client's
// (chunk_bytes each, the last shorter), numbered from 0.
struct CallScope {
  int64_t clock = -1;        // -1: the client's current clock
  uint32_t first_chunk = 0;
  uint32_t num_chunks = 0;   // 0: every chunk from first_chunk
  // False: the call is left off the client's timeline (SetTimeline)
  // because its caller records it there itself, as the comm scheduler does.
  bool on_timeline = true;
};

// How a registered tensor's pushes combine on the shards.
enum class TensorKind {
  // Parameters: the shards' optimizer steps with the pushes (gradients)
  // under the job's consistency model.
  kParameters,
  // A collective: the tensor's value is the average of each round's pushes
  // (one push per live worker and clock), what an allreduce gives. Rounds
  // are BSP's whatever the job's --sync, the shards' optimizer is not
  // used, and the tensor keeps a clock of its own.
  kAverage,
};

// Client::RegisterTensor's choices for one tensor.
struct TensorOptions {
  TensorKind kind = TensorKind::kParameters;
  // Where the caller's push and pull buffers of the tensor live.
  MemoryKind memory = MemoryKind::kHost;
  // The tensor keeps a clock of its own instead of following the worker's
  // (Clock()): a push without an explicit clock is for the tensor's next
  // clock and advances it; a pull without one waits for the tensor's
  // clock. So a tensor may be registered at any point of a job and pushed
  // at its own pace (once an epoch, or never again): its clock counts this
  // worker's pushes of it, and each worker's n-th push of it meets the
  // others' n-th. A push uses its clock when it starts, so a push that
  // fails has used it too: send it again with an explicit CallScope clock.
  // Always true for kAverage.
  bool own_clock = false;
  // Codec specs of this tensor's pushes and pulls (as ClientOptions::codec
  // and pull_codec, "paired" pairing with this tensor's push codec); empty:
  // the client's.
  std::string codec;
  std::string pull_codec;
  // The buffers the caller hands to Push and Pull for this tensor are
  // staging buffers of its own (host memory only):
  // - a push's buffer is written just before the push and left alone until
  //   the push completes, so a transport sends from it as it is instead of
  //   first copying it into a send buffer of its own;
  // - a pull's buffer is read only once the pull succeeded, so a dense
  //   reply is received straight into it where the transport can (tcp,
  //   UCX; then only checked there), or copied into it while its checksum
  //   is taken (gRPC), one pass over the bytes instead of two. A corrupt
  //   reply, or a try cut short and retried, then leaves the buffer
  //   part-written until the pull ends (otherwise the buffer is left as it
  //   was). A push-pull whose gradient and output share memory is copied.
  // A buffer the caller writes while its push is in flight, or reads after
  // a failed pull, needs this false.
  bool staging_buffers = false;
};

// A sparse table: rows of `dim` floats keyed by any int64 id (an
// embedding), created on the shards on first use. Each shard holds the ids
// SparseRowShard() gives it; each row keeps its own optimizer state there.
// The table keeps a clock of its own: a worker's n-th PushRows meets the
// others' n-th, and PullRows waits as the table's consistency says.
struct SparseTableOptions {
  int64_t dim = 0;
  // Per-row optimizer on the shards: "sgd", "adagrad" (an accumulator per
  // element), "rowwise_adagrad" (one per row) or "adam".
  std::string optimizer = "sgd";
  float lr = 0.01f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float initial_accumulator = 0.0f;
  // New rows are uniform in [-init_scale, init_scale), a function of
  // (seed, table name, id) alone: every shard and restart agrees.
  float init_scale = 0.01f;
  uint64_t seed = 0;
  // Rows each shard keeps at most (0: only the shards' --max_param_bytes);
  // past it "lru" or "lfu" picks the row evicted. ttl_steps: a row unused
  // for that many of the table's clocks is evicted (0: never).
  uint64_t max_rows = 0;
  // The same as bytes per shard (rows, optimizer state, index): the lower
  // of the two budgets holds. 0: none.
  uint64_t max_bytes = 0;
  std::string eviction = "lru";
  int64_t ttl_steps = 0;
  // Admission: a new id is stored after this many pushes of it (0 or 1: at
  // once), then with probability admit_probability. Until then its pulls
  // get the initializer's row and its pushes are counted only.
  uint32_t admit_after = 0;
  float admit_probability = 1.0f;
  // The table's consistency: "" the job's --sync; "asp"; "ssp" with
  // `staleness` (a hybrid job: sparse tables asynchronous, dense BSP).
  std::string sync;
  int64_t staleness = 0;
  // Rows on the wire: "float32", "fp16" or "bf16" (both directions).
  std::string wire_dtype = "float32";
  // The worker's hot-row cache: up to cache_rows rows pulled within the
  // last cache_staleness clocks of the table are served without a call
  // (0 rows: no cache), least recently used evicted first. A row served
  // from it may miss up to cache_staleness of the table's updates, this
  // worker's own pushes included: the bound is in clocks, as SSP's.
  size_t cache_rows = 0;
  int64_t cache_staleness = 0;
};

// What a worker's sparse table did (Client::SparseStats).
struct SparseTableStats {
  uint64_t rows_pulled = 0;   // distinct ids asked of the shards
  uint64_t rows_pushed = 0;   // distinct ids pushed
  uint64_t ids_requested = 0; // ids asked by the caller, repeats included
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;
};

// One table's part of a pull of several tables' rows (Client::
// PullRowsAsync over a span): as PullRowsAsync's arguments. The spans must
// stay valid until the operation ends.
struct SparseRowsPull {
  std::string table;
  absl::Span<const int64_t> ids;
  absl::Span<float> out;
};

// One table's part of a push of several tables' gradients.
struct SparseRowsPush {
  std::string table;
  absl::Span<const int64_t> ids;
  absl::Span<const float> gradients;
};

// The shard of `num_shards` that holds row `id` of every sparse table: a
// mixing hash (splitmix64's finalizer) of the id, so that hot or
// consecutive ids do not pile onto one shard.
int SparseRowShard(int64_t id, int num_shards);

class ControlClient;   // worker/control_client.h
class ShardTransport;  // worker/transport/transport.h
class Timeline;        // worker/timeline.h

// What the control plane told this worker when it registered.
struct SyncInfo {
  std::string mode;         // "bsp", "ssp", "asp" or "local"
  int64_t staleness = 0;    // -1: unbounded
  int64_t local_steps = 1;  // H for local SGD
  // The shards' optimizer (--optimizer, --lr, --momentum, --weight_decay);
  // "delta" under local SGD, empty from shards that do not say.
  std::string optimizer;
  float lr = 0;
  float momentum = 0;
  float weight_decay = 0;
};

// Counters for progress output (monotonic, payload bytes only).
struct ClientStats {
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;
  // The two above per shard, in shard order (dense tensors).
  std::vector<uint64_t> bytes_pushed_per_shard;
  std::vector<uint64_t> bytes_pulled_per_shard;
  // Dense chunks of device tensors copied to host memory before a send (a
  // transport that cannot send from device memory).
  uint64_t bytes_staged = 0;
  // Pull reply bytes received straight into device tensors' memory (a
  // transport that ReceivesIntoDeviceMemory), not staged through the host.
  uint64_t bytes_landed = 0;
  // Pull reply bytes received straight into host staging buffers
  // (TensorOptions::staging_buffers; transports that read into host
  // memory they are given: tcp, UCX), without a receive buffer or copy.
  uint64_t bytes_landed_in_staging = 0;
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  absl::Duration push_wait;  // time spent in Wait() on push handles
  absl::Duration pull_wait;  // time spent in Wait() on pull handles
  int64_t last_min_clock = 0;  // the min clock the latest pull reply carried
};

// Thread-safe: any method may be called from any thread. Buffers handed to
// an async call must stay valid until Wait() on its handle has returned (or,
// if nobody waits, until the Client is destroyed). Handles must not be
// waited on after the Client is gone.
class Client {
 public:
  // Owns its operation: dropping a handle without Wait() frees it once its
  // shard calls end. Copyable; the first Wait() on any copy consumes it.
  using Handle = OperationHandle;

  // Connects to every shard and registers with shard 0. UNAVAILABLE if a
  // shard cannot be reached within connect_timeout; INVALID_ARGUMENT for bad
  // options.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  // The same over given parts (tests: fakes, no process): `transports[i]`
  // is shard i's data path; options.servers only names the shards and
  // options.transport is not used. Registers through `control`.
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options, std::unique_ptr<ControlClient> control,
      std::vector<std::unique_ptr<ShardTransport>> transports);
  // Gives the worker's session back (best effort, at most 500 ms), so its
  // rank is free for another worker at once.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int rank() const;
  int num_workers() const;
  int num_shards() const;
  // Each shard's data path, in shard order: "tcp", "grpc", "ucx" (or the
  // given transports' names). The one in use now: under "auto", a shard
  // that restarted without tcp moves from "tcp" to "grpc".
  std::vector<std::string> data_paths() const;
  // ClientOptions::chunk_bytes: chunk c of tensor k holds elements
  // [c * chunk_bytes / 4, ...) and lives on partitioner()'s shard.
  size_t chunk_bytes() const;
  // The placement of every chunk (ClientOptions::partitioner).
  const Partitioner& partitioner() const;
  const SyncInfo& sync() const;

  // Declares a dense float32 tensor. The first worker to register a name
  // initialises it on the shards with `initial_values` (zeros when empty);
  // later registrations must agree on the shape (INVALID_ARGUMENT otherwise)
  // and keep the existing values: Pull to read them.
  absl::Status RegisterTensor(const std::string& name, const std::vector<int64_t>& shape,
                              absl::Span<const float> initial_values = {});
  // The same for a tensor whose push and pull buffers live in `memory`
  // (initial_values are always host memory). With kDevice every buffer
  // later handed to Push/Pull for this name is a device pointer; the
  // tensor is compressed by options.device_backend (FAILED_PRECONDITION
  // without one), and dense chunks are staged through host memory unless
  // the transport sends from device memory.
  absl::Status RegisterTensor(const std::string& name, const std::vector<int64_t>& shape,
                              absl::Span<const float> initial_values, MemoryKind memory);
  // The same with every choice (TensorOptions). Every worker registers a
  // name with the same kind and clock (INVALID_ARGUMENT otherwise).
  absl::Status RegisterTensor(const std::string& name, const std::vector<int64_t>& shape,
                              absl::Span<const float> initial_values,
                              const TensorOptions& options);
  // The clock the tensor's next push is for: its own (TensorOptions::
  // own_clock) or the worker's. NOT_FOUND for a name not registered.
  absl::StatusOr<int64_t> TensorClock(const std::string& name) const;

  // Declares a sparse table on every shard (the first worker creates it;
  // later registrations must agree on its options: INVALID_ARGUMENT).
  absl::Status RegisterSparseTable(const std::string& name, const SparseTableOptions& options);
  // The rows of `ids` (any int64, repeats allowed) into `out` (ids.size()
  // x dim floats, row i for ids[i]), at the table's current clock. Each
  // distinct id is asked once, of the shard that holds it.
  Handle PullRowsAsync(const std::string& name, absl::Span<const int64_t> ids,
                       absl::Span<float> out);
  // Gradients for the rows of `ids` (ids.size() x dim floats); the
  // gradients of a repeated id are summed before they leave. One push per
  // shard, empty where a shard holds none of the ids, so that every shard
  // sees the table's clock advance; the table's clock advances by one.
  Handle PushRowsAsync(const std::string& name, absl::Span<const int64_t> ids,
                       absl::Span<const float> gradients);
  absl::Status PullRows(const std::string& name, absl::Span<const int64_t> ids,
                        absl::Span<float> out);
  absl::Status PushRows(const std::string& name, absl::Span<const int64_t> ids,
                        absl::Span<const float> gradients);
  // Several tables in one operation, as a step of a model with many
  // tables does: one call per shard carries every table's ids (pulls: one
  // per clock when the tables' clocks differ), where one operation per
  // table makes tables x shards calls. Each table's part is checked as the
  // one-table forms check theirs, all before anything is sent (a refused
  // operation changes no clock); a table may appear once.
  Handle PullRowsAsync(absl::Span<const SparseRowsPull> pulls);
  Handle PushRowsAsync(absl::Span<const SparseRowsPush> pushes);
  // NOT_FOUND for a name not registered as a sparse table.
  absl::StatusOr<SparseTableStats> SparseStats(const std::string& name) const;

  // Sends `gradient` for the current clock. Pushes of one clock may be in
  // flight for many tensors at once.
  Handle PushAsync(const std::string& name, absl::Span<const float> gradient);
  // Fetches the tensor's parameters at the current clock into `out`.
  Handle PullAsync(const std::string& name, absl::Span<float> out);
  // The same on the chunks `scope` selects, at its clock. `gradient` and
  // `out` are still whole-tensor buffers: only the selected chunks'
  // elements are read or written. A scope out of the tensor's chunks (or a
  // clock below -1) fails with INVALID_ARGUMENT and sends nothing.
  Handle PushAsync(const std::string& name, absl::Span<const float> gradient,
                   const CallScope& scope);
  Handle PullAsync(const std::string& name, absl::Span<float> out, const CallScope& scope);
  // Push for the current clock, then fetch the parameters of clock + 1.
  Handle PushPullAsync(const std::string& name, absl::Span<const float> gradient,
                       absl::Span<float> out);

  // Waits for an operation. On success or error the handle is consumed. If
  // `deadline` passes first, the operation is cancelled (its buffers are no
  // longer touched when this returns) and DEADLINE_EXCEEDED is returned;
  // INTERNAL naming the operation if its calls still run rpc_timeout after
  // the cancel (a transport that ignores cancellation: the buffers may then
  // still be in use). NOT_FOUND for a default or already-waited handle.
  absl::Status Wait(const Handle& handle, absl::Time deadline = absl::InfiniteFuture());
  // Consumes the operation as Wait() does, handing its outcome to `done`
  // instead of blocking: at once, on this thread, if it has finished (or
  // for a default or already-waited handle: NOT_FOUND), else on the thread
  // that completes its last transport call (a transport or timer thread),
  // so `done` must be quick and must not block or call Wait. At `deadline`
  // the operation is cancelled and `done` gets DEADLINE_EXCEEDED once its
  // calls have ended. The buffers are the client's until `done` runs.
  void WhenDone(const Handle& handle, absl::Time deadline,
                std::function<void(absl::Status)> done);

  absl::Status Push(const std::string& name, absl::Span<const float> gradient);
  absl::Status Pull(const std::string& name, absl::Span<float> out);
  absl::Status PushPull(const std::string& name, absl::Span<const float> gradient,
                        absl::Span<float> out);

  // Blocks until every worker has entered the barrier of this name.
  absl::Status Barrier(const std::string& name);
  // Tells the control plane and every shard this worker is alive, at its
  // current clock (what the background loop does every heartbeat_interval).
  absl::Status Heartbeat();

  // The epoch of this worker's session (from Register; 0 before).
  uint64_t session_epoch() const;

  // Tells every shard this worker has pushed its last clock, so no pull or
  // BSP round waits for it any more (workers may run uneven step counts).
  // Pushes after Leave() fail with FAILED_PRECONDITION.
  absl::Status Leave();

  // Advances this worker's iteration: later pushes are for the next clock
  // and later pulls wait for it.
  void Clock();
  int64_t clock() const;

  ClientStats stats() const;

  // Operations started from now on, and every Wait that has to block, go
  // on `timeline` (worker/timeline.h; null: none): each operation from its
  // start to its end on a lane of its kind ("push 1", "pull 1",
  // "push-pull 1", ...), the waits on the row "waits". Operations keep the
  // timeline alive until they end.
  void SetTimeline(std::shared_ptr<Timeline> timeline);
  // SetTimeline with a new timeline written to `path` (a Chrome trace, as
  // harrier-worker's --timeline), recording at most `max_bytes`: what a
  // program built against the installed library, which does not install
  // worker/timeline.h, calls.
  // INVALID_ARGUMENT when the file cannot be made, FAILED_PRECONDITION while
  // a timeline is on the client or another timeline of this process writes
  // that file.
  absl::Status StartTimeline(const std::string& path, uint64_t max_bytes = uint64_t{256} << 20);
  // Takes the timeline off the client and ends its file, waiting at most
  // `timeout` for the file (worker/timeline.h, Close). OK without one.
  absl::Status StopTimeline(absl::Duration timeout = absl::Seconds(10));
  // The timeline operations go on now; null: none.
  std::shared_ptr<Timeline> timeline() const;

  // Operations alive (held by a handle or running), for tests of leaks.
  int64_t live_operations_for_testing() const;

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_CLIENT_H_
