#ifndef HARRIER_SERVER_JOB_TOKEN_H_
#define HARRIER_SERVER_JOB_TOKEN_H_

#include <string>

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

namespace harrier {

// The job token check every handler of every Harrier service runs first,
// before it reads or changes anything, so a refused call changes nothing.
// It lives in the handlers because gRPC 1.51 offers no server-side hook
// that can refuse a call on plaintext channels (an AuthMetadataProcessor
// needs TLS credentials; interceptors cannot fail a call). The health
// service (gRPC's own) is not checked: probes carry no token.
// Immutable after construction; thread-safe.
class JobTokenCheck {
 public:
  // An empty token: every call passes (the shard runs without a token).
  explicit JobTokenCheck(std::string token = "") : token_(std::move(token)) {}

  // OK, or UNAUTHENTICATED "missing or wrong job token (--auth_token_file)".
  grpc::Status Check(const grpc::ServerContextBase& context) const;

 private:
  const std::string token_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_JOB_TOKEN_H_
