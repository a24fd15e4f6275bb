#ifndef HARRIER_TESTS_INTEGRATION_RAW_GRPC_SHARD_H_
#define HARRIER_TESTS_INTEGRATION_RAW_GRPC_SHARD_H_

// A message-level gRPC client of one harrier-server for tests: Init, Push
// and Pull with chunks built by hand (also malformed ones), each rank's
// session attached as its worker would, every call with a deadline.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/sessions.h"

namespace harrier::testing {

class RawGrpcShard {
 public:
  explicit RawGrpcShard(const std::string& address)
      : channel_(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                           MakeChannelArguments())),
        stub_(proto::ParameterService::NewStub(channel_)),
        sessions_(channel_) {}

  grpc::Status Init(proto::InitRequest request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    sessions_.Attach(&request);  // the rank's session, as its worker sends it
    proto::InitResponse response;
    return stub_->Init(&context, request, &response);
  }

  grpc::Status Push(const std::vector<proto::TensorChunk>& chunks) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PushResponse response;
    auto writer = stub_->Push(&context, &response);
    for (proto::TensorChunk chunk : chunks) {
      // Each rank's session, as its worker would send it.
      sessions_.Attach(&chunk);
      writer->Write(chunk);
    }
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Pull(const std::string& key, int64_t clock, uint64_t elements,
                    std::vector<float>* values, int timeout_ms = 10000, uint32_t rank = 0) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    proto::PullRequest request;
    request.set_rank(rank);
    sessions_.Attach(&request);
    request.set_clock(clock);
    auto* ref = request.add_chunks();
    ref->set_key(key);
    ref->set_num_elements(elements);
    auto reader = stub_->Pull(&context, request);
    proto::TensorChunk reply;
    while (reader->Read(&reply)) {
      values->resize(reply.num_elements());
      std::memcpy(values->data(), reply.payload().data(), reply.payload().size());
    }
    return reader->Finish();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::ParameterService::Stub> stub_;
  Sessions sessions_;
};

}  // namespace harrier::testing

#endif  // HARRIER_TESTS_INTEGRATION_RAW_GRPC_SHARD_H_
