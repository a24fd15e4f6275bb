// Codec base class, factory, Aggregator, seeds, and the shared helpers
// declared in internal.h.

#include "common/codec/codec.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "common/codec/internal.h"

namespace harrier {
namespace codec_internal {

char* StartPayload(CodecId id, uint64_t num_elements, uint32_t param0,
                   uint32_t param1, size_t body_bytes, std::string* payload) {
  payload->resize(kCodecHeaderBytes + body_bytes);
  char* p = &(*payload)[0];
  Store<uint32_t>(p, kCodecWireMagic);
  Store<uint8_t>(p + 4, static_cast<uint8_t>(id));
  Store<uint8_t>(p + 5, kCodecWireVersion);
  Store<uint16_t>(p + 6, 0);
  Store<uint64_t>(p + 8, num_elements);
  Store<uint32_t>(p + 16, param0);
  Store<uint32_t>(p + 20, param1);
  return p + kCodecHeaderBytes;
}

absl::Status Invalid(CodecId id, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("codec ", CodecName(id), ": ", message));
}

absl::StatusOr<PayloadHeader> CheckHeader(absl::string_view payload,
                                          CodecId expected,
                                          size_t expected_elements) {
  absl::StatusOr<PayloadHeader> header = PeekPayloadHeader(payload);
  if (!header.ok()) {
    return Invalid(expected, header.status().message());
  }
  if (header->codec != expected) {
    return Invalid(expected,
                   absl::StrCat("payload was encoded by codec ",
                                CodecName(header->codec), " (id ",
                                static_cast<uint32_t>(header->codec), ")"));
  }
  if (header->num_elements != expected_elements) {
    return Invalid(expected, absl::StrCat("payload has ", header->num_elements,
                                          " elements, output has ",
                                          expected_elements));
  }
  return header;
}

absl::Status CheckBodySize(CodecId id, size_t actual, size_t expected) {
  if (actual < expected) {
    return Invalid(id, absl::StrCat("payload truncated: body has ", actual,
                                    " bytes, expected ", expected));
  }
  if (actual > expected) {
    return Invalid(id, absl::StrCat("payload has ", actual - expected,
                                    " trailing bytes (body ", actual,
                                    ", expected ", expected, ")"));
  }
  return absl::OkStatus();
}

namespace {
// x - x is NaN exactly when x is NaN or Inf. Sixteen independent sums: one
// running sum is a chain of dependent adds (about 3 GB/s, which capped every
// encoder, as Encode scans its input first); lanes vectorise without
// reassociation and any NaN still reaches the result.
bool AllFiniteRange(const float* data, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += data[i + j] - data[i + j];
  }
  for (; i < n; ++i) acc[0] += data[i] - data[i];
  float all = 0.0f;
  for (float a : acc) all += a;
  return all == 0.0f;
}
}  // namespace

bool AllFinite(const float* data, size_t n) {
  bool ok[kMaxCodecThreads];
  std::fill(ok, ok + kMaxCodecThreads, true);
  ParallelRanges(n, 16, [&](size_t part, size_t b, size_t e) {
    ok[part] = AllFiniteRange(data + b, e - b);
  });
  return std::all_of(ok, ok + kMaxCodecThreads, [](bool v) { return v; });
}

absl::Status CheckFiniteInput(CodecId id, absl::Span<const float> input) {
  if (AllFinite(input.data(), input.size())) return absl::OkStatus();
  for (size_t i = 0; i < input.size(); ++i) {
    if (!std::isfinite(input[i])) {
      return Invalid(id, absl::StrCat("input element ", i, " is ", input[i],
                                      "; refusing to encode non-finite "
                                      "values"));
    }
  }
  return absl::OkStatus();
}

bool MaskPaddingIsZero(const char* mask, size_t n) {
  if (n % 8 == 0) return true;
  uint8_t last = static_cast<uint8_t>(mask[n / 8]);
  return (last >> (n % 8)) == 0;
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

namespace {
std::atomic<int> g_test_threads{0};
std::atomic<bool> g_force_scalar{false};
}  // namespace

bool UseAvx2() {
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  return has_avx2 && !g_force_scalar.load(std::memory_order_relaxed);
}

int CodecThreads(size_t n) {
  if (n < kCodecParallelMinElements) return 1;
  const int forced = g_test_threads.load(std::memory_order_relaxed);
  if (forced > 0) return std::min(forced, kMaxCodecThreads);
  static const int hardware = [] {
    const unsigned h = std::thread::hardware_concurrency();
    return h == 0 ? 1 : static_cast<int>(std::min<unsigned>(h, kMaxCodecThreads));
  }();
  return hardware;
}

Rng::Rng(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t& s : s_) s = SplitMix64(&state);
}

