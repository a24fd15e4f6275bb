#ifndef HARRIER_COMMON_GRPC_SECURITY_H_
#define HARRIER_COMMON_GRPC_SECURITY_H_

// Transport security shared by servers and workers: TLS credentials from
// PEM files (--tls_cert, --tls_key, --tls_ca) and the job token
// (--auth_token_file) that every call carries as metadata. Both sides build
// their gRPC credentials here so that what "configured" means is decided in
// one place. Stateless functions; thread-safe.

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace harrier {

// Paths of PEM files; empty = not given.
struct TlsFiles {
  std::string cert;  // this side's certificate chain
  std::string key;   // its private key
  std::string ca;    // CA certificates the peer's certificate must chain to

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The metadata key of the job token on every call.
inline constexpr absl::string_view kJobTokenMetadataKey = "harrier-job-token";

// The message of every call refused for its token, on every service.
inline constexpr absl::string_view kJobTokenRefusal =
    "missing or wrong job token (--auth_token_file)";

// Reads a token file: trailing CR/LF stripped. INVALID_ARGUMENT naming the
// file if it is empty (after stripping), readable by others (mode o+r: a
// token every local user can read authenticates nobody), or holds
// characters gRPC metadata cannot carry; NOT_FOUND if unreadable.
absl::StatusOr<std::string> ReadJobTokenFile(const std::string& path);

// Server side. Without TLS files: plaintext (grpc::InsecureServerCredentials).
// cert + key: TLS; cert + key + ca: mutual TLS, a client certificate signed
// by the CA is required. INVALID_ARGUMENT for other combinations or
// unreadable files, naming the flag.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

// Client side. Nothing: plaintext. ca alone: TLS, the server's certificate
// must chain to the CA and name the host dialled. ca + cert + key: the
// same, and this client presents its certificate (mutual TLS).
// INVALID_ARGUMENT for other combinations or unreadable files.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files);

// Equal contents, in time that depends on the lengths only, so a client
// cannot find the token byte by byte from response times.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace harrier

#endif  // HARRIER_COMMON_GRPC_SECURITY_H_
