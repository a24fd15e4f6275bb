#ifndef HARRIER_COMMON_TRANSPORT_UCX_WORKER_H_
#define HARRIER_COMMON_TRANSPORT_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace harrier::transport {

// One UCP context and worker driven by one progress thread. Every UCP call
// on the worker is made with `ucp_mutex_` held (the worker is created with
// UCS_THREAD_MODE_SERIALIZED): by the progress thread while it progresses,
// and by a thread that Post()s while the progress thread does not hold it,
// which then runs its task (a send) itself instead of handing it over and
// waking the progress thread. Why not UCS_THREAD_MODE_MULTI: it takes a
// worker-wide lock inside every call and gives no way to keep an endpoint
// that an error handler closes from being used by another thread meanwhile;
// with one lock the callers own, endpoint lifetime and request completion
// stay serialised as with a single owning thread.
//
// Features requested: UCP_FEATURE_AM and UCP_FEATURE_WAKEUP only (the
// thread sleeps in epoll on the worker's event fd when idle, after a short
// spin so back-to-back messages keep a low latency). UCX_TLS,
// UCX_NET_DEVICES etc. are read by ucp_config_read.
class UcxWorker {
 public:
  struct AmHandler {
    unsigned id;
    ucp_am_recv_callback_t callback;  // runs on the progress thread
    void* arg;
    // UCP_AM_FLAG_PERSISTENT_DATA: the callback may keep an eager message's
    // data (recv_attr has UCP_AM_RECV_ATTR_FLAG_DATA) by returning
    // UCS_INPROGRESS, and must then give it back with ReleaseData.
    bool persistent_data = false;
  };

