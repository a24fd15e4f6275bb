#include "server/hello_secrets.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/grpc_security.h"
#include "spdlog/spdlog.h"

namespace harrier {

namespace {

// getrandom(2), which blocks until the pool is ready and fails only on
// EINTR; /dev/urandom where the kernel has no getrandom (ENOSYS).
bool FillRandom(unsigned char* bytes, size_t size) {
  size_t filled = 0;
  while (filled < size) {
    const ssize_t n = getrandom(bytes + filled, size - filled, 0);
    if (n > 0) {
      filled += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;
    }
  }
  if (filled == size) return true;
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  while (filled < size) {
    const ssize_t n = read(fd, bytes + filled, size - filled);
    if (n > 0) {
      filled += static_cast<size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fd);
  return filled == size;
}

}  // namespace

std::string HelloSecrets::Issue() {
  if (!required_) return "";
  unsigned char bytes[32];
  if (!FillRandom(bytes, sizeof(bytes))) {
    // A guessable secret would let anyone who can reach the port in; no
    // secret at all would stop every client. Neither is a state to go on in.
    spdlog::critical("no random bytes for a hello secret: getrandom(2) and /dev/urandom failed");
    std::abort();
  }
  std::string secret = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
  absl::MutexLock lock(&mutex_);
  if (secrets_.size() >= kMaxOutstanding) secrets_.pop_front();
  secrets_.emplace_back(secret, absl::Now() + kLifetime);
  return secret;
}

bool HelloSecrets::Take(const std::string& secret) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mutex_);
  while (!secrets_.empty() && secrets_.front().second < now) secrets_.pop_front();
  // Every entry is compared, each in constant time, so the time taken does
  // not say how much of a guess matched.
  auto found = secrets_.end();
  for (auto it = secrets_.begin(); it != secrets_.end(); ++it) {
    if (ConstantTimeEquals(it->first, secret) && found == secrets_.end()) found = it;
  }
  if (found == secrets_.end()) return false;
  secrets_.erase(found);
  return true;
}

}  // namespace harrier
