#include "common/cpu_time.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace harrier {

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return t.tv_sec + 1e-6 * t.tv_usec; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double ThreadCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

double ProcessCpuSecondsOf(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // The command name in "(...)" may hold spaces: count fields after it.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return -1;
  // After ")": state is field 3, utime field 14, stime field 15.
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
  uint64_t user = 0;
  uint64_t system = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &user) ||
      !absl::SimpleAtoi(fields[12], &system)) {
    return -1;
  }
  return static_cast<double>(user + system) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace harrier
