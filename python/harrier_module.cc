// _harrier: the C++ client (worker/client.h) and comm scheduler
// (worker/comm_scheduler.h) as a Python extension. The package around it
// (python/harrier/__init__.py) turns torch tensors into numpy views and
// defines the exception classes this module raises; user code imports
// `harrier`, not this module.
//
// Buffers: every array is taken through the buffer protocol and must be
// float32 and C-contiguous (the package copies readable inputs that are
// not; outputs must already be); sparse tables' ids must be int64 and
// C-contiguous, in host memory. No call copies a payload: the C++ client
// reads gradients from, and writes pulled parameters into, the caller's
// memory. Async calls keep a reference to their arrays until they are
// waited on, so Python cannot free memory a shard call still uses.
//
// The GIL is released whenever C++ may block (connect, every RPC, Wait,
// destruction of a client or scheduler), so other Python threads run while
// a pull waits for the consistency model.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/grpc_security.h"
#include "common/process.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"

#if HARRIER_WITH_CUDA
#include "cuda/cuda_codec_backend.h"
#include "cuda/device_memory.h"
#endif

namespace py = pybind11;

namespace harrier {
namespace {

// Thrown by this module only; translated into the package's exception
// class for the status code (harrier.InvalidArgumentError, ...).
struct StatusError {
  absl::Status status;
};

// code -> exception class, installed by the package at import.
py::dict& ErrorClasses() {
  static py::dict* classes = new py::dict();
  return *classes;
}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

// Runs `call` (returning absl::Status) without the GIL, then raises its
// error, if any, with the GIL held again.
template <typename Call>
void WithoutGil(Call&& call) {
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = call();
  }
  ThrowIfError(status);
}

// Runs `work` without the GIL when this thread holds it: destructors and
// Close() may also run where it is not held (interpreter shutdown).
template <typename Work>
void WithoutGilIfHeld(Work&& work) {
  if (PyGILState_Check()) {
    py::gil_scoped_release release;
    work();
  } else {
    work();
  }
}

absl::Duration SecondsToDuration(double seconds, const char* what) {
  if (!(seconds >= 0)) {  // also NaN
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(what, " must be >= 0 seconds")));
  }
  return absl::Seconds(seconds);
}

// A float32 C-contiguous view of a Python buffer. `keep` holds the buffer
// object (and its export) for as long as the view is used.
struct FloatBuffer {
  py::buffer_info info;
  float* data = nullptr;
  size_t size = 0;
  bool device = false;  // CUDA memory (__cuda_array_interface__)
};

#if HARRIER_WITH_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

// Device memory a Python object exposes through __cuda_array_interface__
// (PyTorch CUDA tensors, CuPy, Numba): float32, C-contiguous.
FloatBuffer DeviceViewOf(const py::object& object, bool writable, const std::string& what) {
  if (!kBuiltWithCuda) {
    ThrowIfError(absl::FailedPreconditionError(absl::StrCat(
        what, ": a CUDA array, but this Harrier module was built without CUDA (build it with "
              "`bazel build --config=cuda //python:package` where the CUDA toolkit is)")));
  }
  const py::dict interface = object.attr("__cuda_array_interface__");
  const std::string type = py::str(interface["typestr"]);
  if (type != "<f4") {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat(what, ": expected float32 device elements, got typestr '", type, "'")));
  }
  size_t size = 1;
  std::vector<ssize_t> shape;
  for (const py::handle dim : py::tuple(interface["shape"])) {
    shape.push_back(dim.cast<ssize_t>());
    size *= static_cast<size_t>(shape.back());
  }
  if (interface.contains("strides") && !interface["strides"].is_none()) {
    ssize_t expected = 4;
    const py::tuple strides(interface["strides"]);
    for (ssize_t dim = static_cast<ssize_t>(shape.size()) - 1; dim >= 0; --dim) {
      if (shape[dim] != 1 && strides[dim].cast<ssize_t>() != expected) {
        ThrowIfError(
            absl::InvalidArgumentError(absl::StrCat(what, ": device array is not C-contiguous")));
      }
      expected *= shape[dim];
    }
  }
  const py::tuple data(interface["data"]);
  if (writable && data[1].cast<bool>()) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(what, ": device array is read-only")));
  }
  FloatBuffer view;
  view.data = reinterpret_cast<float*>(data[0].cast<uintptr_t>());
  view.size = size;
  view.device = true;
  return view;
}

FloatBuffer ViewOf(const py::object& object, bool writable, const std::string& what) {
  if (py::hasattr(object, "__cuda_array_interface__")) return DeviceViewOf(object, writable, what);
  if (!PyObject_CheckBuffer(object.ptr())) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a float32 array (numpy or torch), got ",
                     std::string(py::str(py::type::handle_of(object).attr("__name__"))))));
  }
  FloatBuffer view;
  view.info = py::reinterpret_borrow<py::buffer>(object).request(writable);
  const py::buffer_info& info = view.info;
  if (info.itemsize != 4 || (info.format != "f" && info.format != "<f" && info.format != "=f")) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat(what, ": expected float32 elements, got format '", info.format, "'")));
  }
  ssize_t expected_stride = 4;
  for (ssize_t dim = info.ndim - 1; dim >= 0; --dim) {
    if (info.shape[dim] != 1 && info.strides[dim] != expected_stride) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(what, ": array is not C-contiguous")));
    }
    expected_stride *= info.shape[dim];
  }
  if (writable && info.readonly) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(what, ": array is read-only")));
  }
  view.data = static_cast<float*>(info.ptr);
  view.size = static_cast<size_t>(info.size);
  return view;
}

// The comm scheduler's buffers are host memory.
FloatBuffer HostOnly(FloatBuffer view, const std::string& what) {
  if (view.device) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat(what, " takes host arrays, not CUDA arrays")));
  }
  return view;
}

