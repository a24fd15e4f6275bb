#include "server/grpc/parameter_service.h"

#include <grpc/slice.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/grpc_status.h"
#include "common/request_limits.h"
#include "server/grpc/async_call.h"
#include "server/streamed_unary.h"

namespace harrier {
namespace {

// The client's deadline on the store's clock (gRPC gives it on the system
// clock; max() when the client set none).
ShardService::Clock::time_point ClientDeadline(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return ShardService::Clock::time_point::max();
  }
  const auto remaining = deadline - std::chrono::system_clock::now();
  // Far beyond the service's one-hour cap: the same as none, and no overflow.
  if (remaining > std::chrono::hours(24)) return ShardService::Clock::time_point::max();
  return ShardService::Clock::now() +
         std::chrono::duration_cast<ShardService::Clock::duration>(remaining);
}

// What every data call keeps, whichever stream kind it is. Reactions run
// on the listener's queue threads (async_call.h); the ShardService's `done`
// (and the sink's calls) in a reaction when the work did not wait, else on a
// pool thread. A call without the job token is refused before anything of
// it is read.
template <class Stream>
class DataCall : public AsyncServerCall<Stream> {
 public:
  DataCall(ShardService* service, const JobTokenCheck* token_check)
      : service_(service), token_check_(token_check) {}

 protected:
  // The call arrived and passed the token check.
  virtual void Start() = 0;

  // One HTTP/2 connection: address and port of the client's end.
  const std::string& peer() const { return peer_; }

  ShardService* const service_;
  Cancellation cancellation_;
  ShardService::Call call_;

 private:
  void Begin() override {
    if (auto status = token_check_->Check(*this->context()); !status.ok()) {
      this->Finish(status);
      return;
    }
    peer_ = this->context()->peer();
    call_.client_deadline = ClientDeadline(*this->context());
    call_.cancellation = &cancellation_;
    // Pushes, and pulls the consistency model lets through at once, are
    // answered in the reaction that completed the request: no hand-off. A
    // pull that has to wait goes to the pull pool.
    call_.work_on_caller_thread = true;
    Start();
  }
  // The client cancelled, its deadline passed or it went away: a blocked
  // pull wakes now rather than at its deadline.
  void OnCancel() override { cancellation_.Cancel(); }
  // After Finish and every operation completed: nobody refers to the call.
  void OnDone() override { delete this; }

  const JobTokenCheck* const token_check_;
  std::string peer_;
};

// One received push chunk. `message` owns the bytes `payload` or `pieces`
// point into, or `aligned` does when the payload had to be made contiguous
// (the message is then let go: the header is decoded, nothing else refers
// to it). `slices` are views of the message's slices, each a reference of
// its own. `pieces` is the payload split as it arrived, for a table that
// reads it so (`payload` is then empty).
//
// The message, not the slices, holds the last reference: gRPC gives the
// memory back to its resource quota when the last one goes, and under a
// full quota that must run inside gRPC's execution context, which
// grpc::ByteBuffer's release sets up and a bare grpc::Slice's does not (a
// shard under memory pressure crashed in gRPC's reclaimer so, from a
// callback thread). Declared first, so the slices go before it.
struct ReceivedChunk {
  grpc::ByteBuffer message;
  std::vector<grpc::Slice> slices;
  proto::TensorChunk header;
  absl::string_view payload;
  std::vector<absl::string_view> pieces;
  std::unique_ptr<float[]> aligned;
};

// A split payload is read in place only while its slices average at least
// this (PushReader::Take).
constexpr size_t kMinSplitPieceBytes = 4096;

// Reads the push chunks of a call as they arrive, without copying payloads.
// A payload split over several slices (the reads it came in) or
// misaligned for float goes on as its pieces where the table reads it so
// (dense gradients for a plain SGD step or a round sum: the fused pass
// reads them in place); others are copied once into an aligned
// buffer (the one copy a typed server makes of such a payload). `Base` is a
// DataCall of a stream that reads.
template <class Base>
class PushReader : public Base {
 public:
  using Base::Base;
  // The chunks' buffers go with the call: give their bytes back.
  ~PushReader() override {
    if (reserved_ > 0) this->service_->buffer_budget().Release(this->peer(), reserved_);
  }

 protected:
  void StartReading() { this->StartRead(&buffer_); }

  // Every chunk arrived; answer through End.
  virtual void OnAllRead() = 0;
  // Ends the call with `status` (no reply chunks follow).
  virtual void End(const absl::Status& status) = 0;

