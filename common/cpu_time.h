#ifndef HARRIER_COMMON_CPU_TIME_H_
#define HARRIER_COMMON_CPU_TIME_H_

// CPU time, for the benches' "CPU seconds per GB moved" figures.

#include <sys/types.h>

#include <chrono>
#include <cstdint>

namespace harrier {

// User + system CPU of every thread of this process so far (getrusage).
double ProcessCpuSeconds();

// User + system CPU of the calling thread so far.
double ThreadCpuSeconds();

// User + system CPU of every thread of process `pid` so far, read from
// /proc/PID/stat in clock ticks (10 ms), so meaningful over a whole run, not
// per call; -1 if it cannot be read (the process is gone).
double ProcessCpuSecondsOf(pid_t pid);

// A steady-clock instant as nanoseconds since the clock's epoch
// (CLOCK_MONOTONIC: the same in every process of the machine).
inline int64_t SteadyNanos(std::chrono::steady_clock::time_point t) {
  return static_cast<int64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

}  // namespace harrier

#endif  // HARRIER_COMMON_CPU_TIME_H_
