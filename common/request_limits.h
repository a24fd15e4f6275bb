#ifndef HARRIER_COMMON_REQUEST_LIMITS_H_
#define HARRIER_COMMON_REQUEST_LIMITS_H_

// The size limits on every string and repeated field a client sends a shard
// (proto/harrier.proto), in one place. A shard checks each request against
// them before it allocates or keeps anything for it, so what a call can
// make the shard hold does not grow with what the caller chooses to send;
// the bulk bytes (payloads, initial values, probes) have their own bounds
// (--max_request_bytes and friends, --max_chunk_bytes, kMaxProbeBytes).
//
// A string or list over its limit is refused with INVALID_ARGUMENT (a list
// that is a budget, chunks per call and pending barriers, with
// RESOURCE_EXHAUSTED), in a message that names the request, the field, its
// size and the limit ("limit of N"; a push's chunk count says "more than
// 256 chunks in one call", as it always has), and quotes at most the first
// kMaxLoggedStringBytes of the string. Each limit is far above what a
// worker sends; they are constants, not flags, because no job needs more.
//
// Also here: the one way a shard writes a client's string into its log
// (TruncatedForLog).

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/harrier.pb.h"

namespace harrier {

// Tensor (table) names: InitRequest.key, TensorChunk.key, ChunkRef.key,
// ChunkClock.key.
inline constexpr size_t kMaxTensorNameBytes = 1024;
// Dimensions of InitRequest.shape; each must be at least 1, and the shape's
// product (taken without overflow) at least the chunk's num_elements.
inline constexpr size_t kMaxShapeRank = 32;
// The job name every request carries (and --job on the server).
inline constexpr size_t kMaxJobNameBytes = 256;
// RegisterRequest.worker_name.
inline constexpr size_t kMaxWorkerNameBytes = 256;
// BarrierRequest.name.
inline constexpr size_t kMaxBarrierNameBytes = 256;
// Distinct barrier names shard 0 keeps at once (each with waiting ranks, or
// completed and idle, the idle ones dropped first to make room). One more
// name, while every kept one has a rank waiting, is refused.
inline constexpr size_t kMaxPendingBarriers = 256;
// Codec spec strings: TensorChunk.codec_params and pull_codec_params,
// ChunkRef.codec_params. The longest spec a worker makes is under 128.
inline constexpr size_t kMaxCodecSpecBytes = 256;
// Chunks in one Push, PushPull or Pull call (ChunkRefs of a PullRequest).
inline constexpr size_t kMaxChunksPerCall = 256;
// Session.credential (an HMAC-SHA256: 32 bytes).
inline constexpr size_t kMaxCredentialBytes = 64;
// TransportAddressRequest.transport ("ucx").
inline constexpr size_t kMaxTransportNameBytes = 64;
// ShutdownRequest.reason.
inline constexpr size_t kMaxShutdownReasonBytes = 1024;
// HeartbeatRequest.pushed names at most the chunks the shard may hold
// (--max_chunks): passed in, not a constant.

// A client's string as the shard logs it or quotes it in a refusal: at most
// this many bytes of it, then "...(N bytes)" with its whole length.
inline constexpr size_t kMaxLoggedStringBytes = 128;

// `text` cut to kMaxLoggedStringBytes with a "...(N bytes)" suffix when
// longer, and bytes that are not printable ASCII escaped (\n, \xNN), so a
// client's string can neither flood the log nor forge a line of it.
std::string TruncatedForLog(absl::string_view text);

// INVALID_ARGUMENT "<what>: <field> '<value, cut short>' is <n> bytes,
// over the limit of <limit> bytes" when `value` is longer than `limit`.
absl::Status CheckLength(absl::string_view what, absl::string_view field, absl::string_view value,
                         size_t limit);

// RESOURCE_EXHAUSTED "more than 256 chunks in one call" once a push or
// push-pull holds more than kMaxChunksPerCall chunks (transports ask as
// chunks arrive).
absl::Status CheckChunkCount(size_t chunks);

// The shape rule of InitRequest: at most kMaxShapeRank dimensions, each at
// least 1, their product (without overflow) at least `num_elements`.
absl::Status CheckShape(absl::string_view what, const uint64_t* dims, size_t rank,
                        uint64_t num_elements);

// Every string and list of one request against its limit. `what` names
// the request in the message ("push", "pull", ...).
absl::Status CheckSessionLimits(absl::string_view what, const proto::Session& session);
absl::Status CheckInitLimits(const proto::InitRequest& request);
absl::Status CheckChunkLimits(absl::string_view what, const proto::TensorChunk& chunk);
// A pull also may not name one chunk twice (INVALID_ARGUMENT).
absl::Status CheckPullLimits(const proto::PullRequest& request);
// `max_chunk_clocks`: the chunks the shard may hold (--max_chunks).
absl::Status CheckHeartbeatLimits(const proto::HeartbeatRequest& request,
                                  size_t max_chunk_clocks);
absl::Status CheckLeaveLimits(const proto::LeaveRequest& request);
absl::Status CheckRegisterLimits(const proto::RegisterRequest& request);
absl::Status CheckBarrierLimits(const proto::BarrierRequest& request);
absl::Status CheckTransportAddressLimits(const proto::TransportAddressRequest& request);
absl::Status CheckShutdownLimits(const proto::ShutdownRequest& request);

}  // namespace harrier

#endif  // HARRIER_COMMON_REQUEST_LIMITS_H_
