// One harrier-server shard over UCX for the transport GPU bench: starts
// the shard (a real process, --ucx, one worker, ASP), registers rank 0,
// creates dense tensors chunk by chunk over gRPC, pushes them over a
// UcxShardTransport from host or device memory and pulls them back into it
// (a landing chooser). No CUDA here: the caller owns the memory, so this builds and
// is tested on any machine.

#ifndef HARRIER_BENCH_CUDA_TRANSPORT_UCX_PUSH_TARGET_H_
#define HARRIER_BENCH_CUDA_TRANSPORT_UCX_PUSH_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/codec/codec_backend.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/transport/ucx/ucx_transport.h"

namespace harrier::bench {

// Not thread-safe: one push or pull at a time.
class UcxPushTarget {
 public:
  // `device_memory` as for UcxClientContext::Create; `chunk_bytes` is how
  // a tensor is split (the client's default is 4 MiB).
  static absl::StatusOr<std::unique_ptr<UcxPushTarget>> Start(UcxDeviceMemory device_memory,
                                                              size_t chunk_bytes = 4 << 20);

  bool sends_from_device_memory() const { return transport_->SendsFromDeviceMemory(); }

  // Creates `key` with `values` (dense fp32). The same values must be what
  // every later push of the key carries: the chunks' checksums are computed
  // here, on the host, once (the bench pushes fixed bytes).
  absl::Status AddTensor(const std::string& key, const std::vector<float>& values);

  // One push of the whole tensor at its next clock, from `data` (as many
  // bytes as AddTensor's values) in `memory`, each chunk borrowed in place.
  absl::Status Push(const std::string& key, const void* data, MemoryKind memory,
                    absl::Duration timeout = absl::Seconds(60));

  // True if pulls can land in device memory (ReceivesIntoDeviceMemory).
  bool receives_into_device_memory() const { return transport_->ReceivesIntoDeviceMemory(); }

  // One pull of the whole tensor into `dest` (as many bytes as AddTensor's
  // values, in `memory`) with a landing chooser, each reply landing in place where
  // the transport can. A host reply that did not land is copied in; a reply
  // meant for device memory that did not land is an error (FAILED_PRECONDITION:
  // there is no CUDA here to copy it). Returns the bytes that landed in
  // place. The payload checksums are not checked (a bench of the transport).
  absl::StatusOr<size_t> Pull(const std::string& key, void* dest, MemoryKind memory,
                              absl::Duration timeout = absl::Seconds(60));

 private:
  struct Tensor {
    size_t elements = 0;
    std::vector<uint32_t> checksums;  // per chunk
    int64_t next_clock = 0;
  };
  UcxPushTarget() = default;

  size_t chunk_elements_ = 0;
  std::unique_ptr<testing::ServerProcess> server_;
  std::unique_ptr<testing::Sessions> sessions_;
  std::shared_ptr<UcxClientContext> context_;
  std::unique_ptr<ShardTransport> transport_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_CUDA_TRANSPORT_UCX_PUSH_TARGET_H_
