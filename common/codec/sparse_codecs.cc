// Sparse codecs: top-k, random-k and threshold (DGC).
//
// top-k and threshold bodies: k uint32 indices, strictly increasing, then the
// k fp32 values (8k bytes; header param0 = k). Decoders refuse unsorted or
// repeated indices so that scatter-add touches each element at most once.
//
// random-k body: the uint64 seed the indices were drawn from, then k fp32
// values (8 + 4k bytes); the decoder redraws the same indices, so only 4k
// bytes scale with k.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <emmintrin.h>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {

size_t KFromRatio(double ratio, size_t d) {
  if (d == 0) return 0;
  double k = std::llround(ratio * static_cast<double>(d));
  return std::min<size_t>(d, std::max<size_t>(1, static_cast<size_t>(k)));
}

absl::StatusOr<size_t> CheckSparseK(CodecId id, const PayloadHeader& header,
                                    size_t d) {
  const size_t k = header.param0;
  if (header.param1 != 0) return Invalid(id, "header param1 must be 0");
  if (k > d) {
    return Invalid(id, absl::StrCat("k = ", k, " exceeds element count ", d));
  }
  if (id != CodecId::kThreshold && d > 0 && k == 0) {
    return Invalid(id, "k = 0 for a non-empty tensor");
  }
  return k;
}

absl::Status CheckIndexValueBody(CodecId id, absl::string_view body, size_t k,
                                 size_t d) {
  const char* idx = body.data();
  const char* val = idx + 4 * k;
  uint64_t prev = 0;
  for (size_t j = 0; j < k; ++j) {
    uint32_t i = Load<uint32_t>(idx + 4 * j);
    if (i >= d) {
      return Invalid(id, absl::StrCat("index ", i, " at position ", j,
                                      " out of range [0, ", d, ")"));
    }
    if (j > 0 && i <= prev) {
      return Invalid(id, absl::StrCat("index ", i, " at position ", j,
                                      " repeated or not increasing (previous ",
                                      prev, ")"));
    }
    prev = i;
    float v = Load<float>(val + 4 * j);
    if (!std::isfinite(v)) {
      return Invalid(id, absl::StrCat("value at position ", j, " (index ", i,
                                      ") is ", v));
    }
  }
  return absl::OkStatus();
}

void RandomKIndices(uint64_t seed, size_t d, size_t k,
                    std::vector<uint64_t>* bitmap,
                    std::vector<uint32_t>* indices) {
  indices->clear();
  indices->reserve(k);
  if (k == d) {
    for (size_t i = 0; i < d; ++i) indices->push_back(static_cast<uint32_t>(i));
    return;
  }
  bitmap->assign((d + 63) / 64, 0);
  uint64_t* bits = bitmap->data();
  Rng rng(seed);
  for (size_t j = d - k; j < d; ++j) {
    uint64_t t = rng.Below(j + 1);
    if (bits[t / 64] >> (t % 64) & 1) t = j;
    bits[t / 64] |= uint64_t{1} << (t % 64);
  }
  for (size_t w = 0; w < bitmap->size(); ++w) {
    uint64_t word = bits[w];
    while (word != 0) {
      indices->push_back(static_cast<uint32_t>(w * 64 + __builtin_ctzll(word)));
      word &= word - 1;
    }
  }
}

