#include "server/shard_service.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

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
  bool after_push = false;  // the pull half of a push-pull
  // Set by AnswerPulls: the plan's own memory (request and items) and the
  // parameter bytes its reply carries, for the parked-pull budget.
  uint64_t plan_bytes = 0;
  uint64_t reply_bytes = 0;
};

struct ShardService::Parked : PullWaiter {
  Parked(ShardService* service, std::shared_ptr<Work> work, std::shared_ptr<const PullPlan> plan,
         ReplySink* sink, size_t next)
      : service(service), work(std::move(work)), plan(std::move(plan)), sink(sink), next(next) {}

  void Wake() override { service->Fire(self.lock(), ShardService::Wake::kSlot); }
  const proto::ChunkRef& ref() const { return plan->items[next].ref; }

  ShardService* const service;
  const std::shared_ptr<Work> work;
  const std::shared_ptr<const PullPlan> plan;
  ReplySink* const sink;
  const size_t next;  // the chunk it waits for
  // Held in the memory account's parked-pull budget while parked.
  uint64_t charged_bytes = 0;
  std::weak_ptr<Parked> self;
  std::atomic<bool> fired{false};
  // Held while Park registers the call, so Resume never runs before the
  // cancellation id it must unregister is known.
  absl::Mutex registering;
  Cancellation::WakeId cancel_id ABSL_GUARDED_BY(registering) = 0;
  bool cancel_registered ABSL_GUARDED_BY(registering) = false;
};

namespace {

absl::Status ClientWentAway() { return absl::CancelledError("the client cancelled the call"); }

}  // namespace

ShardService::ShardService(ShardStore* store, const ShardServiceOptions& options)
    : store_(store),
      options_(options),
      memory_(MemoryAccountOptions{options.max_connection_bytes, options.max_buffered_bytes,
                                   options.max_parked_pull_bytes,
                                   options.max_probe_bytes_in_flight}),
      sessions_(options.job, DeriveSessionKey(options.job_token, options.job),
                store->options().num_workers) {
  absl::MutexLock lock(&mutex_);
  push_pool_ = std::make_unique<ThreadPool>(options.push_threads, options.max_queued_calls,
                                            "the shard's push pool");
  pull_pool_ = std::make_unique<ThreadPool>(options.pull_threads, options.max_queued_calls,
                                            "the shard's pull pool");
  timer_ = std::thread([this] { RunTimer(); });
}

ShardService::~ShardService() { Shutdown(); }

