// Helpers shared by the codec tests.

#ifndef HARRIER_TESTS_CODEC_CODEC_TEST_UTIL_H_
#define HARRIER_TESTS_CODEC_CODEC_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/codec.h"

namespace harrier {
namespace testing {

// Every codec with a representative parameter set.
inline std::vector<std::string> AllSpecs() {
  return {"none",
          "fp16",
          "bf16",
          "topk:ratio=0.1",
          "randomk:ratio=0.1,seed=7",
          "randomk:ratio=0.1,scale=0",
          "threshold:tau=0.5",
          "threshold:sample=0.5,ratio=0.1",
          "qsgd:levels=16,bucket=64",
          "terngrad",
          "terngrad:clip=2.5",
          "sign",
          "sign:scale=1",
          "efsign",
          "signum",
          "onebit",
          "powersgd:rank=2"};
}

inline std::vector<float> RandomGradient(size_t d, uint64_t seed,
                                         float stddev = 1.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> g(d);
  for (float& v : g) v = dist(gen);
  return g;
}

inline std::unique_ptr<Codec> MakeCodec(const std::string& text) {
  absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
  INFO(text << ": " << spec.status().ToString());
  REQUIRE(spec.ok());
  absl::StatusOr<std::unique_ptr<Codec>> codec = CreateCodec(*spec);
  REQUIRE(codec.ok());
  return std::move(*codec);
}

inline std::string MustEncode(Codec& codec, const std::vector<float>& g,
                              uint64_t seed = 1) {
  std::string payload;
  absl::Status st = codec.Encode(g, CodecContext{seed}, &payload);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return payload;
}

inline std::vector<float> MustDecode(const Codec& codec,
                                     const std::string& payload, size_t d) {
  std::vector<float> out(d, -7.0f);
  absl::Status st = codec.Decode(payload, absl::MakeSpan(out));
  INFO(st.ToString());
  REQUIRE(st.ok());
  return out;
}

inline double Norm2Sq(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

inline double DiffNorm2Sq(const std::vector<float>& a,
                          const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double t = static_cast<double>(a[i]) - b[i];
    s += t * t;
  }
  return s;
}

inline uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

inline bool BitwiseEqual(const std::vector<float>& a,
                         const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

}  // namespace testing
}  // namespace harrier

#endif  // HARRIER_TESTS_CODEC_CODEC_TEST_UTIL_H_
