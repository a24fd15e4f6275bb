// Small helpers shared by harrier-bench subcommands: latency percentiles, a
// start gate that lines threads up before timing, list-flag parsing and
// the consistency models' names.

#ifndef HARRIER_BENCH_BENCH_UTIL_H_
#define HARRIER_BENCH_BENCH_UTIL_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace harrier::bench {

using BenchClock = std::chrono::steady_clock;

inline double MicrosSince(BenchClock::time_point start) {
  return std::chrono::duration<double, std::micro>(BenchClock::now() - start).count();
}

// The q-quantile (0 <= q <= 1) of `samples` by nearest rank; 0 when empty.
// Sorts `samples` in place.
double Percentile(std::vector<double>& samples, double q);

// Lines up `parties` threads so the timed region starts when all of them
// have finished their set-up and warm-up, not when the first one has.
// Thread-safe; single use.
class StartGate {
 public:
  explicit StartGate(int parties) : parties_(parties) {}

  // Called by each measuring thread when it is ready; returns once Open()
  // was called. Returns false if Abort() was called instead.
  bool ArriveAndWait();
  // Called by the coordinating thread: waits until every party arrived (or
  // one aborted), then records the start time and releases them all.
  // Returns the start time of the timed region.
  BenchClock::time_point WaitAllThenOpen();
  // A party that failed during set-up calls this so nobody waits for it.
  void Abort();

  // The same two waits with a deadline. A party whose deadline passes
  // returns false; a coordinator whose deadline passes aborts the gate (so
  // no party waits on for it) and returns DEADLINE_EXCEEDED naming how many
  // parties had arrived. ABORTED if a party called Abort().
  bool ArriveAndWaitUntil(BenchClock::time_point deadline);
  absl::StatusOr<BenchClock::time_point> WaitAllThenOpenUntil(BenchClock::time_point deadline);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  const int parties_;
  int arrived_ = 0;
  bool open_ = false;
  bool aborted_ = false;
};

// Parses "4K,64K,1M" (suffixes K, M, G are binary: KiB, MiB, GiB) into
// byte counts; every value must be positive.
absl::StatusOr<std::vector<size_t>> ParseByteList(absl::string_view text);
// ParseByteList for tensor sizes: each a whole number of float32 values.
absl::StatusOr<std::vector<size_t>> ParseTensorSizes(absl::string_view text);
// Parses "1,2,4" into positive integers.
absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text);
// "4K" for 4096, "1M" for 1 MiB, else the plain number: for tables.
std::string FormatBytes(size_t bytes);

// The harrier-server flags of a consistency model as the benches and the
// advisor name it: "bsp", "asp", "ssp<N>" (SSP with staleness N >= 1, e.g.
// "ssp2") or "local<H>" (local SGD, the models averaged every H >= 1
// steps, e.g. "local4"). INVALID_ARGUMENT for anything else.
absl::StatusOr<std::vector<std::string>> SyncServerFlags(absl::string_view sync);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_BENCH_UTIL_H_
