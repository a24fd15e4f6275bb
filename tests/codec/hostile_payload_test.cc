// Conformance: every codec refuses malformed payloads with InvalidArgument
// and leaves the output untouched, for both Decode and DecodeAdd.

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace {

using testing::MakeCodec;
using testing::MustEncode;
using testing::RandomGradient;

constexpr size_t kD = 100;

// Decode and DecodeAdd both refuse and the buffers keep their sentinel.
void ExpectRefused(const Codec& codec, const std::string& payload, size_t d,
                   const char* what) {
  INFO(what);
  std::vector<float> out(d, 42.0f);
  absl::Status st = codec.Decode(payload, absl::MakeSpan(out));
  INFO(st.ToString());
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(!st.message().empty());
  for (float v : out) REQUIRE(v == 42.0f);
  st = codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(out));
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  for (float v : out) REQUIRE(v == 42.0f);
}

template <typename T>
std::string Patched(std::string p, size_t offset, T value) {
  REQUIRE(offset + sizeof(T) <= p.size());
  std::memcpy(&p[offset], &value, sizeof(T));
  return p;
}

TEST_CASE("generic header and size attacks", "[hostile]") {
  for (const std::string& spec : testing::AllSpecs()) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    std::string good = MustEncode(*codec, RandomGradient(kD, 3));
    ExpectRefused(*codec, good.substr(0, good.size() - 1), kD, "truncated body");
    ExpectRefused(*codec, good.substr(0, 10), kD, "truncated header");
    ExpectRefused(*codec, "", kD, "empty");
    ExpectRefused(*codec, good + '\0', kD, "trailing byte");
    ExpectRefused(*codec, good, kD + 1, "count mismatch (bigger out)");
    ExpectRefused(*codec, good, kD - 1, "count mismatch (smaller out)");
    ExpectRefused(*codec, Patched<uint64_t>(good, 8, kD + 8), kD,
                  "header element count != out.size()");
    ExpectRefused(*codec, Patched<uint32_t>(good, 0, 0xdeadbeef), kD, "magic");
    ExpectRefused(*codec, Patched<uint8_t>(good, 5, 9), kD, "version");
    ExpectRefused(*codec, Patched<uint16_t>(good, 6, 1), kD, "reserved");
    ExpectRefused(*codec, Patched<uint8_t>(good, 4, 200), kD, "unknown codec id");
    // A valid payload of another codec.
    std::string other_spec = spec == "none" ? "fp16" : "none";
    auto other = MakeCodec(other_spec);
    ExpectRefused(*codec, MustEncode(*other, RandomGradient(kD, 3)), kD,
                  "codec id mismatch");
    // The good payload still decodes after all that.
    std::vector<float> out(kD);
    CHECK(codec->Decode(good, absl::MakeSpan(out)).ok());
  }
}

TEST_CASE("sparse index attacks", "[hostile]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* spec : {"topk:ratio=0.1", "threshold:tau=0.5"}) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    std::string good = MustEncode(*codec, RandomGradient(kD, 3));
    const uint32_t k = PeekPayloadHeader(good)->param0;
    REQUIRE(k >= 2);
    const size_t idx = 24, val = 24 + 4 * k;
    ExpectRefused(*codec, Patched<uint32_t>(good, idx + 4 * (k - 1), kD), kD,
                  "index out of range");
    ExpectRefused(*codec, Patched<uint32_t>(good, idx + 4 * (k - 1), 0xffffffffu),
                  kD, "index 2^32-1");
    uint32_t first;
    std::memcpy(&first, good.data() + idx, 4);
    ExpectRefused(*codec, Patched<uint32_t>(good, idx + 4, first), kD,
                  "repeated index");
    ExpectRefused(*codec, Patched<uint32_t>(good, idx, first + 1000), kD,
                  "decreasing index");
    ExpectRefused(*codec, Patched<float>(good, val, nan), kD, "NaN value");
    ExpectRefused(*codec, Patched<float>(good, val + 4, INFINITY), kD, "Inf value");
    ExpectRefused(*codec, Patched<uint32_t>(good, 16, kD + 1), kD, "k > d");
    ExpectRefused(*codec, Patched<uint32_t>(good, 20, 1), kD, "param1");
  }
  auto randomk = MakeCodec("randomk:ratio=0.1");
  std::string good = MustEncode(*randomk, RandomGradient(kD, 3));
  ExpectRefused(*randomk, Patched<float>(good, 24 + 8, nan), kD, "randomk NaN");
  ExpectRefused(*randomk, Patched<uint32_t>(good, 16, kD + 1), kD, "randomk k > d");
  ExpectRefused(*randomk, Patched<uint32_t>(good, 16, 0), kD, "randomk k = 0");
  auto topk = MakeCodec("topk:ratio=0.1");
  good = MustEncode(*topk, RandomGradient(kD, 3));
  ExpectRefused(*topk, Patched<uint32_t>(good, 16, 0).substr(0, 24), kD, "topk k = 0");
}

