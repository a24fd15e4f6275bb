#include "worker/client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codec/codec.h"
#include "common/codec/error_feedback.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "common/grpc_status.h"
#include "common/partitioner.h"
#include "common/thread_pool.h"
#include "proto/harrier.grpc.pb.h"
#include "worker/transport/grpc/grpc_transport.h"
#include "worker/transport/transport.h"
#include "worker/transport/ucx/ucx_transport.h"

namespace harrier {
namespace {

// One RPC-level unit of an operation: the chunks of one tensor on one shard.
struct ShardGroup {
  int shard = 0;
  std::vector<ChunkSpan> spans;
};

struct TensorInfo {
  std::vector<int64_t> shape;
  size_t num_elements = 0;
  std::vector<ShardGroup> groups;
};

enum class OpKind { kPush, kPull, kPushPull };

// Compression state of one tensor chunk: its codec (PowerSGD keeps a warm
// start in it) and error-feedback residual. Pushes of one chunk are
// serialised by the mutex.
struct ChunkCompression {
  std::mutex mutex;
  std::unique_ptr<Codec> codec;
  std::unique_ptr<ErrorFeedback> error_feedback;  // null: codec needs none
};

// The parameters of one chunk as rebuilt from compressed pull replies.
struct PullMirror {
  std::mutex mutex;
  std::vector<float> values;  // empty until the first (dense) reply
};

bool NeedsErrorFeedback(const CodecSpec& spec) {
  switch (spec.id) {
    case CodecId::kTopK:
    case CodecId::kThreshold:
    case CodecId::kEfSign:
    case CodecId::kOneBit:
    case CodecId::kPowerSgd:
      return true;
    case CodecId::kRandomK:
      return !spec.scaled;
    default:
      return false;
  }
}

// The shared state of one async operation. Tasks on the pools decrement
// `remaining`; the first error wins.
struct Operation {
  explicit Operation(OpKind kind) : kind(kind) {}
  const OpKind kind;
  std::mutex mutex;
  std::condition_variable finished;
  int remaining = 0;
  absl::Status status;
  CallCanceller canceller;

  void Finish(const absl::Status& task_status) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!task_status.ok() && status.ok()) status = task_status;
    if (--remaining == 0) finished.notify_all();
  }
};

std::chrono::system_clock::time_point ToChrono(absl::Time time) { return absl::ToChronoTime(time); }

}  // namespace

class Client::Impl {
 public:
  explicit Impl(const ClientOptions& options)
      : options_(options),
        partitioner_(static_cast<int>(options.servers.size())),
        push_pool_(2 * static_cast<int>(options.servers.size()) + 2),
        pull_pool_(2 * static_cast<int>(options.servers.size()) + 2) {}

  absl::Status Connect();
  // One UCX worker for all shards; each shard's address comes over gRPC.
  absl::Status ConnectUcx(absl::Time deadline);

  ClientOptions options_;
  CodecSpec codec_spec_;
  std::string codec_params_;  // codec_spec_.ToString(), formatted once
  HashPartitioner partitioner_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  // Init, heartbeats and leave always go over gRPC; pushes and pulls over
  // the chosen transport.
  std::vector<std::unique_ptr<proto::ParameterService::Stub>> stubs_;
  std::vector<std::unique_ptr<ShardTransport>> transports_;
  std::unique_ptr<proto::ControlService::Stub> control_;
  int rank_ = 0;
  int num_workers_ = 0;
  SyncInfo sync_;
  std::atomic<int64_t> clock_{0};

  mutable std::shared_mutex tensors_mutex_;
  std::unordered_map<std::string, TensorInfo> tensors_;
  // "name#chunk" -> compression state; guarded by tensors_mutex_ for the map,
  // each entry by its own mutex.
  std::unordered_map<std::string, std::unique_ptr<ChunkCompression>> compression_;

  // Compressed pulls: "name#chunk" -> this worker's view of the chunk, which
  // compressed replies update. Guarded like compression_.
  std::unordered_map<std::string, std::unique_ptr<PullMirror>> mirrors_;
  CodecSpec pull_codec_spec_;
  std::string pull_codec_params_;       // pull_codec_spec_.ToString(), as sent
  std::unique_ptr<Codec> pull_codec_;   // decodes replies; Decode is const, shared

  PullMirror* MirrorFor(const std::string& name, uint32_t chunk) const {
    std::shared_lock<std::shared_mutex> lock(tensors_mutex_);
    auto it = mirrors_.find(absl::StrCat(name, "#", chunk));
    return it == mirrors_.end() ? nullptr : it->second.get();
  }

  ChunkCompression* CompressionFor(const std::string& name, uint32_t chunk) const {
    std::shared_lock<std::shared_mutex> lock(tensors_mutex_);
    auto it = compression_.find(absl::StrCat(name, "#", chunk));
    return it == compression_.end() ? nullptr : it->second.get();
  }