  std::vector<ShardStore::PushChunkView> Views() const {
    std::vector<ShardStore::PushChunkView> views(chunks_.size());
    for (size_t i = 0; i < chunks_.size(); ++i) {
      views[i] = {&chunks_[i].header, chunks_[i].payload, chunks_[i].pieces};
    }
    return views;
  }
  size_t chunk_count() const { return chunks_.size(); }

 private:
  void OnReadDone(bool ok) override {
    if (!ok) {
      // A failed read is the client's half-close, or the call's end: only
      // the first means the push is complete.
      if (this->ReadFailedByError()) {
        End(absl::CancelledError("the client cancelled the call"));
      } else {
        OnAllRead();
      }
      return;
    }
    if (auto status = Take(); !status.ok()) {
      End(status);
      return;
    }
    this->StartRead(&buffer_);
  }

  absl::Status Take() {
    if (auto status = ShardService::CheckChunkCount(chunks_.size() + 1); !status.ok()) {
      return status;
    }
    // The whole message is in memory now (gRPC read it): charged, header
    // and all, before it is kept. HTTP/2 flow control bounds what may
    // arrive unasked, so a connection overshoots by at most one message per
    // call, and the refused call ends now.
    const uint64_t message_bytes = buffer_.Length();
    if (auto status = Reserve(message_bytes); !status.ok()) return status;
    ReceivedChunk& chunk = chunks_.emplace_back();
    chunk.message.Swap(&buffer_);
    if (!chunk.message.Dump(&chunk.slices).ok()) {
      return absl::InvalidArgumentError("unreadable TensorChunk message");
    }
    PayloadView payload;
    if (auto status = DecodeChunk(chunk.slices, &chunk.header, &payload); !status.ok()) {
      return status;
    }
    // Each header within its limits as it arrives: an oversized one ends
    // the call before the rest of it is buffered.
    if (auto status = CheckChunkLimits("push", chunk.header); !status.ok()) return status;
    request_bytes_ += payload.size();
    if (auto status = this->service_->CheckRequestBytes(request_bytes_); !status.ok()) {
      return status;
    }
    const absl::string_view first = payload.first();
    if (payload.contiguous() && reinterpret_cast<uintptr_t>(first.data()) % alignof(float) == 0) {
      chunk.payload = first;
      return absl::OkStatus();
    }
    // Read in place, split: the message stays, as it would for a
    // contiguous payload, and the budget charged it. Only while its slices
    // average 4 KiB or more: a peer that trickles its bytes in can make
    // every slice hold a few bytes of a larger buffer, and those are copied
    // and let go now, not kept until the whole call is applied.
    if (payload.pieces().size() <= payload.size() / kMinSplitPieceBytes + 1 &&
        this->service_->ReadsSplitPayload(chunk.header)) {
      chunk.pieces = payload.pieces();
      return absl::OkStatus();
    }
    // Copied into aligned memory, then the message is let go: the call
    // holds the payload once (twice only while this one message is copied),
    // which is what the budget charged, never the message and the copy
    // together.
    // Not zeroed first (make_unique<float[]> would): every byte is written.
    chunk.aligned.reset(new float[(payload.size() + sizeof(float) - 1) / sizeof(float)]);
    payload.CopyTo(chunk.aligned.get());
    chunk.slices.clear();
    chunk.message.Clear();
    chunk.payload =
        absl::string_view(reinterpret_cast<const char*>(chunk.aligned.get()), payload.size());
    return absl::OkStatus();
  }

  // The service's BufferBudget for this connection, and what the call holds
  // of it.
  absl::Status Reserve(uint64_t bytes) {
    if (auto status = this->service_->buffer_budget().Reserve(this->peer(), bytes);
        !status.ok()) {
      return status;
    }
    reserved_ += bytes;
    return absl::OkStatus();
  }

  grpc::ByteBuffer buffer_;
  uint64_t request_bytes_ = 0;  // payload bytes of the chunks read so far
  uint64_t reserved_ = 0;       // bytes the kept chunks hold in the service's BufferBudget
  // Reactions only (one read at a time); the views handed to the service
  // are taken once reading is over.
  std::vector<ReceivedChunk> chunks_;
};

// Streams reply chunks as the ShardService produces them. Each is one
// message of two slices (the header prefix, then the payload slice the
// store wrote the parameters into), so the parameters are copied once, from
// the store into the slice gRPC sends from. Send never waits for the
// network: gRPC takes one write at a time, so later chunks queue here (at
// most one call's chunks) and OnWriteDone starts the next. The last chunk
// waits for Complete and goes out with the status in one operation, saving
// the round through OnWriteDone that a separate Finish would cost; it is
// not sent from Send because the call may end (and OnDone delete it) as
// soon as its status is out, and the service still calls Complete after
// Send. `Stream` writes (server streaming or bidi).
template <class Stream>
class ReplyWriter : public DataCall<Stream>, public ShardService::ReplySink {
 public:
  using DataCall<Stream>::DataCall;

