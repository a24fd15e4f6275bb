#ifndef HARRIER_TESTING_HEALTH_WATCH_H_
#define HARRIER_TESTING_HEALTH_WATCH_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>

#include "absl/time/time.h"

namespace harrier::testing {

// One grpc.health.v1.Health/Watch stream for the whole server (service
// ""), held open from Open until Close or destruction, so a test can keep
// many open while it makes other calls. Not thread-safe.
class HealthWatch {
 public:
  explicit HealthWatch(std::shared_ptr<grpc::Channel> channel);
  ~HealthWatch();
  HealthWatch(const HealthWatch&) = delete;
  HealthWatch& operator=(const HealthWatch&) = delete;

  // Starts the stream and waits, until `deadline`, for the server's first
  // message: OK with the status it carries in *serving_status (1 SERVING,
  // 2 NOT_SERVING), or the status the server ended the call with
  // (DEADLINE_EXCEEDED when nothing came in time). Once.
  grpc::Status Open(absl::Time deadline, uint32_t* serving_status);

  // Cancels the stream and waits for its end (at most 10 s).
  void Close();

 private:
  // The next event of the stream's queue, expecting `tag`; false when the
  // operation failed or `deadline` passed.
  bool Next(intptr_t tag, absl::Time deadline);
  grpc::Status Finish(absl::Time deadline);

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  int outstanding_ = 0;  // operations started and not yet taken from queue_
  bool started_ = false;
  bool finished_ = false;
};

// Opens Watch streams on `channel` until the server admits one (its first
// status arrives) or `within` has passed, retrying a refusal
// (RESOURCE_EXHAUSTED) every 50 ms: a server counts a stream as ended once
// its handler has returned, a moment after the client's cancel. The
// admitted stream, still open; null when none was admitted in time.
std::unique_ptr<HealthWatch> OpenAdmittedWatch(const std::shared_ptr<grpc::Channel>& channel,
                                               absl::Duration within);

}  // namespace harrier::testing

#endif  // HARRIER_TESTING_HEALTH_WATCH_H_
