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
  bool on_caller_thread = false;  // Call::work_on_caller_thread
  Histogram* latency = nullptr;
  PushResult* push_result = nullptr;  // Call::push_result
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
    const std::string* job = nullptr;  // into `request` or the pushed headers
  };
  proto::PullRequest request;  // a Pull's; empty for a push-pull
  std::vector<Item> items;
  bool after_push = false;     // the pull half of a push-pull
};

namespace {

absl::Status ClientWentAway() { return absl::CancelledError("the client cancelled the call"); }

}  // namespace

ShardService::ShardService(ShardStore* store, const ShardServiceOptions& options)
    : store_(store),
      options_(options),
      buffer_budget_(options.max_connection_bytes, options.max_buffered_bytes),
      sessions_(options.job, DeriveSessionKey(options.job_token, options.job),
                store->options().num_workers) {
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

absl::Status ShardService::CheckRequestBytes(uint64_t bytes) const {
  if (bytes <= options_.max_request_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("call carries more than ", options_.max_request_bytes,
                   " payload bytes (--max_request_bytes); split it into smaller calls"));
}

std::shared_ptr<ShardService::Work> ShardService::Begin(const Call& call, Histogram* latency,
                                                        Done done) const {
  auto work = std::make_shared<Work>();
  work->received = call.received;
  work->deadline = ServerDeadline(call.client_deadline, Clock::now());
  work->cancellation = call.cancellation;
  work->on_caller_thread = call.work_on_caller_thread;
  work->latency = latency;
  work->push_result = call.push_result;
  work->done = std::move(done);
  return work;
}

absl::Status ShardService::Submit(Pool pool, std::function<void()> task) {
  absl::ReaderMutexLock lock(&mutex_);
  ThreadPool* target = pool == Pool::kPush ? push_pool_.get() : pull_pool_.get();
  if (target == nullptr) return absl::UnavailableError("shard is shutting down");
  return target->Submit(std::move(task));
}

absl::Status ShardService::RunPush(const Work& work, std::function<void()> task) {
  if (!work.on_caller_thread) return Submit(Pool::kPush, std::move(task));
  {
    absl::ReaderMutexLock lock(&mutex_);
    if (push_pool_ == nullptr) return absl::UnavailableError("shard is shutting down");
  }
  task();
  return absl::OkStatus();
}

absl::Status ShardService::ApplyPush(const Work& work,
                                     const std::vector<ShardStore::PushChunkView>& chunks) {
  // A call the client gave up on before it was applied changes nothing.
  if (work.cancelled()) return ClientWentAway();
  return store_->Push(chunks, work.push_result);
}

absl::Status ShardService::CheckSessions(const std::vector<ShardStore::PushChunkView>& chunks,
                                         absl::string_view what) {
  const proto::TensorChunk* verified = nullptr;
  for (const ShardStore::PushChunkView& chunk : chunks) {
    const proto::TensorChunk& header = *chunk.header;
    // A call's chunks nearly always share one identity: verify it once.
    if (verified != nullptr && header.rank() == verified->rank() &&
        header.job() == verified->job() &&
        header.session().epoch() == verified->session().epoch() &&
        header.session().credential() == verified->session().credential()) {
      continue;
    }
    if (auto status = sessions_.Verify(header.job(), header.rank(), header.session(), what);
        !status.ok()) {
      return status;
    }
    verified = &header;
  }
  return absl::OkStatus();
}

absl::Status ShardService::Heartbeat(const proto::HeartbeatRequest& request,
                                     proto::HeartbeatResponse* response) {
  if (auto status = sessions_.Verify(request.job(), request.rank(), request.session(), "heartbeat");
      !status.ok()) {
    return status;
  }
  if (auto status = store_->Heartbeat(request.rank()); !status.ok()) return status;
  store_->RebaseFromWorker(request.rank(), request.pushed());
  if (response != nullptr && request.report_next_clock()) {
    response->set_next_clock(store_->NextClock(request.rank()));
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckInit(const proto::InitRequest& request) {
  // Clients from before sessions in Init send none; a session that is sent
  // must verify (and a newer run's starts that run here first).
  if (!request.has_session()) return absl::OkStatus();
  return sessions_.Verify(request.job(), request.rank(), request.session(),
                          absl::StrCat("init '", request.key(), "'"));
}

absl::Status ShardService::Leave(const proto::LeaveRequest& request) {
  if (auto status = sessions_.Verify(request.job(), request.rank(), request.session(),
                                     request.release() ? "release" : "leave");
      !status.ok()) {
    return status;
  }
  if (request.release()) {
    store_->Release(request.rank());
    return absl::OkStatus();
  }
  return store_->Leave(request.rank(), request.clock());
}

absl::Status ShardService::PullInto(const Work& work, const PullPlan& plan, bool only_if_ready,
                                    size_t* next, ReplySink* sink, bool* would_wait) {
  *would_wait = false;
  for (; *next < plan.items.size(); ++*next) {
    const size_t index = *next;
    const PullPlan::Item& item = plan.items[index];
    if (work.cancelled()) return ClientWentAway();
    if (!only_if_ready && index > 0) {
      if (auto status = sink->AwaitSent(work.deadline); !status.ok()) return status;
    }
    // A deadline already reached: the store answers if the consistency
    // model lets the pull through now, and otherwise returns at once.
    const Clock::time_point deadline = only_if_ready ? Clock::now() : work.deadline;
    proto::TensorChunk header;
    auto status = store_->Pull(item.rank, item.clock, item.ref, deadline, work.cancellation,
                               &header, [sink](size_t bytes) { return sink->Allocate(bytes); },
                               [sink](std::shared_ptr<const ParamBuffer> version) {
                                 sink->Borrow(std::move(version));
                               });
    if (only_if_ready && absl::IsDeadlineExceeded(status)) {
      *would_wait = true;
      return absl::OkStatus();
    }
    if (!status.ok()) return status;
    header.set_job(*item.job);
    const bool last = index + 1 == plan.items.size();
    if (status = sink->Send(header, static_cast<uint32_t>(index), last); !status.ok()) {
      return status;
    }
  }
  // Nothing may fail after the last Send: it promised the sink an OK.
  return absl::OkStatus();
}

namespace {

// Pulls up to this many parameter bytes are answered on the transport's
// thread when they need not wait (no hand-off: the 4 KiB round trip is
// 60-100 us faster). Larger ones go to the pull pool even when ready, where
// AwaitSent keeps one reply chunk of the call in memory at a time; inline,
// where nothing may block, every chunk would be queued at once (and 16 MiB
// pulls measured 15-20 % slower with the copies running ahead of the sends).
constexpr uint64_t kInlinePullBytes = 256u << 10;

}  // namespace

void ShardService::AnswerPulls(const std::shared_ptr<Work>& work,
                               std::shared_ptr<const PullPlan> plan, ReplySink* sink) {
  size_t next = 0;
  uint64_t plan_bytes = 0;
  for (const auto& item : plan->items) plan_bytes += item.ref.num_elements() * sizeof(float);
  if (work->on_caller_thread && plan_bytes <= kInlinePullBytes) {
    // What can be answered now is, without a hand-off; the first chunk that
    // has to wait and the rest go to the pull pool.
    bool would_wait = false;
    auto status = PullInto(*work, *plan, /*only_if_ready=*/true, &next, sink, &would_wait);
    if (!would_wait) {
      work->Finish(status);
      return;
    }
  }
  auto queued = Submit(Pool::kPull, [this, work, plan, next, sink] {
    size_t from = next;
    bool would_wait = false;
    work->Finish(PullInto(*work, *plan, /*only_if_ready=*/false, &from, sink, &would_wait));
  });
  if (queued.ok()) return;
  if (plan->after_push) {
    // Say that only the pull half failed (a retry of the whole call is
    // answered as a duplicate push, then pulls).
    queued = absl::Status(queued.code(),
                          absl::StrCat("the push was applied but its pull half was refused: ",
                                       queued.message()));
  }
  work->Finish(queued);
}

void ShardService::Push(const Call& call, std::vector<ShardStore::PushChunkView> chunks,
                        Done done) {
  auto work = Begin(call, options_.push_seconds, std::move(done));
  if (auto status = CheckChunkCount(chunks.size()); !status.ok()) {
    work->Finish(status);
    return;
  }
  if (auto status = CheckSessions(chunks, "push"); !status.ok()) {
    work->Finish(status);
    return;
  }
  auto status = RunPush(*work, [this, work, chunks = std::move(chunks)] {
    work->Finish(ApplyPush(*work, chunks));
  });
  if (!status.ok()) work->Finish(status);
}

void ShardService::Pull(const Call& call, proto::PullRequest request, ReplySink* sink,
                        Done done) {
  auto work = Begin(call, options_.pull_seconds, std::move(done));
  if (auto status = sessions_.Verify(request.job(), request.rank(), request.session(), "pull");
      !status.ok()) {
    work->Finish(status);
    return;
  }
  auto plan = std::make_shared<PullPlan>();
  plan->request = std::move(request);
  const proto::PullRequest& pull = plan->request;
  plan->items.reserve(pull.chunks_size());
  for (const proto::ChunkRef& ref : pull.chunks()) {
    plan->items.push_back({pull.rank(), pull.clock(), ref, &pull.job()});
  }
  AnswerPulls(work, std::move(plan), sink);
}

void ShardService::PushPull(const Call& call, std::vector<ShardStore::PushChunkView> chunks,
                            ReplySink* sink, Done done) {
  auto work = Begin(call, options_.pull_seconds, std::move(done));
  if (auto status = CheckChunkCount(chunks.size()); !status.ok()) {
    work->Finish(status);
    return;
  }
  if (auto status = CheckSessions(chunks, "push-pull"); !status.ok()) {
    work->Finish(status);
    return;
  }
  // A pull half that would be refused refuses the call before its push is
  // applied: a retry could not push the same clock again.
  for (const ShardStore::PushChunkView& pushed : chunks) {
    if (auto status = store_->CheckPullCodec(pushed.header->pull_codec_params()); !status.ok()) {
      work->Finish(status);
      return;
    }
  }
  auto status = RunPush(*work, [this, work, sink, chunks = std::move(chunks)] {
    auto pushed = ApplyPush(*work, chunks);
    // The push half counts as a push: training loops that only PushPull
    // would otherwise leave the push latency empty.
    if (options_.push_seconds != nullptr) {
      options_.push_seconds->Observe(
          std::chrono::duration<double>(Clock::now() - work->received).count());
    }
    if (auto status = std::move(pushed); !status.ok()) {
      work->Finish(status);
      return;
    }
    auto plan = std::make_shared<PullPlan>();
    plan->after_push = true;
    plan->items.reserve(chunks.size());
    for (const ShardStore::PushChunkView& pushed : chunks) {
      PullPlan::Item item;
      item.rank = pushed.header->rank();
      item.ref = ShardStore::PushPullRef(*pushed.header, &item.clock);
      item.job = &pushed.header->job();
      plan->items.push_back(std::move(item));
    }
    AnswerPulls(work, std::move(plan), sink);
  });
  if (!status.ok()) work->Finish(status);
}

}  // namespace harrier
