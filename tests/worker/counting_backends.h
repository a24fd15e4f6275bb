#ifndef HARRIER_TESTS_WORKER_COUNTING_BACKENDS_H_
#define HARRIER_TESTS_WORKER_COUNTING_BACKENDS_H_

// Codec backends that count what the client asks of them, for the proof
// that device tensors are compressed by the device backend and never by
// the CPU one.
//
// CountingBackend wraps the host backend (NewHostCodecBackend) and reports
// the memory kind it is given: as kDevice it is a fake device whose
// "device memory" is host memory the test registers (AddDeviceRange), so
// it computes exactly what the host backend does (results comparable
// bitwise with a pure-host client) while refusing, with INTERNAL, any
// pointer it is handed outside the registered ranges: a host buffer passed
// where device memory is due fails the call instead of passing silently.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/codec/codec_backend.h"
#include "common/codec/host_codec_backend.h"

namespace harrier {

struct BackendCounts {
  std::atomic<int64_t> new_push_streams{0};
  std::atomic<int64_t> encodes{0};
  std::atomic<int64_t> new_pull_mirrors{0};
  std::atomic<int64_t> set_dense{0};
  std::atomic<int64_t> add_compressed{0};
  std::atomic<int64_t> copy_to_host{0};
  std::atomic<int64_t> copy_from_host{0};
  std::atomic<int64_t> crc32c{0};
  std::atomic<int64_t> new_buffers{0};
  std::atomic<int64_t> copy_within{0};
  std::atomic<int64_t> set_dense_from{0};

  int64_t total() const {
    return new_push_streams + encodes + new_pull_mirrors + set_dense + add_compressed +
           copy_to_host + copy_from_host + crc32c + new_buffers + copy_within + set_dense_from;
  }
  std::string ToString() const {
    return absl::StrCat("streams=", new_push_streams.load(), " encodes=", encodes.load(),
                        " mirrors=", new_pull_mirrors.load(), " set_dense=", set_dense.load(),
                        " add_compressed=", add_compressed.load(),
                        " to_host=", copy_to_host.load(), " from_host=", copy_from_host.load(),
                        " crc=", crc32c.load(), " buffers=", new_buffers.load(),
                        " within=", copy_within.load(), " dense_from=", set_dense_from.load());
  }
};

class CountingBackend : public CodecBackend {
 public:
  explicit CountingBackend(MemoryKind memory)
      : memory_(memory), inner_(NewHostCodecBackend()), counts_(std::make_shared<BackendCounts>()) {}

  // Device memory of a fake device: [data, data + n floats).
  void AddDeviceRange(const float* data, size_t n) {
    absl::MutexLock lock(&mutex_);
    ranges_.emplace_back(data, data + n);
  }

  const BackendCounts& counts() const { return *counts_; }

  MemoryKind memory() const override { return memory_; }
  std::string name() const override {
    return memory_ == MemoryKind::kDevice ? "counting-fake-device" : "counting-host";
  }

  absl::StatusOr<std::unique_ptr<PushStream>> NewPushStream(const CodecSpec& spec,
                                                            size_t n) override {
    counts_->new_push_streams++;
    auto inner = inner_->NewPushStream(spec, n);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<PushStream>(new Stream(this, std::move(*inner)));
  }

  absl::StatusOr<std::unique_ptr<PullMirror>> NewPullMirror(const CodecSpec& spec,
                                                            size_t n) override {
    counts_->new_pull_mirrors++;
    auto inner = inner_->NewPullMirror(spec, n);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<PullMirror>(new Mirror(this, std::move(*inner), n));
  }

  absl::Status CopyToHost(const float* values, size_t n, float* host) override {
    counts_->copy_to_host++;
    if (auto status = Check(values, n, "CopyToHost"); !status.ok()) return status;
    return inner_->CopyToHost(values, n, host);
  }

  absl::Status CopyFromHost(const PayloadView& host, float* values) override {
    counts_->copy_from_host++;
    if (auto status = Check(values, host.size() / sizeof(float), "CopyFromHost"); !status.ok()) {
      return status;
    }
    return inner_->CopyFromHost(host, values);
  }

