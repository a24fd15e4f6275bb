// `harrier-bench embedding`: sparse embedding tables (DLRM-style lookups:
// several tables, Zipf-skewed ids, batches with repeats) through real
// harrier-server shards and one worker's Client, each rate next to the same
// tables' in-process rate (server/sparse_rows.h, no wire) and a memcpy of
// the same row bytes measured in the same run; memory per row against the
// raw row and optimizer state; the worker's row cache; the row budget.

#ifndef HARRIER_BENCH_EMBEDDING_BENCH_H_
#define HARRIER_BENCH_EMBEDDING_BENCH_H_

namespace harrier::bench {

// Prints one JSON line per (case, dimension[, optimizer]) to stdout and a
// summary table to stderr. argv[0] is the subcommand's name; --help lists
// the flags. Returns 0 on success, 1 if a measurement failed, 2 on a usage
// error (message on stderr). Starts and stops its own server processes;
// call before this process has started other threads (it tunes malloc).
int RunEmbeddingBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_EMBEDDING_BENCH_H_
