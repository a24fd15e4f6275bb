#include "bench/allreduce/gloo_ring.h"

#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace harrier::allreduce {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo throws IoException both for a peer that went away and for a wait
// that ran out of time; only its message says which ("Timed out ...",
// "Wait timeout for key(s) ...").
absl::Status FromGloo(const std::exception& e, const std::string& what) {
  const std::string message = e.what();
  const std::string lower = absl::AsciiStrToLower(message);
  if (lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": ", message));
  }
  if (message.find("File already exists") != std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the rendezvous directory holds an earlier run's keys (give each run a fresh one): ",
        message));
  }
  if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) {
    return absl::UnavailableError(absl::StrCat(what, ": ", message));
  }
  return absl::InternalError(absl::StrCat(what, ": ", message));
}

void SumFloats(void* out, const void* a, const void* b, size_t n) {
  float* o = static_cast<float*>(out);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

}  // namespace

GlooRing::GlooRing(GlooRingOptions options, std::shared_ptr<gloo::Context> context)
    : options_(std::move(options)), context_(std::move(context)) {}

GlooRing::~GlooRing() = default;

absl::StatusOr<std::unique_ptr<GlooRing>> GlooRing::Connect(const GlooRingOptions& options) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in a world of ", options.world));
  }
  if (options.rendezvous_dir.empty()) {
    return absl::InvalidArgumentError("a rendezvous directory is required");
  }
  const std::string who = absl::StrCat("rank ", options.rank, " of ", options.world, " at ",
                                       options.address, " via ", options.rendezvous_dir);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.address;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world);
    // Set before connecting: the mesh's store waits and pair connections use it.
    context->setTimeout(ToChrono(options.timeout));
    gloo::rendezvous::FileStore store(options.rendezvous_dir);
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooRing>(new GlooRing(options, std::move(context)));
  } catch (const std::exception& e) {
    return FromGloo(e, absl::StrCat("gloo rendezvous of ", who));
  }
}

absl::Status GlooRing::AllreduceSum(float* data, size_t count, uint32_t tag) {
  if (options_.world == 1 || count == 0) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setOutput(data, count);
    opts.setReduceFunction(&SumFloats);
    opts.setTag(tag);
    opts.setTimeout(ToChrono(options_.timeout));
    gloo::allreduce(opts);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return FromGloo(e, absl::StrCat("ring all-reduce of ", count, " floats (tag ", tag,
                                    ") on rank ", options_.rank, " of ", options_.world));
  }
}

int64_t RingBytesPerRank(int64_t bytes, int world) {
  if (world <= 1) return 0;
  return 2 * (world - 1) * bytes / world;
}

}  // namespace harrier::allreduce
