// Checksum throughput benchmark, wired into //bench:harrier-bench as the
// `crc` subcommand.

#ifndef HARRIER_BENCH_CRC_CRC_BENCH_H_
#define HARRIER_BENCH_CRC_CRC_BENCH_H_

namespace harrier::bench {

// For every size: the CRC32C every data message carries (Crc32c), the
// copy that takes it on the way (Crc32cCopy) and memcpy of the same bytes,
// single-threaded, each from a buffer in cache (the same one again) and
// from memory (a new one each time, out of 256 MiB), with the byte-table
// reference (Crc32cPortable) beside them. One JSON line per size on
// stdout, GB/s (1e9 B/s) and ratios to memcpy. argv[0] is the subcommand's
// name. Flags:
//   --sizes=16K,48K,1M,4M,64M   bytes (K/M/G binary)
//   --min_time=0.2              seconds of repetitions per measurement
//   --help
// Returns 0 on success, 2 on a usage error (message on stderr).
int RunCrcBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_CRC_CRC_BENCH_H_
