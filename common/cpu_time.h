#ifndef HARRIER_COMMON_CPU_TIME_H_
#define HARRIER_COMMON_CPU_TIME_H_

// CPU time, for the benches' "CPU seconds per GB moved" figures.

#include <sys/types.h>

namespace harrier {

// User + system CPU of every thread of this process so far (getrusage).
double ProcessCpuSeconds();

// User + system CPU of the calling thread so far.
double ThreadCpuSeconds();

// User + system CPU of every thread of process `pid` so far, read from
// /proc/PID/stat in clock ticks (10 ms), so meaningful over a whole run, not
// per call; -1 if it cannot be read (the process is gone).
double ProcessCpuSecondsOf(pid_t pid);

}  // namespace harrier

#endif  // HARRIER_COMMON_CPU_TIME_H_
