#ifndef HARRIER_SERVER_GRPC_HEALTH_SERVICE_H_
#define HARRIER_SERVER_GRPC_HEALTH_SERVICE_H_

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"

namespace harrier {

// grpc.health.v1.Health (Check and Watch) on gRPC's synchronous threads.
// gRPC's own default health service, in the gRPC this builds against, is a
// callback service: any server carrying it starts the callback API's two
// "nexting" threads, which then take turns polling every connection of the
// process with the data plane's threads (async_call.h), a hand-off on
// nearly every network event. This one serves the same protocol without
// them. The whole server ("") is SERVING or NOT_SERVING as SetServingStatus
// says; other names are NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch) until
// set. Watch holds one of the server's synchronous threads per stream and
// sends each change; it ends when the client cancels or the server shuts
// down. Health calls carry no token, so anyone who reaches the port can
// open them: at most `max_watches` streams are served at once and further
// ones are refused (RESOURCE_EXHAUSTED), else Watch streams alone could
// hold every thread the server has for its unary calls (Init, heartbeats,
// the admin and control calls) and for Check. Messages are read and
// written as protobuf wire bytes: Debian ships health.proto only as a
// source file. Install with Install(), which also makes it the server's
// GetHealthCheckService(). Thread-safe.
class HealthService final : public grpc::Service, public grpc::HealthCheckServiceInterface {
 public:
  // Longest service name a request may carry.
  static constexpr size_t kMaxServiceNameBytes = 256;
  // The protocol's ServingStatus values.
  enum ServingStatus : uint32_t { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
  // Watch streams served at once unless told otherwise (--max_health_watches).
  static constexpr int kDefaultMaxWatches = 16;

  // `max_watches` >= 1.
  explicit HealthService(int max_watches = kDefaultMaxWatches);

  // Registers a new HealthService with `builder` and hands it to the server
  // as its health service (the server owns it).
  static void Install(grpc::ServerBuilder& builder, int max_watches = kDefaultMaxWatches);

  void SetServingStatus(const std::string& service_name, bool serving) override;
  void SetServingStatus(bool serving) override;
  // Every name NOT_SERVING from now on; later changes are ignored.
  void Shutdown() override;

  grpc::Status Check(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                     grpc::ByteBuffer* response);
  grpc::Status Watch(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                     grpc::ServerWriter<grpc::ByteBuffer>* writer);

 private:
  // kServing, kNotServing, or kServiceUnknown for a name never set.
  uint32_t StatusLocked(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int max_watches_;
  absl::Mutex mutex_;
  int watches_ ABSL_GUARDED_BY(mutex_) = 0;  // Watch streams being served
  std::map<std::string, bool> serving_ ABSL_GUARDED_BY(mutex_);
  uint64_t version_ ABSL_GUARDED_BY(mutex_) = 0;  // bumped on every change
  bool shut_down_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_GRPC_HEALTH_SERVICE_H_
