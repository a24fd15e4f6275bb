#include "common/process.h"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace harrier {

void TuneMallocForLargeBuffers() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Per-thread arenas are unmapped whenever they empty, whatever the trim
  // threshold says, so a server thread receiving a large push faults its
  // buffers in again each time. One arena keeps them; on a few cores the
  // extra lock contention costs less.
  mallopt(M_ARENA_MAX, 1);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  const bool written = std::fwrite(contents.data(), 1, contents.size(), file) == contents.size();
  const bool flushed = std::fflush(file) == 0 && fsync(fileno(file)) == 0;
  std::fclose(file);
  if (!written || !flushed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void InitLogging(const std::string& program) {
  auto logger = spdlog::stderr_logger_mt(program);
  logger->set_pattern("[%H:%M:%S.%e] [%n] %l %v");
  spdlog::set_default_logger(logger);
}

}  // namespace harrier
