#ifndef HARRIER_COMMON_GRPC_LIMITS_H_
#define HARRIER_COMMON_GRPC_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include <grpcpp/grpcpp.h>

namespace harrier {

// Chunks are at most 4 MiB of payload; messages carry a small header on top.
// The limit leaves room for a future larger chunk size without a wire change.
inline constexpr size_t kDefaultChunkBytes = 4u << 20;
inline constexpr int kMaxGrpcMessageBytes = 64 << 20;

// AdminService.Probe's bound on its payload (64 MiB). Here, not in
// server/, because the prober (bench/advise) must send within it and may
// not include server/.
inline constexpr uint64_t kMaxProbeBytes = 64u << 20;
// AdminService.Probe's bound on reply_bytes (8 MiB): a few bytes of request
// must not make the shard build and hold a large reply (a client that does
// not read would pin it); larger transfers are measured with payloads,
// which the prober sends itself.
inline constexpr uint64_t kMaxProbeReplyBytes = 8u << 20;
// What a Probe message carries on top of its bytes (field tags, lengths):
// the shard's gRPC message limit leaves this room above kMaxProbeBytes so
// that a probe at the bound goes through and one just over it reaches the
// handler's INVALID_ARGUMENT instead of gRPC's RESOURCE_EXHAUSTED.
inline constexpr int kProbeEnvelopeBytes = 4096;

// Channel and server settings measured to help bulk transfers on loopback
// (harrier-bench transport): no BDP probing, a large HTTP/2 window.
grpc::ChannelArguments MakeChannelArguments();
void ApplyServerTuning(grpc::ServerBuilder& builder);

}  // namespace harrier

#endif  // HARRIER_COMMON_GRPC_LIMITS_H_