// The int64 ids of a sparse table call, C-contiguous host memory. `info`
// holds the buffer's export for as long as the view is used.
struct IdBuffer {
  py::buffer_info info;
  const int64_t* data = nullptr;
  size_t size = 0;
};

IdBuffer IdsOf(const py::object& object, const std::string& what) {
  if (py::hasattr(object, "__cuda_array_interface__") || !PyObject_CheckBuffer(object.ptr())) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat(what, ": expected an int64 array of ids in host memory (numpy or CPU "
                           "torch), got ",
                     std::string(py::str(py::type::handle_of(object).attr("__name__"))))));
  }
  IdBuffer view;
  view.info = py::reinterpret_borrow<py::buffer>(object).request(/*writable=*/false);
  const py::buffer_info& info = view.info;
  // int64 is 'l' on LP64 platforms and 'q' elsewhere.
  const std::string& format = info.format;
  const std::string kind = format.empty() ? "" : format.substr(format.size() - 1);
  const bool signed64 = (kind == "l" || kind == "q") &&
                        (format.size() == 1 || format[0] == '<' || format[0] == '=' ||
                         format[0] == '@');
  if (info.itemsize != 8 || !signed64) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        what, ": expected int64 ids, got format '", info.format, "' of ", info.itemsize,
        "-byte elements")));
  }
  ssize_t expected_stride = 8;
  for (ssize_t dim = info.ndim - 1; dim >= 0; --dim) {
    if (info.shape[dim] != 1 && info.strides[dim] != expected_stride) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(what, ": ids are not C-contiguous")));
    }
    expected_stride *= info.shape[dim];
  }
  view.data = static_cast<const int64_t*>(info.ptr);
  view.size = static_cast<size_t>(info.size);
  return view;
}

// A host float32 view for a sparse table call: the client's row calls read
// and write host memory only, so a CUDA array is refused up front.
FloatBuffer HostViewOf(const py::object& object, bool writable, const std::string& what) {
  if (py::hasattr(object, "__cuda_array_interface__")) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        what, ": a CUDA array; sparse tables take host arrays (copy it with .cpu())")));
  }
  return ViewOf(object, writable, what);
}

class PyClient;

// One async push, pull or push-pull (of a tensor or of a sparse table's
// rows). Holds its client and its arrays until waited on; dropped unwaited,
// it waits (bounded by the client's rpc_timeout) before letting the arrays
// go.
class PyHandle {
 public:
  PyHandle(std::shared_ptr<PyClient> client, Client::Handle handle, py::object keep_input,
           py::object result)
      : client_(std::move(client)),
        handle_(std::move(handle)),
        keep_input_(std::move(keep_input)),
        result_(std::move(result)) {}
  ~PyHandle();
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;

  // Returns the pulled array (a pull or push-pull) or None (a push).
  py::object Wait(std::optional<double> timeout_seconds);
  bool done() const { return done_; }
  uint64_t id() const { return handle_.id(); }

 private:
  std::shared_ptr<PyClient> client_;
  Client::Handle handle_;
  py::object keep_input_;
  py::object result_;
  bool done_ = false;
};

class PyClient : public std::enable_shared_from_this<PyClient> {
 public:
  explicit PyClient(std::unique_ptr<Client> client, absl::Duration rpc_timeout)
      : client_(std::move(client)), rpc_timeout_(rpc_timeout) {}
  ~PyClient() { Close(); }

  Client& client() {
    if (client_ == nullptr) ThrowIfError(absl::FailedPreconditionError("the client is closed"));
    return *client_;
  }
  bool closed() const { return client_ == nullptr; }
  absl::Duration rpc_timeout() const { return rpc_timeout_; }

  // Gives the session back. Called with the GIL held; releases it while
  // the client shuts down.
  void Close() {
    std::unique_ptr<Client> client = std::move(client_);
    if (client == nullptr) return;
    WithoutGilIfHeld([&] {
      // The client's last operations end before its timeline's file does.
      std::shared_ptr<Timeline> timeline = client->timeline();
      client.reset();
      // Also from the destructor: a failure to write is logged, not thrown.
      if (timeline == nullptr) return;
      if (absl::Status closed = timeline->Close(); !closed.ok()) {
        std::fprintf(stderr, "harrier: %s\n", closed.ToString().c_str());
      }
    });
  }

