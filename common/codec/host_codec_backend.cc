#include "common/codec/host_codec_backend.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/codec/error_feedback.h"
#include "common/crc32c.h"

namespace harrier {
namespace {

class HostPushStream : public PushStream {
 public:
  HostPushStream(std::unique_ptr<Codec> codec, const CodecSpec& spec, size_t n)
      : codec_(std::move(codec)), n_(n) {
    switch (PushStateFor(spec)) {
      case PushState::kMomentum:
        momentum_ = std::make_unique<DgcMomentumCorrection>(n, static_cast<float>(spec.momentum));
        break;
      case PushState::kErrorFeedback:
        error_feedback_ = std::make_unique<ErrorFeedback>(n);
        break;
      case PushState::kNone:
        break;
    }
  }

  absl::Status Encode(const float* values, size_t n, const CodecContext& ctx,
                      std::string* payload) override {
    payload->clear();
    if (n != n_) {
      return absl::InvalidArgumentError(
          absl::StrCat("push stream of ", n_, " elements given ", n));
    }
    const absl::Span<const float> input(values, n);
    if (momentum_ != nullptr) return momentum_->Compress(*codec_, input, ctx, payload);
    if (error_feedback_ != nullptr) return error_feedback_->Compress(*codec_, input, ctx, payload);
    return codec_->Encode(input, ctx, payload);
  }

 private:
  const std::unique_ptr<Codec> codec_;
  const size_t n_;
  std::unique_ptr<ErrorFeedback> error_feedback_;
  std::unique_ptr<DgcMomentumCorrection> momentum_;
};

class HostPullMirror : public PullMirror {
 public:
  HostPullMirror(std::unique_ptr<Codec> decoder, size_t n) : decoder_(std::move(decoder)), n_(n) {}

  bool empty() const override { return values_.empty(); }

  absl::Status SetDense(const PayloadView& payload, float* out) override {
    if (payload.size() != n_ * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("dense reply of ", payload.size(),
                                                     " bytes for a mirror of ", n_, " floats"));
    }
    payload.CopyTo(out);
    values_.assign(out, out + n_);
    return absl::OkStatus();
  }

  absl::Status SetDenseFrom(const float* values, float* out) override {
    values_.assign(values, values + n_);
    if (out != values && n_ > 0) std::memcpy(out, values, n_ * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status AddCompressed(absl::string_view payload, float* out) override {
    if (values_.empty()) {
      return absl::FailedPreconditionError("compressed reply before the first dense one");
    }
    if (auto status = decoder_->DecodeAdd(payload, 1.0f, absl::MakeSpan(values_)); !status.ok()) {
      return status;
    }
    std::memcpy(out, values_.data(), n_ * sizeof(float));
    return absl::OkStatus();
  }

 private:
  const std::unique_ptr<Codec> decoder_;
  const size_t n_;
  std::vector<float> values_;
};

class HostBuffer : public BackendBuffer {
 public:
  explicit HostBuffer(size_t n) : values_(n) {}
  float* data() override { return values_.data(); }
  size_t size() const override { return values_.size(); }

 private:
  std::vector<float> values_;
};

class HostCodecBackend : public CodecBackend {
 public:
  MemoryKind memory() const override { return MemoryKind::kHost; }
  std::string name() const override { return "cpu"; }

  absl::StatusOr<std::unique_ptr<PushStream>> NewPushStream(const CodecSpec& spec,
                                                            size_t n) override {
    auto codec = CreateCodec(spec);
    if (!codec.ok()) return codec.status();
    return std::unique_ptr<PushStream>(new HostPushStream(std::move(*codec), spec, n));
  }

  absl::StatusOr<std::unique_ptr<PullMirror>> NewPullMirror(const CodecSpec& spec,
                                                            size_t n) override {
    auto codec = CreateCodec(spec);
    if (!codec.ok()) return codec.status();
    return std::unique_ptr<PullMirror>(new HostPullMirror(std::move(*codec), n));
  }

  absl::Status CopyToHost(const float* values, size_t n, float* host) override {
    if (n > 0) std::memcpy(host, values, n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status CopyFromHost(const PayloadView& host, float* values) override {
    host.CopyTo(values);
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> Crc32c(const void* data, size_t bytes) override {
    return ::harrier::Crc32c(data, bytes);
  }

  absl::StatusOr<std::unique_ptr<BackendBuffer>> NewBuffer(size_t n) override {
    return std::unique_ptr<BackendBuffer>(new HostBuffer(n));
  }

  absl::Status CopyWithin(const float* from, size_t n, float* to) override {
    if (n > 0 && from != to) std::memmove(to, from, n * sizeof(float));
    return absl::OkStatus();
  }
};

}  // namespace

std::shared_ptr<CodecBackend> NewHostCodecBackend() { return std::make_shared<HostCodecBackend>(); }

}  // namespace harrier