  std::mutex ops_mutex_;
  std::unordered_map<Handle, std::shared_ptr<Operation>> ops_;
  Handle next_handle_ = 1;

  std::atomic<uint64_t> bytes_pushed_{0}, bytes_pulled_{0}, pushes_{0}, pulls_{0};
  std::atomic<int64_t> push_wait_ns_{0}, pull_wait_ns_{0}, last_min_clock_{0};

  ThreadPool push_pool_;
  ThreadPool pull_pool_;

  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_wake_;
  bool heartbeat_stop_ = false;
  std::thread heartbeat_thread_;

  void HeartbeatLoop();

  std::string ShardName(int shard) const {
    return absl::StrCat("shard ", shard, " (", options_.servers[shard], ")");
  }
  absl::Status ShardError(int shard, const grpc::Status& status) const {
    absl::Status s = FromGrpcStatus(status);
    return absl::Status(s.code(), absl::StrCat(ShardName(shard), ": ", s.message()));
  }
  absl::StatusOr<TensorInfo> Lookup(const std::string& name, size_t elements) const;
  // Dense chunks borrow `data`: it must outlive the transport call.
  absl::Status FillChunk(const std::string& name, const ChunkSpan& span, const float* data,
                         int64_t clock, OutgoingChunk* chunk) const;
  absl::Status ReadChunk(const std::string& name, const ShardGroup& group,
                         const proto::TensorChunk& reply, const PayloadView& payload, float* out);
  absl::Time Deadline() const { return absl::Now() + options_.rpc_timeout; }
  absl::StatusOr<std::vector<OutgoingChunk>> BuildChunks(const std::string& name,
                                                         const ShardGroup& group,
                                                         const float* gradient, int64_t clock);
  // Runs `attempt` until it succeeds, fails with anything but UNAVAILABLE,
  // or retry_timeout has passed (backoff 50 ms doubling to 1 s).
  absl::Status WithRetries(CallCanceller& canceller, const std::function<absl::Status()>& attempt);
  // WithRetries, then the shard's name in front of any error.
  absl::Status OnShard(Operation& op, const ShardGroup& group,
                       const std::function<absl::Status()>& attempt);
  // Runs a pull-like call with retries, reading every reply chunk into
  // `out`; DATA_LOSS if a chunk did not arrive.
  absl::Status ReceiveInto(Operation& op, const std::string& name, const ShardGroup& group,
                           float* out,
                           const std::function<absl::Status(const ChunkViewSink&)>& call);
  absl::Status CheckAllArrived(const std::string& name, const ShardGroup& group,
                               size_t received) const;
  void SetDeadline(grpc::ClientContext* context) const {
    context->set_deadline(ToChrono(absl::Now() + options_.rpc_timeout));
  }

  absl::Status PushGroup(Operation& op, const std::string& name, const ShardGroup& group,
                         const float* gradient, int64_t clock);
  absl::Status PullGroup(Operation& op, const std::string& name, const ShardGroup& group,
                         float* out, int64_t clock);
  absl::Status PushPullGroup(Operation& op, const std::string& name, const ShardGroup& group,
                             const float* gradient, float* out, int64_t clock);

  // One shard group's part of an operation, at a clock.
  using GroupRun = std::function<absl::Status(Operation&, const ShardGroup&, int64_t clock)>;
  GroupRun PushRun(const std::string& name, const float* gradient);
  GroupRun PullRun(const std::string& name, float* out);
  GroupRun PushPullRun(const std::string& name, const float* gradient, float* out);
  absl::StatusOr<TensorInfo> LookupPair(const std::string& name, size_t in_elements,
                                        size_t out_elements) const;
  // Runs `run` for every shard group of the tensor on the operation's pool.
  Handle StartGroups(OpKind kind, const absl::StatusOr<TensorInfo>& info, const GroupRun& run);
  // The blocking form: on the calling thread when the tensor has one group.
  absl::Status RunBlocking(Client& client, OpKind kind, const absl::StatusOr<TensorInfo>& info,
                           const GroupRun& run);
  void CountStart(OpKind kind);

  Handle Start(std::shared_ptr<Operation> op, const absl::Status& early_error,
               const std::vector<std::function<void()>>& tasks, ThreadPool& pool);
};