namespace {

// Heap bytes a reused scratch vector keeps between calls.
template <typename T>
uint64_t Capacity(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

constexpr size_t kMaxSparseElements = std::numeric_limits<uint32_t>::max();

absl::Status CheckSparseSize(CodecId id, size_t d) {
  if (d > kMaxSparseElements) {
    return Invalid(id, absl::StrCat("tensor of ", d,
                                    " elements exceeds 32-bit indices"));
  }
  return absl::OkStatus();
}

// Writes the index/value body for sorted indices.
void WriteIndexValueBody(CodecId id, absl::Span<const float> input,
                         const std::vector<uint32_t>& indices,
                         std::string* payload) {
  const size_t k = indices.size();
  char* body = StartPayload(id, input.size(), static_cast<uint32_t>(k), 0,
                            8 * k, payload);
  if (k != 0) std::memcpy(body, indices.data(), 4 * k);
  char* values = body + 4 * k;
  for (size_t j = 0; j < k; ++j) {
    Store<float>(values + 4 * j, input[indices[j]]);
  }
}

// Shared decoder for the index/value body of top-k and threshold.
absl::Status DecodeIndexValue(CodecId id, absl::string_view payload,
                              float scale, bool accumulate,
                              absl::Span<float> out) {
  absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id, out.size());
  if (!h.ok()) return h.status();
  const size_t d = out.size();
  absl::StatusOr<size_t> k = CheckSparseK(id, *h, d);
  if (!k.ok()) return k.status();
  absl::string_view body = payload.substr(kCodecHeaderBytes);
  absl::Status st = CheckBodySize(id, body.size(), 8 * *k);
  if (st.ok()) st = CheckIndexValueBody(id, body, *k, d);
  if (!st.ok()) return st;
  const char* idx = body.data();
  const char* val = idx + 4 * *k;
  if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < *k; ++j) {
    Emit(out.data(), Load<uint32_t>(idx + 4 * j), Load<float>(val + 4 * j),
         scale, accumulate);
  }
  return absl::OkStatus();
}

