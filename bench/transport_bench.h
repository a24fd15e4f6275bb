// `harrier-bench transport`: push, pull and push-pull goodput of the real
// client against real harrier-server processes on loopback, each figure
// next to raw loopback TCP measured in the same run.

#ifndef HARRIER_BENCH_TRANSPORT_BENCH_H_
#define HARRIER_BENCH_TRANSPORT_BENCH_H_

namespace harrier::bench {

// Prints one JSON line per (op, size, shards, workers) to stdout and a
// summary table to stderr. argv[0] is the subcommand's name; --help lists the
// flags. Returns 0 on success, 1 if a measurement failed, 2 on a usage
// error (message on stderr). Starts and stops its own server processes;
// call before this process has started other threads (it tunes malloc).
int RunTransportBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_TRANSPORT_BENCH_H_
