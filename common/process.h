#ifndef HARRIER_COMMON_PROCESS_H_
#define HARRIER_COMMON_PROCESS_H_

#include <string>

#include "absl/status/status.h"

namespace harrier {

// Keeps large message buffers mapped between uses. With glibc's defaults
// gRPC's multi-megabyte buffers go back to the kernel after each message and
// are faulted in again, which costs more CPU than the copies themselves.
// Call once at process start, before threads exist.
void TuneMallocForLargeBuffers();

// Turns off absl::Mutex's lock-order (deadlock) detection, which Debian's
// Abseil (built without NDEBUG) runs on every lock: a few per cent of a
// shard's or worker's CPU on the data path. For the binaries; the tests
// keep the detection on, so a lock-order cycle still fails them. Call once
// at process start, before threads exist.
void SkipMutexDeadlockDetection();

// Writes `contents` to `path` atomically (temporary file, then rename), so a
// reader polling for the file never sees it half-written.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// OK when a TCP listener could bind `host`:`port` now (it binds and closes
// a socket); UNAVAILABLE naming the reason (in use, not an address of this
// host) otherwise. For start-up checks that must fail before a process
// takes resources elsewhere (a worker's rank): the port may still be taken
// between the check and the real bind.
absl::Status CheckTcpPortFree(const std::string& host, int port);

// Sets up the process-wide spdlog default logger: stderr, one line per event,
// "[program] level message". Call once from main(), never from a library.
void InitLogging(const std::string& program);

}  // namespace harrier

#endif  // HARRIER_COMMON_PROCESS_H_
