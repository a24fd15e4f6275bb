#ifndef HARRIER_COMMON_GRPC_STATUS_H_
#define HARRIER_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace harrier {

// absl::Status and grpc::Status share their code numbering; these keep the
// code and message across the boundary.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace harrier

#endif  // HARRIER_COMMON_GRPC_STATUS_H_
