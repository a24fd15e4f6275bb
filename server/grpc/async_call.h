#ifndef HARRIER_SERVER_GRPC_ASYNC_CALL_H_
#define HARRIER_SERVER_GRPC_ASYNC_CALL_H_

#include <grpc/grpc.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_stream.h>
#include <grpcpp/support/async_unary_call.h>
#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/queue_event.h"

// gRPC's asynchronous server API driven by threads of our own, each polling
// one completion queue and running every reaction on the thread that took
// its event. The callback API this replaces runs, in the gRPC this builds
// against, on a shared queue polled by two "nexting" threads that hand each
// event between them and an executor: about 8 context switches per 4 KiB
// push-pull on the shard, where one queue thread takes about 1
// (docs/performance.md, "The shard without gRPC's callback threads").

namespace harrier {

// One thread per completion queue, each running the events of its queue
// until the queue is shut down and drained.
class QueuePollers {
 public:
  QueuePollers() = default;
  ~QueuePollers() { ShutdownAndJoin(); }
  QueuePollers(const QueuePollers&) = delete;
  QueuePollers& operator=(const QueuePollers&) = delete;

  // Polls `queues` (not owned; they outlive ShutdownAndJoin).
  void Start(const std::vector<grpc::ServerCompletionQueue*>& queues);
  // Shuts every queue down (after grpc::Server::Shutdown: nothing may be
  // queued on them after) and waits for their threads to drain them.
  void ShutdownAndJoin();
  // Leaves the threads running on their queues (which the caller then must
  // not destroy): for calls that never ended, whose operations may still
  // come.
  void Abandon();

 private:
  std::vector<grpc::ServerCompletionQueue*> queues_;
  std::vector<std::thread> threads_;
};

// How many asynchronous calls are alive, so that a listener stops its
// queues only once none can start another operation on them.
class LiveCalls {
 public:
  void Add() {
    absl::MutexLock lock(&mutex_);
    ++count_;
  }
  void Remove() {
    absl::MutexLock lock(&mutex_);
    --count_;
  }
  // True once none is alive; false at `deadline`.
  bool AwaitNone(absl::Time deadline) {
    absl::MutexLock lock(&mutex_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return count_ == 0; };
    return mutex_.AwaitWithDeadline(absl::Condition(&none), deadline);
  }

 private:
  absl::Mutex mutex_;
  int count_ ABSL_GUARDED_BY(mutex_) = 0;
};

// A grpc::Service some of whose methods are asynchronous: the listener
// that registers it requests their calls on its queues.
class QueueServedService {
 public:
  virtual ~QueueServedService() = default;
  // Requests the calls on `queues` (not owned), which the caller polls
  // (QueuePollers) until it shuts them down; once, after the server started.
  virtual void StartCalls(const std::vector<grpc::ServerCompletionQueue*>& queues) = 0;
  // After grpc::Server::Shutdown: true once every call has ended (its status
  // out, its operations back), false at `deadline`. Only then may the
  // queues be shut down: a call answered late from another thread still
  // starts operations on its queue.
  virtual bool AwaitCallsDone(absl::Time deadline) = 0;
};

// Whether a server stream sends one response message with its status.
template <class Stream>
struct RespondsOnce : std::false_type {};
template <class Request, class Response>
struct RespondsOnce<grpc::ServerAsyncReader<Response, Request>> : std::true_type {};
template <class Response>
struct RespondsOnce<grpc::ServerAsyncResponseWriter<Response>> : std::true_type {};

// One server call of the asynchronous API with the shape of a callback
// reactor: StartRead, StartWrite, StartWriteAndFinish and Finish start
// operations (from any thread, one read and one write at a time), and
// OnReadDone, OnWriteDone, OnCancel and then OnDone react on the queue's
// thread (every reaction of a call on the same thread, one at a time).
// OnDone runs once Finish went out and every operation and the call's done
// notification are back; nothing of the call is touched after it. Finish
// must be called exactly once (a cancelled call too), as the callback API
// asks. `Stream` is grpc::ServerAsyncReader, ServerAsyncWriter,
// ServerAsyncReaderWriter or ServerAsyncResponseWriter; `Request` is the
// message a unary or server-streaming call arrives with, `Response` the one
// a unary or client-streaming call answers with.
template <class Stream, class Request = grpc::ByteBuffer, class Response = grpc::ByteBuffer>
class AsyncServerCall {
 public:
  virtual ~AsyncServerCall() = default;

  grpc::ServerContext* context() { return &context_; }
  Stream* stream() { return &stream_; }
  // A unary or server-streaming call's request message, filled on arrival.
  Request* request() { return &request_; }

  // Before the call is requested from gRPC.
  void ArmDoneNotification() { context_.AsyncNotifyWhenDone(&done_event_); }
  // The call arrived: the reactions begin. `live` counts it until OnDone.
  void Arrived(LiveCalls* live) {
    live_ = live;
    live_->Add();
    Begin();
  }

