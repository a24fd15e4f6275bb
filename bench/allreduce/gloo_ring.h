// A gloo context for the all-reduce baseline: ranks meet through a gloo
// FileStore in a directory they all see (they may sit in different network
// namespaces; only the file system is shared), connect a full mesh of tcp
// pairs bound to this rank's address, and sum float buffers with gloo's ring
// algorithm (reduce-scatter then all-gather, so each rank sends and receives
// 2(n-1)/n of the buffer).
//
// Gloo reports failures by throwing; nothing thrown leaves this library: every
// call returns an absl::Status naming the rank and the operation.

#ifndef HARRIER_BENCH_ALLREDUCE_GLOO_RING_H_
#define HARRIER_BENCH_ALLREDUCE_GLOO_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace harrier::allreduce {

struct GlooRingOptions {
  int rank = 0;
  int world = 1;
  // Shared by all ranks and fresh for each run: keys left by an earlier run
  // of the same ranks would be read as this run's addresses.
  std::string rendezvous_dir;
  // The IP (or host name) this rank's tcp device binds to and advertises.
  std::string address = "127.0.0.1";
  // Bounds the rendezvous, the connection of every pair and each
  // all-reduce, end to end.
  absl::Duration timeout = absl::Seconds(120);
};

// Not thread-safe: one thread (the communication thread) issues the
// all-reduces, one at a time.
class GlooRing {
 public:
  // Blocks until every rank has joined and all pairs are connected, or the
  // timeout passes (DEADLINE_EXCEEDED / UNAVAILABLE naming this rank).
  static absl::StatusOr<std::unique_ptr<GlooRing>> Connect(const GlooRingOptions& options);

  ~GlooRing();
  GlooRing(const GlooRing&) = delete;
  GlooRing& operator=(const GlooRing&) = delete;

  // Replaces data[0, count) with the element-wise sum over all ranks, in
  // place. Every rank must issue the same sequence of calls with the same
  // counts; `tag` tells concurrent operations apart (the caller's sequential
  // use may reuse one). A world of 1 returns at once.
  absl::Status AllreduceSum(float* data, size_t count, uint32_t tag);

  int rank() const { return options_.rank; }
  int world() const { return options_.world; }

 private:
  GlooRing(GlooRingOptions options, std::shared_ptr<gloo::Context> context);

  const GlooRingOptions options_;
  std::shared_ptr<gloo::Context> context_;
};

// Bytes one rank sends (and, symmetrically, receives) in a ring all-reduce
// of `bytes` over `world` ranks: 2(n-1)/n * bytes, from the algorithm (n-1
// reduce-scatter steps and n-1 all-gather steps, each moving 1/n of the
// buffer). Gloo's segmenting makes a rank's share differ from this by at
// most a few segments' rounding; over all ranks the total is exact.
int64_t RingBytesPerRank(int64_t bytes, int world);

}  // namespace harrier::allreduce

#endif  // HARRIER_BENCH_ALLREDUCE_GLOO_RING_H_
