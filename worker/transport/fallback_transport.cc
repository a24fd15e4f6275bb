#include "worker/transport/fallback_transport.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace harrier {

FallbackShardTransport::FallbackShardTransport(
    std::string peer_name, std::unique_ptr<ShardTransport> primary, std::function<bool()> withdrawn,
    std::function<std::unique_ptr<ShardTransport>()> make_fallback)
    : ShardTransport(primary->traits()),
      peer_name_(std::move(peer_name)),
      primary_(std::move(primary)),
      withdrawn_(std::move(withdrawn)),
      make_fallback_(std::move(make_fallback)) {}

std::string FallbackShardTransport::data_path() const {
  ShardTransport* fallback = in_use_fallback_.load(std::memory_order_acquire);
  return fallback != nullptr ? fallback->data_path() : primary_->data_path();
}

ShardTransport& FallbackShardTransport::Current() {
  if (ShardTransport* fallback = in_use_fallback_.load(std::memory_order_acquire)) {
    return *fallback;
  }
  if (!withdrawn_()) return *primary_;
  absl::MutexLock lock(&mutex_);
  if (fallback_ == nullptr) {
    fallback_ = make_fallback_();
    spdlog::warn(
        "{} no longer serves the {} data path (restarted with --{}=false?): its pushes and pulls "
        "go over {} from now on",
        peer_name_, primary_->data_path(), primary_->data_path(), fallback_->data_path());
    in_use_fallback_.store(fallback_.get(), std::memory_order_release);
  }
  return *fallback_;
}

void FallbackShardTransport::StartPush(const std::vector<OutgoingChunk>& chunks,
                                       absl::Time deadline, CallCanceller& canceller,
                                       CallDone done) {
  Current().StartPush(chunks, deadline, canceller, std::move(done));
}

void FallbackShardTransport::StartPull(const proto::PullRequest& request,
                                       const ReplyLandingChooser* choose,
                                       const LandedChunkSink& sink, absl::Time deadline,
                                       CallCanceller& canceller, CallDone done) {
  Current().StartPull(request, choose, sink, deadline, canceller, std::move(done));
}

void FallbackShardTransport::StartPushPull(const std::vector<OutgoingChunk>& chunks,
                                           const ReplyLandingChooser* choose,
                                           const LandedChunkSink& sink, absl::Time deadline,
                                           CallCanceller& canceller, CallDone done) {
  Current().StartPushPull(chunks, choose, sink, deadline, canceller, std::move(done));
}

}  // namespace harrier
