#include "server/shard_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace harrier {

struct ShardService::Work {
  Clock::time_point received;
  Clock::time_point deadline;
  Cancellation* cancellation = nullptr;
  Histogram* latency = nullptr;
  Done done;

  bool cancelled() const { return cancellation != nullptr && cancellation->cancelled(); }

  // The last thing a call does: nothing of it is touched afterwards.
  void Finish(const absl::Status& status) const {
    if (latency != nullptr) {
      latency->Observe(std::chrono::duration<double>(Clock::now() - received).count());
    }
    done(status);
  }
};

struct ShardService::PullPlan {
  struct Item {
    uint32_t rank = 0;
    int64_t clock = 0;
    proto::ChunkRef ref;
    const std::string* job = nullptr;  // into the request or the pushed headers
  };
  std::vector<Item> items;
};

namespace {

absl::Status ClientWentAway() { return absl::CancelledError("the client cancelled the call"); }

}  // namespace

ShardService::ShardService(ShardStore* store, const ShardServiceOptions& options)
    : store_(store), options_(options) {
  absl::MutexLock lock(&mutex_);
  push_pool_ = std::make_unique<ThreadPool>(options.push_threads, options.max_queued_calls,
                                            "the shard's push pool");
  pull_pool_ = std::make_unique<ThreadPool>(options.pull_threads, options.max_queued_calls,
                                            "the shard's pull pool");
}

ShardService::~ShardService() { Shutdown(); }

void ShardService::Shutdown() {
  std::unique_ptr<ThreadPool> push_pool, pull_pool;
  {
    absl::MutexLock lock(&mutex_);
    push_pool = std::move(push_pool_);
    pull_pool = std::move(pull_pool_);
  }
  // Outside the lock: draining tasks submit their pull halves, which are
  // then refused. Pushes first, since a push's task may feed the pull pool.
  push_pool.reset();
  pull_pool.reset();
}

ShardService::Clock::time_point ShardService::ServerDeadline(Clock::time_point client_deadline,
                                                             Clock::time_point now) {
  constexpr Clock::duration kMaxWait = std::chrono::hours(1);
  if (client_deadline == Clock::time_point::max() || client_deadline - now > kMaxWait) {
    return now + kMaxWait;
  }
  Clock::duration remaining = client_deadline - now;
  remaining -= std::min<Clock::duration>(std::chrono::milliseconds(200), remaining / 5);
  return now + remaining;
}

absl::Status ShardService::CheckChunkCount(size_t chunks) {
  if (chunks <= kMaxChunksPerCall) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("more than ", kMaxChunksPerCall, " chunks in one call"));
}

std::shared_ptr<ShardService::Work> ShardService::Begin(const Call& call, Histogram* latency,
                                                        Done done) const {
  auto work = std::make_shared<Work>();
  work->received = call.received;
  work->deadline = ServerDeadline(call.client_deadline, Clock::now());
  work->cancellation = call.cancellation;
  work->latency = latency;
  work->done = std::move(done);
  return work;
}

absl::Status ShardService::Submit(Pool pool, std::function<void()> task) {
  absl::ReaderMutexLock lock(&mutex_);
  ThreadPool* target = pool == Pool::kPush ? push_pool_.get() : pull_pool_.get();
  if (target == nullptr) return absl::UnavailableError("shard is shutting down");
  return target->Submit(std::move(task));
}

absl::Status ShardService::ApplyPush(const Work& work,
                                     const std::vector<ShardStore::PushChunkView>& chunks) {
  // A call the client gave up on before it was applied changes nothing.
  if (work.cancelled()) return ClientWentAway();
  return store_->Push(chunks);
}

absl::Status ShardService::PullInto(const Work& work, const PullPlan& plan, ReplySink* sink) {
  for (uint32_t index = 0; index < plan.items.size(); ++index) {
    const PullPlan::Item& item = plan.items[index];
    if (work.cancelled()) return ClientWentAway();
    proto::TensorChunk header;
    auto status = store_->Pull(item.rank, item.clock, item.ref, work.deadline, work.cancellation,
                               &header, [sink](size_t bytes) { return sink->Allocate(bytes); });
    if (!status.ok()) return status;
    header.set_job(*item.job);
    const bool last = index + 1 == plan.items.size();
    if (status = sink->Send(header, index, last); !status.ok()) return status;
  }
  // Nothing may fail after the last Send: it promised the sink an OK.
  return absl::OkStatus();
}

void ShardService::Push(const Call& call, std::vector<ShardStore::PushChunkView> chunks,
                        Done done) {
  auto work = Begin(call, options_.push_seconds, std::move(done));
  if (auto status = CheckChunkCount(chunks.size()); !status.ok()) {
    work->Finish(status);
    return;
  }
  auto status = Submit(Pool::kPush, [this, work, chunks = std::move(chunks)] {
    work->Finish(ApplyPush(*work, chunks));
  });
  if (!status.ok()) work->Finish(status);
}

void ShardService::Pull(const Call& call, proto::PullRequest request, ReplySink* sink,
                        Done done) {
  auto work = Begin(call, options_.pull_seconds, std::move(done));
  auto shared_request = std::make_shared<proto::PullRequest>(std::move(request));
  auto status = Submit(Pool::kPull, [this, work, sink, request = std::move(shared_request)] {
    PullPlan plan;
    plan.items.reserve(request->chunks_size());
    for (const proto::ChunkRef& ref : request->chunks()) {
      plan.items.push_back({request->rank(), request->clock(), ref, &request->job()});
    }
    work->Finish(PullInto(*work, plan, sink));
  });
  if (!status.ok()) work->Finish(status);
}

void ShardService::PushPull(const Call& call, std::vector<ShardStore::PushChunkView> chunks,
                            ReplySink* sink, Done done) {
  auto work = Begin(call, options_.pull_seconds, std::move(done));
  if (auto status = CheckChunkCount(chunks.size()); !status.ok()) {
    work->Finish(status);
    return;
  }
  auto status = Submit(Pool::kPush, [this, work, sink, chunks = std::move(chunks)] {
    if (auto status = ApplyPush(*work, chunks); !status.ok()) {
      work->Finish(status);
      return;
    }
    auto plan = std::make_shared<PullPlan>();
    plan->items.reserve(chunks.size());
    for (const ShardStore::PushChunkView& pushed : chunks) {
      PullPlan::Item item;
      item.rank = pushed.header->rank();
      item.ref = ShardStore::PushPullRef(*pushed.header, &item.clock);
      item.job = &pushed.header->job();
      plan->items.push_back(std::move(item));
    }
    auto queued =
        Submit(Pool::kPull, [this, work, sink, plan] { work->Finish(PullInto(*work, *plan, sink)); });
    if (!queued.ok()) {
      // Retrying the whole call would be refused as a second push of the
      // clock: say that only the pull half failed.
      work->Finish(absl::Status(
          queued.code(), absl::StrCat("the push was applied but its pull half was refused: ",
                                      queued.message())));
    }
  });
  if (!status.ok()) work->Finish(status);
}

}  // namespace harrier