  char* Allocate(size_t bytes) override {
    // Never inlined (unlike grpc_slice_malloc), so the pointer stays valid
    // when the slice is moved.
    payload_ = grpc::Slice(grpc_slice_malloc_large(bytes), grpc::Slice::STEAL_REF);
    return reinterpret_cast<char*>(const_cast<uint8_t*>(payload_.begin()));
  }

  void Borrow(std::shared_ptr<const ParamBuffer> version) override {
    // The slice points into the parameter version; gRPC drops the
    // reference when it releases the slice (after the write), and the
    // shard never writes a version someone holds.
    const size_t bytes = version->bytes();
    void* data = const_cast<float*>(version->data());
    auto* keep = new std::shared_ptr<const ParamBuffer>(std::move(version));
    payload_ = grpc::Slice(
        grpc_slice_new_with_user_data(
            data, bytes,
            [](void* held) { delete static_cast<std::shared_ptr<const ParamBuffer>*>(held); },
            keep),
        grpc::Slice::STEAL_REF);
  }

  absl::Status Send(const proto::TensorChunk& header, uint32_t, bool last) override {
    grpc::Slice slices[2] = {grpc::Slice(EncodeChunkPrefix(header, payload_.size())),
                             std::move(payload_)};
    Step step;
    {
      absl::MutexLock lock(&mutex_);
      if (broken_) return absl::CancelledError("client went away");
      queue_.push_back({grpc::ByteBuffer(slices, 2), last});
      if (writing_) return absl::OkStatus();
      step = NextLocked();
    }
    Take(step);
    return absl::OkStatus();
  }

  absl::Status AwaitSent(ShardService::Clock::time_point deadline) override {
    absl::MutexLock lock(&mutex_);
    auto sent = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return broken_ || queue_.empty(); };
    const absl::Time until = absl::Now() + absl::FromChrono(deadline - ShardService::Clock::now());
    if (!mutex_.AwaitWithDeadline(absl::Condition(&sent), until)) {
      return absl::DeadlineExceededError("reply chunk not sent by the call's deadline");
    }
    if (broken_) return absl::CancelledError("client went away");
    return absl::OkStatus();
  }

  // The ShardService's `done`, the last call into this object: finishes
  // now, or once the queued chunks are written (a status sent before them
  // would cut the reply short).
  void Complete(const absl::Status& status) {
    Step step;
    {
      absl::MutexLock lock(&mutex_);
      finish_ = broken_ && status.ok()
                    ? grpc::Status(grpc::StatusCode::CANCELLED, "client went away")
                    : ToGrpcStatus(status);
      completed_ = true;
      if (writing_) return;
      step = NextLocked();
    }
    Take(step);
  }

 private:
  struct Outgoing {
    grpc::ByteBuffer message;
    bool last = false;
  };
  // What to hand gRPC next, decided under the lock and done outside it.
  struct Step {
    enum Kind { kNothing, kWrite, kWriteAndFinish, kFinish } kind = kNothing;
    grpc::ByteBuffer* message = nullptr;  // stays queued until the call ends
    grpc::Status status;
  };