absl::Status Client::Impl::ConnectUcx(absl::Time deadline) {
  auto context = UcxClientContext::Create(absl::StrCat("harrier-worker-", options_.worker_name));
  if (!context.ok()) return context.status();
  for (size_t shard = 0; shard < stubs_.size(); ++shard) {
    grpc::ClientContext rpc;
    rpc.set_deadline(ToChrono(deadline));
    proto::TransportAddressRequest request;
    request.set_transport("ucx");
    proto::TransportAddressResponse response;
    if (auto status = stubs_[shard]->GetTransportAddress(&rpc, request, &response);
        !status.ok()) {
      return ShardError(static_cast<int>(shard), status);
    }
    // Over shared memory UCX cannot see a dead shard, so a waiting call asks
    // the shard over gRPC (a side-effect-free RPC): UNAVAILABLE means dead.
    // The channel's state alone is not enough: after a crash it can stay
    // READY for seconds.
    proto::ParameterService::Stub* stub = stubs_[shard].get();
    auto transport = UcxClientContext::Connect(
        *context, ShardName(static_cast<int>(shard)), response.address(), deadline, [stub] {
          grpc::ClientContext probe;
          probe.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
          proto::TransportAddressRequest probe_request;
          proto::TransportAddressResponse probe_response;
          return stub->GetTransportAddress(&probe, probe_request, &probe_response).error_code() !=
                 grpc::StatusCode::UNAVAILABLE;
        },
        // After the shard failed (say it restarted: a new worker address),
        // the transport asks for its current address and reconnects.
        [this, stub, shard](absl::Time address_deadline) -> absl::StatusOr<std::string> {
          grpc::ClientContext address_rpc;
          address_rpc.set_deadline(ToChrono(address_deadline));
          proto::TransportAddressRequest address_request;
          address_request.set_transport("ucx");
          proto::TransportAddressResponse address_response;
          if (auto status =
                  stub->GetTransportAddress(&address_rpc, address_request, &address_response);
              !status.ok()) {
            return ShardError(static_cast<int>(shard), status);
          }
          return address_response.address();
        });
    if (!transport.ok()) return transport.status();
    transports_.push_back(std::move(*transport));
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::Connect() {
  const auto args = MakeChannelArguments();
  const absl::Time connect_deadline = absl::Now() + options_.connect_timeout;
  for (size_t shard = 0; shard < options_.servers.size(); ++shard) {
    auto channel = grpc::CreateCustomChannel(options_.servers[shard],
                                             grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(ToChrono(connect_deadline))) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ",
                                                 ShardName(static_cast<int>(shard)), " within ",
                                                 absl::FormatDuration(options_.connect_timeout)));
    }
    stubs_.push_back(proto::ParameterService::NewStub(channel));
    if (options_.transport == "grpc") {
      transports_.push_back(std::make_unique<GrpcShardTransport>(channel));
    }
    channels_.push_back(std::move(channel));
  }
  if (options_.transport == "ucx") {
    if (auto status = ConnectUcx(connect_deadline); !status.ok()) return status;
  }
  control_ = proto::ControlService::NewStub(channels_[0]);

  proto::RegisterRequest request;
  request.set_job(options_.job);
  request.set_requested_rank(options_.rank);
  request.set_worker_name(options_.worker_name);
  proto::RegisterResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  if (auto status = control_->Register(&context, request, &response); !status.ok()) {
    return ShardError(0, status);
  }
  rank_ = static_cast<int>(response.rank());
  num_workers_ = static_cast<int>(response.num_workers());
  switch (response.sync().mode()) {
    case proto::SYNC_SSP:
      sync_.mode = "ssp";
      break;
    case proto::SYNC_ASP:
      sync_.mode = "asp";
      break;
    case proto::SYNC_LOCAL:
      sync_.mode = "local";
      break;
    default:
      sync_.mode = "bsp";
      break;
  }
  sync_.staleness = response.sync().staleness();
  sync_.local_steps = response.sync().local_steps();
  return absl::OkStatus();
}

absl::StatusOr<TensorInfo> Client::Impl::Lookup(const std::string& name, size_t elements) const {
  std::shared_lock<std::shared_mutex> lock(tensors_mutex_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' is not registered"));
  }
  if (it->second.num_elements != elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has ",
                                                   it->second.num_elements,
                                                   " elements, got a buffer of ", elements));
  }
  return it->second;
}