  // Records the client's operations and waits (and those of schedulers
  // made from now on) to `path`, a Chrome trace, until StopTimeline.
  void StartTimeline(const std::string& path, int64_t max_bytes) {
    Client& c = client();
    if (max_bytes < 1) {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("start_timeline: max_bytes must be >= 1, got ", max_bytes)));
    }
    if (c.timeline() != nullptr) {
      ThrowIfError(absl::FailedPreconditionError(
          "start_timeline: a timeline is already being recorded; stop_timeline() first"));
    }
    ThrowIfError(c.StartTimeline(path, static_cast<uint64_t>(max_bytes)));
  }
  // Ends the file: calls still in flight are left out. A no-op without a
  // timeline.
  void StopTimeline() {
    if (client_ == nullptr) return;
    absl::Status stopped;
    WithoutGilIfHeld([&] { stopped = client_->StopTimeline(); });
    ThrowIfError(stopped);
  }
  std::shared_ptr<Timeline> timeline() const {
    return client_ != nullptr ? client_->timeline() : nullptr;
  }

  // kind: "parameters" or "average" (TensorKind).
  void Register(const std::string& name, const std::vector<int64_t>& shape,
                const py::object& initial, const std::string& kind, bool own_clock,
                const std::string& codec, const std::string& pull_codec, const std::string& memory,
                bool staging_buffers) {
    Client& c = client();
    TensorOptions options;
    options.staging_buffers = staging_buffers;
    if (memory == "device") {
      if (!kBuiltWithCuda) {
        ThrowIfError(absl::FailedPreconditionError(absl::StrCat(
            "tensor '", name, "' in device memory, but this Harrier module was built without "
            "CUDA (build it with `bazel build --config=cuda //python:package`)")));
      }
      if (!device_backend_error_.empty()) {
        ThrowIfError(absl::FailedPreconditionError(
            absl::StrCat("tensor '", name, "' in device memory: ", device_backend_error_)));
      }
      options.memory = MemoryKind::kDevice;
    } else if (memory != "host") {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': memory must be 'host' or 'device', got '", memory, "'")));
    }
    if (kind == "average") {
      options.kind = TensorKind::kAverage;
    } else if (kind != "parameters") {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': kind must be 'parameters' or 'average', got '", kind, "'")));
    }
    options.own_clock = own_clock;
    options.codec = codec;
    options.pull_codec = pull_codec;
    FloatBuffer values;
    if (!initial.is_none()) values = ViewOf(initial, /*writable=*/false, "register '" + name + "'");
    if (values.device) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "register '", name, "': initial values are read from host memory (copy them there)")));
    }
    WithoutGil([&] {
      return c.RegisterTensor(name, shape, absl::MakeConstSpan(values.data, values.size),
                              options);
    });
    absl::MutexLock lock(&memory_mutex_);
    device_tensors_[name] = options.memory == MemoryKind::kDevice;
  }

  // Why device tensors cannot be registered ("" when they can).
  void set_device_backend_error(std::string error) { device_backend_error_ = std::move(error); }

  // A buffer in the memory `name` was registered in: the client reads a
  // device tensor's buffers as device pointers and a host tensor's as host
  // pointers, so a mix-up would read the wrong memory.
  FloatBuffer Checked(const std::string& name, FloatBuffer view) {
    bool device = false;
    {
      absl::MutexLock lock(&memory_mutex_);
      auto it = device_tensors_.find(name);
      if (it == device_tensors_.end()) return view;  // the client says NOT_FOUND
      device = it->second;
    }
    if (device != view.device) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' is registered in ", device ? "device" : "host", " memory, but ",
          view.device ? "a CUDA array" : "a host array", " was given")));
    }
    return view;
  }

  int64_t TensorClock(const std::string& name) {
    absl::StatusOr<int64_t> clock = client().TensorClock(name);
    if (!clock.ok()) ThrowIfError(clock.status());
    return *clock;
  }

  void Push(const std::string& name, const py::object& gradient) {
    Client& c = client();
    FloatBuffer in = Checked(name, ViewOf(gradient, false, "push '" + name + "'"));
    WithoutGil([&] { return c.Push(name, absl::MakeConstSpan(in.data, in.size)); });
  }

  py::object Pull(const std::string& name, const py::object& out) {
    Client& c = client();
    FloatBuffer view = Checked(name, ViewOf(out, true, "pull '" + name + "' out"));
    WithoutGil([&] { return c.Pull(name, absl::MakeSpan(view.data, view.size)); });
    return out;
  }

  py::object PushPull(const std::string& name, const py::object& gradient, const py::object& out) {
    Client& c = client();
    FloatBuffer in = Checked(name, ViewOf(gradient, false, "push_pull '" + name + "'"));
    FloatBuffer view = Checked(name, ViewOf(out, true, "push_pull '" + name + "' out"));
    WithoutGil([&] {
      return c.PushPull(name, absl::MakeConstSpan(in.data, in.size),
                        absl::MakeSpan(view.data, view.size));
    });
    return out;
  }

  std::unique_ptr<PyHandle> PushAsync(const std::string& name, const py::object& gradient,
                                      std::optional<int64_t> clock, uint32_t first_chunk,
                                      uint32_t num_chunks) {
    Client& c = client();
    FloatBuffer in = Checked(name, ViewOf(gradient, false, "push_async '" + name + "'"));
    const auto span = absl::MakeConstSpan(in.data, in.size);
    const std::optional<CallScope> scope = Scope(clock, first_chunk, num_chunks);
    return StartWithoutGil(
        [&] { return scope ? c.PushAsync(name, span, *scope) : c.PushAsync(name, span); }, gradient,
        py::none());
  }

  std::unique_ptr<PyHandle> PullAsync(const std::string& name, const py::object& out,
                                      std::optional<int64_t> clock, uint32_t first_chunk,
                                      uint32_t num_chunks) {
    Client& c = client();
    FloatBuffer view = Checked(name, ViewOf(out, true, "pull_async '" + name + "' out"));
    const auto span = absl::MakeSpan(view.data, view.size);
    const std::optional<CallScope> scope = Scope(clock, first_chunk, num_chunks);
    return StartWithoutGil(
        [&] { return scope ? c.PullAsync(name, span, *scope) : c.PullAsync(name, span); },
        py::none(), out);
  }

  std::unique_ptr<PyHandle> PushPullAsync(const std::string& name, const py::object& gradient,
                                          const py::object& out) {
    Client& c = client();
    FloatBuffer in = Checked(name, ViewOf(gradient, false, "push_pull_async '" + name + "'"));
    FloatBuffer view = Checked(name, ViewOf(out, true, "push_pull_async '" + name + "' out"));
    return StartWithoutGil(
        [&] {
          return c.PushPullAsync(name, absl::MakeConstSpan(in.data, in.size),
                                 absl::MakeSpan(view.data, view.size));
        },
        gradient, out);
  }

  // Sparse tables: rows of options.dim floats keyed by int64 ids, in host
  // memory (worker/client.h, SparseTableOptions).
  void RegisterSparse(const std::string& name, const SparseTableOptions& options) {
    Client& c = client();
    WithoutGil([&] { return c.RegisterSparseTable(name, options); });
  }

  py::object PullRows(const std::string& name, const py::object& ids, const py::object& out) {
    Client& c = client();
    IdBuffer in = IdsOf(ids, "pull_rows '" + name + "' ids");
    FloatBuffer view = HostViewOf(out, true, "pull_rows '" + name + "' out");
    WithoutGil([&] {
      return c.PullRows(name, absl::MakeConstSpan(in.data, in.size),
                        absl::MakeSpan(view.data, view.size));
    });
    return out;
  }

  void PushRows(const std::string& name, const py::object& ids, const py::object& gradients) {
    Client& c = client();
    IdBuffer in = IdsOf(ids, "push_rows '" + name + "' ids");
    FloatBuffer grads = HostViewOf(gradients, false, "push_rows '" + name + "' gradients");
    WithoutGil([&] {
      return c.PushRows(name, absl::MakeConstSpan(in.data, in.size),
                        absl::MakeConstSpan(grads.data, grads.size));
    });
  }

  std::unique_ptr<PyHandle> PullRowsAsync(const std::string& name, const py::object& ids,
                                          const py::object& out) {
    Client& c = client();
    IdBuffer in = IdsOf(ids, "pull_rows_async '" + name + "' ids");
    FloatBuffer view = HostViewOf(out, true, "pull_rows_async '" + name + "' out");
    return StartWithoutGil(
        [&] {
          return c.PullRowsAsync(name, absl::MakeConstSpan(in.data, in.size),
                                 absl::MakeSpan(view.data, view.size));
        },
        ids, out);
  }

  std::unique_ptr<PyHandle> PushRowsAsync(const std::string& name, const py::object& ids,
                                          const py::object& gradients) {
    Client& c = client();
    IdBuffer in = IdsOf(ids, "push_rows_async '" + name + "' ids");
    FloatBuffer grads = HostViewOf(gradients, false, "push_rows_async '" + name + "' gradients");
    return StartWithoutGil(
        [&] {
          return c.PushRowsAsync(name, absl::MakeConstSpan(in.data, in.size),
                                 absl::MakeConstSpan(grads.data, grads.size));
        },
        py::make_tuple(ids, gradients), py::none());
  }

  // Several tables in one operation (one call per shard): names[i]'s rows
  // of ids[i] into outs[i]; the handle's result is `outs`.
  std::unique_ptr<PyHandle> PullRowsManyAsync(const std::vector<std::string>& names,
                                              const py::list& ids, const py::list& outs) {
    Client& c = client();
    if (ids.size() != names.size() || outs.size() != names.size()) {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("pull_rows_many: ", names.size(), " names, ", ids.size(), " id arrays, ",
                       outs.size(), " outputs")));
    }
    std::vector<IdBuffer> in;
    std::vector<FloatBuffer> views;
    std::vector<SparseRowsPull> pulls;
    for (size_t t = 0; t < names.size(); ++t) {
      in.push_back(IdsOf(ids[t], "pull_rows_many '" + names[t] + "' ids"));
      views.push_back(HostViewOf(outs[t], true, "pull_rows_many '" + names[t] + "' out"));
    }
    for (size_t t = 0; t < names.size(); ++t) {
      pulls.push_back({names[t], absl::MakeConstSpan(in[t].data, in[t].size),
                       absl::MakeSpan(views[t].data, views[t].size)});
    }
    return StartWithoutGil([&] { return c.PullRowsAsync(pulls); }, ids, outs);
  }

  std::unique_ptr<PyHandle> PushRowsManyAsync(const std::vector<std::string>& names,
                                              const py::list& ids, const py::list& gradients) {
    Client& c = client();
    if (ids.size() != names.size() || gradients.size() != names.size()) {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("push_rows_many: ", names.size(), " names, ", ids.size(), " id arrays, ",
                       gradients.size(), " gradient arrays")));
    }
    std::vector<IdBuffer> in;
    std::vector<FloatBuffer> grads;
    std::vector<SparseRowsPush> pushes;
    for (size_t t = 0; t < names.size(); ++t) {
      in.push_back(IdsOf(ids[t], "push_rows_many '" + names[t] + "' ids"));
      grads.push_back(
          HostViewOf(gradients[t], false, "push_rows_many '" + names[t] + "' gradients"));
    }
    for (size_t t = 0; t < names.size(); ++t) {
      pushes.push_back({names[t], absl::MakeConstSpan(in[t].data, in[t].size),
                        absl::MakeConstSpan(grads[t].data, grads[t].size)});
    }
    return StartWithoutGil([&] { return c.PushRowsAsync(pushes); },
                           py::make_tuple(ids, gradients), py::none());
  }

  py::dict SparseStats(const std::string& name) {
    absl::StatusOr<SparseTableStats> stats = client().SparseStats(name);
    if (!stats.ok()) ThrowIfError(stats.status());
    py::dict out;
    out["rows_pulled"] = stats->rows_pulled;
    out["rows_pushed"] = stats->rows_pushed;
    out["ids_requested"] = stats->ids_requested;
    out["cache_hits"] = stats->cache_hits;
    out["cache_misses"] = stats->cache_misses;
    out["bytes_pushed"] = stats->bytes_pushed;
    out["bytes_pulled"] = stats->bytes_pulled;
    return out;
  }

  void Barrier(const std::string& name) {
    Client& c = client();
    WithoutGil([&] { return c.Barrier(name); });
  }

  void Heartbeat() {
    Client& c = client();
    WithoutGil([&] { return c.Heartbeat(); });
  }

  void Leave() {
    Client& c = client();
    WithoutGil([&] { return c.Leave(); });
  }

  py::dict Stats() {
    const ClientStats stats = client().stats();
    py::dict out;
    out["bytes_pushed"] = stats.bytes_pushed;
    out["bytes_pulled"] = stats.bytes_pulled;
    out["pushes"] = stats.pushes;
    out["pulls"] = stats.pulls;
    out["push_wait_s"] = absl::ToDoubleSeconds(stats.push_wait);
    out["pull_wait_s"] = absl::ToDoubleSeconds(stats.pull_wait);
    out["last_min_clock"] = stats.last_min_clock;
    out["bytes_pushed_per_shard"] = stats.bytes_pushed_per_shard;
    out["bytes_pulled_per_shard"] = stats.bytes_pulled_per_shard;
    out["bytes_staged"] = stats.bytes_staged;
    out["bytes_landed"] = stats.bytes_landed;
    out["bytes_landed_in_staging"] = stats.bytes_landed_in_staging;
    return out;
  }

  py::dict Sync() {
    const SyncInfo& sync = client().sync();
    py::dict out;
    out["mode"] = sync.mode;
    out["staleness"] = sync.staleness;
    out["local_steps"] = sync.local_steps;
    out["optimizer"] = sync.optimizer;
    out["lr"] = sync.lr;
    out["momentum"] = sync.momentum;
    out["weight_decay"] = sync.weight_decay;
    return out;
  }

 private:
  // The piece a call covers; none for the whole tensor at the current clock.
  static std::optional<CallScope> Scope(std::optional<int64_t> clock, uint32_t first_chunk,
                                        uint32_t num_chunks) {
    if (!clock.has_value() && first_chunk == 0 && num_chunks == 0) return std::nullopt;
    CallScope scope;
    scope.clock = clock.value_or(-1);
    scope.first_chunk = first_chunk;
    scope.num_chunks = num_chunks;
    return scope;
  }

  // Starts an async call without the GIL; the handle keeps the arrays.
  template <typename Start>
  std::unique_ptr<PyHandle> StartWithoutGil(Start&& start, py::object keep_input,
                                            py::object result) {
    Client::Handle handle;
    {
      py::gil_scoped_release release;
      handle = start();
    }
    return std::make_unique<PyHandle>(shared_from_this(), std::move(handle), std::move(keep_input),
                                      std::move(result));
  }

  std::unique_ptr<Client> client_;
  absl::Duration rpc_timeout_;
  std::string device_backend_error_;
  absl::Mutex memory_mutex_;
  absl::flat_hash_map<std::string, bool> device_tensors_ ABSL_GUARDED_BY(memory_mutex_);
};

