#ifndef HARRIER_WORKER_FAKE_CONTROL_CLIENT_H_
#define HARRIER_WORKER_FAKE_CONTROL_CLIENT_H_

// A ControlClient for tests: no process, no socket. It records every
// request and answers OK (Register: rank 0 of `num_workers`, BSP) unless
// the test sets a failure for a method.

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/control_client.h"

namespace harrier {

class FakeControlClient : public ControlClient {
 public:
  struct Requests {
    std::vector<proto::RegisterRequest> registers;
    std::vector<std::pair<int, proto::InitRequest>> inits;  // (shard, request)
    std::vector<proto::BarrierRequest> barriers;
    std::vector<proto::HeartbeatRequest> heartbeats;
    std::vector<std::pair<int, proto::HeartbeatRequest>> shard_heartbeats;
    std::vector<std::pair<int, proto::LeaveRequest>> leaves;
    std::vector<proto::RegisterRequest> releases;
  };

  // The session Register hands out for `rank` (epoch 1, a fixed
  // credential): what every later request of that rank must carry.
  static proto::Session SessionFor(uint32_t rank) {
    proto::Session session;
    session.set_epoch(1);
    session.set_credential(absl::StrCat("fake-credential-", rank));
    return session;
  }

  explicit FakeControlClient(int num_shards, int num_workers = 1)
      : num_shards_(num_shards), num_workers_(num_workers) {}

  // Every later Init fails with `status` (OK clears it).
  void FailInit(absl::Status status) {
    absl::MutexLock lock(&mutex_);
    init_failure_ = std::move(status);
  }

  Requests requests() const {
    absl::MutexLock lock(&mutex_);
    return requests_;
  }

  int num_shards() const override { return num_shards_; }
  std::string ShardName(int shard) const override {
    return absl::StrCat("shard ", shard, " (fake:", shard, ")");
  }
  absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& request) override {
    absl::MutexLock lock(&mutex_);
    requests_.registers.push_back(request);
    proto::RegisterResponse response;
    response.set_rank(request.requested_rank() < 0 ? 0 : request.requested_rank());
    response.set_num_workers(num_workers_);
    *response.mutable_session() = SessionFor(response.rank());
    return response;
  }
  absl::Status ReleaseSession(const proto::RegisterRequest& request, absl::Time) override {
    absl::MutexLock lock(&mutex_);
    requests_.releases.push_back(request);
    return absl::OkStatus();
  }
  absl::Status Barrier(const proto::BarrierRequest& request) override {
    absl::MutexLock lock(&mutex_);
    requests_.barriers.push_back(request);
    return absl::OkStatus();
  }
  absl::Status Heartbeat(const proto::HeartbeatRequest& request) override {
    absl::MutexLock lock(&mutex_);
    requests_.heartbeats.push_back(request);
    return absl::OkStatus();
  }
  absl::Status Init(int shard, const proto::InitRequest& request) override {
    absl::MutexLock lock(&mutex_);
    requests_.inits.emplace_back(shard, request);
    if (init_failure_.ok()) return absl::OkStatus();
    return absl::Status(init_failure_.code(),
                        absl::StrCat(ShardName(shard), ": ", init_failure_.message()));
  }
  absl::Status Leave(int shard, const proto::LeaveRequest& request) override {
    absl::MutexLock lock(&mutex_);
    requests_.leaves.emplace_back(shard, request);
    return absl::OkStatus();
  }
  absl::Status ShardHeartbeat(int shard, const proto::HeartbeatRequest& request, absl::Time,
                              proto::HeartbeatResponse* = nullptr) override {
    absl::MutexLock lock(&mutex_);
    requests_.shard_heartbeats.emplace_back(shard, request);
    return absl::OkStatus();
  }
  absl::StatusOr<transport::PeerAddress> GetTransportAddress(int shard, const std::string&,
                                                             absl::Time) override {
    return transport::PeerAddress{absl::StrCat("fake:", shard), ""};
  }
  bool ShardReachable(int) override { return true; }

 private:
  const int num_shards_;
  const int num_workers_;
  mutable absl::Mutex mutex_;
  Requests requests_ ABSL_GUARDED_BY(mutex_);
  absl::Status init_failure_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_FAKE_CONTROL_CLIENT_H_
