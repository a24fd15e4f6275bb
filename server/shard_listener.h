#ifndef HARRIER_SERVER_SHARD_LISTENER_H_
#define HARRIER_SERVER_SHARD_LISTENER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace harrier {

// What a gRPC server may hold for its clients before any handler has
// accounted for it: the library's own buffers (messages being received,
// unary request bodies, replies being sent) and its threads.
struct GrpcServerLimits {
  // grpc::ResourceQuota size (--grpc_memory_bytes): the bytes gRPC's
  // connections may hold in all; past it gRPC shrinks its reads and cancels
  // streams (RESOURCE_EXHAUSTED). Also counts the received push payloads
  // the shard keeps, so it should stay above --max_buffered_bytes.
  // 0: unbounded.
  uint64_t memory_bytes = uint64_t{8} << 30;
  // Threads of the synchronous methods (unary calls, health),
  // --grpc_max_threads; while all are busy gRPC refuses further calls
  // (RESOURCE_EXHAUSTED, "Server Threadpool Exhausted"). 0: gRPC's default
  // (unbounded).
  int max_threads = 256;
  // HTTP/2 streams one connection may have open (--max_streams_per_connection);
  // a client's further calls wait for one to end. 0: gRPC's default.
  int max_streams_per_connection = 1024;
  // grpc.health.v1 Watch streams served at once (--max_health_watches),
  // each holding one of the max_threads above; at least 1, and at most
  // half of max_threads when that is bounded. The --health_port server has
  // a cap of this size of its own.
  int max_health_watches = 16;
  // Threads serving Push, Pull, PushPull and Barrier (--grpc_queue_threads),
  // each polling a completion queue of its own; at least 1.
  int queue_threads = 1;
};

class ShardService;

// One way clients reach a shard: gRPC (server/grpc/) or UCX active messages
// (server/ucx/). Every listener hands each call to the same ShardService,
// which answers it alike whichever listener carried it. Made by name with
// CreateShardListener (shard_listener_factory.h); ShardServer holds its
// listeners through this interface only.
//
// Life: Start once; then any thread may call address, port,
// IssueHelloSecret and SetServing; at shutdown Stop, then Close once the
// ShardService has shut down (every call answered). The destructor closes a
// listener still open.
class ShardListener {
 public:
  virtual ~ShardListener() = default;

  // "grpc" or "ucx": the name the factory and GetTransportAddress know it by.
  virtual absl::string_view name() const = 0;

  // Binds and starts handing calls to `service` (not owned; it must stay
  // until Close has returned). UNAVAILABLE when the address cannot be bound.
  virtual absl::Status Start(ShardService* service) = 0;

  // Once started, what clients connect to: "host:port" for gRPC (with the
  // bound port), the UCP worker address (bytes) for UCX.
  virtual std::string address() const = 0;
  // The bound port, or -1 for a listener without a port of its own (UCX:
  // clients get its address over gRPC).
  virtual int port() const = 0;

  // A fresh one-time secret for a client's hello on this listener, or empty
  // when the listener takes any hello (gRPC authenticates every call
  // itself). Handed out with the address (GetTransportAddress).
  virtual std::string IssueHelloSecret() = 0;

  // What the listener's health probes report (grpc.health.v1 on gRPC; UCX
  // has none). Calls are served either way.
  virtual void SetServing(bool serving) = 0;

  // Shutdown, first step: stops taking calls; those in flight may finish
  // until `deadline`, then are cancelled. Returns once they have ended.
  // A listener whose calls are all answered on the ShardService's pools
  // (UCX) keeps taking them until Close.
  virtual void Stop(absl::Time deadline) = 0;
  // Shutdown, last step, after the ShardService has shut down: closes every
  // connection. Idempotent.
  virtual void Close() = 0;
};

// A running listener of the shard by name, for the gRPC listener's
// GetTransportAddress: INVALID_ARGUMENT for a name no listener has,
// FAILED_PRECONDITION for a listener the shard was started without.
using ShardListenerLookup =
    std::function<absl::StatusOr<ShardListener*>(absl::string_view name)>;

}  // namespace harrier

#endif  // HARRIER_SERVER_SHARD_LISTENER_H_