class TopKCodec : public Codec {
 public:
  explicit TopKCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext&,
                      std::string* payload) override {
    absl::Status st = CheckSparseSize(id(), input.size());
    if (!st.ok()) return st;
    const size_t d = input.size();
    const size_t k = KFromRatio(spec().ratio, d);
    SelectTopK(input, k);
    // values_ holds input[indices_[j]], gathered during the scan: reading
    // them back here would be k cache misses on a large tensor.
    char* body = StartPayload(id(), d, static_cast<uint32_t>(k), 0, 8 * k, payload);
    if (k != 0) {
      std::memcpy(body, indices_.data(), 4 * k);
      std::memcpy(body + 4 * k, values_.data(), 4 * k);
    }
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    return DecodeIndexValue(id(), payload, scale, accumulate, out);
  }

  uint64_t RetainedBytes() const override {
    return Capacity(selection_) + Capacity(values_) + Capacity(candidate_values_) +
           Capacity(keys_) + Capacity(indices_) + Capacity(sample_);
  }

 private:
  // Leaves the k best indices, sorted ascending, in indices_ and their
  // values in values_. "Best" is larger abs value, ties broken by the lower
  // index, so the result equals the first k of a full stable sort by
  // descending abs value.
  void SelectTopK(absl::Span<const float> g, size_t k) {
    const size_t d = g.size();
    indices_.clear();
    values_.clear();
    if (k == d) {
      indices_.resize(d);
      for (size_t i = 0; i < d; ++i) indices_[i] = static_cast<uint32_t>(i);
      values_.assign(g.begin(), g.end());
      return;
    }
    // A strided sample gives a threshold t that about 2k elements pass;
    // every top-k element has abs >= the k-th value >= t whenever at least
    // k pass, so the selection below is exact. Otherwise fall back to all.
    const size_t samples = std::min<size_t>(d, 4096);
    sample_.resize(samples);
    for (size_t s = 0; s < samples; ++s) {
      sample_[s] = std::fabs(g[s * d / samples]);
    }
    size_t rank = std::min<size_t>(samples - 1, 2 * k * samples / d + 16);
    std::nth_element(sample_.begin(), sample_.begin() + rank, sample_.end(),
                     std::greater<float>());
    const float t = sample_[rank];
    // Candidates abs(g) >= t in index order, as (key, value); per-thread
    // lists, joined in range order. The key is made here, while g[i] is in cache: building it
    // later from an index is a cache miss per candidate.
    std::vector<uint64_t> part_keys[kMaxCodecThreads];
    std::vector<float> part_values[kMaxCodecThreads];
    keys_.clear();
    candidate_values_.clear();
    ParallelRanges(d, 16, [&](size_t part, size_t begin, size_t end) {
      std::vector<uint64_t>& keys = part == 0 ? keys_ : part_keys[part];
      std::vector<float>& values = part == 0 ? candidate_values_ : part_values[part];
      auto take = [&](size_t j) {
        keys.push_back(Key(g[j], static_cast<uint32_t>(j)));
        values.push_back(g[j]);
      };
      // SSE2 (part of x86-64, so no runtime check): a 16-bit mask of
      // abs(g) >= t per block, then only its set bits.
      const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
      const __m128 tv = _mm_set1_ps(t);
      const float* data = g.data();
      size_t i = begin;
      for (; i + 16 <= end; i += 16) {
        unsigned mask = 0;
        for (int q = 0; q < 4; ++q) {
          const __m128 v = _mm_and_ps(_mm_loadu_ps(data + i + 4 * q), abs_mask);
          mask |= static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(v, tv))) << (4 * q);
        }
        while (mask != 0) {
          take(i + static_cast<size_t>(__builtin_ctz(mask)));
          mask &= mask - 1;
        }
      }
      for (; i < end; ++i) {
        if (std::fabs(g[i]) >= t) take(i);
      }
    });
    for (size_t p = 1; p < kMaxCodecThreads; ++p) {
      keys_.insert(keys_.end(), part_keys[p].begin(), part_keys[p].end());
      candidate_values_.insert(candidate_values_.end(), part_values[p].begin(),
                               part_values[p].end());
    }
    if (keys_.size() < k) {
      keys_.resize(d);
      for (size_t i = 0; i < d; ++i) keys_[i] = Key(g[i], static_cast<uint32_t>(i));
      candidate_values_.assign(g.begin(), g.end());
    }
    // Keys order by abs value, then lower index: abs(g)'s bits (finite,
    // non-negative: ordered as integers) above the complemented index. Keys
    // are distinct, so the k-th largest key K selects exactly the k best
    // (ties to the lower index, as a stable sort by descending abs value),
    // and keeping key >= K in candidate order leaves them sorted by index
    // without sorting.
    selection_.assign(keys_.begin(), keys_.end());
    std::nth_element(selection_.begin(), selection_.begin() + (k - 1),
                     selection_.end(), std::greater<uint64_t>());
    const uint64_t kth = selection_[k - 1];
    indices_.reserve(k);
    values_.reserve(k);
    for (size_t c = 0; c < keys_.size(); ++c) {
      if (keys_[c] >= kth) {
        indices_.push_back(0xffffffffu - static_cast<uint32_t>(keys_[c]));
        values_.push_back(candidate_values_[c]);
      }
    }
  }

  static uint64_t Key(float v, uint32_t i) {
    const float a = std::fabs(v);
    uint32_t bits;
    std::memcpy(&bits, &a, sizeof(bits));
    return (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - i);
  }

  std::vector<uint64_t> selection_;
  std::vector<float> values_, candidate_values_;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> indices_;
  std::vector<float> sample_;
};