uint64_t Rng::Next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::Below(uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

double Rng::Normal() {
  // 53-bit uniform in (0, 1] for the log.
  double u1 = (static_cast<double>(Next() >> 11) + 1.0) * 0x1p-53;
  double u2 = static_cast<double>(Next() >> 11) * 0x1p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t out;
  if (x >= (143u << 23)) {  // >= 65536 (and Inf/NaN): overflow
    out = x > (255u << 23) ? 0x7e00 : 0x7c00;
  } else if (x < (113u << 23)) {  // below 2^-14: half subnormal or zero
    // Adding 0.5 aligns the half's subnormal ulp (2^-24) with the float's
    // last mantissa bit, so the FPU does the round-to-nearest-even.
    const uint32_t magic_bits = 126u << 23;
    float magic, v;
    std::memcpy(&magic, &magic_bits, sizeof(magic));
    std::memcpy(&v, &x, sizeof(v));
    v += magic;
    uint32_t vb;
    std::memcpy(&vb, &v, sizeof(vb));
    out = static_cast<uint16_t>(vb - magic_bits);
  } else {
    uint32_t mant_odd = (x >> 13) & 1;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff;
    x += mant_odd;
    out = static_cast<uint16_t>(x >> 13);  // may carry into 0x7c00 (Inf)
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = static_cast<float>(mant) * 0x1p-24f;  // exact: mant < 2^10
    return sign ? -f : f;
  }
  uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                            : (sign | ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  x += 0x7fffu + ((x >> 16) & 1);  // round to nearest even; NaN is refused earlier
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace codec_internal

void SetCodecScalarForTesting(bool scalar) {
  codec_internal::g_force_scalar.store(scalar, std::memory_order_relaxed);
}

void SetCodecThreadsForTesting(int threads) {
  codec_internal::g_test_threads.store(std::max(0, threads),
                                       std::memory_order_relaxed);
}

using codec_internal::Load;

size_t HeaderBytes() { return kCodecHeaderBytes; }

absl::StatusOr<PayloadHeader> PeekPayloadHeader(absl::string_view payload) {
  if (payload.size() < kCodecHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload truncated: ", payload.size(), " bytes < ",
                     kCodecHeaderBytes, "-byte header"));
  }
  const char* p = payload.data();
  uint32_t magic = Load<uint32_t>(p);
  if (magic != kCodecWireMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad payload magic 0x", absl::Hex(magic)));
  }
  PayloadHeader header;
  uint8_t id = Load<uint8_t>(p + 4);
  if (id > static_cast<uint8_t>(CodecId::kPowerSgd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown codec id ", id, " in payload"));
  }
  header.codec = static_cast<CodecId>(id);
  header.version = Load<uint8_t>(p + 5);
  if (header.version != kCodecWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported payload version ", header.version));
  }
  if (Load<uint16_t>(p + 6) != 0) {
    return absl::InvalidArgumentError("reserved header bits are not zero");
  }
  header.num_elements = Load<uint64_t>(p + 8);
  header.param0 = Load<uint32_t>(p + 16);
  header.param1 = Load<uint32_t>(p + 20);
  return header;
}

uint64_t DeriveSeed(absl::string_view key, uint32_t chunk, int64_t clock,
                    uint32_t rank, uint64_t base_seed) {
  // FNV-1a over the key, then one splitmix round per field so that nearby
  // (chunk, clock, rank) tuples give unrelated streams.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : key) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  h = codec_internal::Mix64(base_seed, h);
  h = codec_internal::Mix64(h, chunk);
  h = codec_internal::Mix64(h, static_cast<uint64_t>(clock));
  h = codec_internal::Mix64(h, rank);
  return h;
}

absl::Status Codec::Encode(absl::Span<const float> input,
                           const CodecContext& ctx, std::string* payload) {
  payload->clear();
  absl::Status status = codec_internal::CheckFiniteInput(id(), input);
  if (status.ok()) status = EncodeImpl(input, ctx, payload);
  if (!status.ok()) payload->clear();
  return status;
}

absl::Status Codec::Decode(absl::string_view payload,
                           absl::Span<float> out) const {
  return DecodeImpl(payload, 1.0f, /*accumulate=*/false, out);
}

absl::Status Codec::DecodeAdd(absl::string_view payload, float scale,
                              absl::Span<float> accum) const {
  if (!std::isfinite(scale)) {
    return codec_internal::Invalid(
        id(), absl::StrCat("DecodeAdd scale ", scale, " is not finite"));
  }
  return DecodeImpl(payload, scale, /*accumulate=*/true, accum);
}

absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(const CodecSpec& spec) {
  // Re-validate through the parser so that hand-built specs obey the same
  // ranges as parsed ones.
  absl::StatusOr<CodecSpec> checked = CodecSpec::Parse(spec.ToString());
  if (!checked.ok()) return checked.status();
  std::unique_ptr<Codec> codec;
  switch (spec.id) {
    case CodecId::kNone:
    case CodecId::kFp16:
    case CodecId::kBf16:
      codec = codec_internal::CreateDenseCodec(*checked);
      break;
    case CodecId::kTopK:
    case CodecId::kRandomK:
    case CodecId::kThreshold:
      codec = codec_internal::CreateSparseCodec(*checked);
      break;
    case CodecId::kQsgd:
    case CodecId::kTernGrad:
      codec = codec_internal::CreateQuantizedCodec(*checked);
      break;
    case CodecId::kSign:
    case CodecId::kEfSign:
    case CodecId::kSignum:
    case CodecId::kOneBit:
      codec = codec_internal::CreateSignCodec(*checked);
      break;
    case CodecId::kPowerSgd:
      codec = codec_internal::CreatePowerSgdCodec(*checked);
      break;
  }
  if (codec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no codec for id ", static_cast<uint32_t>(spec.id)));
  }
  return codec;
}

// ---- Aggregator ----

void AverageInPlace(absl::Span<float> sum, int count) {
  const float n = static_cast<float>(count);
  for (float& g : sum) g /= n;
}

Aggregator::Aggregator(std::unique_ptr<Codec> codec, size_t num_elements)
    : codec_(std::move(codec)), num_elements_(num_elements) {
  if (codec_->IsMajorityVote()) {
    votes_.assign(num_elements_, 0);
  } else {
    sum_.assign(num_elements_, 0.0f);
  }
}

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Create(
    const CodecSpec& spec, size_t num_elements) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = CreateCodec(spec);
  if (!codec.ok()) return codec.status();
  return std::unique_ptr<Aggregator>(
      new Aggregator(std::move(*codec), num_elements));
}

absl::Status Aggregator::Add(absl::string_view payload) {
  absl::Status status;
  if (codec_->IsMajorityVote()) {
    const auto* voter =
        static_cast<const codec_internal::VoteCodec*>(codec_.get());
    float scale = 1.0f;
    status = voter->AddVotes(payload, absl::MakeSpan(votes_), &scale);
    if (status.ok()) scale_sum_ += scale;
  } else {
    status = codec_->DecodeAdd(payload, 1.0f, absl::MakeSpan(sum_));
  }
  if (status.ok()) ++count_;
  return status;
}

absl::Status Aggregator::Finish(absl::Span<float> out) const {
  if (out.size() != num_elements_) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregator for codec ", CodecName(codec_->id()), ": out has ",
                     out.size(), " elements, expected ", num_elements_));
  }
  if (count_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("aggregator for codec ", CodecName(codec_->id()),
                     ": Finish with no payloads added"));
  }
  if (codec_->IsMajorityVote()) {
    float scale = static_cast<float>(scale_sum_ / count_);
    for (size_t i = 0; i < num_elements_; ++i) {
      int32_t v = votes_[i];
      out[i] = v > 0 ? scale : (v < 0 ? -scale : 0.0f);
    }
  } else {
    std::copy(sum_.begin(), sum_.end(), out.begin());
    AverageInPlace(out, count_);
  }
  return absl::OkStatus();
}

void Aggregator::Reset() {
  count_ = 0;
  scale_sum_ = 0.0;
  std::fill(sum_.begin(), sum_.end(), 0.0f);
  std::fill(votes_.begin(), votes_.end(), 0);
}

}  // namespace harrier