absl::Status Client::Impl::FillChunk(const std::string& name, const ChunkSpan& span,
                                     const float* data, int64_t clock,
                                     OutgoingChunk* out) const {
  proto::TensorChunk* chunk = &out->header;
  chunk->set_job(options_.job);
  chunk->set_rank(static_cast<uint32_t>(rank_));
  chunk->set_key(name);
  chunk->set_chunk(span.chunk);
  chunk->set_clock(clock);
  chunk->set_num_elements(span.num_elements);
  if (MirrorFor(name, span.chunk) != nullptr) {
    chunk->set_pull_codec_params(pull_codec_params_);
  }
  chunk->set_dtype(proto::DTYPE_FLOAT32);
  ChunkCompression* compression = CompressionFor(name, span.chunk);
  if (compression == nullptr) {
    chunk->set_codec(0);
    chunk->clear_codec_params();
    // Not copied: the transport sends straight from the caller's gradient.
    out->borrowed = absl::string_view(reinterpret_cast<const char*>(data + span.offset),
                                      span.num_elements * sizeof(float));
    out->is_borrowed = true;
  } else {
    std::lock_guard<std::mutex> lock(compression->mutex);
    const auto input = absl::MakeConstSpan(data + span.offset, span.num_elements);
    CodecContext context;
    context.seed =
        DeriveSeed(name, span.chunk, clock, static_cast<uint32_t>(rank_), codec_spec_.seed);
    absl::Status status =
        compression->error_feedback
            ? compression->error_feedback->Compress(*compression->codec, input, context,
                                                    &out->owned)
            : compression->codec->Encode(input, context, &out->owned);
    out->is_borrowed = false;
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("tensor '", name, "' chunk ", span.chunk,
                                                      ": ", status.message()));
    }
    chunk->set_codec(static_cast<uint32_t>(codec_spec_.id));
    chunk->set_codec_params(codec_params_);
  }
  const absl::string_view payload = out->payload();
  chunk->set_checksum(Crc32c(payload.data(), payload.size()));
  return absl::OkStatus();
}

