#include "server/parameter_service.h"

#include <google/protobuf/descriptor.h>
#include <grpc/slice.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/grpc_status.h"

namespace harrier {
namespace {

// Most chunks one call may carry: bounds the memory a single stream holds
// (chunks are at most 4 MiB each, so 1 GiB).
constexpr size_t kMaxChunksPerCall = 256;

ShardStore::Clock::time_point DeadlineOf(const grpc::ServerContext* context) {
  auto remaining = context->deadline() - std::chrono::system_clock::now();
  // Give up a little before the client does, so the client receives the
  // shard's DEADLINE_EXCEEDED (which names the slowest worker) rather than
  // its own bare one.
  remaining -= std::min<std::chrono::system_clock::duration>(std::chrono::milliseconds(200),
                                                             remaining / 5);
  // No deadline from the client: wait at most an hour rather than forever.
  const auto capped = std::min<std::chrono::system_clock::duration>(remaining, std::chrono::hours(1));
  return ShardStore::Clock::now() + std::chrono::duration_cast<ShardStore::Clock::duration>(capped);
}

// One received push chunk. `slices` own the bytes `payload` points into
// (or `aligned` does, when the payload had to be made contiguous).
struct ReceivedChunk {
  std::vector<grpc::Slice> slices;
  proto::TensorChunk header;
  absl::string_view payload;
  std::unique_ptr<float[]> aligned;
};

// Reads every chunk of the stream without copying payloads, except those
// that arrived split over several slices or misaligned for float: the store
// reads dense payloads in place as float gradients, so those are copied once
// into an aligned buffer (the one copy a typed server makes of every
// payload).
grpc::Status ReadAll(grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream,
                     std::vector<ReceivedChunk>* chunks) {
  grpc::ByteBuffer buffer;
  PayloadView payload;
  while (stream->Read(&buffer)) {
    if (chunks->size() == kMaxChunksPerCall) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("more than ", kMaxChunksPerCall, " chunks in one call"));
    }
    ReceivedChunk& chunk = chunks->emplace_back();
    if (!buffer.Dump(&chunk.slices).ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unreadable TensorChunk message");
    }
    buffer.Clear();
    if (auto status = DecodeChunk(chunk.slices, &chunk.header, &payload); !status.ok()) {
      return ToGrpcStatus(status);
    }
    const absl::string_view first = payload.first();
    if (payload.contiguous() &&
        reinterpret_cast<uintptr_t>(first.data()) % alignof(float) == 0) {
      chunk.payload = first;
    } else {
      chunk.aligned = std::make_unique<float[]>((payload.size() + sizeof(float) - 1) /
                                                sizeof(float));
      payload.CopyTo(chunk.aligned.get());
      chunk.payload = absl::string_view(reinterpret_cast<const char*>(chunk.aligned.get()),
                                        payload.size());
    }
  }
  return grpc::Status::OK;
}

std::vector<ShardStore::PushChunkView> ViewsOf(const std::vector<ReceivedChunk>& chunks) {
  std::vector<ShardStore::PushChunkView> views(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) views[i] = {&chunks[i].header, chunks[i].payload};
  return views;
}

