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

// The largest HTTP/2 DATA frame (2^24 - 1 bytes) that each side advertises
// to the other, instead of HTTP/2's default of 16 KiB: a chunk travels in one
// frame rather than hundreds.
inline constexpr int kMaxHttp2FrameBytes = (1 << 24) - 1;

// Channel and server settings measured to help bulk transfers: no BDP
// probing and a large HTTP/2 window (harrier-bench transport, loopback), and
// kMaxHttp2FrameBytes (harrier-bench overlap, 4 workers and 4 shards at
// 1 Gbit/s: steps 4-10 % shorter, CPU per GB lower; docs/performance.md,
// "The parameter server at its cost model").
grpc::ChannelArguments MakeChannelArguments();
void ApplyServerTuning(grpc::ServerBuilder& builder);

}  // namespace harrier

#endif  // HARRIER_COMMON_GRPC_LIMITS_H_
