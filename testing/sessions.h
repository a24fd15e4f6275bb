#ifndef HARRIER_TESTING_SESSIONS_H_
#define HARRIER_TESTING_SESSIONS_H_

// For tests that call a real shard with raw stubs rather than through
// harrier::Client: registers each rank with shard 0 on first use, as a
// worker does, and attaches the job and the rank's session to requests.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "proto/harrier.grpc.pb.h"

namespace harrier::testing {

class Sessions {
 public:
  // `channel` reaches shard 0; `token`, if any, goes with every Register.
  explicit Sessions(std::shared_ptr<grpc::Channel> channel, std::string job = "harrier",
                    std::string token = "")
      : control_(proto::ControlService::NewStub(std::move(channel))),
        job_(std::move(job)),
        token_(std::move(token)) {}

  const std::string& job() const { return job_; }

  // Register's answer for `rank` (requested by number), or its status.
  grpc::Status Register(int rank, proto::RegisterResponse* response,
                        const proto::Session* previous = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token_.empty()) context.AddMetadata("harrier-job-token", token_);  // kJobTokenMetadataKey
    proto::RegisterRequest request;
    request.set_job(job_);
    request.set_requested_rank(rank);
    if (previous != nullptr) *request.mutable_previous_session() = *previous;
    return control_->Register(&context, request, response);
  }

  // The rank's session, registered on first use; empty if Register refused
  // (a rank out of range, say).
  proto::Session For(uint32_t rank) {
    absl::MutexLock lock(&mutex_);
    auto found = sessions_.find(rank);
    if (found != sessions_.end()) return found->second;
    proto::RegisterResponse response;
    const grpc::Status status = Register(static_cast<int>(rank), &response);
    proto::Session session = status.ok() ? response.session() : proto::Session();
    if (status.ok()) sessions_[rank] = session;
    return session;
  }

  // Uses `session` for `rank` from now on (one registered by another
  // process, say) instead of registering it.
  void Adopt(uint32_t rank, const proto::Session& session) {
    absl::MutexLock lock(&mutex_);
    sessions_[rank] = session;
  }

  template <typename Request>
  void Attach(Request* request) {
    request->set_job(job_);
    *request->mutable_session() = For(request->rank());
  }

 private:
  std::unique_ptr<proto::ControlService::Stub> control_;
  const std::string job_;
  const std::string token_;
  absl::Mutex mutex_;
  std::map<uint32_t, proto::Session> sessions_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier::testing

#endif  // HARRIER_TESTING_SESSIONS_H_
