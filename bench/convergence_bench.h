// `harrier-bench convergence`: the survey's grid. For every
// model x sync mode x codec x compressed pulls off/on x link rate, a fresh
// training job (2 shards, 4 harrier-worker processes, each in its own
// network namespace behind its own emulated link, as `harrier-bench tta`)
// runs for --epochs; rank 0's loss and test accuracy against steps and
// training wall time, and its bytes up and down, are appended to
// runs.jsonl / runs.csv / curves.csv in --out_dir as each run ends, so an
// interrupted grid resumes where it stopped (README.md, "convergence").

#ifndef HARRIER_BENCH_CONVERGENCE_BENCH_H_
#define HARRIER_BENCH_CONVERGENCE_BENCH_H_

namespace harrier::bench {

// argv[0] is the subcommand's name; --help lists the flags. Returns 0 when every
// run of the grid is done ok (now or before), 1 when a run failed (its line
// says why) or namespaces cannot be made here, 2 on a usage error. Call
// before this process has started other threads (it tunes malloc).
int RunConvergenceBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_CONVERGENCE_BENCH_H_