PyHandle::~PyHandle() {
  if (done_ || client_->closed()) return;  // a closed client touches no buffer
  // Nobody waited: let the calls finish (or be cancelled at the bound)
  // before the arrays they use can be freed.
  Client* client = &client_->client();
  const absl::Time deadline = absl::Now() + client_->rpc_timeout();
  WithoutGilIfHeld([&] { client->Wait(handle_, deadline).IgnoreError(); });
}

py::object PyHandle::Wait(std::optional<double> timeout_seconds) {
  if (done_) ThrowIfError(absl::NotFoundError("this handle was already waited on"));
  Client& client = client_->client();
  const absl::Time deadline = timeout_seconds.has_value()
                                  ? absl::Now() + SecondsToDuration(*timeout_seconds, "timeout")
                                  : absl::InfiniteFuture();
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client.Wait(handle_, deadline);
  }
  // Waited, with or without success: the operation is over (a deadline
  // cancels it), so its buffers are free.
  done_ = true;
  py::object result = std::move(result_);
  keep_input_ = py::none();
  result_ = py::none();
  ThrowIfError(status);
  return result;
}

// The comm scheduler over numpy parameter buffers that outlive it.
class PyScheduler {
 public:
  PyScheduler(std::shared_ptr<PyClient> client, std::unique_ptr<CommScheduler> scheduler,
              std::vector<py::object> parameters, std::shared_ptr<Timeline> timeline)
      : client_(std::move(client)),
        timeline_(std::move(timeline)),
        scheduler_(std::move(scheduler)),
        parameters_(std::move(parameters)),
        gradients_(parameters_.size()) {}
  ~PyScheduler() { Close(); }

