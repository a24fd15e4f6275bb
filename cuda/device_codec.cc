// Host orchestration of the CUDA codecs: validation, header, the sequential
// parts that must match the CPU bit for bit (random-k draws, DGC sampling,
// PowerSGD's Gram-Schmidt and warm start), and the copies. Kernels are in
// codec_kernels.cu and select_kernels.cu behind kernels.h.

#include "cuda/device_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec/internal.h"
#include "common/crc32c.h"
#include "cuda/host_twin.h"
#include "cuda/kernels.h"

namespace harrier {
namespace cuda {
namespace {

namespace k = kernels;
using codec_internal::Invalid;
using codec_internal::KFromRatio;
using codec_internal::Mix64;
using codec_internal::RandomKIndices;
using codec_internal::Rng;
using codec_internal::StartPayload;

absl::Status CudaError(int err, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("CUDA error in ", what, ": ", k::ErrorString(err)));
}

#define RETURN_IF_CUDA(expr, what)             \
  do {                                         \
    int cuda_err_ = (expr);                    \
    if (cuda_err_ != 0) return CudaError(cuda_err_, what); \
  } while (0)

// A grow-only device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (p_ != nullptr) k::Free(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_ && p_ != nullptr) return absl::OkStatus();
    if (p_ != nullptr) k::Free(p_);
    p_ = nullptr;
    capacity_ = 0;
    RETURN_IF_CUDA(k::Malloc(&p_, bytes), "cudaMalloc");
    capacity_ = bytes;
    return absl::OkStatus();
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t capacity_ = 0;
};

absl::Status CheckDevicePointer(const void* p, size_t n, absl::string_view what) {
  if (n == 0) return absl::OkStatus();
  if (p == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  }
  bool is_device = false;
  k::IsDevicePointer(p, &is_device);
  if (!is_device) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not device (or managed) memory"));
  }
  return absl::OkStatus();
}

float ReadDeviceFloat(const float* d_x, size_t i) {
  float v = 0.0f;
  k::ToHost(&v, d_x + i, sizeof(v));
  return v;
}

}  // namespace

struct DeviceCodec::Impl {
  CodecSpec spec;
  DeviceBuffer ws;       // kernels::WorkspaceBytes(n)
  size_t ws_elements = 0;
  DeviceBuffer body;     // encode output / decode input
  DeviceBuffer indices;  // u32, up to n
  DeviceBuffer values;   // fp32, up to n
  DeviceBuffer ef_c;     // error feedback: g + e
  DeviceBuffer ef_d;     // error feedback: D(p); DGC: D(p)
  DeviceBuffer dgc_u;    // DGC: momentum u + g
  DeviceBuffer add;      // DecodeAdd: D(p) of a dense codec
  std::vector<uint32_t> host_indices;
  std::vector<uint64_t> host_bitmap;  // random-k draw scratch
  std::vector<float> host_values;
  // PowerSGD warm start, as the CPU codec keeps it.
  size_t psgd_m = 0;
  std::vector<float> psgd_q;

  absl::Status Workspace(size_t n) {
    if (ws.get() != nullptr && n <= ws_elements) return absl::OkStatus();
    absl::Status st = ws.Reserve(k::WorkspaceBytes(n));
    if (st.ok()) ws_elements = n;
    return st;
  }

  absl::Status Encode(const float* x, size_t d, const CodecContext& ctx,
                      std::string* payload);
  absl::Status Decode(absl::string_view payload, float* out, size_t d);
  absl::Status DecodeAdd(absl::string_view payload, float scale, float* accum,
                         size_t d);

 private:
  // out = D(payload) for a payload CheckPayload accepted.
  absl::Status DecodeChecked(const host::CheckedPayload& c, float* out,
                             size_t d);
  absl::Status EncodeDense(const float* x, size_t d, std::string* payload);
  absl::Status EncodeTopK(const float* x, size_t d, std::string* payload);
  absl::Status EncodeRandomK(const float* x, size_t d, const CodecContext& ctx,
                             std::string* payload);
  absl::Status EncodeThreshold(const float* x, size_t d,
                               const CodecContext& ctx, std::string* payload);
  absl::Status EncodeQsgd(const float* x, size_t d, const CodecContext& ctx,
                          std::string* payload);
  absl::Status EncodeTernGrad(const float* x, size_t d,
                              const CodecContext& ctx, std::string* payload);
  absl::Status EncodeSign(const float* x, size_t d, std::string* payload);
  absl::Status EncodePowerSgd(const float* x, size_t d,
                              const CodecContext& ctx, std::string* payload);
  // Writes the index/value body of the k indices in `indices` (device).
  absl::Status WriteIndexValue(const float* x, size_t d, size_t kk,
                               std::string* payload);
};

