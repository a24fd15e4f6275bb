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
inline std::chrono::milliseconds AtOnce(int ms) {
  const char* slowdown = std::getenv("HARRIER_TEST_SLOWDOWN");
  const int factor = slowdown != nullptr ? std::max(1, std::atoi(slowdown)) : 1;
  return std::chrono::milliseconds(ms * factor);
}

}  // namespace harrier::testing

#endif  // HARRIER_TESTS_SLOWDOWN_H_
