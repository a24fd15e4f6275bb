#ifndef HARRIER_BENCH_CHECKPOINT_BENCH_H_
#define HARRIER_BENCH_CHECKPOINT_BENCH_H_

namespace harrier::bench {

// harrier-bench checkpoint: bytes written per checkpoint of a sparse table
// against the rows changed since the previous one, complete against
// incremental, and the time to write each (one JSON line per case).
int RunCheckpointBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_CHECKPOINT_BENCH_H_