class RandomKCodec : public Codec {
 public:
  explicit RandomKCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext& ctx,
                      std::string* payload) override {
    absl::Status st = CheckSparseSize(id(), input.size());
    if (!st.ok()) return st;
    const size_t d = input.size();
    const size_t k = KFromRatio(spec().ratio, d);
    const uint64_t seed = Mix64(ctx.seed, spec().seed);
    RandomKIndices(seed, d, k, &bitmap_, &indices_);
    // Unbiased scaling d/k, rounded once to fp32 (exactly 1 when k == d).
    const float scale =
        spec().scaled && k > 0
            ? static_cast<float>(static_cast<double>(d) / static_cast<double>(k))
            : 1.0f;
    char* body =
        StartPayload(id(), d, static_cast<uint32_t>(k), 0, 8 + 4 * k, payload);
    Store<uint64_t>(body, seed);
    for (size_t j = 0; j < k; ++j) {
      float v = input[indices_[j]] * scale;
      if (!std::isfinite(v)) {
        return Invalid(id(), absl::StrCat("scaled value at index ", indices_[j],
                                          " overflows fp32"));
      }
      Store<float>(body + 8 + 4 * j, v);
    }
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    absl::StatusOr<PayloadHeader> h = CheckHeader(payload, id(), out.size());
    if (!h.ok()) return h.status();
    const size_t d = out.size();
    absl::StatusOr<size_t> checked_k = CheckSparseK(id(), *h, d);
    if (!checked_k.ok()) return checked_k.status();
    const size_t k = *checked_k;
    absl::string_view body = payload.substr(kCodecHeaderBytes);
    absl::Status st = CheckBodySize(id(), body.size(), 8 + 4 * k);
    if (!st.ok()) return st;
    const char* val = body.data() + 8;
    for (size_t j = 0; j < k; ++j) {
      if (!std::isfinite(Load<float>(val + 4 * j))) {
        return Invalid(id(), absl::StrCat("value at position ", j,
                                          " is not finite"));
      }
    }
    // Decode is const and may run concurrently, so index scratch is local.
    std::vector<uint64_t> bitmap;
    std::vector<uint32_t> indices;
    RandomKIndices(Load<uint64_t>(body.data()), d, k, &bitmap, &indices);
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    for (size_t j = 0; j < k; ++j) {
      Emit(out.data(), indices[j], Load<float>(val + 4 * j), scale, accumulate);
    }
    return absl::OkStatus();
  }

  uint64_t RetainedBytes() const override { return Capacity(bitmap_) + Capacity(indices_); }

 private:
  std::vector<uint64_t> bitmap_;
  std::vector<uint32_t> indices_;
};

class ThresholdCodec : public Codec {
 public:
  explicit ThresholdCodec(const CodecSpec& spec) : Codec(spec) {}

  absl::Status EncodeImpl(absl::Span<const float> input, const CodecContext& ctx,
                      std::string* payload) override {
    absl::Status st = CheckSparseSize(id(), input.size());
    if (!st.ok()) return st;
    const size_t d = input.size();
    indices_.clear();
    if (spec().fixed_tau) {
      const float tau = static_cast<float>(spec().tau);
      for (size_t i = 0; i < d; ++i) {
        if (std::fabs(input[i]) > tau) indices_.push_back(static_cast<uint32_t>(i));
      }
    } else if (d > 0) {
      // DGC: estimate the (1 - ratio) quantile of abs(g) from a random
      // sample instead of sorting all d values.
      const size_t n = KFromRatio(spec().sample, d);
      Rng rng(ctx.seed);
      sample_.resize(n);
      for (size_t s = 0; s < n; ++s) sample_[s] = std::fabs(input[rng.Below(d)]);
      const size_t rank = KFromRatio(spec().ratio, n) - 1;
      std::nth_element(sample_.begin(), sample_.begin() + rank, sample_.end(),
                       std::greater<float>());
      const float tau = sample_[rank];
      // >= so that the sampled quantile itself passes; zeros never do.
      for (size_t i = 0; i < d; ++i) {
        float a = std::fabs(input[i]);
        if (a >= tau && a > 0.0f) indices_.push_back(static_cast<uint32_t>(i));
      }
    }
    WriteIndexValueBody(id(), input, indices_, payload);
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(absl::string_view payload, float scale,
                          bool accumulate,
                          absl::Span<float> out) const override {
    return DecodeIndexValue(id(), payload, scale, accumulate, out);
  }

  uint64_t RetainedBytes() const override { return Capacity(indices_) + Capacity(sample_); }

 private:
  std::vector<uint32_t> indices_;
  std::vector<float> sample_;
};

}  // namespace

std::unique_ptr<Codec> CreateSparseCodec(const CodecSpec& spec) {
  switch (spec.id) {
    case CodecId::kTopK:
      return std::make_unique<TopKCodec>(spec);
    case CodecId::kRandomK:
      return std::make_unique<RandomKCodec>(spec);
    case CodecId::kThreshold:
      return std::make_unique<ThresholdCodec>(spec);
    default:
      return nullptr;
  }
}

}  // namespace codec_internal
}  // namespace harrier