  Step NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    Step step;
    if (!queue_.empty() && !queue_.front().last) {
      step.kind = Step::kWrite;
    } else if (!completed_) {
      return step;  // the last chunk (or the status) waits for Complete
    } else if (!queue_.empty() && finish_.ok()) {
      step.kind = Step::kWriteAndFinish;
      step.status = finish_;
    } else {
      step.kind = Step::kFinish;
      step.status = finish_;
      queue_.clear();  // a last chunk never goes out with an error
      return step;
    }
    writing_ = true;
    step.message = &queue_.front().message;  // deque: stays put as others are added
    return step;
  }

  // The call may end as soon as a status is out: nothing of it is touched
  // after.
  void Take(const Step& step) {
    switch (step.kind) {
      case Step::kNothing:
        return;
      case Step::kWrite:
        this->StartWrite(step.message);
        return;
      case Step::kWriteAndFinish:
        this->StartWriteAndFinish(step.message, grpc::WriteOptions(), step.status);
        return;
      case Step::kFinish:
        this->Finish(step.status);
        return;
    }
  }

  void OnWriteDone(bool ok) override {
    Step step;
    {
      absl::MutexLock lock(&mutex_);
      queue_.pop_front();
      writing_ = false;
      if (!ok) {
        broken_ = true;
        queue_.clear();
        if (finish_.ok()) finish_ = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      step = NextLocked();
    }
    // The stream is gone: stop pulling chunks nobody will receive.
    if (!ok) this->cancellation_.Cancel();
    Take(step);
  }

  grpc::Slice payload_;  // the answering thread's, between Allocate and Send
  absl::Mutex mutex_;
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mutex_);  // front: being written
  bool writing_ ABSL_GUARDED_BY(mutex_) = false;
  bool broken_ ABSL_GUARDED_BY(mutex_) = false;     // a write failed
  bool completed_ ABSL_GUARDED_BY(mutex_) = false;  // the service is done
  grpc::Status finish_ ABSL_GUARDED_BY(mutex_);     // once completed_
};

using PushStream = grpc::ServerAsyncReader<grpc::ByteBuffer, grpc::ByteBuffer>;
using PullStream = grpc::ServerAsyncWriter<grpc::ByteBuffer>;
using PushPullStream = grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

class PushReactor final : public PushReader<DataCall<PushStream>> {
 public:
  using PushReader::PushReader;

 private:
  void Start() override { StartReading(); }
  void OnAllRead() override {
    call_.push_result = &push_result_;
    service_->Push(call_, Views(), [this](const absl::Status& status) { End(status); });
  }

  void End(const absl::Status& status) override {
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    proto::PushResponse response;
    response.set_chunks_accepted(static_cast<uint32_t>(chunk_count()));
    response.set_chunks_duplicate(push_result_.duplicate);
    bool own_buffer = false;
    // The one response travels with the status, as a typed client-streaming
    // handler sends it.
    if (!grpc::SerializationTraits<proto::PushResponse>::Serialize(response, this->response(),
                                                                   &own_buffer)
             .ok()) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, "cannot serialise the push response"));
      return;
    }
    Finish(grpc::Status::OK);
  }

  PushResult push_result_;  // the store's, before End
};

class PullReactor final : public ReplyWriter<PullStream> {
 public:
  using ReplyWriter::ReplyWriter;

 private:
  void Start() override {
    proto::PullRequest request;
    if (!grpc::SerializationTraits<proto::PullRequest>::Deserialize(this->request(), &request)
             .ok()) {
      Complete(absl::InvalidArgumentError("malformed PullRequest message"));
      return;
    }
    service_->Pull(call_, std::move(request), this,
                   [this](const absl::Status& status) { Complete(status); });
  }
};

class PushPullReactor final : public PushReader<ReplyWriter<PushPullStream>> {
 public:
  using PushReader::PushReader;

 private:
  void Start() override { StartReading(); }
  void OnAllRead() override {
    service_->PushPull(call_, Views(), this, [this](const absl::Status& status) { End(status); });
  }
  void End(const absl::Status& status) override { Complete(status); }
};

}  // namespace

ParameterServiceImpl::ParameterServiceImpl(ShardStore* store, ShardService* service,
                                           std::string job_token, ShardListenerLookup find_listener)
    : store_(store),
      service_(service),
      token_check_(std::move(job_token)),
      find_listener_(std::move(find_listener)) {}

ParameterServiceImpl::~ParameterServiceImpl() = default;

template <class Call, class Request>
std::unique_ptr<QueueEvent> ParameterServiceImpl::Accept(grpc::ServerCompletionQueue* queue,
                                                         Request request) {
  ShardService* service = service_;
  const JobTokenCheck* token_check = &token_check_;
  return AcceptCalls<Call>(queue, &live_calls_, std::move(request),
                           [service, token_check] { return new Call(service, token_check); });
}

