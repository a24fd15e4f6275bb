#include "server/hello_secrets.h"

#include <sys/random.h>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/grpc_security.h"

namespace harrier {

std::string HelloSecrets::Issue() {
  if (!required_) return "";
  unsigned char bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    // getrandom(2) blocks until the pool is ready and fails only on EINTR.
    if (n > 0) filled += static_cast<size_t>(n);
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
