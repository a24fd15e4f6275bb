// harrier-bench overlap: replayed real models (ResNet-50, VGG-16, BERT-base)
// trained under BSP by real harrier-worker and harrier-server processes,
// each on its own emulated link (bench/netem, per-host model), once per
// overlap technique set, beside the cost model's ideal. See README.md,
// "overlap".

#ifndef HARRIER_BENCH_OVERLAP_BENCH_H_
#define HARRIER_BENCH_OVERLAP_BENCH_H_

#include <cstdint>
#include <string>

namespace harrier::bench {

// The cost model's communication time of one iteration, in ms, on links of
// `link_gbps` (10^9 bit/s, each host its own full-duplex link).
// Parameter server, n workers, k shards, M bytes per direction per worker:
// the busiest link carries max(M, n*M/k) each way.
double PsCommMs(double model_bytes, int workers, int shards, double link_gbps);
// Ring all-reduce: each rank sends (and receives) 2(n-1)M/n.
double AllReduceCommMs(double model_bytes, int ranks, double link_gbps);

// Exit status when emulated links cannot be made here (not root, no
// `ip netns`): the smoke test tells this apart from a failure.
inline constexpr int kOverlapUnavailableExit = 3;

// `harrier-bench overlap [flags]`; argv[0] is the subcommand's name.
int RunOverlapBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_OVERLAP_BENCH_H_
