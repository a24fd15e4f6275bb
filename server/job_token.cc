#include "server/job_token.h"

#include "common/grpc_security.h"

namespace harrier {

grpc::Status JobTokenCheck::Check(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const std::string key(kJobTokenMetadataKey);
  // A call with several token entries is refused unless the first matches;
  // clients built here send one.
  const auto found = metadata.find(key);
  if (found != metadata.end() &&
      ConstantTimeEquals(absl::string_view(found->second.data(), found->second.size()), token_)) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(kJobTokenRefusal));
}

}  // namespace harrier