  void Close() {
    std::unique_ptr<CommScheduler> scheduler = std::move(scheduler_);
    if (scheduler != nullptr) WithoutGilIfHeld([&] { scheduler.reset(); });
  }

  CommScheduler& scheduler() {
    if (scheduler_ == nullptr)
      ThrowIfError(absl::FailedPreconditionError("the scheduler is closed"));
    return *scheduler_;
  }

  void WaitParameters(int tensor) {
    CheckIndex(tensor);
    CommScheduler& s = scheduler();
    WithoutGil([&] { return s.WaitParameters(tensor); });
    // The scheduler no longer reads this tensor's gradient.
    gradients_[tensor] = py::none();
  }

  void GradientReady(int tensor, const py::object& gradient) {
    CheckIndex(tensor);
    CommScheduler& s = scheduler();
    FloatBuffer in = HostOnly(ViewOf(gradient, false, "gradient_ready"), "gradient_ready");
    gradients_[tensor] = gradient;  // borrowed until the next WaitParameters(tensor)
    WithoutGil([&] { return s.GradientReady(tensor, absl::MakeConstSpan(in.data, in.size)); });
  }

  void Run(absl::Status (CommScheduler::*method)()) {
    CommScheduler& s = scheduler();
    WithoutGil([&] { return (s.*method)(); });
  }

