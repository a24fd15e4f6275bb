#ifndef HARRIER_SERVER_TCP_TCP_LISTENER_H_
#define HARRIER_SERVER_TCP_TCP_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/framing.h"
#include "common/transport/stream.h"
#include "proto/harrier.pb.h"
#include "server/hello_secrets.h"
#include "server/shard_listener.h"
#include "server/shard_service.h"

namespace harrier {

struct TcpListenerOptions {
  // Where it listens; port 0: the kernel picks one (port() says which).
  std::string host = "0.0.0.0";
  int port = 0;
  // A hello must carry a secret from IssueHelloSecret, so that only
  // clients that fetched the address over the authenticated gRPC channel
  // get a connection that is served. Off: any hello is accepted.
  bool require_hello_secret = false;
  // Connections open at once, served or waiting for their hello; one more
  // is closed at once.
  int max_connections = 1024;
  // Set on every connection (transport::SetCongestionControl; "" keeps the
  // kernel's default): it governs the pull replies this end sends.
  std::string congestion_control = std::string(transport::kDefaultCongestionControl);
  // The address handed to clients instead of the bound one ("host:port"),
  // for a shard reached through a proxy or a forwarded port; "" hands out
  // the bound address.
  std::string advertise;
};

// OK for an address TcpListenerOptions::advertise may hold: "host:port" or
// ":port", port 1-65535, at most 255 bytes; INVALID_ARGUMENT saying what is
// wrong otherwise.
absl::Status CheckAdvertisedAddress(absl::string_view address);

// The "tcp" ShardListener: framing.h's messages over plain TCP streams
// (common/transport/stream.h has the wire). No HTTP/2, no per-message
// protobuf of the payload: a push's payload is read from the socket
// straight into the buffer the store applies from, and a pull's reply is
// written from the parameters' own memory.
//
// One thread per connection reads its requests in order; every request
// goes to the ShardService, which answers exactly as it answers gRPC.
// Small calls run their store work on that thread when it does not wait
// (ShardService's work_on_caller_thread); the rest runs on the service's
// pools. Replies are written by whichever thread answers, one whole message
// at a time under the connection's write lock, each write bounded
// (kWriteTimeout): a client that stops reading its replies loses its
// connection. A connection must say hello within kHelloTimeout.
//
// Every byte a client can make the shard hold is counted before it is
// read: a request's header beyond kMaxHelloHeaderBytes and every push
// payload in the service's BufferBudget (per connection and in all) and
// against --max_request_bytes per call. A refused push's remaining bytes
// are read and dropped, so the stream stays in step; a connection that
// stalls within a message past its limit is closed, which gives its
// reservations back. Thread-safe.
class TcpListener final : public ShardListener {
 public:
  explicit TcpListener(const TcpListenerOptions& options = {});
  ~TcpListener() override;

  absl::string_view name() const override { return "tcp"; }
  // Binds and starts accepting. UNAVAILABLE when the address cannot be
  // bound.
  absl::Status Start(ShardService* service) override;

  // TcpListenerOptions::advertise if set; else "host:port" with the bound
  // port, the host empty when the listener is bound to every interface
  // (clients use the host they reach the shard's gRPC port at).
  std::string address() const override;
  int port() const override { return bound_port_; }

  // With require_hello_secret: a fresh one-time secret (HelloSecrets::Issue).
  // Without: empty. Any thread.
  std::string IssueHelloSecret() override { return hello_secrets_.Issue(); }

  void SetServing(bool) override {}
  // Requests are answered on the ShardService's pools: they keep coming
  // until Close.
  void Stop(absl::Time) override {}
  // Stops accepting, cancels the requests being answered and waits (at
  // most kDrainTimeout) for the service to answer them, then shuts every
  // connection down and waits for their threads. Idempotent.
  void Close() override;

  // Connections open now (tests).
  int connections() const;

  static constexpr absl::Duration kHelloTimeout = absl::Seconds(10);
  static constexpr absl::Duration kWriteTimeout = absl::Seconds(30);

 private:
  struct Connection;
  struct Request;
  struct PendingPush;
  using PendingPushes = std::map<uint64_t, std::unique_ptr<PendingPush>>;
  struct ServingThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  static constexpr absl::Duration kDrainTimeout = absl::Seconds(10);

  void AcceptLoop();
  // Joins the serving threads that have ended.
  void ReapServingThreads();
  // A connection's thread: the hello, then requests until the connection
  // fails or closes.
  void Serve(const std::shared_ptr<Connection>& connection);
  // Reads and checks the hello; false closes the connection.
  bool Greet(Connection& connection);
  // Reads and handles one message. An error ends the connection.
  absl::Status ServeMessage(const std::shared_ptr<Connection>& connection, PendingPushes& pending);
  // One chunk frame of a push or push-pull, its payload still unread.
  absl::Status OnChunkFrame(const std::shared_ptr<Connection>& connection,
                            const transport::Frame& frame, absl::string_view body,
                            PendingPushes& pending);
  // Refuses the pushes whose frames stopped coming before their limit.
  void ExpirePending(Connection& connection, PendingPushes& pending, bool all);
  // Hands a complete request to the service; `pushed` is null for a pull
  // or an empty push.
  void Dispatch(const std::shared_ptr<Connection>& connection, const transport::Frame& frame,
                int64_t timeout_ms, std::shared_ptr<PendingPush> pushed, proto::PullRequest* pull);

  // Any thread: the service's answer to a request.
  void Answer(const std::shared_ptr<Request>& request, const absl::Status& status);

  const TcpListenerOptions options_;
  ShardService* service_ = nullptr;  // set by Start
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends the accept loop
  int bound_port_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::vector<ServingThread> serving_ ABSL_GUARDED_BY(mutex_);

  mutable absl::Mutex mutex_;
  // Open connections by id, and their serving threads (detached; counted).
  std::map<uint64_t, std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_connection_ ABSL_GUARDED_BY(mutex_) = 1;
  // Requests the service is answering, by (connection, request id): a
  // kCancel frame, a closed connection or Close cancels them.
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<Request>> requests_
      ABSL_GUARDED_BY(mutex_);

  HelloSecrets hello_secrets_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_TCP_TCP_LISTENER_H_