TEST_CASE("scale and code attacks", "[hostile]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    const char* spec;
    size_t offset;  // first float after the header
  } scaled[] = {{"sign:scale=1", 24}, {"efsign", 24}, {"onebit", 24},
                {"onebit", 28},       {"terngrad", 24}, {"qsgd:levels=16,bucket=64", 24},
                {"qsgd:levels=16,bucket=64", 28}, {"powersgd:rank=2", 24},
                {"none", 24 + 4 * 50}};
  for (const Case& c : scaled) {
    INFO(c.spec << " @" << c.offset);
    auto codec = MakeCodec(c.spec);
    std::string good = MustEncode(*codec, RandomGradient(kD, 3));
    ExpectRefused(*codec, Patched<float>(good, c.offset, nan), kD, "NaN scale");
    ExpectRefused(*codec, Patched<float>(good, c.offset, -INFINITY), kD, "Inf scale");
  }
  for (const char* spec : {"sign:scale=1", "efsign", "terngrad", "qsgd:levels=16,bucket=64"}) {
    auto codec = MakeCodec(spec);
    ExpectRefused(*codec, Patched<float>(MustEncode(*codec, RandomGradient(kD, 3)), 24, -1.0f),
                  kD, "negative scale/norm");
  }
  // fp16 / bf16 Inf and NaN bit patterns.
  auto fp16 = MakeCodec("fp16");
  ExpectRefused(*fp16, Patched<uint16_t>(MustEncode(*fp16, RandomGradient(kD, 3)), 30, 0x7c00),
                kD, "fp16 Inf");
  auto bf16 = MakeCodec("bf16");
  ExpectRefused(*bf16, Patched<uint16_t>(MustEncode(*bf16, RandomGradient(kD, 3)), 30, 0xffc0),
                kD, "bf16 NaN");
  // Mask padding bits (d = 100: last byte uses 4 bits).
  for (const char* spec : {"sign", "signum"}) {
    auto codec = MakeCodec(spec);
    std::string p = MustEncode(*codec, RandomGradient(kD, 3));
    p.back() = static_cast<char>(p.back() | 0x80);
    ExpectRefused(*codec, p, kD, "mask padding");
  }
  // TernGrad code 3 and QSGD level > s.
  auto tern = MakeCodec("terngrad");
  ExpectRefused(*tern, Patched<uint8_t>(MustEncode(*tern, RandomGradient(kD, 3)), 28, 0xff),
                kD, "terngrad code 3");
  auto qsgd = MakeCodec("qsgd:levels=16,bucket=64");
  // 6-bit codes: 0x3e in the first code is level 31 > 16.
  ExpectRefused(*qsgd, Patched<uint8_t>(MustEncode(*qsgd, RandomGradient(kD, 3)), 32, 0x3e),
                kD, "qsgd level > s");
  // PowerSGD shape lies.
  auto psgd = MakeCodec("powersgd:rank=2");
  std::string p = MustEncode(*psgd, RandomGradient(kD, 3));
  ExpectRefused(*psgd, Patched<uint32_t>(p, 20, 3), kD, "m does not divide d");
  ExpectRefused(*psgd, Patched<uint32_t>(p, 16, 11), kD, "rank > min(m, n)");
}

}  // namespace
}  // namespace harrier
