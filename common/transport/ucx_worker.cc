#include "common/transport/ucx_worker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace harrier::transport {
namespace {

absl::Status UcsError(const std::string& what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// Idle spin before sleeping: long enough to catch the next message of a
// burst (a round trip is ~5-15 us), short enough not to burn a core. No
// longer spin while a reply is expected: on a link slower than this
// machine's memory (1 Gbit/s) fragments arrive tens of microseconds apart
// for the whole of a large message, so such a spin never ends and a
// worker's progress thread took a core (4.7-4.8 CPU s per GB moved against
// 1.2-1.7 without it, harrier-bench overlap over UCX at 1 Gbit/s), while
// 4 KiB round trips on loopback were no faster with it.
constexpr auto kSpin = std::chrono::microseconds(50);

// True when UCX_TLS lists transports and none of them is a network one
// (those detect peer failure); "^" lists exclusions, so it may allow tcp.
bool OnlySharedMemory() {
  const char* value = std::getenv("UCX_TLS");
  if (value == nullptr || value[0] == '\0' || value[0] == '^') return false;
  for (absl::string_view tl : absl::StrSplit(value, ',')) {
    for (absl::string_view network : {"all", "tcp", "rc", "ud", "dc", "ib", "rdma"}) {
      if (absl::StartsWith(tl, network)) return false;
    }
  }
  return true;
}

// Worker addresses as this class hands them out carry a trailer naming the
// host: [UCP address][16-byte host id][kHostTrailerMagic]. Connect strips
// it, so a peer on this host can be reached over shared memory (see
// Connect). An address without the trailer is used as it is.
constexpr char kHostTrailerMagic[8] = {'H', 'R', 'X', 'H', 'O', 'S', 'T', '1'};
constexpr size_t kHostIdBytes = 16;
constexpr size_t kHostTrailerBytes = kHostIdBytes + sizeof(kHostTrailerMagic);

// This boot of this machine: the kernel's boot id (a fresh UUID per boot,
// shared by every process and container on the host), hashed with the host
// name for machines where /proc is not the host's, and with the network
// namespace. A process in a network namespace of its own (a container, or an
// emulated host of harrier-bench) is another host: its peers reach it
// through its network, as its operator set that network up to be reached.
// Shared memory across namespaces would bypass that network (and between
// harrier-bench's emulated hosts such endpoints stalled on large sends).
std::string HostId() {
  static const std::string id = [] {
    std::string boot;
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char buffer[64] = {};
      if (std::fgets(buffer, sizeof(buffer), f) != nullptr) boot = buffer;
      std::fclose(f);
    }
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    char netns[128] = {};
    [[maybe_unused]] const ssize_t netns_bytes =
        readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
    const std::string text = absl::StrCat(boot, "/", host, "/", netns);
    std::string out(kHostIdBytes, '\0');
    // FNV-1a over two seeds: collisions between hosts are what matters.
    for (int half = 0; half < 2; ++half) {
      uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(half);
      for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
      std::memcpy(&out[half * 8], &h, 8);
    }
    return out;
  }();
  return id;
}

// Splits `address` into the UCP address and whether it names this host.
absl::string_view SplitHost(const std::string& address, bool* same_host) {
  *same_host = false;
  if (address.size() <= kHostTrailerBytes ||
      std::memcmp(address.data() + address.size() - sizeof(kHostTrailerMagic), kHostTrailerMagic,
                  sizeof(kHostTrailerMagic)) != 0) {
    return address;
  }
  const size_t ucp_bytes = address.size() - kHostTrailerBytes;
  *same_host = std::memcmp(address.data() + ucp_bytes, HostId().data(), kHostIdBytes) == 0;
  return absl::string_view(address.data(), ucp_bytes);
}

// The user chose UCX's transports: their choice wins over ours.
bool UserChoseTransports() {
  const char* value = std::getenv("UCX_TLS");
  return value != nullptr && value[0] != '\0';
}

std::string MemoryTypeNames(uint64_t types) {
  std::string names;
  for (int type = 0; type < UCS_MEMORY_TYPE_LAST; ++type) {
    if ((types & (uint64_t{1} << type)) == 0) continue;
    if (!names.empty()) names += ",";
    names += ucs_memory_type_names[type];
  }
  return names;
}

// Once per process: every client and server makes a worker, and the answer
// is the same for all of them (it depends on the UCX build and the host).
void LogMemoryTypesOnce(uint64_t types) {
  static std::once_flag once;
  std::call_once(once, [types] {
    const bool cuda = (types & (uint64_t{1} << UCS_MEMORY_TYPE_CUDA)) != 0;
    spdlog::info("ucx memory types: {} ({})", MemoryTypeNames(types),
                 cuda ? "UCS_MEMORY_TYPE_CUDA supported: device memory can be sent directly"
                      : "no UCS_MEMORY_TYPE_CUDA in this UCX: device memory must be staged "
                        "through host memory");
  });
}

// The worker whose ucp_mutex_ this thread holds, if any.
thread_local const UcxWorker* held_worker = nullptr;

struct Completion {
  UcxWorker* owner;
  std::atomic<int>* outstanding;
  std::string header;  // sends: kept alive until completion
  std::function<void(ucs_status_t)> done;
  std::string data_prefix;  // sends: data ahead of the caller's (IOV)
  ucp_dt_iov_t iov[2] = {};
};

void Complete(Completion* completion, ucs_status_t status) {
  if (completion->done) completion->done(status);
  completion->outstanding->fetch_sub(1);
  delete completion;
}

void OnSend(void* request, ucs_status_t status, void* user_data) {
  Complete(static_cast<Completion*>(user_data), status);
  ucp_request_free(request);
}

void OnReceive(void* request, ucs_status_t status, size_t, void* user_data) {
  Complete(static_cast<Completion*>(user_data), status);
  ucp_request_free(request);
}

// The three outcomes of a *_nbx call: done now, failed now, or a request
// whose callback completes it later.
void Settle(ucs_status_ptr_t result, Completion* completion) {
  if (result == nullptr) {
    Complete(completion, UCS_OK);
  } else if (UCS_PTR_IS_ERR(result)) {
    Complete(completion, UCS_PTR_STATUS(result));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Start(
    const std::string& name, const std::vector<AmHandler>& handlers) {
  std::unique_ptr<UcxWorker> self(new UcxWorker());
  self->name_ = name;
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcsError("ucp_config_read", s);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = self->name_.c_str();
  ucs_status_t status = ucp_init(&params, config, &self->context_);
  ucp_config_release(config);
  if (status != UCS_OK) return UcsError("ucp_init", status);
  ucp_context_attr_t context_attr{};
  context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (status = ucp_context_query(self->context_, &context_attr); status != UCS_OK) {
    return UcsError("ucp_context_query", status);
  }
  self->memory_types_ = context_attr.memory_types;
  LogMemoryTypesOnce(self->memory_types_);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Serialised by ucp_mutex_: the progress thread and posting threads.
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if (status = ucp_worker_create(self->context_, &worker_params, &self->worker_);
      status != UCS_OK) {
    return UcsError("ucp_worker_create", status);
  }
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  if (status = ucp_worker_get_address(self->worker_, &address, &address_length);
      status != UCS_OK) {
    return UcsError("ucp_worker_get_address", status);
  }
  self->address_.assign(reinterpret_cast<const char*>(address), address_length);
  self->address_ += HostId();
  self->address_.append(kHostTrailerMagic, sizeof(kHostTrailerMagic));
  ucp_worker_release_address(self->worker_, address);

  for (const AmHandler& handler : handlers) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = handler.id;
    am.flags = UCP_AM_FLAG_WHOLE_MSG | (handler.persistent_data ? UCP_AM_FLAG_PERSISTENT_DATA : 0);
    am.cb = handler.callback;
    am.arg = handler.arg;
    if (status = ucp_worker_set_am_recv_handler(self->worker_, &am); status != UCS_OK) {
      return UcsError("ucp_worker_set_am_recv_handler", status);
    }
  }

  if (status = ucp_worker_get_efd(self->worker_, &self->event_fd_); status != UCS_OK) {
    return UcsError("ucp_worker_get_efd", status);
  }
  self->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  self->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (self->wake_fd_ < 0 || self->epoll_fd_ < 0) {
    return absl::InternalError("cannot create eventfd/epoll for the UCX progress thread");
  }
  for (int fd : {self->event_fd_, self->wake_fd_}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(self->epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      return absl::InternalError("epoll_ctl failed for the UCX progress thread");
    }
  }
  UcxWorker* raw = self.get();
  self->thread_ = std::thread([raw] { raw->Loop(); });
  return self;
}

void UcxWorker::Stop() {
  if (thread_.joinable()) {
    stop_ = true;
    Wake();
    thread_.join();
  }
}

UcxWorker::~UcxWorker() {
  Stop();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

bool UcxWorker::HeldByThisThread() const { return held_worker == this; }

void UcxWorker::Post(std::function<void()> task) {
  if (!HeldByThisThread() && ucp_mutex_.TryLock()) {
    // The progress thread is not progressing (asleep, or between rounds):
    // run the task here rather than paying its wake-up.
    held_worker = this;
    bool wake = false;
    if (!stopped_) {
      RunTasks();  // earlier hand-overs first: tasks stay in order
      task();
      // A request left in progress needs the loop, which may be asleep.
      wake = sleeping_ && outstanding_ > 0;
    }
    held_worker = nullptr;
    ucp_mutex_.Unlock();
    if (wake) Wake();
    return;
  }
  {
    absl::MutexLock lock(&mutex_);
    tasks_.push_back(std::move(task));
  }
  if (!HeldByThisThread()) Wake();
}

bool UcxWorker::TryProgress() {
  if (HeldByThisThread() || !ucp_mutex_.TryLock()) return false;
  held_worker = this;
  bool worked = false;
  if (!stopped_) {
    worked = RunTasks();
    while (ucp_worker_progress(worker_) != 0) worked = true;
  }
  held_worker = nullptr;
  ucp_mutex_.Unlock();
  return worked;
}

void UcxWorker::EndDriving() {
  // The progress thread slept while this thread drove; what is still in
  // flight (another call's reply, a rendezvous send) needs it spinning.
  if (drivers_.fetch_sub(1, std::memory_order_relaxed) == 1 &&
      (outstanding_.load() > 0 || expecting_.load(std::memory_order_relaxed) > 0)) {
    Wake();
  }
}

void UcxWorker::Wake() {
  const uint64_t one = 1;
  // A full counter (impossible in practice) still leaves the fd readable.
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void UcxWorker::SetPeriodicTask(std::chrono::milliseconds interval, std::function<void()> task) {
  absl::MutexLock lock(&ucp_mutex_);  // the loop reads them with it held
  periodic_interval_ = interval;
  next_periodic_ = std::chrono::steady_clock::now() + interval;
  periodic_task_ = std::move(task);
}

bool UcxWorker::RunTasks() {
  std::deque<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mutex_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
  return !tasks.empty();
}

void UcxWorker::Loop() {
  using Clock = std::chrono::steady_clock;
  auto last_work = Clock::now();
  while (!stop_) {
    bool worked = false;
    {
      // Released between rounds, so a posting thread can take the worker.
      absl::MutexLock lock(&ucp_mutex_);
      held_worker = this;
      worked = RunTasks();
      while (ucp_worker_progress(worker_) != 0) worked = true;
      if (periodic_task_ && Clock::now() >= next_periodic_) {
        next_periodic_ = Clock::now() + periodic_interval_;
        periodic_task_();
      }
      held_worker = nullptr;
    }
    if (worked) {
      last_work = Clock::now();
      continue;
    }
    const auto idle = Clock::now() - last_work;
    // A waiting caller progresses the worker itself (BeginDriving): spinning
    // here too would only take the lock and the CPU from it.
    const bool driven = drivers_.load(std::memory_order_relaxed) > 0;
    if (idle < kSpin && !driven) continue;
    {
      // Arm, then sleep; BUSY means events arrived meanwhile: progress
      // again. A task queued meanwhile has written wake_fd_.
      absl::MutexLock lock(&ucp_mutex_);
      if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      sleeping_ = true;
    }
    epoll_event events[2];
    const int n = epoll_wait(epoll_fd_, events, 2, 100);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t value;
        [[maybe_unused]] ssize_t r = read(wake_fd_, &value, sizeof(value));
      }
    }
    {
      absl::MutexLock lock(&ucp_mutex_);
      sleeping_ = false;
    }
    last_work = Clock::now();
  }
  // Finish what was handed over, then give in-flight requests a moment.
  const auto until = Clock::now() + std::chrono::seconds(1);
  bool ran = false;
  absl::MutexLock lock(&ucp_mutex_);
  held_worker = this;
  do {
    ran = RunTasks();
    while (ucp_worker_progress(worker_) != 0) {
    }
  } while ((outstanding_ > 0 || ran) && Clock::now() < until);
  stopped_ = true;
  held_worker = nullptr;
  if (outstanding_ > 0) {
    spdlog::warn("ucx worker={} stopping with {} requests outstanding", name_,
                 outstanding_.load());
  }
}

absl::StatusOr<ucp_ep_h> UcxWorker::Connect(const std::string& address,
                                            ucp_err_handler_cb_t on_error, void* arg,
                                            bool* detects_failure, ErrorMode mode) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  bool same_host = false;
  const absl::string_view ucp_address = SplitHost(address, &same_host);
  params.address = reinterpret_cast<const ucp_address_t*>(ucp_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_error;
  params.err_handler.arg = arg;
  ucp_ep_h ep = nullptr;
  // Skip the PEER attempt (and the error UCX logs when it fails) when
  // UCX_TLS names only shared-memory transports. A peer on this host, when
  // the user chose no transports: shared memory, which UCX 1.13 offers only
  // without PEER error handling (the measured default, README "Choosing":
  // posix/sysv for messages and cma for rendezvous beat tcp over loopback).
  const bool shared_memory =
      mode == ErrorMode::kNone ||
      (mode == ErrorMode::kChoose &&
       (OnlySharedMemory() || (same_host && !UserChoseTransports())));
  ucs_status_t status = shared_memory ? UCS_ERR_UNREACHABLE
                                      : ucp_ep_create(worker_, &params, &ep);
  *detects_failure = status == UCS_OK;
  // A mode the peer asked for is kept: falling back would make the pair
  // asymmetric, which UCX refuses later with a less clear error.
  if (status == UCS_ERR_UNREACHABLE && mode != ErrorMode::kPeer) {
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucp_ep_create(worker_, &params, &ep);
    if (status == UCS_OK) {
      spdlog::info("ucx worker={}: no transport to the peer detects failures (shared memory); "
                   "endpoint uses error mode NONE",
                   name_);
    }
  }
  if (status != UCS_OK) return UcsError("ucp_ep_create", status);
  return ep;
}

void UcxWorker::CloseEndpoint(ucp_ep_h ep) {
  auto* completion = new Completion{this, &outstanding_, {}, nullptr};
  outstanding_++;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  param.cb.send = OnSend;
  param.user_data = completion;
  Settle(ucp_ep_close_nbx(ep, &param), completion);
}

void UcxWorker::SendAm(ucp_ep_h ep, unsigned id, std::string header, const void* data,
                       size_t bytes, std::function<void(ucs_status_t)> done,
                       ucs_memory_type_t data_memory, std::string data_prefix) {
  auto* completion = new Completion{this, &outstanding_, std::move(header), std::move(done),
                                    std::move(data_prefix)};
  outstanding_++;
  if (data_memory != UCS_MEMORY_TYPE_UNKNOWN && !SupportsMemoryType(data_memory)) {
    // UCX without that transport would treat the pointer as host memory.
    Complete(completion, UCS_ERR_UNSUPPORTED);
    return;
  }
  if (!completion->data_prefix.empty() && data_memory != UCS_MEMORY_TYPE_HOST && bytes > 0) {
    // One send's IOV has one memory type: the prefix is host memory.
    Complete(completion, UCS_ERR_UNSUPPORTED);
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  // The memory type covers the data only; UCX always reads the header as
  // host memory. Saying it spares UCX its pointer lookup.
  if (data_memory != UCS_MEMORY_TYPE_UNKNOWN) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.memory_type = data_memory;
  }
  param.cb.send = OnSend;
  param.user_data = completion;
  if (!completion->data_prefix.empty()) {
    // The prefix and the data as one message, neither copied.
    completion->iov[0].buffer = completion->data_prefix.data();
    completion->iov[0].length = completion->data_prefix.size();
    completion->iov[1].buffer = const_cast<void*>(data);
    completion->iov[1].length = bytes;
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    Settle(ucp_am_send_nbx(ep, id, completion->header.data(), completion->header.size(),
                           completion->iov, bytes > 0 ? 2 : 1, &param),
           completion);
    return;
  }
  Settle(ucp_am_send_nbx(ep, id, completion->header.data(), completion->header.size(), data,
                         bytes, &param),
         completion);
}

void UcxWorker::ReleaseData(void* data) {
  Post([this, data] { ucp_am_data_release(worker_, data); });
}

void UcxWorker::ReceiveData(void* descriptor, void* buffer, size_t bytes,
                            std::function<void(ucs_status_t)> done,
                            ucs_memory_type_t buffer_memory) {
  auto* completion = new Completion{this, &outstanding_, {}, std::move(done)};
  outstanding_++;
  if (buffer_memory != UCS_MEMORY_TYPE_UNKNOWN && !SupportsMemoryType(buffer_memory)) {
    ucp_am_data_release(worker_, descriptor);  // the sender's request ends too
    Complete(completion, UCS_ERR_UNSUPPORTED);
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (buffer_memory != UCS_MEMORY_TYPE_UNKNOWN) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.memory_type = buffer_memory;
  }
  param.cb.recv_am = OnReceive;
  param.user_data = completion;
  Settle(ucp_am_recv_data_nbx(worker_, descriptor, buffer, bytes, &param), completion);
}

}  // namespace harrier::transport
