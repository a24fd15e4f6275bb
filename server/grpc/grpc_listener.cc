#include "server/grpc/grpc_listener.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_limits.h"
#include "server/grpc/health_service.h"
#include "spdlog/spdlog.h"

namespace harrier {
namespace {
// How long calls may take to end after the server's shutdown deadline.
constexpr absl::Duration kCallsEndGrace = absl::Seconds(10);
}  // namespace

GrpcListener::GrpcListener(GrpcListenerOptions options) : options_(std::move(options)) {}

GrpcListener::~GrpcListener() { Stop(absl::Now()); }

absl::Status GrpcListener::Start(ShardService* service) {
  parameter_service_ = std::make_unique<ParameterServiceImpl>(
      options_.store, service, options_.job_token, options_.find_listener);
  grpc::ServerBuilder builder;
  // grpc.health.v1 without the callback threads gRPC's own would start.
  HealthService::Install(builder, options_.limits.max_health_watches);
  builder.AddListeningPort(
      absl::StrCat(options_.host, ":", options_.port),
      options_.credentials ? options_.credentials : grpc::InsecureServerCredentials(), &port_);
  // gRPC sets SO_REUSEPORT by default: a second server on a fixed port would
  // then bind too, say "serving" and take half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The room above the 64 MiB: AdminService.Probe's messages at its bound.
  builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  builder.SetMaxSendMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  ApplyServerTuning(builder);
  // gRPC buffers what clients send before any handler sees it (a message
  // being received, a unary request body) and what it sends: the resource
  // quota bounds those bytes for every connection together, the thread
  // cap the synchronous handlers, the stream cap how many calls one
  // connection may hold open at once.
  if (options_.limits.memory_bytes > 0 || options_.limits.max_threads > 0) {
    grpc::ResourceQuota quota("harrier-shard");
    if (options_.limits.memory_bytes > 0) {
      quota.Resize(static_cast<size_t>(options_.limits.memory_bytes));
    }
    if (options_.limits.max_threads > 0) quota.SetMaxThreads(options_.limits.max_threads);
    builder.SetResourceQuota(quota);
  }
  if (options_.limits.max_streams_per_connection > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options_.limits.max_streams_per_connection);
  }
  builder.RegisterService(parameter_service_.get());
  for (grpc::Service* extra : options_.services) builder.RegisterService(extra);
  std::vector<grpc::ServerCompletionQueue*> queues;
  for (int i = 0; i < std::max(1, options_.limits.queue_threads); ++i) {
    queues_.push_back(builder.AddCompletionQueue());
    queues.push_back(queues_.back().get());
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    // Nothing was requested on the queues: shut down, they are empty.
    for (auto& queue : queues_) {
      queue->Shutdown();
      void* tag;
      bool ok;
      while (queue->Next(&tag, &ok)) {
      }
    }
    queues_.clear();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.host, ":", options_.port,
                     " (--port): in use, or not an address of this host"));
  }
  queue_served_ = {parameter_service_.get()};
  for (grpc::Service* extra : options_.services) {
    if (auto* served = dynamic_cast<QueueServedService*>(extra)) queue_served_.push_back(served);
  }
  for (QueueServedService* served : queue_served_) served->StartCalls(queues);
  pollers_.Start(queues);
  return absl::OkStatus();
}

std::string GrpcListener::address() const { return absl::StrCat(options_.host, ":", port_); }

void GrpcListener::SetServing(bool serving) {
  if (server_) server_->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcListener::Stop(absl::Time deadline) {
  if (server_ == nullptr || stopped_) return;
  stopped_ = true;
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  // Every call is cancelled now; each ends once its service answers it
  // (a pull parked on the pool wakes on its cancellation). A queue may only
  // be shut down once no call can start another operation on it.
  const absl::Time calls_end = std::max(deadline, absl::Now()) + kCallsEndGrace;
  bool ended = true;
  for (QueueServedService* served : queue_served_) ended = served->AwaitCallsDone(calls_end) && ended;
  if (!ended) {
    spdlog::error("gRPC listener: calls still open {} after the shutdown deadline; their "
                  "queue threads are left running",
                  absl::FormatDuration(kCallsEndGrace));
    pollers_.Abandon();
    for (auto& queue : queues_) queue.release();  // in use by those threads
    queues_.clear();
    return;
  }
  pollers_.ShutdownAndJoin();
}

void GrpcListener::Close() {}

}  // namespace harrier
