// What harrier-advise measures on this host: the link to every shard
// (AdminService.Probe), the codecs' encode and decode time and bytes at the
// model's tensor sizes (as the client chunks and compresses them), and the
// compute time of one training step.
#ifndef HARRIER_BENCH_ADVISE_MEASURE_H_
#define HARRIER_BENCH_ADVISE_MEASURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/advise/cost_model.h"
#include "common/codec/codec_backend.h"
#include "common/partitioner.h"

namespace harrier::advise {

// ---- The link ----

struct ShardLink {
  std::string address;
  double rtt_s = 0;             // median of the small probes
  double up_bytes_per_s = 0;    // median of the large-payload probes
  double down_bytes_per_s = 0;  // median of the large-reply probes
  // This process's CPU (user + system, every thread) per byte of the large
  // probes: what one end's gRPC and TCP stack spend to move a byte here.
  double cpu_s_per_byte = 0;
  double cpu_s_per_call = 0;  // the same per small probe (a call's fixed cost)
};

struct LinkOptions {
  std::vector<std::string> servers;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: insecure
  std::string token;                                      // "" : none
  uint64_t probe_bytes = 8u << 20;  // of the large probes, at most 64 MiB
  int small_probes = 20;            // round-trip samples per shard
  int repeats = 5;                  // large probes per direction per shard
  absl::Duration timeout = absl::Seconds(30);  // each call's deadline
};

// Probes every shard in turn. Rates exclude one round trip per probe (the
// request's own latency), so a fast link does not look like a slow one.
// The first error names the shard (e.g. UNAUTHENTICATED for a wrong token,
// UNIMPLEMENTED for a shard without Probe).
absl::StatusOr<std::vector<ShardLink>> MeasureLinks(const LinkOptions& options);

// The link the cost model uses: the slowest shard's rates (under BSP it
// sets the pace), the largest round trip and the largest CPU costs.
Link CombineLinks(const std::vector<ShardLink>& links);

// ---- Codecs ----

struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
  int64_t num_elements() const;
};

// ---- A running job's model ----

// The tensors the shards of a running job hold (AdminService.GetStatus with
// include_tensors: what its workers registered), by name, with their
// registered shapes. FAILED_PRECONDITION when no shard holds a tensor yet
// (the workers register theirs as they start); DATA_LOSS when the shards
// disagree on a tensor's shape or hold more or fewer of its elements than
// the shape has; a call's own error names the shard.
absl::StatusOr<std::vector<TensorShape>> ReadJobTensors(const LinkOptions& options);

struct CodecMeasureOptions {
  size_t chunk_bytes = 4u << 20;         // ClientOptions::chunk_bytes
  size_t compress_min_bytes = 16u << 10;  // chunks below travel dense
  int shards = 2;                         // for the chunks' placement
  // Where each chunk lives; null: a HashPartitioner over `shards`.
  std::shared_ptr<const Partitioner> partitioner;
  // Each distinct chunk is encoded and decoded this many times; the
  // fastest counts (the others pay for caches and page faults).
  int repeats = 3;
  // Where the worker's side runs (its push encode, its pull decode), in
  // that backend's memory: null for the host's CPU codecs; the CUDA backend
  // (//cuda:cuda_codec_backend) for a GPU worker. The shard's side always
  // runs on the host codecs.
  std::shared_ptr<CodecBackend> backend;
};

// The bytes and codec times of one option's push codec (`push_spec`) and
// pull codec (`pull_spec`, "none": dense pulls) for one worker's round over
// `tensors`, on this host's CPU codecs. INVALID_ARGUMENT for a spec the
// codecs refuse.
absl::StatusOr<CodecCost> MeasureCodec(const std::vector<TensorShape>& tensors,
                                       const std::string& push_spec, const std::string& pull_spec,
                                       const CodecMeasureOptions& options);

// ---- Compute ----

// Median time of one forward + backward of the Fashion-MNIST MLP
// (784-256-256-10, one BLAS thread, as harrier-worker runs it) on a
// synthetic batch of `batch_size`.
absl::StatusOr<double> MeasureMlpStepSeconds(int batch_size);
// The same for the Fashion-MNIST CNN (worker/workload/cnn.h), median of 10.
absl::StatusOr<double> MeasureCnnStepSeconds(int batch_size);

}  // namespace harrier::advise

#endif  // HARRIER_BENCH_ADVISE_MEASURE_H_