  // Creates the context and worker, registers `handlers` (with
  // UCP_AM_FLAG_WHOLE_MSG) and starts the progress thread.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Start(const std::string& name,
                                                          const std::vector<AmHandler>& handlers);
  // Stop(), then destroys the worker and context.
  ~UcxWorker();

  // Stops the progress thread after it has run the posted tasks and
  // progressed outstanding requests for at most about a second. Tasks posted
  // later never run. Idempotent; not from the progress thread.
  void Stop();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // This worker's address (ucp_worker_get_address) followed by a trailer
  // naming this host, for peers' Connect (which strips it).
  const std::string& address() const { return address_; }

  // The memory types this UCX build can send from and receive into
  // (ucp_context_query, UCP_ATTR_FIELD_MEMORY_TYPES), queried once at
  // Start(): bit UCS_BIT(type) per ucs_memory_type_t. Host memory is always
  // there; UCS_MEMORY_TYPE_CUDA only when UCX was built with CUDA and found
  // a device (Debian's 1.13.1 package has no CUDA transports).
  uint64_t memory_types() const { return memory_types_; }
  bool SupportsMemoryType(ucs_memory_type_t type) const {
    return (memory_types_ & (uint64_t{1} << type)) != 0;
  }

  // Runs `task` with the worker held, in order with the other tasks posted
  // (tasks handed over earlier run first). A thread that finds the worker
  // free runs it itself, before Post returns; otherwise (the progress
  // thread is progressing) it is handed to the progress thread, which runs
  // it within microseconds. On the progress thread itself (in a callback or
  // a task) it is queued and runs in the loop's next round: UCP calls are
  // not made from inside UCP callbacks. Thread-safe. After Stop() tasks are
  // dropped.
  void Post(std::function<void()> task);

  // Runs `task` on the progress thread, with the worker held, about every
  // `interval` (the thread wakes at least every 100 ms), for housekeeping
  // that must happen without any traffic: the shard's sweep of calls whose
  // frames never all arrived. Set once, before traffic; not thread-safe
  // against itself.
  void SetPeriodicTask(std::chrono::milliseconds interval, std::function<void()> task);

  // A thread waiting for a reply may progress the worker itself instead of
  // sleeping until the progress thread hands the reply over (one wake-up
  // less per call). Between BeginDriving and EndDriving the progress thread
  // does not spin (it sleeps armed, so events it must see still wake it),
  // and TryProgress progresses the worker on the calling thread when no
  // other thread holds it: UCP callbacks then run on this thread. Returns
  // whether anything progressed. Thread-safe; not from a UCP callback.
  void BeginDriving() { drivers_.fetch_add(1, std::memory_order_relaxed); }
  void EndDriving();
  bool TryProgress();

  // Owners count replies they expect soon (+1 when a request starts, -1
  // when it ends). While any is expected, the last EndDriving wakes the
  // progress thread so that it sees the reply. Thread-safe.
  void ExpectReplies(int delta) { expecting_.fetch_add(delta, std::memory_order_relaxed); }

  // --- With the worker held: in tasks (Post) and UCP callbacks only. ---
  ucp_worker_h worker() const { return worker_; }
  // Endpoint to a worker address with error mode PEER: `on_error` runs on
  // the progress thread when the peer fails (it should call CloseEndpoint).
  // UCX 1.13's shared-memory transports cannot detect peer failure, so
  // where only they reach the peer (UCX_TLS=sm,self) the endpoint falls
  // back to error mode NONE and `*detects_failure` says false: the owner
  // must then notice a dead peer some other way. Without UCX_TLS in the
  // environment, a peer whose address names this host gets error mode NONE
  // at once, so UCX picks shared memory for it (tcp otherwise).
  //
  // Both ends of a connection must use the same error mode (UCX refuses an
  // "asymmetric endpoint configuration"), whatever each side's environment
  // says: the side that connects back (the shard, after a client's hello)
  // passes the mode the client's endpoint uses instead of choosing.
  enum class ErrorMode { kChoose, kNone, kPeer };
  absl::StatusOr<ucp_ep_h> Connect(const std::string& address, ucp_err_handler_cb_t on_error,
                                   void* arg, bool* detects_failure,
                                   ErrorMode mode = ErrorMode::kChoose);
  // Force-closes `ep` (outstanding sends complete with an error); the close
  // request is progressed by this object.
  void CloseEndpoint(ucp_ep_h ep);
  // Sends an AM; `header` and `data` (not copied) must stay valid until
  // `done` runs, which it always does exactly once on the progress thread
  // (possibly before SendAm returns). The header is kept by this call and
  // always sent from host memory; `data_memory` says where `data` lives
  // (UNKNOWN: UCX detects it, which costs a lookup per send; the callers
  // know, so they say). A type this worker does not support completes
  // `done` with UCS_ERR_UNSUPPORTED without sending anything.
  // `data_prefix` (host memory) goes ahead of `data` in the same message
  // (an IOV; `data` must then be host memory too).
  void SendAm(ucp_ep_h ep, unsigned id, std::string header, const void* data, size_t bytes,
              std::function<void(ucs_status_t)> done,
              ucs_memory_type_t data_memory = UCS_MEMORY_TYPE_HOST,
              std::string data_prefix = {});
  // Gives back an eager message's data kept by an AM callback
  // (persistent_data). Any thread (through Post).
  void ReleaseData(void* data);
  // Receives rendezvous data into `buffer` (of memory type `buffer_memory`,
  // with the same rule as SendAm's); `done` runs exactly once.
  void ReceiveData(void* descriptor, void* buffer, size_t bytes,
                   std::function<void(ucs_status_t)> done,
                   ucs_memory_type_t buffer_memory = UCS_MEMORY_TYPE_HOST);

 private:
  UcxWorker() = default;
  void Loop();
  bool RunTasks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ucp_mutex_);
  void Wake();
  // True when this thread holds ucp_mutex_ (the progress thread's loop, or a
  // caller running its task).
  bool HeldByThisThread() const;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string name_;
  std::string address_;
  uint64_t memory_types_ = 0;
  int event_fd_ = -1;   // the worker's (ucp_worker_get_efd)
  int wake_fd_ = -1;    // eventfd: Post() wakes the thread
  int epoll_fd_ = -1;
  std::atomic<bool> stop_{false};
  // SetPeriodicTask's.
  std::function<void()> periodic_task_ ABSL_GUARDED_BY(ucp_mutex_);
  std::chrono::milliseconds periodic_interval_ ABSL_GUARDED_BY(ucp_mutex_){0};
  std::chrono::steady_clock::time_point next_periodic_ ABSL_GUARDED_BY(ucp_mutex_);
  std::atomic<int> outstanding_{0};  // requests not yet completed
  std::atomic<int> expecting_{0};    // see ExpectReplies
  std::atomic<int> drivers_{0};      // see BeginDriving
  // Held around every UCP call on worker_ (see the class comment). Taken
  // before mutex_, never the other way round.
  absl::Mutex ucp_mutex_ ABSL_ACQUIRED_BEFORE(mutex_);
  // Set while the progress thread sleeps in epoll (armed): a caller that
  // leaves a request in progress must wake it. Set and cleared with
  // ucp_mutex_ held; read by callers with it held.
  bool sleeping_ ABSL_GUARDED_BY(ucp_mutex_) = false;
  // The progress thread ended: later tasks are dropped.
  bool stopped_ ABSL_GUARDED_BY(ucp_mutex_) = false;
  // Guards only the hand-over queue: the counters above are atomics and the
  // rest is set before the progress thread starts or used with ucp_mutex_.
  absl::Mutex mutex_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mutex_);
  std::thread thread_;
};

}  // namespace harrier::transport

#endif  // HARRIER_COMMON_TRANSPORT_UCX_WORKER_H_