// Pulls one chunk into a fresh slice and writes it as a TensorChunk message
// of two slices (header prefix, payload): the parameters are copied once,
// from the store into the slice gRPC sends from.
grpc::Status PullAndWrite(ShardStore* store, grpc::ServerReaderWriter<grpc::ByteBuffer,
                                                                      grpc::ByteBuffer>* stream,
                          const std::string& job, uint32_t rank, int64_t clock,
                          const proto::ChunkRef& ref, ShardStore::Clock::time_point deadline,
                          Cancellation* cancellation) {
  proto::TensorChunk header;
  grpc::Slice payload;
  size_t payload_bytes = 0;
  auto status = store->Pull(rank, clock, ref, deadline, cancellation, &header, [&](size_t bytes) {
    // Never inlined (unlike grpc_slice_malloc), so the pointer stays valid
    // when the slice is wrapped.
    payload = grpc::Slice(grpc_slice_malloc_large(bytes), grpc::Slice::STEAL_REF);
    payload_bytes = bytes;
    return reinterpret_cast<char*>(const_cast<uint8_t*>(payload.begin()));
  });
  if (!status.ok()) return ToGrpcStatus(status);
  header.set_job(job);
  grpc::Slice slices[2] = {grpc::Slice(EncodeChunkPrefix(header, payload_bytes)),
                           std::move(payload)};
  grpc::ByteBuffer message(slices, 2);
  if (!stream->Write(message)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  return grpc::Status::OK;
}

int MethodIndex(const char* name) {
  const auto* service = proto::TensorChunk::descriptor()->file()->FindServiceByName(
      "ParameterService");
  return service->FindMethodByName(name)->index();
}

// Observes the scope's duration into a histogram, if there is one.
class LatencyTimer {
 public:
  explicit LatencyTimer(Histogram* histogram)
      : histogram_(histogram), start_(std::chrono::steady_clock::now()) {}
  ~LatencyTimer() {
    if (histogram_ != nullptr) {
      histogram_->Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }

 private:
  Histogram* histogram_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

ParameterServiceImpl::ParameterServiceImpl(ShardStore* store) : store_(store) {
  // Replaces the generated typed handlers; the method keeps the synchronous
  // API (gRPC owns each handler object). All three are served as
  // bidirectional streams of ByteBuffers, which gRPC's server treats like
  // the client- and server-streaming methods they are on the wire.
  using Handler = grpc::internal::BidiStreamingHandler<ParameterServiceImpl, grpc::ByteBuffer,
                                                       grpc::ByteBuffer>;
  MarkMethodStreamed(MethodIndex("Push"), new Handler(&ParameterServiceImpl::RawPush, this));
  MarkMethodStreamed(MethodIndex("Pull"), new Handler(&ParameterServiceImpl::RawPull, this));
  MarkMethodStreamed(MethodIndex("PushPull"),
                     new Handler(&ParameterServiceImpl::RawPushPull, this));
}

grpc::Status ParameterServiceImpl::Init(grpc::ServerContext*, const proto::InitRequest* request,
                                        proto::InitResponse* response) {
  auto created = store_->Init(*request);
  if (!created.ok()) return ToGrpcStatus(created.status());
  response->set_created(*created);
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::RawPush(grpc::ServerContext*, RawStream* stream) {
  LatencyTimer timer(push_seconds_);
  std::vector<ReceivedChunk> chunks;
  if (auto status = ReadAll(stream, &chunks); !status.ok()) return status;
  if (auto status = store_->Push(ViewsOf(chunks)); !status.ok()) return ToGrpcStatus(status);
  proto::PushResponse response;
  response.set_chunks_accepted(static_cast<uint32_t>(chunks.size()));
  grpc::ByteBuffer message;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<proto::PushResponse>::Serialize(response, &message, &own_buffer)
           .ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot serialise the push response");
  }
  // The one response travels with the status, as a typed client-streaming
  // handler sends it.
  stream->WriteLast(message, grpc::WriteOptions());
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::RawPull(grpc::ServerContext* context, RawStream* stream) {
  LatencyTimer timer(pull_seconds_);
  grpc::ByteBuffer message;
  proto::PullRequest request;
  if (!stream->Read(&message)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "pull without a request");
  }
  if (!grpc::SerializationTraits<proto::PullRequest>::Deserialize(&message, &request).ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed PullRequest message");
  }
  const auto deadline = DeadlineOf(context);
  // TODO(shard-service): the synchronous API has no cancel notification; the
  // callback service wakes blocked pulls through this.
  Cancellation cancellation;
  for (const proto::ChunkRef& ref : request.chunks()) {
    auto status = PullAndWrite(store_, stream, request.job(), request.rank(), request.clock(), ref,
                               deadline, &cancellation);
    if (!status.ok()) return status;
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::RawPushPull(grpc::ServerContext* context, RawStream* stream) {
  LatencyTimer timer(pull_seconds_);
  std::vector<ReceivedChunk> chunks;
  if (auto status = ReadAll(stream, &chunks); !status.ok()) return status;
  if (auto status = store_->Push(ViewsOf(chunks)); !status.ok()) return ToGrpcStatus(status);
  const auto deadline = DeadlineOf(context);
  Cancellation cancellation;  // as in RawPull
  for (const ReceivedChunk& received : chunks) {
    const proto::TensorChunk& pushed = received.header;
    int64_t clock = 0;
    const proto::ChunkRef ref = ShardStore::PushPullRef(pushed, &clock);
    auto status =
        PullAndWrite(store_, stream, pushed.job(), pushed.rank(), clock, ref, deadline,
                     &cancellation);
    if (!status.ok()) return status;
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::Heartbeat(grpc::ServerContext*,
                                             const proto::HeartbeatRequest* request,
                                             proto::HeartbeatResponse* response) {
  if (auto status = store_->Heartbeat(request->rank()); !status.ok()) return ToGrpcStatus(status);
  response->set_server_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
  return grpc::Status::OK;
}

void ParameterServiceImpl::SetUcxAddress(std::string address) {
  std::lock_guard<std::mutex> lock(address_mutex_);
  ucx_address_ = std::move(address);
}

grpc::Status ParameterServiceImpl::GetTransportAddress(
    grpc::ServerContext*, const proto::TransportAddressRequest* request,
    proto::TransportAddressResponse* response) {
  if (!request->transport().empty() && request->transport() != "ucx") {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("unknown transport '", request->transport(), "'"));
  }
  std::lock_guard<std::mutex> lock(address_mutex_);
  if (ucx_address_.empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "shard was started without --ucx");
  }
  response->set_address(ucx_address_);
  response->set_transport("ucx");
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::Leave(grpc::ServerContext*, const proto::LeaveRequest* request,
                                         proto::LeaveResponse*) {
  return ToGrpcStatus(store_->Leave(request->rank(), request->clock()));
}

}  // namespace harrier