absl::Status Client::Impl::ReadChunk(const std::string& name, const ShardGroup& group,
                                     const proto::TensorChunk& reply,
                                     const PayloadView& payload, float* out) {
  const ChunkSpan* span = nullptr;
  for (const ChunkSpan& candidate : group.spans) {
    if (candidate.chunk == reply.chunk()) span = &candidate;
  }
  const bool compressed = reply.codec() != 0;
  if (reply.key() != name || span == nullptr || reply.num_elements() != span->num_elements ||
      (!compressed && payload.size() != span->num_elements * sizeof(float))) {
    return absl::DataLossError(absl::StrCat(ShardName(group.shard), ": reply for '", reply.key(),
                                            "' chunk ", reply.chunk(),
                                            " does not match the request for '", name, "'"));
  }
  // Checked before anything is written, so a corrupt reply leaves `out` as
  // it was; then one copy, straight from the received slices.
  uint32_t crc = 0;
  for (absl::string_view piece : payload.pieces()) {
    crc = Crc32cExtend(crc, piece.data(), piece.size());
  }
  if (crc != reply.checksum()) {
    return absl::DataLossError(absl::StrCat(ShardName(group.shard), ": checksum mismatch in '",
                                            name, "' chunk ", reply.chunk()));
  }
  PullMirror* mirror = MirrorFor(name, span->chunk);
  if (!compressed) {
    payload.CopyTo(out + span->offset);
    if (mirror != nullptr) {
      std::lock_guard<std::mutex> lock(mirror->mutex);
      mirror->values.assign(out + span->offset, out + span->offset + span->num_elements);
    }
  } else {
    // A compressed reply is the difference to this worker's view: decode it
    // into the mirror, then hand out the mirror.
    if (mirror == nullptr) {
      return absl::DataLossError(absl::StrCat(ShardName(group.shard), ": compressed reply for '",
                                              name, "' chunk ", reply.chunk(),
                                              " that was pulled uncompressed"));
    }
    if (reply.codec_params() != pull_codec_params_) {
      return absl::DataLossError(absl::StrCat(ShardName(group.shard), ": reply for '", name,
                                              "' chunk ", reply.chunk(), " uses codec '",
                                              reply.codec_params(), "', requested '",
                                              pull_codec_params_, "'"));
    }
    // Decoders read one contiguous buffer; replies may arrive in pieces.
    std::string joined;
    absl::string_view bytes = payload.first();
    if (!payload.contiguous()) {
      joined.resize(payload.size());
      payload.CopyTo(joined.data());
      bytes = joined;
    }
    std::lock_guard<std::mutex> lock(mirror->mutex);
    if (mirror->values.size() != span->num_elements) {
      return absl::DataLossError(absl::StrCat("compressed reply for '", name, "' chunk ",
                                              reply.chunk(), " before its first dense one"));
    }
    if (auto status = pull_codec_->DecodeAdd(bytes, 1.0f, absl::MakeSpan(mirror->values));
        !status.ok()) {
      return absl::DataLossError(absl::StrCat(ShardName(group.shard), ": '", name, "' chunk ",
                                              reply.chunk(), ": ", status.message()));
    }
    std::memcpy(out + span->offset, mirror->values.data(), span->num_elements * sizeof(float));
  }
  bytes_pulled_ += payload.size();
  last_min_clock_ = reply.min_clock();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OutgoingChunk>> Client::Impl::BuildChunks(const std::string& name,
                                                                     const ShardGroup& group,
                                                                     const float* gradient,
                                                                     int64_t clock) {
  std::vector<OutgoingChunk> chunks(group.spans.size());
  for (size_t i = 0; i < group.spans.size(); ++i) {
    if (auto status = FillChunk(name, group.spans[i], gradient, clock, &chunks[i]); !status.ok()) {
      return status;
    }
    bytes_pushed_ += chunks[i].payload().size();
  }
  return chunks;
}

absl::Status Client::Impl::WithRetries(CallCanceller& canceller,
                                       const std::function<absl::Status()>& attempt) {
  const absl::Time give_up = absl::Now() + options_.retry_timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  for (;;) {
    absl::Status status = attempt();
    if (!absl::IsUnavailable(status) || canceller.cancelled() || absl::Now() + backoff > give_up) {
      return status;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::Status Client::Impl::CheckAllArrived(const std::string& name, const ShardGroup& group,
                                           size_t received) const {
  if (received == group.spans.size()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(ShardName(group.shard), ": ", received, " of ",
                                          group.spans.size(), " chunks of '", name, "' arrived"));
}

absl::Status Client::Impl::OnShard(Operation& op, const ShardGroup& group,
                                   const std::function<absl::Status()>& attempt) {
  absl::Status status = WithRetries(op.canceller, attempt);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(ShardName(group.shard), ": ", status.message()));
}

absl::Status Client::Impl::ReceiveInto(
    Operation& op, const std::string& name, const ShardGroup& group, float* out,
    const std::function<absl::Status(const ChunkViewSink&)>& call) {
  size_t received = 0;
  const ChunkViewSink sink = [&](const proto::TensorChunk& reply, const PayloadView& payload) {
    ++received;
    return ReadChunk(name, group, reply, payload, out);
  };
  absl::Status status = OnShard(op, group, [&] {
    received = 0;  // a retried call starts over
    return call(sink);
  });
  if (!status.ok()) return status;
  return CheckAllArrived(name, group, received);
}

absl::Status Client::Impl::PushGroup(Operation& op, const std::string& name,
                                     const ShardGroup& group, const float* gradient,
                                     int64_t clock) {
  auto chunks = BuildChunks(name, group, gradient, clock);
  if (!chunks.ok()) return chunks.status();
  return OnShard(op, group, [&] {
    return transports_[group.shard]->Push(*chunks, Deadline(), op.canceller);
  });
}

absl::Status Client::Impl::PullGroup(Operation& op, const std::string& name,
                                     const ShardGroup& group, float* out, int64_t clock) {
  proto::PullRequest request;
  request.set_job(options_.job);
  request.set_rank(static_cast<uint32_t>(rank_));
  request.set_clock(clock);
  for (const ChunkSpan& span : group.spans) {
    proto::ChunkRef* ref = request.add_chunks();
    ref->set_key(name);
    ref->set_chunk(span.chunk);
    ref->set_num_elements(span.num_elements);
    if (MirrorFor(name, span.chunk) != nullptr) ref->set_codec_params(pull_codec_params_);
  }
  return ReceiveInto(op, name, group, out, [&](const ChunkViewSink& sink) {
    return transports_[group.shard]->Pull(request, sink, Deadline(), op.canceller);
  });
}

absl::Status Client::Impl::PushPullGroup(Operation& op, const std::string& name,
                                         const ShardGroup& group, const float* gradient, float* out,
                                         int64_t clock) {
  auto chunks = BuildChunks(name, group, gradient, clock);
  if (!chunks.ok()) return chunks.status();
  return ReceiveInto(op, name, group, out, [&](const ChunkViewSink& sink) {
    return transports_[group.shard]->PushPull(*chunks, sink, Deadline(), op.canceller);
  });
}

void Client::Impl::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(heartbeat_mutex_);
  while (!heartbeat_stop_) {
    lock.unlock();
    for (size_t shard = 0; shard < stubs_.size(); ++shard) {
      proto::HeartbeatRequest request;
      request.set_job(options_.job);
      request.set_rank(static_cast<uint32_t>(rank_));
      request.set_clock(clock_);
      proto::HeartbeatResponse response;
      grpc::ClientContext context;
      context.set_deadline(ToChrono(absl::Now() + absl::Seconds(2)));
      // A failed heartbeat is not an error of any operation: the calls that
      // matter report the shard's state themselves.
      stubs_[shard]->Heartbeat(&context, request, &response);
    }
    lock.lock();
    heartbeat_wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.heartbeat_interval),
                             [this] { return heartbeat_stop_; });
  }
}

