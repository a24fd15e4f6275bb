#include "common/request_limits.h"

#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace harrier {

std::string TruncatedForLog(absl::string_view text) {
  const bool cut = text.size() > kMaxLoggedStringBytes;
  std::string out = absl::CHexEscape(cut ? text.substr(0, kMaxLoggedStringBytes) : text);
  if (cut) absl::StrAppend(&out, "...(", text.size(), " bytes)");
  return out;
}

absl::Status CheckLength(absl::string_view what, absl::string_view field, absl::string_view value,
                         size_t limit) {
  if (value.size() <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", field, " '", TruncatedForLog(value),
                                                 "' is ", value.size(),
                                                 " bytes, over the limit of ", limit, " bytes"));
}

absl::Status CheckChunkCount(size_t chunks) {
  if (chunks <= kMaxChunksPerCall) return absl::OkStatus();
  // Said so since before the limits had a header; clients match it.
  return absl::ResourceExhaustedError(
      absl::StrCat("more than ", kMaxChunksPerCall, " chunks in one call"));
}

namespace {

absl::Status CheckJob(absl::string_view what, const std::string& job) {
  return CheckLength(what, "job", job, kMaxJobNameBytes);
}

absl::Status CheckTensorName(absl::string_view what, const std::string& key) {
  return CheckLength(what, "key", key, kMaxTensorNameBytes);
}

}  // namespace

absl::Status CheckShape(absl::string_view what, const uint64_t* dims, size_t rank,
                        uint64_t num_elements) {
  if (rank > kMaxShapeRank) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape of ", rank,
                                                   " dimensions, over the limit of ", kMaxShapeRank,
                                                   " dimensions"));
  }
  // A chunk holds part of its tensor: never more elements than the shape
  // has (a shape of [] is a scalar).
  uint64_t elements = 1;
  for (size_t i = 0; i < rank; ++i) {
    if (dims[i] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape dimension ", i, " is 0 (each dimension must be at least 1)"));
    }
    if (elements > std::numeric_limits<uint64_t>::max() / dims[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the shape's element count overflows 64 bits"));
    }
    elements *= dims[i];
  }
  if (num_elements > elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", num_elements, " elements do not fit the shape's ", elements));
  }
  return absl::OkStatus();
}

absl::Status CheckSessionLimits(absl::string_view what, const proto::Session& session) {
  return CheckLength(what, "session credential", session.credential(), kMaxCredentialBytes);
}

absl::Status CheckInitLimits(const proto::InitRequest& request) {
  constexpr absl::string_view kWhat = "init";
  if (auto status = CheckJob(kWhat, request.job()); !status.ok()) return status;
  if (auto status = CheckTensorName(kWhat, request.key()); !status.ok()) return status;
  if (auto status = CheckSessionLimits(kWhat, request.session()); !status.ok()) return status;
  return CheckShape(absl::StrCat(kWhat, " '", request.key(), "' chunk ", request.chunk()),
                    request.shape().data(), static_cast<size_t>(request.shape_size()),
                    request.num_elements());
}

absl::Status CheckChunkLimits(absl::string_view what, const proto::TensorChunk& chunk) {
  if (auto status = CheckJob(what, chunk.job()); !status.ok()) return status;
  if (auto status = CheckTensorName(what, chunk.key()); !status.ok()) return status;
  if (auto status = CheckLength(what, "codec_params", chunk.codec_params(), kMaxCodecSpecBytes);
      !status.ok()) {
    return status;
  }
  if (auto status =
          CheckLength(what, "pull_codec_params", chunk.pull_codec_params(), kMaxCodecSpecBytes);
      !status.ok()) {
    return status;
  }
  return CheckSessionLimits(what, chunk.session());
}

absl::Status CheckPullLimits(const proto::PullRequest& request) {
  constexpr absl::string_view kWhat = "pull";
  if (static_cast<size_t>(request.chunks_size()) > kMaxChunksPerCall) {
    return absl::ResourceExhaustedError(absl::StrCat(kWhat, ": ", request.chunks_size(),
                                                     " chunks in one call, over the limit of ",
                                                     kMaxChunksPerCall, " chunks per call"));
  }
  if (auto status = CheckJob(kWhat, request.job()); !status.ok()) return status;
  if (auto status = CheckSessionLimits(kWhat, request.session()); !status.ok()) return status;
  for (const proto::ChunkRef& ref : request.chunks()) {
    if (auto status = CheckTensorName(kWhat, ref.key()); !status.ok()) return status;
    if (auto status = CheckLength(kWhat, "codec_params", ref.codec_params(), kMaxCodecSpecBytes);
        !status.ok()) {
      return status;
    }
  }
  // A chunk named twice would be read, compressed and sent twice for one
  // call: no client asks for that, and a compressed pull of one chunk named
  // 256 times made the shard encode it 256 times.
  if (request.chunks_size() > 1) {
    absl::flat_hash_set<std::pair<absl::string_view, uint32_t>> named;
    named.reserve(static_cast<size_t>(request.chunks_size()));
    for (const proto::ChunkRef& ref : request.chunks()) {
      if (!named.emplace(ref.key(), ref.chunk()).second) {
        return absl::InvalidArgumentError(absl::StrCat(kWhat, ": chunk ", ref.chunk(), " of '",
                                                       TruncatedForLog(ref.key()),
                                                       "' is named twice in one call"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHeartbeatLimits(const proto::HeartbeatRequest& request, size_t max_chunk_clocks) {
  constexpr absl::string_view kWhat = "heartbeat";
  if (auto status = CheckJob(kWhat, request.job()); !status.ok()) return status;
  if (auto status = CheckSessionLimits(kWhat, request.session()); !status.ok()) return status;
  if (static_cast<size_t>(request.pushed_size()) > max_chunk_clocks) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": ", request.pushed_size(), " pushed chunks named, over the limit of ",
                     max_chunk_clocks, " (the chunks this shard may hold, --max_chunks)"));
  }
  for (const proto::ChunkClock& pushed : request.pushed()) {
    if (auto status = CheckTensorName(kWhat, pushed.key()); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status CheckLeaveLimits(const proto::LeaveRequest& request) {
  constexpr absl::string_view kWhat = "leave";
  if (auto status = CheckJob(kWhat, request.job()); !status.ok()) return status;
  return CheckSessionLimits(kWhat, request.session());
}

absl::Status CheckRegisterLimits(const proto::RegisterRequest& request) {
  constexpr absl::string_view kWhat = "register";
  if (auto status = CheckJob(kWhat, request.job()); !status.ok()) return status;
  if (auto status = CheckLength(kWhat, "worker_name", request.worker_name(), kMaxWorkerNameBytes);
      !status.ok()) {
    return status;
  }
  return CheckSessionLimits(kWhat, request.previous_session());
}

absl::Status CheckBarrierLimits(const proto::BarrierRequest& request) {
  constexpr absl::string_view kWhat = "barrier";
  if (auto status = CheckJob(kWhat, request.job()); !status.ok()) return status;
  if (auto status = CheckLength(kWhat, "name", request.name(), kMaxBarrierNameBytes);
      !status.ok()) {
    return status;
  }
  return CheckSessionLimits(kWhat, request.session());
}

absl::Status CheckTransportAddressLimits(const proto::TransportAddressRequest& request) {
  return CheckLength("transport address", "transport", request.transport(), kMaxTransportNameBytes);
}

absl::Status CheckShutdownLimits(const proto::ShutdownRequest& request) {
  return CheckLength("shutdown", "reason", request.reason(), kMaxShutdownReasonBytes);
}

}  // namespace harrier
