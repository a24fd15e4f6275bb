#include "server/pull_views.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "server/table.h"

namespace harrier {
namespace {

// PowerSGD factors the layer's own matrix, as the client does for pushes
// (worker/chunk_codec.cc): rows of shape[1] * shape[2] * ... elements. A
// 1-D tensor, or a chunk that is not whole rows, gets PowerSGD's
// uncompressed form (a column count that does not divide the chunk). The
// reply's codec_params stay the requested spec; the client decodes the
// shape from the payload header.
CodecSpec PullEncoderSpec(const CodecSpec& spec, const std::vector<uint64_t>& shape,
                          size_t num_elements) {
  if (spec.id != CodecId::kPowerSgd || spec.cols != 0) return spec;
  CodecSpec chunk_spec = spec;
  uint64_t row = 1;
  for (size_t i = 1; i < shape.size(); ++i) row *= shape[i];
  const bool whole_rows = shape.size() >= 2 && row > 0 && num_elements % row == 0;
  chunk_spec.cols = whole_rows ? row : static_cast<uint64_t>(num_elements) + 1;
  return chunk_spec;
}

// Codecs whose payload is a function of the input alone (no seed, no
// state carried between calls), so one encode serves every rank whose
// view and parameters are the same. Random codecs draw from the rank's
// seed, and PowerSGD warm-starts from each stream's last factor.
bool SharesReplies(const CodecSpec& spec) {
  switch (spec.id) {
    case CodecId::kFp16:
    case CodecId::kBf16:
    case CodecId::kTopK:
    case CodecId::kSign:
    case CodecId::kEfSign:
    case CodecId::kSignum:
    case CodecId::kOneBit:
      return true;
    case CodecId::kThreshold:
      return spec.fixed_tau;
    default:
      return false;
  }
}

// A view buffer and the budget bytes it holds, given back when the last
// rank lets go of it (the budget outlives the tables, and so their views).
struct CountedBuffer {
  std::vector<float> values;
  HeldBudgetBytes held;
};

// A copy of `n` floats at `data` as a view buffer, counted in the shard's
// parameter budget (null: not counted) while any rank holds it.
absl::StatusOr<std::shared_ptr<std::vector<float>>> CountedCopy(const PullViewEnvironment& env,
                                                                const PullViews::Chunk& chunk,
                                                                const float* data, size_t n) {
  auto buffer = std::make_shared<CountedBuffer>();
  if (absl::Status reserved = buffer->held.Resize(
          env.budget,
          [&chunk] {
            return absl::StrCat("compressed pull view of ", *chunk.key, " chunk ", chunk.chunk);
          },
          n * sizeof(float));
      !reserved.ok()) {
    return reserved;
  }
  buffer->values.assign(data, data + n);
  return std::shared_ptr<std::vector<float>>(buffer, &buffer->values);
}

}  // namespace

absl::StatusOr<PullViews::Values> PullViews::DenseView(const PullViewEnvironment& env,
                                                       const Chunk& chunk) {
  if (dense_ == nullptr || dense_version_ != chunk.values_version ||
      dense_->size() != chunk.num_elements) {
    // The old dense view is let go first: it is counted, and only ranks
    // still holding it keep it alive.
    dense_.reset();
    auto copy = CountedCopy(env, chunk, chunk.values, chunk.num_elements);
    if (!copy.ok()) return copy.status();
    dense_ = std::move(*copy);
    dense_version_ = chunk.values_version;
  }
  return dense_;
}

absl::Status PullViews::Compress(const PullViewEnvironment& env, const Chunk& chunk, uint32_t rank,
                                 const std::string& codec_params, uint64_t held_version,
                                 proto::TensorChunk* out, std::string* payload) {
  auto codec = env.codecs->Get(codec_params);
  if (!codec.ok()) return codec.status();
  const CodecSpec& spec = (*codec)->spec;
  const size_t n = chunk.num_elements;
  if (views_.empty()) views_.resize(env.num_workers);
  View& view = views_[rank];
  const bool holds_current = held_version != 0 && held_version == view.version &&
                             view.values != nullptr && view.values->size() == n;
  const bool holds_previous = held_version != 0 && held_version == view.previous_version &&
                              view.previous != nullptr && view.previous->size() == n;
  if (!holds_current && !holds_previous) {
    // The rank's first compressed pull, or a view this shard does not hold
    // (version 0, one from before a restart, garbage): dense, and the view
    // starts there. The old views are no base for anything the rank holds.
    if ((view.values != nullptr && view.values->size() == n) || held_version != 0) {
      env.counters->pull_view_resets++;
    }
    auto dense = DenseView(env, chunk);
    if (!dense.ok()) return dense.status();
    view.values = std::move(*dense);
    view.version = ++*env.last_version;
    view.previous_version = 0;
    view.previous.reset();
    payload->assign(reinterpret_cast<const char*>(view.values->data()), n * sizeof(float));
    out->set_codec(0);
    out->set_view_version(view.version);
    return absl::OkStatus();
  }
  // What the rank holds: the current view, or the previous one when it
  // lost the latest reply (re-made from there; that reply's view is
  // dropped, the previous one stays as it is).
  const Values base = holds_current ? view.values : view.previous;
  if (!holds_current) env.counters->pull_view_remakes++;
  const bool shares = SharesReplies(spec);
  Values next;
  if (shares && last_.next != nullptr && last_.base == base &&
      last_.values_version == chunk.values_version && last_.codec_params == codec_params) {
    *payload = last_.payload;
    next = last_.next;
    env.counters->pull_replies_shared++;
  } else {
    if (!view.encoder || view.encoder_params != codec_params) {
      auto encoder = CreateCodec(PullEncoderSpec(spec, *chunk.shape, n));
      if (!encoder.ok()) return absl::InvalidArgumentError(encoder.status().message());
      view.encoder = std::move(*encoder);
      view.encoder_params = codec_params;
    }
    // The next view's buffer first: refused by the budget, nothing has
    // changed, the encoder's state included.
    auto advanced = CountedCopy(env, chunk, base->data(), base->size());
    if (!advanced.ok()) return advanced.status();
    std::vector<float> delta(n);
    for (size_t i = 0; i < n; ++i) delta[i] = chunk.values[i] - (*base)[i];
    CodecContext context;
    context.seed = DeriveSeed(*chunk.key, chunk.chunk, out->clock(), rank, spec.seed);
    // Nothing changes if either step fails: the rank still holds `base`.
    if (auto status = view.encoder->Encode(delta, context, payload); !status.ok()) return status;
    // The view advances by what the rank will decode, so what the codec
    // drops stays in the next difference (error feedback on the shard's
    // side).
    if (auto status = view.encoder->DecodeAdd(*payload, 1.0f, absl::MakeSpan(**advanced));
        !status.ok()) {
      return status;
    }
    // What the encoder keeps for its next call is the rank's memory too.
    if (auto charged = view.encoder_held.Resize(
            env.budget,
            [&chunk, rank] {
              return absl::StrCat("pull encoder state of ", *chunk.key, " chunk ", chunk.chunk,
                                  " rank ", rank);
            },
            view.encoder->RetainedBytes());
        !charged.ok()) {
      view.encoder.reset();
      view.encoder_params.clear();
      view.encoder_held.Reset();
      return charged;
    }
    next = std::move(*advanced);
    if (shares) last_ = SharedReply{base, chunk.values_version, codec_params, *payload, next};
  }
  if (holds_current) {
    // The current view becomes the previous one: what the rank holds
    // until this reply arrives.
    view.previous = std::move(view.values);
    view.previous_version = view.version;
  }
  view.values = std::move(next);
  out->set_pull_view_version(held_version);  // the base: what the rank holds
  view.version = ++*env.last_version;
  out->set_codec(static_cast<uint32_t>(spec.id));
  out->set_codec_params(spec.ToString());
  out->set_view_version(view.version);
  return absl::OkStatus();
}

}  // namespace harrier