Client::Handle Client::Impl::Start(std::shared_ptr<Operation> op, const absl::Status& early_error,
                                   const std::vector<std::function<void()>>& tasks,
                                   ThreadPool& pool) {
  Handle handle;
  {
    std::lock_guard<std::mutex> lock(ops_mutex_);
    handle = next_handle_++;
    ops_[handle] = op;
  }
  if (!early_error.ok()) {
    op->status = early_error;
    op->remaining = 0;
    return handle;
  }
  op->remaining = static_cast<int>(tasks.size());
  for (const auto& task : tasks) pool.Submit(task);
  return handle;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  {
    std::lock_guard<std::mutex> lock(impl_->heartbeat_mutex_);
    impl_->heartbeat_stop_ = true;
  }
  impl_->heartbeat_wake_.notify_all();
  if (impl_->heartbeat_thread_.joinable()) impl_->heartbeat_thread_.join();
  // Cancel whatever is still in flight so the pools drain quickly.
  std::vector<std::shared_ptr<Operation>> ops;
  {
    std::lock_guard<std::mutex> lock(impl_->ops_mutex_);
    for (auto& entry : impl_->ops_) ops.push_back(entry.second);
  }
  for (auto& op : ops) op->canceller.CancelAll();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.servers is empty: need host:port of every shard");
  }
  for (const auto& server : options.servers) {
    if (server.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("server address '", server, "' is not host:port"));
    }
  }
  if (options.chunk_bytes < sizeof(float) || options.chunk_bytes > (32u << 20)) {
    return absl::InvalidArgumentError("chunk_bytes must be in [4, 32 MiB]");
  }
  if (options.transport != "grpc" && options.transport != "ucx") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown transport '", options.transport, "' (grpc or ucx)"));
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("rpc_timeout must be positive");
  }
  auto spec = CodecSpec::Parse(options.codec);
  if (!spec.ok()) return spec.status();
  auto impl = std::make_unique<Impl>(options);
  impl->codec_spec_ = *spec;
  impl->codec_params_ = spec->ToString();
  auto pull_spec = CodecSpec::Parse(options.pull_codec);
  if (!pull_spec.ok()) return pull_spec.status();
  impl->pull_codec_spec_ = *pull_spec;
  impl->pull_codec_params_ = pull_spec->ToString();
  auto pull_codec = CreateCodec(*pull_spec);
  if (!pull_codec.ok()) return pull_codec.status();
  impl->pull_codec_ = std::move(*pull_codec);
  if (auto status = impl->Connect(); !status.ok()) return status;
  if (options.heartbeat_interval > absl::ZeroDuration()) {
    Impl* raw = impl.get();
    impl->heartbeat_thread_ = std::thread([raw] { raw->HeartbeatLoop(); });
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

int Client::rank() const { return impl_->rank_; }
int Client::num_workers() const { return impl_->num_workers_; }
int Client::num_shards() const { return static_cast<int>(impl_->options_.servers.size()); }
const SyncInfo& Client::sync() const { return impl_->sync_; }
void Client::Clock() { impl_->clock_++; }
int64_t Client::clock() const { return impl_->clock_; }

absl::Status Client::RegisterTensor(const std::string& name, const std::vector<int64_t>& shape,
                                    absl::Span<const float> initial_values) {
  if (name.empty()) return absl::InvalidArgumentError("tensor name is empty");
  size_t elements = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': negative dimension"));
    }
    elements *= static_cast<size_t>(dim);
  }
  if (!initial_values.empty() && initial_values.size() != elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", initial_values.size(),
                                                   " initial values for ", elements, " elements"));
  }
  std::vector<float> zeros;
  if (initial_values.empty()) {
    zeros.assign(elements, 0.0f);
    initial_values = zeros;
  }
  TensorInfo info;
  info.shape = shape;
  info.num_elements = elements;
  const size_t chunk_elements = std::max<size_t>(1, impl_->options_.chunk_bytes / sizeof(float));
  std::map<int, ShardGroup> by_shard;
  for (const ChunkSpan& span :
       SplitIntoChunks(name, elements, chunk_elements, impl_->partitioner_)) {
    by_shard[span.shard].shard = span.shard;
    by_shard[span.shard].spans.push_back(span);
    proto::InitRequest request;
    request.set_job(impl_->options_.job);
    request.set_rank(static_cast<uint32_t>(impl_->rank_));
    request.set_key(name);
    request.set_chunk(span.chunk);
    for (int64_t dim : shape) request.add_shape(static_cast<uint64_t>(dim));
    request.set_num_elements(span.num_elements);
    request.set_dtype(proto::DTYPE_FLOAT32);
    request.mutable_initial_values()->assign(
        reinterpret_cast<const char*>(initial_values.data() + span.offset),
        span.num_elements * sizeof(float));
    request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
    proto::InitResponse response;
    grpc::ClientContext context;
    impl_->SetDeadline(&context);
    if (auto status = impl_->stubs_[span.shard]->Init(&context, request, &response); !status.ok()) {
      return impl_->ShardError(span.shard, status);
    }
  }
  std::unordered_map<std::string, std::unique_ptr<ChunkCompression>> compression;
  if (impl_->codec_spec_.id != CodecId::kNone) {
    for (auto& entry : by_shard) {
      for (const ChunkSpan& span : entry.second.spans) {
        if (span.num_elements * sizeof(float) < impl_->options_.compress_min_bytes) continue;
        auto state = std::make_unique<ChunkCompression>();
        auto codec = CreateCodec(impl_->codec_spec_);
        if (!codec.ok()) return codec.status();
        state->codec = std::move(*codec);
        if (NeedsErrorFeedback(impl_->codec_spec_)) {
          state->error_feedback = std::make_unique<ErrorFeedback>(span.num_elements);
        }
        compression[absl::StrCat(name, "#", span.chunk)] = std::move(state);
      }
    }
  }
  std::unordered_map<std::string, std::unique_ptr<PullMirror>> mirrors;
  if (impl_->pull_codec_spec_.id != CodecId::kNone) {
    for (auto& entry : by_shard) {
      for (const ChunkSpan& span : entry.second.spans) {
        if (span.num_elements * sizeof(float) < impl_->options_.compress_min_bytes) continue;
        mirrors[absl::StrCat(name, "#", span.chunk)] = std::make_unique<PullMirror>();
      }
    }
  }
  for (auto& entry : by_shard) info.groups.push_back(std::move(entry.second));
  std::unique_lock<std::shared_mutex> lock(impl_->tensors_mutex_);
  for (auto& entry : mirrors) impl_->mirrors_[entry.first] = std::move(entry.second);
  impl_->tensors_[name] = std::move(info);
  for (auto& entry : compression) impl_->compression_[entry.first] = std::move(entry.second);
  return absl::OkStatus();
}

