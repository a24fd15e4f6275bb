#include "worker/transport/grpc/client_call_queue.h"

#include <pthread.h>

#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/queue_event.h"
#include "spdlog/spdlog.h"

namespace harrier {
namespace {

// How long the destructor waits for cancelled calls to end. A cancelled
// call's operations come back at once; this only bounds a gRPC that does
// not deliver them.
constexpr absl::Duration kCloseGrace = absl::Seconds(10);

}  // namespace

struct ClientCallQueue::State {
  grpc::CompletionQueue queue;
  std::thread thread;
  absl::Mutex mutex;
  absl::flat_hash_set<grpc::ClientContext*> open ABSL_GUARDED_BY(mutex);
  bool closing ABSL_GUARDED_BY(mutex) = false;
  bool shut_down ABSL_GUARDED_BY(mutex) = false;  // queue.Shutdown() was called

  // The thread's loop. It waits in the queue only while a call is open:
  // a thread waiting in a gRPC queue polls every connection of the
  // process, so an idle one would take the replies of the calls that
  // waiting callers run on their own threads (gRPC's synchronous API) and
  // hand each back to its caller, two context switches more per call
  // (docs/performance.md, "The worker without gRPC's callback threads").
  // Every event belongs to an open call: a call holds the queue from
  // before its first operation until its last is back.
  void Poll() {
    for (;;) {
      {
        absl::MutexLock lock(&mutex);
        auto may_poll = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
          return !open.empty() || shut_down;
        };
        mutex.Await(absl::Condition(&may_poll));
      }
      void* tag = nullptr;
      bool ok = false;
      if (!queue.Next(&tag, &ok)) return;  // shut down and drained
      Received(tag);
      static_cast<QueueEvent*>(tag)->Run(ok);
    }
  }

  // Waits for the open calls, then shuts the queue down and joins. If
  // calls stay open past the grace, leaves the thread polling (operations
  // may still come) and keeps the state alive for it.
  static void Drain(std::shared_ptr<State> state) {
    bool none_open = false;
    {
      absl::MutexLock lock(&state->mutex);
      auto no_call = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mutex) {
        return state->open.empty();
      };
      none_open =
          state->mutex.AwaitWithTimeout(absl::Condition(&no_call), kCloseGrace);
    }
    if (!none_open) {
      spdlog::error(
          "gRPC client queue: calls did not end {} after they were cancelled; leaving its "
          "thread running",
          absl::FormatDuration(kCloseGrace));
      state->thread.detach();
      new std::shared_ptr<State>(std::move(state));  // the thread still uses it
      return;
    }
    state->queue.Shutdown();
    {
      absl::MutexLock lock(&state->mutex);
      state->shut_down = true;
    }
    state->thread.join();
  }
};

ClientCallQueue::ClientCallQueue(std::string name) : state_(std::make_shared<State>()) {
  State* state = state_.get();
  state->thread = std::thread([state, name = std::move(name)] {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    state->Poll();
  });
}

ClientCallQueue::~ClientCallQueue() {
  {
    absl::MutexLock lock(&state_->mutex);
    state_->closing = true;
    // The cancels only queue events: no reaction runs from TryCancel.
    for (grpc::ClientContext* context : state_->open) context->TryCancel();
  }
  if (OnQueueThread()) {
    // This thread must return to its queue for the calls to end.
    std::thread([state = state_]() mutable { State::Drain(std::move(state)); }).detach();
    return;
  }
  // A copy: the calls ending meanwhile still Close through this object.
  State::Drain(state_);
}

std::unique_ptr<ClientCallQueue::OpenCall> ClientCallQueue::Open(grpc::ClientContext* context) {
  {
    absl::MutexLock lock(&state_->mutex);
    if (state_->closing) return nullptr;
    state_->open.insert(context);
  }
  return std::unique_ptr<OpenCall>(new OpenCall(state_, context));
}

ClientCallQueue::OpenCall::OpenCall(std::shared_ptr<ClientCallQueue::State> state,
                                    grpc::ClientContext* context)
    : state_(std::move(state)), context_(context) {}

ClientCallQueue::OpenCall::~OpenCall() {
  absl::MutexLock lock(&state_->mutex);
  state_->open.erase(context_);
}

grpc::CompletionQueue* ClientCallQueue::OpenCall::queue() const { return &state_->queue; }

bool ClientCallQueue::OnQueueThread() const {
  return std::this_thread::get_id() == state_->thread.get_id();
}

}  // namespace harrier
