#ifndef HARRIER_SERVER_HELLO_SECRETS_H_
#define HARRIER_SERVER_HELLO_SECRETS_H_

#include <cstddef>
#include <deque>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace harrier {

// The one-time secrets a listener without authentication of its own (UCX,
// tcp) asks of a client's hello: handed out with the listener's address by
// GetTransportAddress over the authenticated gRPC channel, so only a
// client that passed its checks gets a connection served. Thread-safe.
class HelloSecrets {
 public:
  static constexpr absl::Duration kLifetime = absl::Seconds(120);
  static constexpr size_t kMaxOutstanding = 4096;

  // `required` false: Issue hands out nothing and the listener takes any
  // hello.
  explicit HelloSecrets(bool required) : required_(required) {}

  bool required() const { return required_; }
  // With `required`: a fresh random secret (64 hex digits) that one hello
  // may use within kLifetime; at most kMaxOutstanding are outstanding, the
  // oldest goes first. Without: empty.
  std::string Issue();
  // Consumes `secret` if it was issued and has not expired.
  bool Take(const std::string& secret);

 private:
  const bool required_;
  absl::Mutex mutex_;
  // Issued secrets and when each expires, oldest first.
  std::deque<std::pair<std::string, absl::Time>> secrets_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_SERVER_HELLO_SECRETS_H_
