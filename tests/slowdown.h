#ifndef HARRIER_TESTS_SLOWDOWN_H_
#define HARRIER_TESTS_SLOWDOWN_H_

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace harrier::testing {

// A bound on how soon something happens "at once", times
// HARRIER_TEST_SLOWDOWN (set by the sanitizer configs in .bazelrc: TSan runs
// this code several times slower, and CI runs it on 2 shared cores). The
// plain build keeps the tight bound, which is what tells a wake-up from a
// poll.
inline int SlowdownFactor() {
  const char* slowdown = std::getenv("HARRIER_TEST_SLOWDOWN");
  return slowdown != nullptr ? std::max(1, std::atoi(slowdown)) : 1;
}
inline std::chrono::milliseconds AtOnce(int ms) {
  return std::chrono::milliseconds(ms * SlowdownFactor());
}

}  // namespace harrier::testing

#endif  // HARRIER_TESTS_SLOWDOWN_H_