  py::dict Stats() {
    const CommSchedulerStats stats = scheduler().stats();
    py::dict out;
    out["push_calls"] = stats.push_calls;
    out["pull_calls"] = stats.pull_calls;
    out["bytes_pushed"] = stats.bytes_pushed;
    out["bytes_pulled"] = stats.bytes_pulled;
    out["peak_inflight_push_bytes"] = stats.peak_inflight_push_bytes;
    out["peak_unreturned_push_bytes"] = stats.peak_unreturned_push_bytes;
    out["forward_order_tail"] = stats.forward_order_tail;
    out["measured_forward_order_tail"] = stats.measured_forward_order_tail;
    out["forward_order_tail_from_step"] = stats.forward_order_tail_from_step;
    return out;
  }

 private:
  void CheckIndex(int tensor) const {
    if (tensor < 0 || static_cast<size_t>(tensor) >= parameters_.size()) {
      ThrowIfError(absl::OutOfRangeError(
          absl::StrCat("tensor index ", tensor, " is not in [0, ", parameters_.size(), ")")));
    }
  }

  std::shared_ptr<PyClient> client_;
  std::shared_ptr<Timeline> timeline_;  // outlives the scheduler, which records to it
  std::unique_ptr<CommScheduler> scheduler_;
  std::vector<py::object> parameters_;
  std::vector<py::object> gradients_;
};

// device: "cpu" (host tensors only) or "auto" (in a CUDA build, tensors
// registered in device memory are compressed by the CUDA codec backend when
// a device is there).
std::shared_ptr<PyClient> CreateClient(ClientOptions options, const std::string& device) {
  if (device != "cpu" && device != "auto") {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("device must be 'auto' or 'cpu', got '", device, "'")));
  }
  std::string device_error = "the client was created with device='cpu'";
#if HARRIER_WITH_CUDA
  if (device == "auto") {
    absl::StatusOr<std::shared_ptr<CodecBackend>> backend = cuda::NewCudaCodecBackend();
    if (backend.ok()) {
      options.device_backend = *std::move(backend);
      device_error.clear();
    } else {
      device_error = absl::StrCat("no CUDA codec backend: ", backend.status().message());
    }
  }
#else
  device_error = "this Harrier module was built without CUDA";
#endif
  absl::StatusOr<std::unique_ptr<Client>> client;
  {
    py::gil_scoped_release release;
    client = Client::Create(options);
  }
  ThrowIfError(client.status());
  auto made = std::make_shared<PyClient>(std::move(*client), options.rpc_timeout);
  made->set_device_backend_error(std::move(device_error));
  return made;
}

std::unique_ptr<PyScheduler> CreateScheduler(
    const std::shared_ptr<PyClient>& client, const std::vector<std::string>& names,
    const std::vector<std::vector<int64_t>>& shapes, const std::vector<py::object>& parameters,
    const std::string& techniques, size_t fusion_bytes, size_t partition_bytes,
    size_t max_inflight_bytes, double wait_timeout_seconds, double forward_order_tail,
    bool measure_forward_order_tail) {
  if (names.size() != shapes.size() || names.size() != parameters.size()) {
    ThrowIfError(absl::InvalidArgumentError("names, shapes and parameters differ in length"));
  }
  absl::StatusOr<CommSchedulerOptions> options =
      ParseTechniques(techniques, fusion_bytes, partition_bytes, max_inflight_bytes);
  ThrowIfError(options.status());
  options->wait_timeout = SecondsToDuration(wait_timeout_seconds, "wait_timeout");
  options->forward_order_tail = forward_order_tail;
  options->measure_forward_order_tail = measure_forward_order_tail;
  std::vector<ScheduledTensor> tensors;
  std::vector<FloatBuffer> views;
  for (size_t i = 0; i < names.size(); ++i) {
    views.push_back(HostOnly(ViewOf(parameters[i], true, "scheduler tensor '" + names[i] + "'"),
                             "the comm scheduler"));
    tensors.push_back({names[i], shapes[i], absl::MakeSpan(views.back().data, views.back().size)});
  }
  Client& c = client->client();
  // The client's timeline, if one is recording, gets the scheduler's calls,
  // steps and waits too.
  std::shared_ptr<Timeline> timeline = client->timeline();
  options->timeline = timeline.get();
  absl::StatusOr<std::unique_ptr<CommScheduler>> scheduler;
  {
    py::gil_scoped_release release;
    scheduler = CommScheduler::Create(c, std::move(tensors), *options);
  }
  ThrowIfError(scheduler.status());
  return std::make_unique<PyScheduler>(client, std::move(*scheduler), parameters,
                                       std::move(timeline));
}

}  // namespace
}  // namespace harrier

