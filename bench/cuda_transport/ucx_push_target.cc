#include "bench/cuda_transport/ucx_push_target.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"

namespace harrier::bench {

absl::StatusOr<std::unique_ptr<UcxPushTarget>> UcxPushTarget::Start(UcxDeviceMemory device_memory,
                                                                    size_t chunk_bytes) {
  if (chunk_bytes < sizeof(float) || chunk_bytes % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", chunk_bytes, " is not a positive number of floats"));
  }
  std::unique_ptr<UcxPushTarget> self(new UcxPushTarget());
  self->chunk_elements_ = chunk_bytes / sizeof(float);
  // A tiny lr: the parameters barely move however long the bench runs.
  auto server = testing::ServerProcess::Start(
      {"--num_workers=1", "--sync=asp", "--optimizer=sgd", "--lr=1e-9", "--ucx"});
  if (!server.ok()) return server.status();
  self->server_ = std::move(*server);
  const std::string address = self->server_->address();
  auto channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), MakeChannelArguments());
  self->sessions_ = std::make_unique<testing::Sessions>(channel);
  if (self->sessions_->For(0).credential().empty()) {
    return absl::UnavailableError(absl::StrCat("cannot register rank 0 with ", address));
  }

  auto stub = proto::ParameterService::NewStub(channel);
  grpc::ClientContext rpc;
  rpc.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::TransportAddressRequest request;
  request.set_transport("ucx");
  proto::TransportAddressResponse response;
  if (grpc::Status status = stub->GetTransportAddress(&rpc, request, &response); !status.ok()) {
    return absl::UnavailableError(absl::StrCat("GetTransportAddress: ", status.error_message()));
  }
  auto context = UcxClientContext::Create("transport-gpu-bench", device_memory);
  if (!context.ok()) return context.status();
  self->context_ = *context;
  auto transport = UcxClientContext::Connect(
      self->context_, absl::StrCat("shard 0 (", address, ")"),
      transport::PeerAddress{response.address(), response.hello_secret()},
      absl::Now() + absl::Seconds(10));
  if (!transport.ok()) return transport.status();
  self->transport_ = std::move(*transport);
  return self;
}

absl::Status UcxPushTarget::AddTensor(const std::string& key, const std::vector<float>& values) {
  if (values.empty()) return absl::InvalidArgumentError("a tensor needs at least one value");
  auto stub = proto::ParameterService::NewStub(grpc::CreateCustomChannel(
      server_->address(), grpc::InsecureChannelCredentials(), MakeChannelArguments()));
  Tensor tensor;
  tensor.elements = values.size();
  for (size_t begin = 0, chunk = 0; begin < values.size(); begin += chunk_elements_, ++chunk) {
    const size_t n = std::min(chunk_elements_, values.size() - begin);
    const size_t bytes = n * sizeof(float);
    proto::InitRequest request;
    request.set_rank(0);
    sessions_->Attach(&request);
    request.set_key(key);
    request.set_chunk(static_cast<uint32_t>(chunk));
    request.add_shape(values.size());
    request.set_num_elements(n);
    request.set_dtype(proto::DTYPE_FLOAT32);
    request.set_initial_values(reinterpret_cast<const char*>(values.data() + begin), bytes);
    const uint32_t checksum = Crc32c(request.initial_values().data(), bytes);
    request.set_checksum(checksum);
    tensor.checksums.push_back(checksum);
    grpc::ClientContext rpc;
    rpc.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    proto::InitResponse response;
    if (grpc::Status status = stub->Init(&rpc, request, &response); !status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("Init of '", key, "' chunk ", chunk, ": ",
                                       status.error_message()));
    }
  }
  tensors_[key] = std::move(tensor);
  return absl::OkStatus();
}