void ParameterServiceImpl::StartCalls(const std::vector<grpc::ServerCompletionQueue*>& queues) {
  for (grpc::ServerCompletionQueue* queue : queues) {
    acceptors_.push_back(Accept<PushReactor>(
        queue, [this](PushReactor* call, grpc::ServerCompletionQueue* q, void* tag) {
          RequestPush(call->context(), call->stream(), q, q, tag);
        }));
    acceptors_.push_back(Accept<PullReactor>(
        queue, [this](PullReactor* call, grpc::ServerCompletionQueue* q, void* tag) {
          RequestPull(call->context(), call->request(), call->stream(), q, q, tag);
        }));
    acceptors_.push_back(Accept<PushPullReactor>(
        queue, [this](PushPullReactor* call, grpc::ServerCompletionQueue* q, void* tag) {
          RequestPushPull(call->context(), call->stream(), q, q, tag);
        }));
  }
}

bool ParameterServiceImpl::AwaitCallsDone(absl::Time deadline) {
  return live_calls_.AwaitNone(deadline);
}

grpc::Status ParameterServiceImpl::StreamedInit(
    grpc::ServerContext* context,
    UnaryStreamer<proto::InitRequest, proto::InitResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this](const proto::InitRequest& request, proto::InitResponse* response) {
        return AnswerInit(request, response);
      });
}

grpc::Status ParameterServiceImpl::StreamedHeartbeat(
    grpc::ServerContext* context,
    UnaryStreamer<proto::HeartbeatRequest, proto::HeartbeatResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this](const proto::HeartbeatRequest& request, proto::HeartbeatResponse* response) {
        return AnswerHeartbeat(request, response);
      });
}

grpc::Status ParameterServiceImpl::StreamedLeave(
    grpc::ServerContext* context,
    UnaryStreamer<proto::LeaveRequest, proto::LeaveResponse>* streamer) {
  return ServeStreamedUnary(token_check_, context, streamer,
                            [this](const proto::LeaveRequest& request, proto::LeaveResponse*) {
                              return AnswerLeave(request);
                            });
}

grpc::Status ParameterServiceImpl::StreamedGetShardInfo(
    grpc::ServerContext* context,
    UnaryStreamer<proto::ShardInfoRequest, proto::ShardInfoResponse>* streamer) {
  return ServeStreamedUnary(
      token_check_, context, streamer,
      [this](const proto::ShardInfoRequest&, proto::ShardInfoResponse* response) {
        return AnswerShardInfo(response);
      });
}

grpc::Status ParameterServiceImpl::StreamedGetTransportAddress(
    grpc::ServerContext* context,
    UnaryStreamer<proto::TransportAddressRequest, proto::TransportAddressResponse>* streamer) {
  return ServeStreamedUnary(token_check_, context, streamer,
                            [this](const proto::TransportAddressRequest& request,
                                   proto::TransportAddressResponse* response) {
                              return AnswerTransportAddress(request, response);
                            });
}

grpc::Status ParameterServiceImpl::AnswerInit(const proto::InitRequest& request,
                                              proto::InitResponse* response) {
  auto created = service_->Init(request);
  if (!created.ok()) return ToGrpcStatus(created.status());
  response->set_created(*created);
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::AnswerHeartbeat(const proto::HeartbeatRequest& request,
                                                   proto::HeartbeatResponse* response) {
  if (auto status = service_->Heartbeat(request, response); !status.ok()) {
    return ToGrpcStatus(status);
  }
  response->set_server_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::AnswerTransportAddress(
    const proto::TransportAddressRequest& request, proto::TransportAddressResponse* response) {
  if (auto status = CheckTransportAddressLimits(request); !status.ok()) {
    return ToGrpcStatus(status);
  }
  // Empty names "ucx" (harrier.proto). The gRPC listener has no address to
  // give: the client already holds the channel this call came on.
  const std::string name = request.transport().empty() ? "ucx" : request.transport();
  if (name == "grpc") {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("unknown transport '", name, "'"));
  }
  absl::StatusOr<ShardListener*> listener =
      find_listener_
          ? find_listener_(name)
          : absl::FailedPreconditionError(absl::StrCat("shard was started without --", name));
  if (!listener.ok()) return ToGrpcStatus(listener.status());
  response->set_address((*listener)->address());
  response->set_transport(name);
  // Only to a request naming the transport: reachability probes (empty
  // name) do not pile secrets up.
  if (request.transport() == name) response->set_hello_secret((*listener)->IssueHelloSecret());
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::AnswerShardInfo(proto::ShardInfoResponse* response) {
  response->set_shard(static_cast<uint32_t>(store_->options().shard));
  response->set_num_shards(static_cast<uint32_t>(store_->options().num_shards));
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::AnswerLeave(const proto::LeaveRequest& request) {
  return ToGrpcStatus(service_->Leave(request));
}

}  // namespace harrier