absl::Status DeviceCodec::Impl::Encode(const float* x, size_t d,
                                       const CodecContext& ctx,
                                       std::string* payload) {
  payload->clear();
  const CodecId id = spec.id;
  absl::Status st = CheckDevicePointer(x, d, "device_input");
  if (!st.ok()) return st;
  st = Workspace(d);
  if (!st.ok()) return st;
  uint64_t bad = d;
  RETURN_IF_CUDA(k::FirstNonFinite(x, d, ws.get(), &bad), "finite check");
  if (bad < d) {
    return Invalid(id, absl::StrCat("input element ", bad, " is ",
                                    ReadDeviceFloat(x, bad),
                                    "; refusing to encode non-finite values"));
  }
  switch (id) {
    case CodecId::kNone:
    case CodecId::kFp16:
    case CodecId::kBf16:
      st = EncodeDense(x, d, payload);
      break;
    case CodecId::kTopK:
      st = EncodeTopK(x, d, payload);
      break;
    case CodecId::kRandomK:
      st = EncodeRandomK(x, d, ctx, payload);
      break;
    case CodecId::kThreshold:
      st = EncodeThreshold(x, d, ctx, payload);
      break;
    case CodecId::kQsgd:
      st = EncodeQsgd(x, d, ctx, payload);
      break;
    case CodecId::kTernGrad:
      st = EncodeTernGrad(x, d, ctx, payload);
      break;
    case CodecId::kSign:
    case CodecId::kEfSign:
    case CodecId::kSignum:
    case CodecId::kOneBit:
      st = EncodeSign(x, d, payload);
      break;
    case CodecId::kPowerSgd:
      st = EncodePowerSgd(x, d, ctx, payload);
      break;
  }
  if (!st.ok()) payload->clear();
  return st;
}

absl::Status DeviceCodec::Impl::EncodeDense(const float* x, size_t d,
                                            std::string* payload) {
  const CodecId id = spec.id;
  if (id == CodecId::kNone) {
    char* body = StartPayload(id, d, 0, 0, 4 * d, payload);
    RETURN_IF_CUDA(k::ToHost(body, x, 4 * d), "copy to host");
    return absl::OkStatus();
  }
  const bool fp16 = id == CodecId::kFp16;
  absl::Status st = body.Reserve(2 * d);
  if (!st.ok()) return st;
  uint64_t overflow = d;
  RETURN_IF_CUDA(k::ToHalf(x, d, fp16, body.get<uint16_t>(), ws.get(), &overflow),
                 "half conversion");
  if (overflow < d) {
    return Invalid(id, absl::StrCat("input element ", overflow, " = ",
                                    ReadDeviceFloat(x, overflow), " overflows ",
                                    CodecName(id), " to Inf"));
  }
  char* out = StartPayload(id, d, 0, 0, 2 * d, payload);
  RETURN_IF_CUDA(k::ToHost(out, body.get(), 2 * d), "copy to host");
  return absl::OkStatus();
}