  absl::StatusOr<uint32_t> Crc32c(const void* data, size_t bytes) override {
    counts_->crc32c++;
    if (auto status = Check(static_cast<const float*>(data), bytes / sizeof(float), "Crc32c");
        !status.ok()) {
      return status;
    }
    return inner_->Crc32c(data, bytes);
  }

  // Buffers of the fake device are host buffers it registers as its own.
  absl::StatusOr<std::unique_ptr<BackendBuffer>> NewBuffer(size_t n) override {
    counts_->new_buffers++;
    auto inner = inner_->NewBuffer(n);
    if (!inner.ok()) return inner.status();
    if (memory_ == MemoryKind::kDevice) AddDeviceRange((*inner)->data(), n);
    return inner;
  }

  absl::Status CopyWithin(const float* from, size_t n, float* to) override {
    counts_->copy_within++;
    if (auto status = Check(from, n, "CopyWithin"); !status.ok()) return status;
    if (auto status = Check(to, n, "CopyWithin"); !status.ok()) return status;
    return inner_->CopyWithin(from, n, to);
  }

 private:
  class Stream : public PushStream {
   public:
    Stream(CountingBackend* backend, std::unique_ptr<PushStream> inner)
        : backend_(backend), inner_(std::move(inner)) {}
    absl::Status Encode(const float* values, size_t n, const CodecContext& ctx,
                        std::string* payload) override {
      backend_->counts_->encodes++;
      if (auto status = backend_->Check(values, n, "Encode"); !status.ok()) {
        payload->clear();
        return status;
      }
      return inner_->Encode(values, n, ctx, payload);
    }

   private:
    CountingBackend* const backend_;
    const std::unique_ptr<PushStream> inner_;
  };

  class Mirror : public PullMirror {
   public:
    Mirror(CountingBackend* backend, std::unique_ptr<PullMirror> inner, size_t n)
        : backend_(backend), inner_(std::move(inner)), n_(n) {}
    bool empty() const override { return inner_->empty(); }
    absl::Status SetDense(const PayloadView& payload, float* out) override {
      backend_->counts_->set_dense++;
      if (auto status = backend_->Check(out, n_, "SetDense"); !status.ok()) return status;
      return inner_->SetDense(payload, out);
    }
    absl::Status SetDenseFrom(const float* values, float* out) override {
      backend_->counts_->set_dense_from++;
      if (auto status = backend_->Check(values, n_, "SetDenseFrom"); !status.ok()) return status;
      if (auto status = backend_->Check(out, n_, "SetDenseFrom"); !status.ok()) return status;
      return inner_->SetDenseFrom(values, out);
    }
    absl::Status AddCompressed(absl::string_view payload, float* out) override {
      backend_->counts_->add_compressed++;
      if (auto status = backend_->Check(out, n_, "AddCompressed"); !status.ok()) return status;
      return inner_->AddCompressed(payload, out);
    }

   private:
    CountingBackend* const backend_;
    const std::unique_ptr<PullMirror> inner_;
    const size_t n_;
  };

  // A device backend handed a pointer outside the fake device's memory.
  absl::Status Check(const float* data, size_t n, const char* what) const {
    if (memory_ != MemoryKind::kDevice) return absl::OkStatus();
    absl::MutexLock lock(&mutex_);
    for (const auto& range : ranges_) {
      if (data >= range.first && data + n <= range.second) return absl::OkStatus();
    }
    return absl::InternalError(
        absl::StrCat("fake device backend: ", what, " given ", n, " floats outside device memory"));
  }

  const MemoryKind memory_;
  const std::shared_ptr<CodecBackend> inner_;
  const std::shared_ptr<BackendCounts> counts_;
  mutable absl::Mutex mutex_;
  std::vector<std::pair<const float*, const float*>> ranges_;
};

}  // namespace harrier

#endif  // HARRIER_TESTS_WORKER_COUNTING_BACKENDS_H_