absl::Status UcxPushTarget::Push(const std::string& key, const void* data, MemoryKind memory,
                                 absl::Duration timeout) {
  auto found = tensors_.find(key);
  if (found == tensors_.end()) return absl::NotFoundError(absl::StrCat("no tensor '", key, "'"));
  Tensor& tensor = found->second;
  const char* bytes = static_cast<const char*>(data);
  std::vector<OutgoingChunk> chunks;
  for (size_t begin = 0, chunk = 0; begin < tensor.elements; begin += chunk_elements_, ++chunk) {
    const size_t n = std::min(chunk_elements_, tensor.elements - begin);
    OutgoingChunk out;
    out.header.set_rank(0);
    sessions_->Attach(&out.header);
    out.header.set_key(key);
    out.header.set_chunk(static_cast<uint32_t>(chunk));
    out.header.set_clock(tensor.next_clock);
    out.header.set_num_elements(n);
    out.header.set_dtype(proto::DTYPE_FLOAT32);
    out.header.set_checksum(tensor.checksums[chunk]);
    out.borrowed = absl::string_view(bytes + begin * sizeof(float), n * sizeof(float));
    out.is_borrowed = true;
    out.borrowed_memory = memory;
    chunks.push_back(std::move(out));
  }
  CallCanceller canceller;
  absl::Status status = PushBlocking(*transport_, chunks, absl::Now() + timeout, canceller);
  // Only an applied push uses up its clock; a refused one may be retried.
  if (status.ok()) ++tensor.next_clock;
  return status;
}

absl::StatusOr<size_t> UcxPushTarget::Pull(const std::string& key, void* dest,
                                           MemoryKind memory, absl::Duration timeout) {
  auto found = tensors_.find(key);
  if (found == tensors_.end()) return absl::NotFoundError(absl::StrCat("no tensor '", key, "'"));
  const Tensor& tensor = found->second;
  proto::PullRequest request;
  request.set_rank(0);
  sessions_->Attach(&request);
  request.set_clock(tensor.next_clock);
  for (size_t begin = 0, chunk = 0; begin < tensor.elements; begin += chunk_elements_, ++chunk) {
    proto::ChunkRef* ref = request.add_chunks();
    ref->set_key(key);
    ref->set_chunk(static_cast<uint32_t>(chunk));
    ref->set_num_elements(std::min(chunk_elements_, tensor.elements - begin));
  }
  char* base = static_cast<char*>(dest);
  const size_t total = tensor.elements * sizeof(float);
  auto where = [&](const proto::TensorChunk& header) -> std::pair<char*, size_t> {
    const size_t offset = static_cast<size_t>(header.chunk()) * chunk_elements_ * sizeof(float);
    if (header.key() != key || offset >= total) return {nullptr, 0};
    return {base + offset, total - offset};
  };
  // The chooser runs on the UCX progress thread; it only reads `where`'s
  // captures, which outlive the call.
  const ReplyLandingChooser choose = [&](const proto::TensorChunk& header, size_t) {
    const auto [at, capacity] = where(header);
    return ReplyLanding{at, capacity, memory};
  };
  size_t landed = 0;
  const LandedChunkSink sink = [&](const proto::TensorChunk& header, const PayloadView& payload,
                                   MemoryKind payload_memory) -> absl::Status {
    const auto [at, capacity] = where(header);
    if (at == nullptr || payload.size() > capacity) {
      return absl::DataLossError(absl::StrCat("unexpected reply chunk ", header.chunk(), " of '",
                                              header.key(), "'"));
    }
    if (payload_memory == memory && payload.first().data() == at) {
      landed += payload.size();
      return absl::OkStatus();
    }
    if (memory == MemoryKind::kDevice) {
      return absl::FailedPreconditionError(absl::StrCat(
          "reply chunk ", header.chunk(), " of '", key, "' (", payload.size(),
          " bytes) did not land in device memory"));
    }
    payload.CopyTo(at);
    return absl::OkStatus();
  };
  CallCanceller canceller;
  absl::Status status =
      PullBlocking(*transport_, request, &choose, sink, absl::Now() + timeout, canceller);
  if (!status.ok()) return status;
  return landed;
}

}  // namespace harrier::bench