Client::Handle Client::Impl::StartGroups(OpKind kind, const absl::StatusOr<TensorInfo>& info,
                                         const GroupRun& run) {
  auto op = std::make_shared<Operation>(kind);
  std::vector<std::function<void()>> tasks;
  if (info.ok()) {
    const int64_t clock = clock_;
    for (const ShardGroup& group : info->groups) {
      tasks.push_back([op, group, run, clock] { op->Finish(run(*op, group, clock)); });
    }
    CountStart(kind);
  }
  return Start(op, info.status(), tasks, kind == OpKind::kPush ? push_pool_ : pull_pool_);
}

// The blocking forms run a tensor that lives on one shard (every tensor up
// to the chunk size) on the calling thread: two thread hand-offs fewer per
// call, which is most of a small operation's cost.
absl::Status Client::Impl::RunBlocking(Client& client, OpKind kind,
                                       const absl::StatusOr<TensorInfo>& info,
                                       const GroupRun& run) {
  if (!info.ok()) return info.status();
  if (info->groups.size() != 1) return client.Wait(StartGroups(kind, info, run));
  Operation op(kind);
  CountStart(kind);
  const absl::Time start = absl::Now();
  absl::Status status = run(op, info->groups[0], clock_);
  (kind == OpKind::kPush ? push_wait_ns_ : pull_wait_ns_) +=
      absl::ToInt64Nanoseconds(absl::Now() - start);
  return status;
}

void Client::Impl::CountStart(OpKind kind) {
  if (kind != OpKind::kPull) pushes_++;
  if (kind != OpKind::kPush) pulls_++;
}

absl::StatusOr<TensorInfo> Client::Impl::LookupPair(const std::string& name, size_t in_elements,
                                                    size_t out_elements) const {
  auto info = Lookup(name, in_elements);
  if (info.ok() && out_elements != in_elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': output buffer of ",
                                                   out_elements, " elements for ", in_elements));
  }
  return info;
}

Client::Impl::GroupRun Client::Impl::PushRun(const std::string& name, const float* gradient) {
  return [this, name, gradient](Operation& op, const ShardGroup& group, int64_t clock) {
    return PushGroup(op, name, group, gradient, clock);
  };
}

Client::Impl::GroupRun Client::Impl::PullRun(const std::string& name, float* out) {
  return [this, name, out](Operation& op, const ShardGroup& group, int64_t clock) {
    return PullGroup(op, name, group, out, clock);
  };
}

Client::Impl::GroupRun Client::Impl::PushPullRun(const std::string& name, const float* gradient,
                                                 float* out) {
  return [this, name, gradient, out](Operation& op, const ShardGroup& group, int64_t clock) {
    return PushPullGroup(op, name, group, gradient, out, clock);
  };
}

Client::Handle Client::PushAsync(const std::string& name, absl::Span<const float> gradient) {
  return impl_->StartGroups(OpKind::kPush, impl_->Lookup(name, gradient.size()),
                            impl_->PushRun(name, gradient.data()));
}

Client::Handle Client::PullAsync(const std::string& name, absl::Span<float> out) {
  return impl_->StartGroups(OpKind::kPull, impl_->Lookup(name, out.size()),
                            impl_->PullRun(name, out.data()));
}