void ShardService::Shutdown() {
  std::unique_ptr<ThreadPool> push_pool, pull_pool;
  {
    absl::MutexLock lock(&mutex_);
    push_pool = std::move(push_pool_);
    pull_pool = std::move(pull_pool_);
  }
  // Parked calls end UNAVAILABLE: with the pools gone, Fire hands them to
  // the timer thread, where Resume finds parking closed.
  std::map<std::pair<Clock::time_point, const Parked*>, std::shared_ptr<Parked>> parked;
  {
    absl::MutexLock lock(&parking_mutex_);
    parking_closed_ = true;
    parked.swap(parked_);
  }
  for (auto& entry : parked) Fire(entry.second, Wake::kShutdown);
  // Outside the lock: draining tasks submit their pull halves, which are
  // then refused. Pushes first, since a push's task may feed the pull pool.
  push_pool.reset();
  pull_pool.reset();
  {
    absl::MutexLock lock(&parking_mutex_);
    timer_stop_ = true;
    parking_changed_.Signal();
  }
  if (timer_.joinable()) timer_.join();
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
  return harrier::CheckChunkCount(chunks);
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

absl::Status ShardService::CheckChunks(const std::vector<ShardStore::PushChunkView>& chunks,
                                       absl::string_view what) {
  // Every header within its limits before anything else reads it (the
  // transports check each as it arrives too, so as not to buffer the rest).
  for (const ShardStore::PushChunkView& chunk : chunks) {
    if (auto status = CheckChunkLimits(what, *chunk.header); !status.ok()) return status;
  }
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
  if (auto status = CheckHeartbeatLimits(request, store_->options().max_chunks); !status.ok()) {
    return status;
  }
  if (auto status = sessions_.Verify(request.job(), request.rank(), request.session(), "heartbeat");
      !status.ok()) {
    return status;
  }
  if (auto status = store_->membership().CheckRank(request.rank(), "heartbeat"); !status.ok()) {
    return status;
  }
  store_->membership().Heard(request.rank());
  store_->RebaseFromWorker(request.rank(), request.pushed());
  if (response != nullptr && request.report_next_clock()) {
    response->set_next_clock(store_->NextClock(request.rank()));
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckInit(const proto::InitRequest& request) {
  if (auto status = CheckInitLimits(request); !status.ok()) return status;
  // Like every call that names a rank: no session, no tensor (a session of
  // a newer run starts that run here first, before anything is created).
  return sessions_.Verify(request.job(), request.rank(), request.session(),
                          absl::StrCat("init '", request.key(), "'"));
}

absl::StatusOr<bool> ShardService::Init(const proto::InitRequest& request) {
  if (auto status = CheckInit(request); !status.ok()) return status;
  return store_->Init(request);
}

void ShardService::Release(uint32_t rank) {
  if (rank >= static_cast<uint32_t>(store_->options().num_workers)) return;
  store_->membership().Release(rank);
  spdlog::info("event=worker_done shard={} rank={} present={}", store_->options().shard, rank,
               store_->membership().present());
}

void ShardService::CheckLiveness(std::chrono::milliseconds timeout, WorkerLossPolicy policy) {
  std::vector<Membership::Lost> lost;
  store_->membership().FindLost(timeout, policy, &lost);
  if (lost.empty()) return;
  const bool carry_on = policy == WorkerLossPolicy::kContinue;
  for (const Membership::Lost& worker : lost) {
    if (carry_on) store_->Depart(worker.rank);
    spdlog::warn(
        "event=worker_lost shard={} rank={} last_heartbeat_ms={} timeout_ms={} policy={} "
        "present={}",
        store_->options().shard, worker.rank, worker.silent.count(), timeout.count(),
        carry_on ? "continue" : "fail", store_->membership().present());
  }
  if (!carry_on) store_->WakeAllPulls();  // parked pulls wake and fail
}

absl::Status ShardService::Leave(const proto::LeaveRequest& request) {
  if (auto status = CheckLeaveLimits(request); !status.ok()) return status;
  if (auto status = sessions_.VerifyHolder(request.job(), request.rank(), request.session(),
                                           request.release() ? "release" : "leave",
                                           options_.rejoin_after);
      !status.ok()) {
    return status;
  }
  if (request.release()) {
    Release(request.rank());
    return absl::OkStatus();
  }
  return store_->Leave(request.rank(), request.clock());
}

absl::Status ShardService::PullInto(const Work& work, const PullPlan& plan, bool on_pool,
                                    size_t* next, ReplySink* sink, bool* would_wait) {
  *would_wait = false;
  for (; *next < plan.items.size(); ++*next) {
    const size_t index = *next;
    const PullPlan::Item& item = plan.items[index];
    if (work.cancelled()) return ClientWentAway();
    if (on_pool && index > 0) {
      if (auto status = sink->AwaitSent(work.deadline); !status.ok()) return status;
    }
    // The store answers if the consistency model lets the pull through,
    // and otherwise says what it waits for; the wait is a Park.
    proto::TensorChunk header;
    PullTarget target;
    target.allocate = [sink](size_t bytes) { return sink->Allocate(bytes); };
    target.borrow = [sink](std::shared_ptr<const ParamBuffer> version) {
      sink->Borrow(std::move(version));
    };
    auto outcome = store_->TryPull(item.rank, item.clock, item.ref, &header, target);
    if (!outcome.ok()) return outcome.status();
    if (!outcome->ready) {
      if (work.cancellation != nullptr && work.cancellation->cancelled()) {
        return absl::CancelledError(absl::StrCat("pull of key '", item.ref.key(), "' chunk ",
                                                 item.ref.chunk(), " cancelled by the client"));
      }
      if (Clock::now() < work.deadline) {
        *would_wait = true;
        return absl::OkStatus();
      }
      return PullWaitExpired(PullQuery{item.rank, item.clock, &item.ref}, outcome->verdict);
    }
    absl::Status status;
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

void ShardService::AnswerPulls(const std::shared_ptr<Work>& work, std::shared_ptr<PullPlan> plan,
                               ReplySink* sink) {
  // The plan's memory, counted without reflection (this runs for every
  // pull): the items with their keys, and a Pull's request holding a copy
  // of each reference.
  const uint64_t request_refs = plan->after_push ? 0 : 1;
  plan->plan_bytes = sizeof(PullPlan) + plan->items.capacity() * sizeof(PullPlan::Item) +
                     request_refs * plan->items.size() * sizeof(proto::ChunkRef);
  for (const auto& item : plan->items) {
    plan->reply_bytes += item.ref.num_elements() * sizeof(float);
    plan->plan_bytes += (1 + request_refs) * item.ref.key().capacity();
  }
  if (work->on_caller_thread && plan->reply_bytes <= kInlinePullBytes) {
    // What can be answered now is, without a hand-off; at the first chunk
    // that has to wait the call parks, still without one.
    Continue(work, std::move(plan), sink, 0, /*on_pool=*/false);
    return;
  }
  auto queued = Submit(
      Pool::kPull, [this, work, plan, sink] { Continue(work, plan, sink, 0, /*on_pool=*/true); });
  if (queued.ok()) return;
  if (plan->after_push) {
    // Say that only the pull half failed (a retry of the whole call is
    // answered as a duplicate push, then pulls).
    queued = absl::Status(
        queued.code(),
        absl::StrCat("the push was applied but its pull half was refused: ", queued.message()));
  }
  work->Finish(queued);
}

void ShardService::Continue(const std::shared_ptr<Work>& work, std::shared_ptr<const PullPlan> plan,
                            ReplySink* sink, size_t next, bool on_pool) {
  bool would_wait = false;
  auto status = PullInto(*work, *plan, on_pool, &next, sink, &would_wait);
  if (!would_wait) {
    work->Finish(status);
    return;
  }
  Park(work, std::move(plan), sink, next);
}

uint64_t ShardService::ParkedBytes(const PullPlan& plan, size_t next) {
  // Reply chunks answered before the wait may still be queued in the sink:
  // all of them when answered inline (at most kInlinePullBytes), one at a
  // time on the pull pool (AwaitSent).
  const uint64_t queued = next == 0 ? 0 : std::min<uint64_t>(plan.reply_bytes, kInlinePullBytes);
  return plan.plan_bytes + queued;
}

void ShardService::Park(const std::shared_ptr<Work>& work, std::shared_ptr<const PullPlan> plan,
                        ReplySink* sink, size_t next) {
  auto parked = std::make_shared<Parked>(this, work, std::move(plan), sink, next);
  parked->self = parked;
  const PullPlan::Item& item = parked->plan->items[next];
  // A parked pull holds its request (the chunk list) and the reply chunks
  // it queued before it parked, for as long as it waits: charged so that
  // many waiting pulls cannot hold the shard's memory unbounded.
  parked->charged_bytes = ParkedBytes(*parked->plan, next);
  if (auto status = memory_.parked_pulls().Reserve(parked->charged_bytes); !status.ok()) {
    parked->charged_bytes = 0;
    work->Finish(status);
    return;
  }
  {
    absl::MutexLock hold(&parked->registering);
    {
      // In the registry first: from here on the deadline (or Shutdown)
      // ends the wait whatever else happens.
      absl::MutexLock lock(&parking_mutex_);
      if (parking_closed_) {
        memory_.parked_pulls().Release(parked->charged_bytes);
        work->Finish(absl::UnavailableError("shard is shutting down"));
        return;
      }
      if (parked_.size() >= options_.max_parked_pulls) {
        memory_.parked_pulls().Release(parked->charged_bytes);
        work->Finish(absl::ResourceExhaustedError(
            absl::StrCat("more than ", options_.max_parked_pulls,
                         " pulls already wait on the consistency model on this shard")));
        return;
      }
      parked_.emplace(std::make_pair(work->deadline, parked.get()), parked);
      parking_changed_.Signal();
    }
    if (!store_->Park(item.clock, item.ref, parked)) {
      Fire(parked, Wake::kRetry);
    } else if (work->cancellation != nullptr) {
      // Runs the wake-up at once if the client has cancelled already.
      std::weak_ptr<Parked> weak = parked;
      parked->cancel_id = work->cancellation->Register([weak] {
        if (auto woken = weak.lock()) woken->service->Fire(woken, Wake::kCancel);
      });
      parked->cancel_registered = true;
    }
  }
  // Fired while registering: what was registered after the firing's
  // clean-up is taken off again (both are idempotent).
  if (parked->fired) {
    store_->Unpark(item.ref, parked.get());
    absl::MutexLock lock(&parking_mutex_);
    parked_.erase(std::make_pair(work->deadline, parked.get()));
  }
}

void ShardService::Fire(const std::shared_ptr<Parked>& parked, Wake why) {
  if (parked == nullptr || parked->fired.exchange(true)) return;
  // No longer parked: Resume answers it, or parks it again (charged anew).
  memory_.parked_pulls().Release(parked->charged_bytes);
  if (why != Wake::kSlot) store_->Unpark(parked->ref(), parked.get());
  {
    absl::MutexLock lock(&parking_mutex_);
    parked_.erase(std::make_pair(parked->work->deadline, parked.get()));
  }
  auto queued = Submit(Pool::kPull, [this, parked] { Resume(parked); });
  if (queued.ok()) return;
  // A full or retired pool: the timer thread answers it (the call still
  // ends, with its answer or the error a retry of the store gives).
  absl::MutexLock lock(&parking_mutex_);
  run_now_.push_back(parked);
  parking_changed_.Signal();
}

void ShardService::Resume(const std::shared_ptr<Parked>& parked) {
  {
    absl::MutexLock hold(&parked->registering);
    // Not from inside the wake-up (Unregister waits for it): Resume runs on
    // the pull pool or the timer thread.
    if (parked->cancel_registered) parked->work->cancellation->Unregister(parked->cancel_id);
    parked->cancel_registered = false;
  }
  Continue(parked->work, parked->plan, parked->sink, parked->next, /*on_pool=*/true);
}

// The lock is dropped around each firing (Fire and Resume take it, and
// may finish a call).
void ShardService::RunTimer() {
  absl::MutexLock lock(&parking_mutex_);
  while (!timer_stop_ || !run_now_.empty()) {
    if (!run_now_.empty()) {
      std::vector<std::shared_ptr<Parked>> ready;
      ready.swap(run_now_);
      parking_mutex_.Unlock();
      for (auto& parked : ready) Resume(parked);
      parking_mutex_.Lock();
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (!parked_.empty() && parked_.begin()->first.first <= now) {
      std::shared_ptr<Parked> expired = parked_.begin()->second;
      parked_.erase(parked_.begin());
      parking_mutex_.Unlock();
      Fire(expired, Wake::kDeadline);
      parking_mutex_.Lock();
      continue;
    }
    // Every wait has a deadline: the earliest parked one, or a second.
    Clock::time_point until = now + std::chrono::seconds(1);
    if (!parked_.empty()) until = std::min(until, parked_.begin()->first.first);
    parking_changed_.WaitWithTimeout(&parking_mutex_, absl::FromChrono(until - now));
  }
}

void ShardService::Push(const Call& call, std::vector<ShardStore::PushChunkView> chunks,
                        Done done) {
  auto work = Begin(call, options_.push_seconds, std::move(done));
  if (auto status = CheckChunkCount(chunks.size()); !status.ok()) {
    work->Finish(status);
    return;
  }
  if (auto status = CheckChunks(chunks, "push"); !status.ok()) {
    work->Finish(status);
    return;
  }
  auto status = RunPush(
      *work, [this, work, chunks = std::move(chunks)] { work->Finish(ApplyPush(*work, chunks)); });
  if (!status.ok()) work->Finish(status);
}

void ShardService::Pull(const Call& call, proto::PullRequest request, ReplySink* sink, Done done) {
  auto work = Begin(call, options_.pull_seconds, std::move(done));
  if (auto status = CheckPullLimits(request); !status.ok()) {
    work->Finish(status);
    return;
  }
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
  if (auto status = CheckChunks(chunks, "push-pull"); !status.ok()) {
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
