#ifndef HARRIER_WORKER_CONTROL_CLIENT_H_
#define HARRIER_WORKER_CONTROL_CLIENT_H_

// The worker's control plane: registration with shard 0, tensor Init,
// barriers, heartbeats, Leave and the UCX address lookup, each a unary RPC
// with the client's deadline and an error that names the shard
// ("shard i (host:port): message"). Pushes and pulls do not go through it
// (ShardTransport does).
//
// ControlClient is the interface the client library uses; GrpcControlClient
// talks to real shards and FakeControlClient (fake_control_client.h) records
// requests for tests.

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/transport/framing.h"
#include "proto/harrier.pb.h"

namespace grpc {
class Channel;
class ChannelCredentials;
}  // namespace grpc

namespace harrier {

// Thread-safe: calls may run concurrently from any thread. Every call ends
// by its deadline (the client's rpc_timeout unless the method says).
class ControlClient {
 public:
  virtual ~ControlClient() = default;

  virtual int num_shards() const = 0;
  // "shard i (host:port)", the prefix of every error about that shard.
  virtual std::string ShardName(int shard) const = 0;

  // Control plane (shard 0).
  virtual absl::StatusOr<proto::RegisterResponse> Register(
      const proto::RegisterRequest& request) = 0;
  virtual absl::Status Barrier(const proto::BarrierRequest& request) = 0;
  virtual absl::Status Heartbeat(const proto::HeartbeatRequest& request) = 0;
  // Gives the worker's session back (a RegisterRequest with release set),
  // by `deadline`: the worker exits and its rank is free again at once.
  virtual absl::Status ReleaseSession(const proto::RegisterRequest& request,
                                      absl::Time deadline) = 0;

  // One shard's parameter service.
  virtual absl::Status Init(int shard, const proto::InitRequest& request) = 0;
  virtual absl::Status Leave(int shard, const proto::LeaveRequest& request) = 0;
  // The liveness heartbeat every shard gets from the background loop.
  // `response` (may be null) gets the shard's answer (the rank's next clock
  // there).
  virtual absl::Status ShardHeartbeat(int shard, const proto::HeartbeatRequest& request,
                                      absl::Time deadline,
                                      proto::HeartbeatResponse* response = nullptr) = 0;
  // A LeaveRequest with `release` (the worker exits), by `deadline`.
  virtual absl::Status ReleaseShard(int shard, const proto::LeaveRequest& request,
                                    absl::Time /*deadline*/) {
    return Leave(shard, request);
  }
  // The shard's address for a data-path backend ("ucx"), with the secret
  // its hello must carry, by `deadline`.
  virtual absl::StatusOr<transport::PeerAddress> GetTransportAddress(
      int shard, const std::string& transport, absl::Time deadline) = 0;
  // False only if the shard answers UNAVAILABLE to a side-effect-free RPC
  // within a second: it is down (a channel's state alone can stay READY for
  // seconds after a crash).
  virtual bool ShardReachable(int shard) = 0;
};

// How the channels to the shards are secured; the default is plaintext
// without a token, as before security existed.
struct ChannelSecurity {
  // Null: plaintext. Else e.g. from MakeChannelCredentials (TLS).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Non-empty: sent as metadata on every call of every channel.
  std::string job_token;
};

// Over gRPC: one channel per shard, shared with the gRPC data path, so every
// call of the worker (control and data) goes with the same credentials.
class GrpcControlClient : public ControlClient {
 public:
  // Opens a channel to every server (shard 0 first) and waits until each
  // has connected; UNAVAILABLE naming the shard if one does not within
  // connect_timeout. INVALID_ARGUMENT ("127.0.0.1:50062 is not shard 0 (it
  // says it is shard 1 of 2): list --servers in shard order") when a
  // server's own --shard or --num_shards disagrees with the list.
  static absl::StatusOr<std::unique_ptr<GrpcControlClient>> Connect(
      const std::vector<std::string>& servers, absl::Duration connect_timeout,
      absl::Duration rpc_timeout, const ChannelSecurity& security = {});
  ~GrpcControlClient() override;

  // The shard's channel, for the gRPC data path (transport_factory.h).
  std::shared_ptr<grpc::Channel> channel(int shard) const;
  // Another channel to the shard, with the same credentials, on a TCP
  // connection of its own (`index` >= 1 sets a channel argument, so gRPC
  // does not share the first channel's subchannel): the gRPC data path's
  // extra connections. Not waited for: it connects on first use.
  std::shared_ptr<grpc::Channel> OpenDataChannel(int shard, int index) const;
  // The same for the gRPC data path's pull connection
  // (ClientOptions::pull_connection): apart from every data channel.
  std::shared_ptr<grpc::Channel> OpenPullChannel(int shard) const;

  int num_shards() const override;
  std::string ShardName(int shard) const override;
  // The shard's gRPC address as given ("host:port").
  const std::string& ShardTarget(int shard) const { return servers_[shard]; }
  absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& request) override;
  absl::Status Barrier(const proto::BarrierRequest& request) override;
  absl::Status Heartbeat(const proto::HeartbeatRequest& request) override;
  absl::Status ReleaseSession(const proto::RegisterRequest& request,
                              absl::Time deadline) override;
  absl::Status Init(int shard, const proto::InitRequest& request) override;
  absl::Status Leave(int shard, const proto::LeaveRequest& request) override;
  absl::Status ShardHeartbeat(int shard, const proto::HeartbeatRequest& request,
                              absl::Time deadline,
                              proto::HeartbeatResponse* response = nullptr) override;
  absl::Status ReleaseShard(int shard, const proto::LeaveRequest& request,
                            absl::Time deadline) override;
  absl::StatusOr<transport::PeerAddress> GetTransportAddress(int shard,
                                                             const std::string& transport,
                                                             absl::Time deadline) override;
  bool ShardReachable(int shard) override;

 private:
  struct Shard;
  GrpcControlClient(std::vector<std::string> servers, absl::Duration rpc_timeout);
  // INVALID_ARGUMENT unless servers_[shard] says it is shard `shard` of
  // servers_.size(). OK from a shard that predates GetShardInfo.
  absl::Status CheckShardIndex(int shard);

  const std::vector<std::string> servers_;
  const absl::Duration rpc_timeout_;
  ChannelSecurity security_;                     // set by Connect
  std::vector<std::unique_ptr<Shard>> shards_;  // fixed after Connect
};

// Tells every shard, every `interval`, that this worker is alive at its
// current clock, on a thread of its own, until destroyed. A failed
// heartbeat is not an error of any operation: the calls that matter report
// the shard's state themselves.
class HeartbeatLoop {
 public:
  // `request` is called on the loop's thread for each shard of each round
  // (shards get their own chunks' clocks). `control` must outlive the loop.
  HeartbeatLoop(ControlClient& control, absl::Duration interval,
                std::function<proto::HeartbeatRequest(int shard)> request);
  ~HeartbeatLoop();  // stops and joins
  HeartbeatLoop(const HeartbeatLoop&) = delete;
  HeartbeatLoop& operator=(const HeartbeatLoop&) = delete;

 private:
  void Run();

  ControlClient& control_;
  const absl::Duration interval_;
  const std::function<proto::HeartbeatRequest(int shard)> request_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_CONTROL_CLIENT_H_
