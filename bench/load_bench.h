// `harrier-bench load`: many concurrent clients against real
// harrier-server processes on loopback for a fixed time, pushing integer
// gradients whose exact effect is known, so the run ends with a check of
// every parameter as well as latency and throughput figures.

#ifndef HARRIER_BENCH_LOAD_BENCH_H_
#define HARRIER_BENCH_LOAD_BENCH_H_

namespace harrier::bench {

// Prints one JSON line per sync mode to stdout and a one-line summary per
// mode to stderr. argv[0] is the subcommand's name; --help lists the flags.
// Returns 0 when every mode ran with no failed call and the exact expected
// parameters, 1 otherwise, 2 on a usage error (message on stderr). Starts
// and stops its own server processes; call before this process has started
// other threads (it tunes malloc).
int RunLoadBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_LOAD_BENCH_H_