PYBIND11_MODULE(_harrier, m) {
  using namespace harrier;
  m.doc() = "Harrier's C++ client; import the harrier package instead.";
  SkipMutexDeadlockDetection();

  m.attr("built_with_cuda") = kBuiltWithCuda;
  m.attr("default_tcp_congestion") = ClientOptions().tcp_congestion_control;
#if HARRIER_WITH_CUDA
  // Device memory with __cuda_array_interface__, for the GPU checks of a
  // machine whose PyTorch has no CUDA (tests/cuda/python_device_check.py).
  py::class_<cuda::DeviceArray>(m, "_DeviceArrayForTesting")
      .def(py::init([](size_t n) {
        absl::StatusOr<cuda::DeviceArray> array = cuda::DeviceArray::Create(n);
        ThrowIfError(array.status());
        return std::make_unique<cuda::DeviceArray>(*std::move(array));
      }))
      .def_property_readonly("__cuda_array_interface__",
                             [](const cuda::DeviceArray& a) {
                               py::dict out;
                               out["shape"] = py::make_tuple(a.size());
                               out["typestr"] = "<f4";
                               out["data"] = py::make_tuple(
                                   reinterpret_cast<uintptr_t>(a.data()), false);
                               out["version"] = 2;
                               out["strides"] = py::none();
                               return out;
                             })
      .def("from_host",
           [](cuda::DeviceArray& a, const py::object& values) {
             FloatBuffer in = ViewOf(values, false, "from_host");
             if (in.size != a.size()) {
               ThrowIfError(absl::InvalidArgumentError("from_host: size differs"));
             }
             ThrowIfError(a.CopyFromHost(in.data, in.size));
           })
      .def("to_host", [](const cuda::DeviceArray& a, const py::object& out) {
        FloatBuffer view = ViewOf(out, true, "to_host");
        if (view.size != a.size()) ThrowIfError(absl::InvalidArgumentError("to_host: size differs"));
        ThrowIfError(a.CopyToHost(view.data, view.size));
        return out;
      });
#endif
  m.def("_set_error_classes", [](py::dict classes) { ErrorClasses() = std::move(classes); });
  // The file a worker of `rank` writes its timeline to, as harrier-worker's
  // --timeline: "{rank}" replaced, else rank 0 only (empty for others).
  m.def(
      "timeline_path_for",
      [](const std::string& pattern, int rank) { return TimelinePathFor(pattern, rank); },
      py::arg("pattern"), py::arg("rank"));
  // The job token file as the binaries read it (--auth_token_file): not
  // readable by every user, trailing newlines dropped, not empty.
  m.def("read_job_token_file", [](const std::string& path) {
    absl::StatusOr<std::string> token = ReadJobTokenFile(path);
    ThrowIfError(token.status());
    return py::bytes(*token);
  });
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const StatusError& error) {
      const std::string code = absl::StatusCodeToString(error.status.code());
      const std::string message(error.status.message());
      py::object cls = ErrorClasses().contains(code)
                           ? ErrorClasses()[py::str(code)]
                           : py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
      py::object instance = cls(message, code, static_cast<int>(error.status.code()));
      PyErr_SetObject(cls.ptr(), instance.ptr());
    }
  });

  py::class_<ClientOptions>(m, "ClientOptions")
      .def(py::init<>())
      .def_readwrite("servers", &ClientOptions::servers)
      .def_readwrite("job", &ClientOptions::job)
      .def_readwrite("rank", &ClientOptions::rank)
      .def_readwrite("worker_name", &ClientOptions::worker_name)
      .def_property(
          "rpc_timeout",
          [](const ClientOptions& o) { return absl::ToDoubleSeconds(o.rpc_timeout); },
          [](ClientOptions& o, double s) { o.rpc_timeout = SecondsToDuration(s, "rpc_timeout"); })
      .def_property(
          "connect_timeout",
          [](const ClientOptions& o) { return absl::ToDoubleSeconds(o.connect_timeout); },
          [](ClientOptions& o, double s) {
            o.connect_timeout = SecondsToDuration(s, "connect_timeout");
          })
      .def_property(
          "heartbeat_interval",
          [](const ClientOptions& o) { return absl::ToDoubleSeconds(o.heartbeat_interval); },
          [](ClientOptions& o, double s) {
            o.heartbeat_interval = SecondsToDuration(s, "heartbeat_interval");
          })
      .def_property(
          "retry_timeout",
          [](const ClientOptions& o) { return absl::ToDoubleSeconds(o.retry_timeout); },
          [](ClientOptions& o, double s) {
            o.retry_timeout = SecondsToDuration(s, "retry_timeout");
          })
      .def_readwrite("chunk_bytes", &ClientOptions::chunk_bytes)
      .def_readwrite("codec", &ClientOptions::codec)
      .def_readwrite("compress_min_bytes", &ClientOptions::compress_min_bytes)
      .def_readwrite("pull_codec", &ClientOptions::pull_codec)
      .def_readwrite("transport", &ClientOptions::transport)
      .def_readwrite("tcp_congestion_control", &ClientOptions::tcp_congestion_control)
      .def_readwrite("max_queued_calls", &ClientOptions::max_queued_calls)
      .def_readwrite("max_calls_in_flight", &ClientOptions::max_calls_in_flight)
      .def_readwrite("pull_connection", &ClientOptions::pull_connection)
      .def_readwrite("tls_ca_file", &ClientOptions::tls_ca_file)
      .def_readwrite("tls_cert_file", &ClientOptions::tls_cert_file)
      .def_readwrite("tls_key_file", &ClientOptions::tls_key_file)
      .def_readwrite("auth_token", &ClientOptions::auth_token);

  const SparseTableOptions kSparseDefaults;
  py::class_<PyHandle>(m, "Handle")
      .def("wait", &PyHandle::Wait, py::arg("timeout") = py::none())
      .def_property_readonly("done", &PyHandle::done)
      .def_property_readonly("id", &PyHandle::id);

  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "Client")
      .def(py::init(&CreateClient), py::arg("options"), py::arg("device") = "auto")
      .def("close", &PyClient::Close)
      .def("start_timeline", &PyClient::StartTimeline, py::arg("path"), py::arg("max_bytes"))
      .def("stop_timeline", &PyClient::StopTimeline)
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("rank", [](PyClient& c) { return c.client().rank(); })
      .def_property_readonly("num_workers", [](PyClient& c) { return c.client().num_workers(); })
      .def_property_readonly("num_shards", [](PyClient& c) { return c.client().num_shards(); })
      .def_property_readonly("data_paths", [](PyClient& c) { return c.client().data_paths(); })
      .def_property_readonly("chunk_bytes", [](PyClient& c) { return c.client().chunk_bytes(); })
      .def_property_readonly("session_epoch",
                             [](PyClient& c) { return c.client().session_epoch(); })
      .def_property_readonly("current_clock", [](PyClient& c) { return c.client().clock(); })
      .def("sync", &PyClient::Sync)
      .def("register", &PyClient::Register, py::arg("name"), py::arg("shape"), py::arg("initial"),
           py::arg("kind") = "parameters", py::arg("own_clock") = false, py::arg("codec") = "",
           py::arg("pull_codec") = "", py::arg("memory") = "host",
           py::arg("staging_buffers") = false)
      .def("tensor_clock", &PyClient::TensorClock)
      .def("push", &PyClient::Push)
      .def("pull", &PyClient::Pull)
      .def("push_pull", &PyClient::PushPull)
      .def("push_async", &PyClient::PushAsync, py::arg("name"), py::arg("gradient"),
           py::arg("clock") = py::none(), py::arg("first_chunk") = 0, py::arg("num_chunks") = 0)
      .def("pull_async", &PyClient::PullAsync, py::arg("name"), py::arg("out"),
           py::arg("clock") = py::none(), py::arg("first_chunk") = 0, py::arg("num_chunks") = 0)
      .def("push_pull_async", &PyClient::PushPullAsync)
      .def(
          "register_sparse",
          [](PyClient& c, const std::string& name, int64_t dim, const std::string& optimizer,
             float lr, float beta1, float beta2, float epsilon, float initial_accumulator,
             float init_scale, uint64_t seed, uint64_t max_rows, const std::string& eviction,
             int64_t ttl_steps, uint32_t admit_after, float admit_probability,
             const std::string& sync, int64_t staleness, const std::string& wire_dtype,
             size_t cache_rows, int64_t cache_staleness, uint64_t max_bytes) {
            SparseTableOptions options;
            options.dim = dim;
            options.optimizer = optimizer;
            options.lr = lr;
            options.beta1 = beta1;
            options.beta2 = beta2;
            options.epsilon = epsilon;
            options.initial_accumulator = initial_accumulator;
            options.init_scale = init_scale;
            options.seed = seed;
            options.max_rows = max_rows;
            options.eviction = eviction;
            options.ttl_steps = ttl_steps;
            options.admit_after = admit_after;
            options.admit_probability = admit_probability;
            options.sync = sync;
            options.staleness = staleness;
            options.wire_dtype = wire_dtype;
            options.cache_rows = cache_rows;
            options.cache_staleness = cache_staleness;
            options.max_bytes = max_bytes;
            c.RegisterSparse(name, options);
          },
          // The defaults are SparseTableOptions' own.
          py::arg("name"), py::arg("dim"), py::arg("optimizer") = kSparseDefaults.optimizer,
          py::arg("lr") = kSparseDefaults.lr, py::arg("beta1") = kSparseDefaults.beta1,
          py::arg("beta2") = kSparseDefaults.beta2, py::arg("epsilon") = kSparseDefaults.epsilon,
          py::arg("initial_accumulator") = kSparseDefaults.initial_accumulator,
          py::arg("init_scale") = kSparseDefaults.init_scale,
          py::arg("seed") = kSparseDefaults.seed, py::arg("max_rows") = kSparseDefaults.max_rows,
          py::arg("eviction") = kSparseDefaults.eviction,
          py::arg("ttl_steps") = kSparseDefaults.ttl_steps,
          py::arg("admit_after") = kSparseDefaults.admit_after,
          py::arg("admit_probability") = kSparseDefaults.admit_probability,
          py::arg("sync") = kSparseDefaults.sync, py::arg("staleness") = kSparseDefaults.staleness,
          py::arg("wire_dtype") = kSparseDefaults.wire_dtype,
          py::arg("cache_rows") = kSparseDefaults.cache_rows,
          py::arg("cache_staleness") = kSparseDefaults.cache_staleness,
          py::arg("max_bytes") = kSparseDefaults.max_bytes)
      .def("pull_rows", &PyClient::PullRows, py::arg("name"), py::arg("ids"), py::arg("out"))
      .def("push_rows", &PyClient::PushRows, py::arg("name"), py::arg("ids"), py::arg("gradients"))
      .def("pull_rows_async", &PyClient::PullRowsAsync, py::arg("name"), py::arg("ids"),
           py::arg("out"))
      .def("push_rows_async", &PyClient::PushRowsAsync, py::arg("name"), py::arg("ids"),
           py::arg("gradients"))
      .def("pull_rows_many_async", &PyClient::PullRowsManyAsync, py::arg("names"), py::arg("ids"),
           py::arg("outs"))
      .def("push_rows_many_async", &PyClient::PushRowsManyAsync, py::arg("names"), py::arg("ids"),
           py::arg("gradients"))
      .def("sparse_stats", &PyClient::SparseStats)
      .def("barrier", &PyClient::Barrier)
      .def("heartbeat", &PyClient::Heartbeat)
      .def("leave", &PyClient::Leave)
      .def("clock",
           [](PyClient& c) {
             c.client().Clock();
             return c.client().clock();
           })
      .def("stats", &PyClient::Stats)
      .def("live_operations", [](PyClient& c) { return c.client().live_operations_for_testing(); });

  py::class_<PyScheduler>(m, "Scheduler")
      .def(py::init(&CreateScheduler), py::arg("client"), py::arg("names"), py::arg("shapes"),
           py::arg("parameters"), py::arg("techniques"), py::arg("fusion_bytes") = 0,
           py::arg("partition_bytes") = 0, py::arg("max_inflight_bytes") = 0,
           py::arg("wait_timeout") = 120.0, py::arg("forward_order_tail") = 0.0,
           py::arg("measure_forward_order_tail") = false)
      .def("wait_parameters", &PyScheduler::WaitParameters)
      .def("gradient_ready", &PyScheduler::GradientReady)
      .def("end_backward", [](PyScheduler& s) { s.Run(&CommScheduler::EndBackward); })
      .def("drain", [](PyScheduler& s) { s.Run(&CommScheduler::Drain); })
      .def("refresh", [](PyScheduler& s) { s.Run(&CommScheduler::Refresh); })
      .def("stats", &PyScheduler::Stats)
      .def("close", &PyScheduler::Close);
}