Client::Handle Client::PushPullAsync(const std::string& name, absl::Span<const float> gradient,
                                     absl::Span<float> out) {
  return impl_->StartGroups(OpKind::kPushPull,
                            impl_->LookupPair(name, gradient.size(), out.size()),
                            impl_->PushPullRun(name, gradient.data(), out.data()));
}

absl::Status Client::Wait(Handle handle, absl::Time deadline) {
  std::shared_ptr<Operation> op;
  {
    std::lock_guard<std::mutex> lock(impl_->ops_mutex_);
    auto it = impl_->ops_.find(handle);
    if (it == impl_->ops_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown or already waited handle ", handle));
    }
    op = it->second;
  }
  const absl::Time start = absl::Now();
  absl::Status result;
  {
    std::unique_lock<std::mutex> lock(op->mutex);
    const bool done =
        op->finished.wait_until(lock, ToChrono(deadline), [&] { return op->remaining == 0; });
    if (!done) {
      lock.unlock();
      op->canceller.CancelAll();
      lock.lock();
      // The tasks finish promptly once cancelled; after that no buffer of
      // this operation is touched again.
      op->finished.wait(lock, [&] { return op->remaining == 0; });
      result = absl::DeadlineExceededError(
          absl::StrCat("operation ", handle, " did not finish by its deadline and was cancelled"));
    } else {
      result = op->status;
    }
  }
  const int64_t waited = absl::ToInt64Nanoseconds(absl::Now() - start);
  if (op->kind == OpKind::kPush) {
    impl_->push_wait_ns_ += waited;
  } else {
    impl_->pull_wait_ns_ += waited;
  }
  std::lock_guard<std::mutex> lock(impl_->ops_mutex_);
  impl_->ops_.erase(handle);
  return result;
}

absl::Status Client::Push(const std::string& name, absl::Span<const float> gradient) {
  return impl_->RunBlocking(*this, OpKind::kPush, impl_->Lookup(name, gradient.size()),
                            impl_->PushRun(name, gradient.data()));
}

absl::Status Client::Pull(const std::string& name, absl::Span<float> out) {
  return impl_->RunBlocking(*this, OpKind::kPull, impl_->Lookup(name, out.size()),
                            impl_->PullRun(name, out.data()));
}

absl::Status Client::PushPull(const std::string& name, absl::Span<const float> gradient,
                              absl::Span<float> out) {
  return impl_->RunBlocking(*this, OpKind::kPushPull,
                            impl_->LookupPair(name, gradient.size(), out.size()),
                            impl_->PushPullRun(name, gradient.data(), out.data()));
}

absl::Status Client::Barrier(const std::string& name) {
  proto::BarrierRequest request;
  request.set_job(impl_->options_.job);
  request.set_rank(static_cast<uint32_t>(impl_->rank_));
  request.set_name(name);
  proto::BarrierResponse response;
  grpc::ClientContext context;
  impl_->SetDeadline(&context);
  auto status = impl_->control_->Barrier(&context, request, &response);
  return status.ok() ? absl::OkStatus() : impl_->ShardError(0, status);
}

absl::Status Client::Heartbeat() {
  proto::HeartbeatRequest request;
  request.set_job(impl_->options_.job);
  request.set_rank(static_cast<uint32_t>(impl_->rank_));
  request.set_clock(impl_->clock_);
  proto::HeartbeatResponse response;
  grpc::ClientContext context;
  impl_->SetDeadline(&context);
  auto status = impl_->control_->Heartbeat(&context, request, &response);
  return status.ok() ? absl::OkStatus() : impl_->ShardError(0, status);
}

absl::Status Client::Leave() {
  for (size_t shard = 0; shard < impl_->stubs_.size(); ++shard) {
    proto::LeaveRequest request;
    request.set_job(impl_->options_.job);
    request.set_rank(static_cast<uint32_t>(impl_->rank_));
    request.set_clock(impl_->clock_);
    proto::LeaveResponse response;
    grpc::ClientContext context;
    impl_->SetDeadline(&context);
    auto status = impl_->stubs_[shard]->Leave(&context, request, &response);
    if (!status.ok()) return impl_->ShardError(static_cast<int>(shard), status);
  }
  return absl::OkStatus();
}

ClientStats Client::stats() const {
  ClientStats stats;
  stats.bytes_pushed = impl_->bytes_pushed_;
  stats.bytes_pulled = impl_->bytes_pulled_;
  stats.pushes = impl_->pushes_;
  stats.pulls = impl_->pulls_;
  stats.push_wait = absl::Nanoseconds(impl_->push_wait_ns_.load());
  stats.pull_wait = absl::Nanoseconds(impl_->pull_wait_ns_.load());
  stats.last_min_clock = impl_->last_min_clock_;
  return stats;
}

}  // namespace harrier
