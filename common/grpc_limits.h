#ifndef HARRIER_COMMON_GRPC_LIMITS_H_
#define HARRIER_COMMON_GRPC_LIMITS_H_

#include <cstddef>

#include <grpcpp/grpcpp.h>

namespace harrier {

// Chunks are at most 4 MiB of payload; messages carry a small header on top.
// The limit leaves room for a future larger chunk size without a wire change.
inline constexpr size_t kDefaultChunkBytes = 4u << 20;
inline constexpr int kMaxGrpcMessageBytes = 64 << 20;

// Channel and server settings measured to help bulk transfers on loopback
// (see ../shared/BUILDING.md): no BDP probing, a large HTTP/2 window.
grpc::ChannelArguments MakeChannelArguments();
void ApplyServerTuning(grpc::ServerBuilder& builder);

}  // namespace harrier

#endif  // HARRIER_COMMON_GRPC_LIMITS_H_
