// `harrier-bench tta`: time to accuracy on a scarce network. Shards and
// harrier-worker processes each run in a network namespace of their own,
// joined through a bridge, every one behind its own emulated link
// (//bench/netem, per-host model: tc tbf on both ends of each veth).
// The workers train the Fashion-MNIST MLP under BSP; rank 0 evaluates the
// test set every --eval_every steps, and the bench records the training
// wall time (evaluation excluded) to the first evaluation at or above the
// target, once per codec and technique set.

#ifndef HARRIER_BENCH_TTA_BENCH_H_
#define HARRIER_BENCH_TTA_BENCH_H_

namespace harrier::bench {

// Prints one JSON line per (codec, techniques) on stdout, progress on
// stderr. argv[0] is the subcommand's name; --help lists the flags. Returns 0
// when every run finished (whether or not it reached the target), 1 when a
// run failed or namespaces cannot be made here (one line says why), 2 on a
// usage error. Starts and removes its own namespaces and processes; call
// before this process has started other threads (it tunes malloc).
int RunTtaBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_TTA_BENCH_H_