 protected:
  AsyncServerCall() : stream_(&context_) {}

  // The call's first reaction, once it arrived (its metadata is in).
  virtual void Begin() = 0;
  virtual void OnReadDone(bool /*ok*/) {}
  virtual void OnWriteDone(bool /*ok*/) {}
  // The client cancelled, its deadline passed or it went away.
  virtual void OnCancel() {}
  // The last reaction.
  virtual void OnDone() {}

  void StartRead(grpc::ByteBuffer* message) {
    Hold();
    stream_.Read(message, &read_event_);
  }
  void StartWrite(const grpc::ByteBuffer* message) {
    Hold();
    stream_.Write(*message, &write_event_);
  }
  // The write and the status in one operation; OnWriteDone does not run.
  void StartWriteAndFinish(const grpc::ByteBuffer* message, grpc::WriteOptions options,
                           const grpc::Status& status) {
    Hold();
    stream_.WriteAndFinish(*message, options, status, &finish_event_);
  }
  // A unary or client-streaming call sends `response()` with an OK status.
  void Finish(const grpc::Status& status) {
    Hold();
    if constexpr (RespondsOnce<Stream>::value) {
      if (status.ok()) {
        stream_.Finish(response_, status, &finish_event_);
      } else {
        stream_.FinishWithError(status, &finish_event_);
      }
    } else {
      stream_.Finish(status, &finish_event_);
    }
  }
  Response* response() { return &response_; }

  // After a read failed: true when the stream broke (cancelled, reset, past
  // its deadline), false when the client half-closed it. The asynchronous
  // API's IsCancelled is only known once the call is done.
  bool ReadFailedByError() const {
    return grpc_call_failed_before_recv_message(
               const_cast<grpc::ServerContext&>(context_).c_call()) != 0;
  }

 private:
  void Hold() { holds_.Hold(); }
  void Release() {
    if (!holds_.Release()) return;
    LiveCalls* live = live_;
    OnDone();  // may delete this
    if (live != nullptr) live->Remove();
  }
  void ReadDone(bool ok) {
    OnReadDone(ok);
    Release();
  }
  void WriteDone(bool ok) {
    OnWriteDone(ok);
    Release();
  }
  void FinishDone(bool) {
    Release();  // the operation
    Release();  // the call is finished
  }
  void Done(bool) {
    if (context_.IsCancelled()) OnCancel();
    Release();
  }

  grpc::ServerContext context_;
  Stream stream_;
  Request request_;
  Response response_;
  LiveCalls* live_ = nullptr;
  // Until Finish went out, and until the done notification came back.
  OperationCount holds_{2};
  MemberEvent<AsyncServerCall, &AsyncServerCall::ReadDone> read_event_{this};
  MemberEvent<AsyncServerCall, &AsyncServerCall::WriteDone> write_event_{this};
  MemberEvent<AsyncServerCall, &AsyncServerCall::FinishDone> finish_event_{this};
  MemberEvent<AsyncServerCall, &AsyncServerCall::Done> done_event_{this};
};

// Keeps one call of a method requested on one queue: when it arrives the
// next is requested, then the call begins. `Call` derives from
// AsyncServerCall; `request(call, queue, tag)` asks gRPC for the next call
// of the method (the generated RequestX); `make()` builds an empty call.
template <class Call, class Request, class Make>
class CallAcceptor final : public QueueEvent {
 public:
  CallAcceptor(grpc::ServerCompletionQueue* queue, LiveCalls* live, Request request, Make make)
      : queue_(queue), live_(live), request_(std::move(request)), make_(std::move(make)) {}
  ~CallAcceptor() override { delete waiting_; }

  void Arm() {
    waiting_ = make_();
    waiting_->ArmDoneNotification();
    request_(waiting_, queue_, this);
  }

  void Run(bool ok) override {
    Call* call = waiting_;
    waiting_ = nullptr;
    if (!ok) {  // the server is shutting down: the call never started
      delete call;
      return;
    }
    Arm();
    call->Arrived(live_);
  }

 private:
  grpc::ServerCompletionQueue* const queue_;
  LiveCalls* const live_;
  Request request_;
  Make make_;
  Call* waiting_ = nullptr;  // requested, not arrived
};

// Keeps one call of a method requested on `queue` from now on (an armed
// CallAcceptor): `request` and `make` as CallAcceptor takes them, `live`
// counting the calls that arrived.
template <class Call, class Request, class Make>
std::unique_ptr<QueueEvent> AcceptCalls(grpc::ServerCompletionQueue* queue, LiveCalls* live,
                                        Request request, Make make) {
  auto acceptor = std::make_unique<CallAcceptor<Call, Request, Make>>(queue, live, std::move(request),
                                                                      std::move(make));
  acceptor->Arm();
  return acceptor;
}

}  // namespace harrier

#endif  // HARRIER_SERVER_GRPC_ASYNC_CALL_H_
