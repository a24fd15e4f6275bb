#include "common/grpc_security.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace harrier {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, "=", path, ": cannot read the file"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat(flag, "=", path, ": read error"));
  return contents.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  auto pem = ReadWholeFile(path, flag);
  if (!pem.ok()) return pem.status();
  // gRPC would only report "handshake failed" much later, for every call.
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": not a PEM file"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<std::string> ReadJobTokenFile(const std::string& path) {
  constexpr absl::string_view kFlag = "--auth_token_file";
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat(kFlag, "=", path, ": cannot read the file"));
  }
  if ((info.st_mode & S_IROTH) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFlag, "=", path,
                     ": the token file is readable by every user (chmod o-r, e.g. 0600 or 0440)"));
  }
  auto token = ReadWholeFile(path, kFlag);
  if (!token.ok()) return token.status();
  while (!token->empty() && (token->back() == '\n' || token->back() == '\r')) token->pop_back();
  if (token->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kFlag, "=", path, ": the token file is empty"));
  }
  // gRPC refuses to send metadata values outside printable ASCII; find out
  // here rather than as a failure of every call.
  for (const char c : *token) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFlag, "=", path, ": the token must be printable ASCII on one line"));
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "a TLS server needs both --tls_cert and --tls_key (--tls_ca adds client certificates)");
  }
  auto cert = ReadPem(files.cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(files.key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!files.ca.empty()) {
    auto ca = ReadPem(files.ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  // Without a CA gRPC would trust the system's roots: a job's shards carry
  // certificates of the job's own CA, so asking for it avoids trusting any
  // public CA by accident.
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS on a worker needs --tls_ca (the CA of the shards' certificates); --tls_cert and "
        "--tls_key add a client certificate");
  }
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs both --tls_cert and --tls_key");
  }
  grpc::SslCredentialsOptions options;
  auto ca = ReadPem(files.ca, "--tls_ca");
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *ca;
  if (!files.cert.empty()) {
    auto cert = ReadPem(files.cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(files.key, "--tls_key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  // volatile: the compiler may not stop at the first difference.
  volatile unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = difference | (static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]));
  }
  return difference == 0;
}

}  // namespace harrier