static absl::Status CheckSparseSize(CodecId id, size_t d) {
  if (d > std::numeric_limits<uint32_t>::max()) {
    return Invalid(id, absl::StrCat("tensor of ", d,
                                    " elements exceeds 32-bit indices"));
  }
  if (d >= (size_t{1} << 31)) {
    return absl::UnimplementedError(absl::StrCat(
        "codec ", CodecName(id), ": the CUDA encoder handles fewer than 2^31 "
        "elements, got ", d));
  }
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::WriteIndexValue(const float* x, size_t d,
                                                size_t kk,
                                                std::string* payload) {
  absl::Status st = values.Reserve(4 * kk);
  if (!st.ok()) return st;
  uint64_t bad = kk;
  RETURN_IF_CUDA(k::Gather(x, indices.get<uint32_t>(), kk, 1.0f,
                           values.get<float>(), ws.get(), &bad),
                 "gather");
  char* out = StartPayload(spec.id, d, static_cast<uint32_t>(kk), 0,
                                 8 * kk, payload);
  RETURN_IF_CUDA(k::ToHost(out, indices.get(), 4 * kk), "copy to host");
  RETURN_IF_CUDA(k::ToHost(out + 4 * kk, values.get(), 4 * kk), "copy to host");
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::EncodeTopK(const float* x, size_t d,
                                           std::string* payload) {
  absl::Status st = CheckSparseSize(spec.id, d);
  if (!st.ok()) return st;
  const size_t kk = KFromRatio(spec.ratio, d);
  st = indices.Reserve(4 * kk);
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::TopKIndices(x, d, kk, indices.get<uint32_t>(), ws.get()),
                 "top-k selection");
  return WriteIndexValue(x, d, kk, payload);
}

absl::Status DeviceCodec::Impl::EncodeRandomK(const float* x, size_t d,
                                              const CodecContext& ctx,
                                              std::string* payload) {
  absl::Status st = CheckSparseSize(spec.id, d);
  if (!st.ok()) return st;
  const size_t kk = KFromRatio(spec.ratio, d);
  const uint64_t seed = Mix64(ctx.seed, spec.seed);
  // Floyd's draw is sequential; the host does it, as the decoder will.
  RandomKIndices(seed, d, kk, &host_bitmap, &host_indices);
  const float scale =
      spec.scaled && kk > 0
          ? static_cast<float>(static_cast<double>(d) / static_cast<double>(kk))
          : 1.0f;
  st = indices.Reserve(4 * kk);
  if (st.ok()) st = values.Reserve(4 * kk);
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::ToDevice(indices.get(), host_indices.data(), 4 * kk),
                 "copy to device");
  uint64_t bad = kk;
  RETURN_IF_CUDA(k::Gather(x, indices.get<uint32_t>(), kk, scale,
                           values.get<float>(), ws.get(), &bad),
                 "gather");
  if (bad < kk) {
    return Invalid(spec.id, absl::StrCat("scaled value at index ",
                                         host_indices[bad], " overflows fp32"));
  }
  char* out = StartPayload(spec.id, d, static_cast<uint32_t>(kk), 0,
                                 8 + 4 * kk, payload);
  std::memcpy(out, &seed, 8);
  RETURN_IF_CUDA(k::ToHost(out + 8, values.get(), 4 * kk), "copy to host");
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::EncodeThreshold(const float* x, size_t d,
                                                const CodecContext& ctx,
                                                std::string* payload) {
  absl::Status st = CheckSparseSize(spec.id, d);
  if (!st.ok()) return st;
  st = indices.Reserve(4 * std::max<size_t>(d, 1));
  if (!st.ok()) return st;
  size_t kk = 0;
  if (spec.fixed_tau) {
    RETURN_IF_CUDA(k::SelectIndices(x, d, 0, static_cast<float>(spec.tau),
                                    indices.get<uint32_t>(), ws.get(), &kk),
                   "threshold selection");
  } else if (d > 0) {
    // DGC: the sample indices come from the CPU's sequential stream, the
    // values from the device; the quantile is then the CPU's own.
    const size_t ns = KFromRatio(spec.sample, d);
    Rng rng(ctx.seed);
    host_indices.resize(ns);
    for (size_t s = 0; s < ns; ++s) {
      host_indices[s] = static_cast<uint32_t>(rng.Below(d));
    }
    st = values.Reserve(4 * ns);
    if (!st.ok()) return st;
    RETURN_IF_CUDA(k::ToDevice(indices.get(), host_indices.data(), 4 * ns),
                   "copy to device");
    uint64_t bad = ns;
    RETURN_IF_CUDA(k::Gather(x, indices.get<uint32_t>(), ns, 1.0f,
                             values.get<float>(), ws.get(), &bad),
                   "gather");
    host_values.resize(ns);
    RETURN_IF_CUDA(k::ToHost(host_values.data(), values.get(), 4 * ns),
                   "copy to host");
    for (float& v : host_values) v = std::fabs(v);
    const size_t rank = KFromRatio(spec.ratio, ns) - 1;
    std::nth_element(host_values.begin(), host_values.begin() + rank,
                     host_values.end(), std::greater<float>());
    const float tau = host_values[rank];
    RETURN_IF_CUDA(k::SelectIndices(x, d, 1, tau, indices.get<uint32_t>(),
                                    ws.get(), &kk),
                   "threshold selection");
  }
  return WriteIndexValue(x, d, kk, payload);
}

absl::Status DeviceCodec::Impl::EncodeQsgd(const float* x, size_t d,
                                           const CodecContext& ctx,
                                           std::string* payload) {
  const uint32_t s = spec.levels;
  const size_t bucket = spec.bucket;
  const int bits = 1 + codec_internal::BitWidth(s);
  const size_t buckets = (d + bucket - 1) / bucket;
  const size_t packed = codec_internal::PackedBytes(d, bits);
  const size_t words = (packed + 3) / 4;
  absl::Status st = body.Reserve(4 * buckets + 4 * words);
  if (!st.ok()) return st;
  float* norms = body.get<float>();
  uint32_t* codes = reinterpret_cast<uint32_t*>(norms + buckets);
  RETURN_IF_CUDA(k::Memset(codes, 0, 4 * words), "memset");
  RETURN_IF_CUDA(k::QsgdNorms(x, d, bucket, norms), "qsgd norms");
  RETURN_IF_CUDA(k::QsgdEncode(x, d, bucket, norms, s, bits, ctx.seed, codes),
                 "qsgd encode");
  char* out = StartPayload(spec.id, d, s, static_cast<uint32_t>(bucket),
                                 4 * buckets + packed, payload);
  RETURN_IF_CUDA(k::ToHost(out, body.get(), 4 * buckets + packed),
                 "copy to host");
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::EncodeTernGrad(const float* x, size_t d,
                                               const CodecContext& ctx,
                                               std::string* payload) {
  float limit = std::numeric_limits<float>::infinity();
  if (spec.clip > 0.0 && d > 0) {
    double stats[6];
    RETURN_IF_CUDA(k::Stats(x, d, ws.get(), stats), "statistics");
    double mean = stats[0] / d;
    double var = std::max(0.0, stats[1] / d - mean * mean);
    limit = static_cast<float>(spec.clip * std::sqrt(var));
  }
  float max_abs = 0.0f;
  RETURN_IF_CUDA(k::AbsMaxClipped(x, d, limit, ws.get(), &max_abs), "abs max");
  const size_t code_bytes = (d + 3) / 4;
  absl::Status st = body.Reserve(code_bytes);
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::TernEncode(x, d, limit, max_abs, ctx.seed,
                               body.get<uint8_t>()),
                 "terngrad encode");
  char* out = StartPayload(spec.id, d, 0, 0, 4 + code_bytes, payload);
  std::memcpy(out, &max_abs, 4);
  RETURN_IF_CUDA(k::ToHost(out + 4, body.get(), code_bytes), "copy to host");
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::EncodeSign(const float* x, size_t d,
                                           std::string* payload) {
  const CodecId id = spec.id;
  const uint32_t scaled = id == CodecId::kSign && spec.scaled ? 1 : 0;
  const size_t floats = id == CodecId::kSign     ? scaled
                        : id == CodecId::kEfSign ? 1
                        : id == CodecId::kOneBit ? 2
                                                 : 0;
  float scales[2] = {0.0f, 0.0f};
  if (floats > 0) {
    double stats[6];
    RETURN_IF_CUDA(k::Stats(x, d, ws.get(), stats), "statistics");
    if (id == CodecId::kOneBit) {
      const size_t neg_count = static_cast<size_t>(stats[5]);
      const size_t pos_count = d - neg_count;
      scales[0] = neg_count ? static_cast<float>(stats[3] / neg_count) : 0.0f;
      scales[1] = pos_count ? static_cast<float>(stats[4] / pos_count) : 0.0f;
    } else {
      scales[0] = d ? static_cast<float>(stats[2] / d) : 0.0f;
    }
  }
  const size_t mask_bytes = codec_internal::MaskBytes(d);
  absl::Status st = body.Reserve(mask_bytes);
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::SignMask(x, d, body.get<uint8_t>()), "sign mask");
  char* out =
      StartPayload(id, d, scaled, 0, 4 * floats + mask_bytes, payload);
  if (floats) std::memcpy(out, scales, 4 * floats);
  RETURN_IF_CUDA(k::ToHost(out + 4 * floats, body.get(), mask_bytes),
                 "copy to host");
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::EncodePowerSgd(const float* x, size_t d,
                                               const CodecContext& ctx,
                                               std::string* payload) {
  const CodecId id = spec.id;
  const codec_internal::PowerSgdShape s =
      codec_internal::ChoosePowerSgdShape(d, spec.rank, spec.cols);
  if (s.r == 0) {
    char* out = StartPayload(id, d, 0, 0, 4 * d, payload);
    RETURN_IF_CUDA(k::ToHost(out, x, 4 * d), "copy to host");
    return absl::OkStatus();
  }
  if (s.m > 0xffffffffu) {
    return Invalid(id, absl::StrCat("matrix rows ", s.m, " exceed 32 bits"));
  }
  const size_t m = s.m, n = s.n, r = s.r;
  Rng rng(Mix64(ctx.seed, 0x504f574552ULL));
  if (psgd_q.size() != n * r || psgd_m != m) {
    psgd_m = m;
    psgd_q.resize(n * r);
    for (float& v : psgd_q) v = static_cast<float>(rng.Normal());
  }
  // Device: P = M Q and Q = M^T P (the O(d r) work, summed in the CPU's
  // order); host: Gram-Schmidt on the small m x r factor, as the CPU does.
  const size_t small = std::max(m, n) * r;
  absl::Status st = body.Reserve(8 * small);
  if (st.ok()) st = values.Reserve(4 * small);
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::ToDevice(values.get(), psgd_q.data(), 4 * n * r),
                 "copy to device");
  RETURN_IF_CUDA(k::MatMulQ(x, m, n, r, values.get<float>(), body.get<double>()),
                 "P = M Q");
  std::vector<double> p(m * r);
  RETURN_IF_CUDA(k::ToHost(p.data(), body.get(), 8 * m * r), "copy to host");
  codec_internal::OrthonormalizeColumns(m, r, p.data());
  std::vector<float> pf(p.begin(), p.end());
  RETURN_IF_CUDA(k::ToDevice(values.get(), pf.data(), 4 * m * r),
                 "copy to device");
  RETURN_IF_CUDA(
      k::MatMulTP(x, m, n, r, values.get<float>(), body.get<double>()),
      "Q = M^T P");
  std::vector<double> q(n * r);
  RETURN_IF_CUDA(k::ToHost(q.data(), body.get(), 8 * n * r), "copy to host");
  char* out = StartPayload(id, d, static_cast<uint32_t>(r),
                                 static_cast<uint32_t>(m), 4 * r * (m + n),
                                 payload);
  std::memcpy(out, pf.data(), 4 * m * r);
  for (size_t j = 0; j < n * r; ++j) {
    float v = static_cast<float>(q[j]);
    if (!std::isfinite(v)) return Invalid(id, "Q overflows fp32");
    std::memcpy(out + 4 * (m * r + j), &v, 4);
  }
  // Commit the warm start only once the payload is complete (the CPU codec
  // writes q_ while filling the payload; on its error path q_ is
  // half-updated, which no caller relies on).
  for (size_t j = 0; j < n * r; ++j) {
    psgd_q[j] = static_cast<float>(q[j]);
  }
  for (size_t c = 0; c < r; ++c) {
    bool zero = true;
    for (size_t j = 0; j < n && zero; ++j) zero = psgd_q[j * r + c] == 0.0f;
    if (zero) {
      for (size_t j = 0; j < n; ++j) {
        psgd_q[j * r + c] = static_cast<float>(rng.Normal());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::Decode(absl::string_view payload, float* out,
                                       size_t d) {
  absl::StatusOr<host::CheckedPayload> checked =
      host::CheckPayload(payload, spec.id, /*expected_any=*/false, d);
  if (!checked.ok()) return checked.status();
  absl::Status st = CheckDevicePointer(out, d, "device_out");
  if (!st.ok()) return st;
  return DecodeChecked(*checked, out, d);
}

absl::Status DeviceCodec::Impl::DecodeChecked(const host::CheckedPayload& c,
                                              float* out, size_t d) {
  absl::Status st;
  const absl::string_view b = c.body;
  const CodecId id = spec.id;
  if (id == CodecId::kNone ||
      (id == CodecId::kPowerSgd && c.r == 0)) {
    RETURN_IF_CUDA(k::ToDevice(out, b.data(), 4 * d), "copy to device");
    return absl::OkStatus();
  }
  if (id == CodecId::kRandomK) {
    RandomKIndices(c.seed, d, c.k, &host_bitmap, &host_indices);
    st = indices.Reserve(4 * c.k);
    if (st.ok()) st = body.Reserve(4 * c.k);
    if (!st.ok()) return st;
    RETURN_IF_CUDA(k::ToDevice(indices.get(), host_indices.data(), 4 * c.k),
                   "copy to device");
    RETURN_IF_CUDA(k::ToDevice(body.get(), b.data() + 8, 4 * c.k),
                   "copy to device");
    RETURN_IF_CUDA(k::Memset(out, 0, 4 * d), "memset");
    RETURN_IF_CUDA(k::Scatter(indices.get<uint32_t>(), body.get<float>(), c.k,
                              out),
                   "scatter");
    return absl::OkStatus();
  }
  st = body.Reserve(b.size());
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::ToDevice(body.get(), b.data(), b.size()), "copy to device");
  char* db = body.get<char>();
  switch (id) {
    case CodecId::kFp16:
    case CodecId::kBf16:
      RETURN_IF_CUDA(k::FromHalf(reinterpret_cast<const uint16_t*>(db), d,
                                 id == CodecId::kFp16, out),
                     "half decode");
      break;
    case CodecId::kTopK:
    case CodecId::kThreshold:
      RETURN_IF_CUDA(k::Memset(out, 0, 4 * d), "memset");
      RETURN_IF_CUDA(k::Scatter(reinterpret_cast<const uint32_t*>(db),
                                reinterpret_cast<const float*>(db + 4 * c.k),
                                c.k, out),
                     "scatter");
      break;
    case CodecId::kQsgd:
      RETURN_IF_CUDA(
          k::QsgdDecode(reinterpret_cast<const float*>(db),
                        reinterpret_cast<const uint8_t*>(db + 4 * c.buckets),
                        b.size() - 4 * c.buckets, d, c.header.param1,
                        c.header.param0, c.bits, out),
          "qsgd decode");
      break;
    case CodecId::kTernGrad:
      RETURN_IF_CUDA(k::TernDecode(reinterpret_cast<const uint8_t*>(db + 4), d,
                                   c.positive, out),
                     "terngrad decode");
      break;
    case CodecId::kSign:
    case CodecId::kEfSign:
    case CodecId::kSignum:
    case CodecId::kOneBit:
      RETURN_IF_CUDA(
          k::SignDecode(reinterpret_cast<const uint8_t*>(db + c.mask_offset), d,
                        c.negative, c.positive, out),
          "sign decode");
      break;
    case CodecId::kPowerSgd:
      RETURN_IF_CUDA(k::LowRankDecode(reinterpret_cast<const float*>(db),
                                      reinterpret_cast<const float*>(db) +
                                          c.m * c.r,
                                      c.m, c.n, c.r, out),
                     "low-rank decode");
      break;
    default:
      break;
  }
  RETURN_IF_CUDA(k::Synchronize(), "decode");
  return absl::OkStatus();
}

absl::Status DeviceCodec::Impl::DecodeAdd(absl::string_view payload,
                                          float scale, float* accum,
                                          size_t d) {
  // The CPU's order of refusals: the scale, then the payload.
  if (!std::isfinite(scale)) {
    return Invalid(spec.id,
                   absl::StrCat("DecodeAdd scale ", scale, " is not finite"));
  }
  absl::StatusOr<host::CheckedPayload> checked =
      host::CheckPayload(payload, spec.id, /*expected_any=*/false, d);
  if (!checked.ok()) return checked.status();
  absl::Status st = CheckDevicePointer(accum, d, "device_accum");
  if (!st.ok()) return st;
  const host::CheckedPayload& c = *checked;
  if (d == 0) return absl::OkStatus();
  const CodecId id = spec.id;
  if (id == CodecId::kTopK || id == CodecId::kThreshold ||
      id == CodecId::kRandomK) {
    // Scatter-add the k entries only: the CPU never touches the others, so
    // densifying would turn an accumulator's -0.0 into +0.0.
    const uint32_t* d_idx = nullptr;
    const float* d_val = nullptr;
    if (id == CodecId::kRandomK) {
      RandomKIndices(c.seed, d, c.k, &host_bitmap, &host_indices);
      st = indices.Reserve(4 * c.k);
      if (st.ok()) st = body.Reserve(4 * c.k);
      if (!st.ok()) return st;
      RETURN_IF_CUDA(k::ToDevice(indices.get(), host_indices.data(), 4 * c.k),
                     "copy to device");
      RETURN_IF_CUDA(k::ToDevice(body.get(), c.body.data() + 8, 4 * c.k),
                     "copy to device");
      d_idx = indices.get<uint32_t>();
      d_val = body.get<float>();
    } else {
      st = body.Reserve(c.body.size());
      if (!st.ok()) return st;
      RETURN_IF_CUDA(k::ToDevice(body.get(), c.body.data(), c.body.size()),
                     "copy to device");
      d_idx = body.get<uint32_t>();
      d_val = reinterpret_cast<const float*>(body.get<char>() + 4 * c.k);
    }
    RETURN_IF_CUDA(k::ScatterAdd(d_idx, d_val, c.k, scale, accum),
                   "scatter-add");
    RETURN_IF_CUDA(k::Synchronize(), "decode-add");
    return absl::OkStatus();
  }
  // Dense codecs: the CPU adds scale * D(p)_i to every element, and D(p)
  // is what Decode writes bit for bit, so decode then add in fp32.
  st = add.Reserve(4 * d);
  if (!st.ok()) return st;
  st = DecodeChecked(c, add.get<float>(), d);
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::Axpy(add.get<float>(), scale, accum, d), "accumulate");
  RETURN_IF_CUDA(k::Synchronize(), "decode-add");
  return absl::OkStatus();
}

bool DeviceAvailable() {
  int count = 0;
  return k::DeviceCount(&count) == 0 && count > 0;
}

DeviceCodec::DeviceCodec(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceCodec::~DeviceCodec() = default;

absl::StatusOr<std::unique_ptr<DeviceCodec>> DeviceCodec::Create(
    const CodecSpec& spec) {
  // The CPU factory validates the spec exactly as CreateCodec callers see.
  absl::StatusOr<std::unique_ptr<Codec>> cpu = CreateCodec(spec);
  if (!cpu.ok()) return cpu.status();
  if (!DeviceAvailable()) {
    return absl::FailedPreconditionError(
        "no CUDA device: cannot create a device codec");
  }
  auto impl = std::make_unique<Impl>();
  impl->spec = (*cpu)->spec();
  return std::unique_ptr<DeviceCodec>(new DeviceCodec(std::move(impl)));
}

const CodecSpec& DeviceCodec::spec() const { return impl_->spec; }

absl::Status DeviceCodec::Encode(const float* device_input, size_t n,
                                 const CodecContext& ctx,
                                 std::string* payload) {
  return impl_->Encode(device_input, n, ctx, payload);
}

absl::Status DeviceCodec::Decode(absl::string_view payload, float* device_out,
                                 size_t n) {
  return impl_->Decode(payload, device_out, n);
}

absl::Status DeviceCodec::DecodeAdd(absl::string_view payload, float scale,
                                    float* device_accum, size_t n) {
  return impl_->DecodeAdd(payload, scale, device_accum, n);
}

absl::Status EncodeOnDevice(const CodecSpec& spec, const float* device_input,
                            size_t n, const CodecContext& ctx,
                            std::string* payload) {
  payload->clear();
  absl::StatusOr<std::unique_ptr<DeviceCodec>> codec = DeviceCodec::Create(spec);
  if (!codec.ok()) return codec.status();
  return (*codec)->Encode(device_input, n, ctx, payload);
}

absl::Status DecodeOnDevice(absl::string_view payload, float* device_out,
                            size_t n) {
  absl::StatusOr<PayloadHeader> h = PeekPayloadHeader(payload);
  if (!h.ok()) return h.status();
  CodecSpec spec;
  spec.id = h->codec;  // parameters come from the header
  absl::StatusOr<std::unique_ptr<DeviceCodec>> codec = DeviceCodec::Create(spec);
  if (!codec.ok()) return codec.status();
  return (*codec)->Decode(payload, device_out, n);
}

absl::Status ErrorFeedbackOnDevice(DeviceCodec& codec, const float* device_grad,
                                   float* device_residual, size_t n,
                                   const CodecContext& ctx,
                                   std::string* payload) {
  payload->clear();
  absl::Status st = CheckDevicePointer(device_grad, n, "device_grad");
  if (st.ok()) st = CheckDevicePointer(device_residual, n, "device_residual");
  DeviceCodec::Impl& impl = *codec.impl_;
  if (st.ok()) st = impl.ef_c.Reserve(4 * n);
  if (st.ok()) st = impl.ef_d.Reserve(4 * n);
  if (!st.ok()) return st;
  float* c = impl.ef_c.get<float>();
  float* dec = impl.ef_d.get<float>();
  RETURN_IF_CUDA(k::Add(device_grad, device_residual, c, n), "g + e");
  st = impl.Encode(c, n, ctx, payload);
  if (st.ok()) st = impl.Decode(*payload, dec, n);
  if (!st.ok()) {
    payload->clear();
    return st;
  }
  RETURN_IF_CUDA(k::Subtract(c, dec, device_residual, n), "c - D(p)");
  RETURN_IF_CUDA(k::Synchronize(), "error feedback");
  return absl::OkStatus();
}

absl::Status DgcMomentumOnDevice(DeviceCodec& codec, float momentum,
                                 const float* device_grad, float* device_u,
                                 float* device_v, size_t n,
                                 const CodecContext& ctx,
                                 std::string* payload) {
  payload->clear();
  if (!std::isfinite(momentum)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DGC momentum ", momentum, " is not finite"));
  }
  absl::Status st = CheckDevicePointer(device_grad, n, "device_grad");
  if (st.ok()) st = CheckDevicePointer(device_u, n, "device_u");
  if (st.ok()) st = CheckDevicePointer(device_v, n, "device_v");
  DeviceCodec::Impl& impl = *codec.impl_;
  // Work on copies (next_u, next_v) so that a refused encode leaves u and v
  // as they were, as the CPU does.
  if (st.ok()) st = impl.dgc_u.Reserve(4 * n);
  if (st.ok()) st = impl.ef_c.Reserve(4 * n);
  if (st.ok()) st = impl.ef_d.Reserve(4 * n);
  if (!st.ok()) return st;
  float* next_u = impl.dgc_u.get<float>();
  float* next_v = impl.ef_c.get<float>();
  float* dec = impl.ef_d.get<float>();
  RETURN_IF_CUDA(k::DgcPrepare(device_grad, device_u, device_v, momentum,
                               next_u, next_v, n),
                 "u = m u + g; v = v + u");
  st = impl.Encode(next_v, n, ctx, payload);
  if (st.ok()) st = impl.Decode(*payload, dec, n);
  if (!st.ok()) {
    payload->clear();
    return st;
  }
  RETURN_IF_CUDA(k::DgcCommit(next_u, next_v, dec, device_u, device_v, n),
                 "v = v - D(p); u = 0 where sent");
  RETURN_IF_CUDA(k::Synchronize(), "DGC momentum correction");
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> DeviceCrc32c(const void* device_data, size_t bytes) {
  if (bytes == 0) return 0u;
  absl::Status st = CheckDevicePointer(device_data, bytes, "device_data");
  if (!st.ok()) return st;
  // Segments of at least 1 KiB, at most 16384 of them: enough threads to
  // fill the device for multi-MiB chunks, few enough that joining them on
  // the host (one 32-step multiply each) stays well under a millisecond.
  constexpr size_t kMinSegment = 1024, kMaxSegments = 16384;
  size_t segment = (bytes + kMaxSegments - 1) / kMaxSegments;
  if (segment < kMinSegment) segment = kMinSegment;
  const size_t segments = (bytes + segment - 1) / segment;
  // Per-thread scratch: the free function may be called from many threads.
  thread_local DeviceBuffer crcs;
  thread_local std::vector<uint32_t> host_crcs;
  st = crcs.Reserve(4 * segments);
  if (!st.ok()) return st;
  RETURN_IF_CUDA(k::Crc32cSegments(device_data, bytes, segment,
                                   crcs.get<uint32_t>()),
                 "CRC32C segments");
  host_crcs.resize(segments);
  RETURN_IF_CUDA(k::ToHost(host_crcs.data(), crcs.get(), 4 * segments),
                 "copy to host");
  const uint32_t shift = Crc32cShiftOperator(segment);
  uint32_t crc = host_crcs[0];
  for (size_t s = 1; s < segments; ++s) {
    const size_t len = std::min(segment, bytes - s * segment);
    crc = len == segment ? Crc32cCombineWithOperator(crc, host_crcs[s], shift)
                         : Crc32cCombine(crc, host_crcs[s], len);
  }
  return crc;
}

absl::Status ErrorFeedbackOnDevice(const CodecSpec& spec,
                                   const float* device_grad,
                                   float* device_residual, size_t n,
                                   const CodecContext& ctx,
                                   std::string* payload) {
  payload->clear();
  absl::StatusOr<std::unique_ptr<DeviceCodec>> codec = DeviceCodec::Create(spec);
  if (!codec.ok()) return codec.status();
  return ErrorFeedbackOnDevice(**codec, device_grad, device_residual, n, ctx,
                               payload);
}

}  // namespace cuda
}  // namespace harrier
