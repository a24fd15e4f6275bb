#include "server/parameter_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
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

template <typename Reader>
grpc::Status ReadAll(Reader* reader, std::vector<proto::TensorChunk>* chunks) {
  proto::TensorChunk chunk;
  while (reader->Read(&chunk)) {
    if (chunks->size() == kMaxChunksPerCall) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("more than ", kMaxChunksPerCall, " chunks in one call"));
    }
    chunks->push_back(std::move(chunk));
    chunk.Clear();
  }
  return grpc::Status::OK;
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

grpc::Status ParameterServiceImpl::Init(grpc::ServerContext*, const proto::InitRequest* request,
                                        proto::InitResponse* response) {
  auto created = store_->Init(*request);
  if (!created.ok()) return ToGrpcStatus(created.status());
  response->set_created(*created);
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::Push(grpc::ServerContext*,
                                        grpc::ServerReader<proto::TensorChunk>* reader,
                                        proto::PushResponse* response) {
  LatencyTimer timer(push_seconds_);
  std::vector<proto::TensorChunk> chunks;
  if (auto status = ReadAll(reader, &chunks); !status.ok()) return status;
  if (auto status = store_->Push(chunks); !status.ok()) return ToGrpcStatus(status);
  response->set_chunks_accepted(static_cast<uint32_t>(chunks.size()));
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::Pull(grpc::ServerContext* context,
                                        const proto::PullRequest* request,
                                        grpc::ServerWriter<proto::TensorChunk>* writer) {
  LatencyTimer timer(pull_seconds_);
  const auto deadline = DeadlineOf(context);
  auto cancelled = [context] { return context->IsCancelled(); };
  proto::TensorChunk out;
  for (const proto::ChunkRef& ref : request->chunks()) {
    out.Clear();
    auto status = store_->Pull(request->rank(), request->clock(), ref, deadline, cancelled, &out);
    if (!status.ok()) return ToGrpcStatus(status);
    out.set_job(request->job());
    if (!writer->Write(out)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServiceImpl::PushPull(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<proto::TensorChunk, proto::TensorChunk>* stream) {
  LatencyTimer timer(pull_seconds_);
  std::vector<proto::TensorChunk> chunks;
  if (auto status = ReadAll(stream, &chunks); !status.ok()) return status;
  if (auto status = store_->Push(chunks); !status.ok()) return ToGrpcStatus(status);
  const auto deadline = DeadlineOf(context);
  auto cancelled = [context] { return context->IsCancelled(); };
  proto::TensorChunk out;
  for (const proto::TensorChunk& pushed : chunks) {
    proto::ChunkRef ref;
    ref.set_key(pushed.key());
    ref.set_chunk(pushed.chunk());
    ref.set_num_elements(pushed.num_elements());
    out.Clear();
    auto status = store_->Pull(pushed.rank(), pushed.clock() + 1, ref, deadline, cancelled, &out);
    if (!status.ok()) return ToGrpcStatus(status);
    out.set_job(pushed.job());
    if (!stream->Write(out)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
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

grpc::Status ParameterServiceImpl::Leave(grpc::ServerContext*, const proto::LeaveRequest* request,
                                         proto::LeaveResponse*) {
  return ToGrpcStatus(store_->Leave(request->rank(), request->clock()));
}

}  // namespace harrier
