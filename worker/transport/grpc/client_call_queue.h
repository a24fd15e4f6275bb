#ifndef HARRIER_WORKER_TRANSPORT_GRPC_CLIENT_CALL_QUEUE_H_
#define HARRIER_WORKER_TRANSPORT_GRPC_CLIENT_CALL_QUEUE_H_

#include <grpcpp/completion_queue.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <string>

namespace harrier {

// One completion queue and the one thread that polls it: the worker's
// asynchronous gRPC calls start their operations on it, and every reaction
// runs on that thread (its tags are QueueEvents, common/queue_event.h).
// The thread waits in the queue only while a call is open; otherwise it
// sleeps, so that it does not take the replies of the calls that waiting
// callers run through gRPC's synchronous API on their own threads.
//
// Why not gRPC's callback API: in the gRPC this builds against, its
// reactions run on a process-wide queue polled by two threads that take
// turns at every connection of the process, handing each event between
// them; one thread of our own takes the events without those hand-offs
// (docs/performance.md, "The shard without gRPC's callback threads", which
// measured the same change on the shard). One queue serves all of a
// client's shards: every polling thread takes turns at all of the process's
// connections, so a second one would bring the hand-offs back.
//
// Thread-safe.
class ClientCallQueue {
  struct State;

 public:
  // `name`: the thread's name (at most 15 characters are kept).
  explicit ClientCallQueue(std::string name);
  // Cancels the calls still open, waits for them to end (they do promptly
  // once cancelled; past kCloseGrace their thread is left running and an
  // error logged), then shuts the queue down and joins its thread. Run on
  // the queue's own thread (a call's reaction dropping the last owner), the
  // wait and the join go to a thread of their own.
  ~ClientCallQueue();
  ClientCallQueue(const ClientCallQueue&) = delete;
  ClientCallQueue& operator=(const ClientCallQueue&) = delete;

  // A call's hold on the queue, from before it starts its first operation
  // until every operation is back: the destructor cancels the call while
  // it is held, and waits for it to be dropped. It keeps the queue itself
  // alive, so a call may end after its queue's owner is gone.
  class OpenCall {
   public:
    ~OpenCall();
    OpenCall(const OpenCall&) = delete;
    OpenCall& operator=(const OpenCall&) = delete;
    grpc::CompletionQueue* queue() const;

   private:
    friend class ClientCallQueue;
    OpenCall(std::shared_ptr<State> state, grpc::ClientContext* context);
    const std::shared_ptr<State> state_;
    grpc::ClientContext* const context_;
  };

  // Holds the queue for a call about to start operations on it; null once
  // the destructor began (the call must not start).
  std::unique_ptr<OpenCall> Open(grpc::ClientContext* context);

 private:
  bool OnQueueThread() const;

  std::shared_ptr<State> state_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_TRANSPORT_GRPC_CLIENT_CALL_QUEUE_H_
