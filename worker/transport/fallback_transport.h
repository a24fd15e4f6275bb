#ifndef HARRIER_WORKER_TRANSPORT_FALLBACK_TRANSPORT_H_
#define HARRIER_WORKER_TRANSPORT_FALLBACK_TRANSPORT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/transport.h"

namespace harrier {

// One shard's data path that moves to a second backend, for good, once the
// shard withdraws the first: "auto" keeps a shard on tcp until the shard,
// restarted with --tcp=false, no longer serves it, and then goes on over
// gRPC instead of failing every call. The first backend's reconnect is
// what finds out (the shard's address for it is FAILED_PRECONDITION); the
// call that found out fails UNAVAILABLE as any call to a lost shard does,
// and its retry, like every call after it, runs on the second backend.
//
// Both backends must agree on device memory (tcp and gRPC: host memory
// only); the traits are the first's, data_path() names the one in use.
class FallbackShardTransport final : public ShardTransport {
 public:
  // `withdrawn`: whether the shard has withdrawn `primary` (cheap, called
  // on every Start until it says true). `make_fallback`: the second
  // backend, made the first time it is needed.
  FallbackShardTransport(std::string peer_name, std::unique_ptr<ShardTransport> primary,
                         std::function<bool()> withdrawn,
                         std::function<std::unique_ptr<ShardTransport>()> make_fallback);

  std::string data_path() const override;

  void StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                 CallCanceller& canceller, CallDone done) override;
  void StartPull(const proto::PullRequest& request, const ReplyLandingChooser* choose,
                 const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                 CallDone done) override;
  void StartPushPull(const std::vector<OutgoingChunk>& chunks, const ReplyLandingChooser* choose,
                     const LandedChunkSink& sink, absl::Time deadline, CallCanceller& canceller,
                     CallDone done) override;

 private:
  ShardTransport& Current();

  const std::string peer_name_;
  // Declared before the fallback, so destroyed after it: each backend's
  // destructor ends its own calls.
  const std::unique_ptr<ShardTransport> primary_;
  const std::function<bool()> withdrawn_;
  const std::function<std::unique_ptr<ShardTransport>()> make_fallback_;
  absl::Mutex mutex_;
  std::unique_ptr<ShardTransport> fallback_ ABSL_GUARDED_BY(mutex_);
  // fallback_ once made, read without the lock on every call.
  std::atomic<ShardTransport*> in_use_fallback_{nullptr};
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_FALLBACK_TRANSPORT_H_
