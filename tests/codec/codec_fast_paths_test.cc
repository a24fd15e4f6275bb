// The fast paths of the CPU codecs (vectorised, threaded): payloads of the
// deterministic codecs are the bytes the scalar reference produced before
// them (golden hashes), payloads and decodes do not depend on the thread
// count, and QSGD/TernGrad draw the CUDA twins' counter-based uniforms.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/codec.h"
#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace testing {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// Above the codecs' threading threshold, odd so that every tail path runs.
constexpr size_t kLarge = 1000003;

// Gradients with many exact ties in abs value (top-k's tie rule) and zeros
// (sign(0), QSGD level 0).
std::vector<float> TiedGradient(size_t d, uint64_t seed) {
  std::vector<float> g = RandomGradient(d, seed);
  for (float& v : g) v = std::round(v * 8.0f) / 8.0f;
  return g;
}

const std::vector<std::string> kDeterministic = {
    "none", "fp16", "bf16", "topk:ratio=0.01", "topk:ratio=0.3",
    "randomk:ratio=0.01,seed=7", "threshold:tau=1.5",
    "threshold:sample=0.01,ratio=0.01", "sign", "sign:scale=1", "efsign",
    "signum", "onebit", "powersgd:rank=2", "powersgd:rank=3,cols=1009"};

std::vector<std::pair<std::string, std::vector<float>>> Inputs() {
  return {{"normal4099", RandomGradient(4099, 11)},
          {"normal1M", RandomGradient(kLarge, 12)},
          {"tied1M", TiedGradient(kLarge, 13)},
          {"normal2018060", RandomGradient(2018060, 14)}};
}

// FNV-1a of each payload as the scalar, single-threaded reference codecs
// wrote it (captured from the code before the fast paths). The wire format
// must not change: the CUDA twins and the fuzzers' corpora depend on it.
const std::map<std::string, uint64_t>& Golden() {
  static const auto* golden = new std::map<std::string, uint64_t>{
      {"none@normal4099", 0xaf2c4178bcf8e4d2ULL},
      {"fp16@normal4099", 0xea557e1da036cf60ULL},
      {"bf16@normal4099", 0x4647842ca313d9a1ULL},
      {"topk:ratio=0.01@normal4099", 0xc22af499b1f4e83fULL},
      {"topk:ratio=0.3@normal4099", 0xb8169db069089e10ULL},
      {"randomk:ratio=0.01,seed=7@normal4099", 0x7ce0a1f9fa8e47cbULL},
      {"threshold:tau=1.5@normal4099", 0x70059fede0d04d67ULL},
      {"threshold:sample=0.01,ratio=0.01@normal4099", 0x37dad9dbbccc0550ULL},
      {"sign@normal4099", 0x389cddc4d01055c4ULL},
      {"sign:scale=1@normal4099", 0x41d38ecbc10b1a6fULL},
      {"efsign@normal4099", 0xab7fc2be73a3c3cbULL},
      {"signum@normal4099", 0x62c578861b60f7c2ULL},
      {"onebit@normal4099", 0x3250ec6cde48eda0ULL},
      {"powersgd:rank=2@normal4099", 0x514c30b364b91b9eULL},
      {"powersgd:rank=3,cols=1009@normal4099", 0x514c30b364b91b9eULL},
      {"none@normal1M", 0xf906079af98b3bfbULL},
      {"fp16@normal1M", 0xd5809f7975ee2b5bULL},
      {"bf16@normal1M", 0x6f53f0c26406a309ULL},
      {"topk:ratio=0.01@normal1M", 0x2904cfc9b2478c68ULL},
      {"topk:ratio=0.3@normal1M", 0x6f9cf5d8dd1fd679ULL},
      {"randomk:ratio=0.01,seed=7@normal1M", 0x4140bcd29a8c1d0eULL},
      {"threshold:tau=1.5@normal1M", 0x7183272ae979ec49ULL},
      {"threshold:sample=0.01,ratio=0.01@normal1M", 0x28e263a4b31b56fcULL},
      {"sign@normal1M", 0x59d88be7ae30a954ULL},
      {"sign:scale=1@normal1M", 0xa693047f23d33e05ULL},
      {"efsign@normal1M", 0x14d47b5c3e795d4dULL},
      {"signum@normal1M", 0x825ea5c51594a8e2ULL},
      {"onebit@normal1M", 0x582d0699f2a896e3ULL},
      {"powersgd:rank=2@normal1M", 0x80e86257de8b8877ULL},
      {"powersgd:rank=3,cols=1009@normal1M", 0x80e86257de8b8877ULL},
      {"none@tied1M", 0x979713a44eb65dfdULL},
      {"fp16@tied1M", 0xfc02bcccf4e0b9b4ULL},
      {"bf16@tied1M", 0x7f10ba2e0213c8d3ULL},
      {"topk:ratio=0.01@tied1M", 0xff53f27374da318bULL},
      {"topk:ratio=0.3@tied1M", 0xc2d88a76aa114156ULL},
      {"randomk:ratio=0.01,seed=7@tied1M", 0x07e7db9633637198ULL},
      {"threshold:tau=1.5@tied1M", 0xd6f88a837ffff480ULL},
      {"threshold:sample=0.01,ratio=0.01@tied1M", 0xaab7242c4f8b7bb7ULL},
      {"sign@tied1M", 0x36b6e3d7d3b5e117ULL},
      {"sign:scale=1@tied1M", 0xb9aec4d76290502dULL},
      {"efsign@tied1M", 0xa57c76342f0e1b95ULL},
      {"signum@tied1M", 0x72072b5253bad6fdULL},
      {"onebit@tied1M", 0x51746f60f0c66aefULL},
      {"powersgd:rank=2@tied1M", 0xff9f7a2f321f5fc1ULL},
      {"powersgd:rank=3,cols=1009@tied1M", 0xff9f7a2f321f5fc1ULL},
      {"none@normal2018060", 0x48b58b14098176b4ULL},
      {"fp16@normal2018060", 0x99a5ba7f123765f6ULL},
      {"bf16@normal2018060", 0xb3863ddbcc18ee17ULL},
      {"topk:ratio=0.01@normal2018060", 0xa3ab58af4970991fULL},
      {"topk:ratio=0.3@normal2018060", 0xfafcf34239209249ULL},
      {"randomk:ratio=0.01,seed=7@normal2018060", 0xea986b06f194226cULL},
      {"threshold:tau=1.5@normal2018060", 0x8c1c8cc42c2b61e9ULL},
      {"threshold:sample=0.01,ratio=0.01@normal2018060", 0x75d87e055a959467ULL},
      {"sign@normal2018060", 0xe150f7637a6562d7ULL},
      {"sign:scale=1@normal2018060", 0x8a6d7d2cb55fabfeULL},
      {"efsign@normal2018060", 0xfd62d6c918b92c8aULL},
      {"signum@normal2018060", 0xea8454a75d3cdc5dULL},
      {"onebit@normal2018060", 0x24d090ed5e4cf15bULL},
      {"powersgd:rank=2@normal2018060", 0x3cead8d798969364ULL},
      {"powersgd:rank=3,cols=1009@normal2018060", 0x872d25d67499fec8ULL},
  };
  return *golden;
}

TEST_CASE("deterministic payloads are the reference bytes") {
  bool missing = false;
  for (const auto& [name, g] : Inputs()) {
    for (const std::string& text : kDeterministic) {
      std::unique_ptr<Codec> codec = MakeCodec(text);
      std::string payload;
      REQUIRE(codec->Encode(g, CodecContext{77}, &payload).ok());
      // Twice: PowerSGD's second call runs from its warm start.
      REQUIRE(codec->Encode(g, CodecContext{78}, &payload).ok());
      const std::string key = text + "@" + name;
      const uint64_t h = Fnv1a(payload);
      auto it = Golden().find(key);
      if (it == Golden().end()) {
        std::printf("      {\"%s\", 0x%016llxULL},\n", key.c_str(),
                    static_cast<unsigned long long>(h));
        missing = true;
        continue;
      }
      INFO(key);
      CHECK(h == it->second);
    }
  }
  CHECK_FALSE(missing);
}

// Restores the default thread count and SIMD choice when a test ends.
struct ThreadsGuard {
  explicit ThreadsGuard(int n, bool scalar = false) {
    SetCodecThreadsForTesting(n);
    SetCodecScalarForTesting(scalar);
  }
  ~ThreadsGuard() {
    SetCodecThreadsForTesting(0);
    SetCodecScalarForTesting(false);
  }
};

// Threads 1 with the baseline loops is the reference; the AVX2 loops (where
// the CPU has them) and 2, 3 and 8 threads must give the same bytes.
TEST_CASE("payloads and decodes do not depend on the thread count or SIMD") {
  std::vector<std::string> specs = AllSpecs();
  specs.push_back("qsgd:levels=16,bucket=512");
  specs.push_back("qsgd:levels=65535,bucket=1000");
  specs.push_back("topk:ratio=0.01");
  specs.push_back("powersgd:rank=3,cols=1009");
  const std::vector<float> g = TiedGradient(2018060, 21);
  const std::vector<float> base = RandomGradient(g.size(), 22);
  for (const std::string& text : specs) {
    INFO(text);
    std::string reference;
    std::vector<float> decoded, added;
    for (int variant = 0; variant < 5; ++variant) {
      const int threads = variant == 0 ? 1 : variant == 1 ? 1 : variant == 2 ? 2
                          : variant == 3 ? 3 : 8;
      ThreadsGuard guard(threads, /*scalar=*/variant == 0 || variant == 3);
      std::unique_ptr<Codec> codec = MakeCodec(text);
      std::string payload;
      REQUIRE(codec->Encode(g, CodecContext{5}, &payload).ok());
      std::vector<float> out(g.size(), 0.0f), acc = base;
      REQUIRE(codec->Decode(payload, absl::MakeSpan(out)).ok());
      REQUIRE(codec->DecodeAdd(payload, 0.5f, absl::MakeSpan(acc)).ok());
      INFO("threads " << threads << (variant == 0 || variant == 3 ? " baseline" : ""));
      if (variant == 0) {
        reference = payload;
        decoded = out;
        added = acc;
        continue;
      }
      CHECK(payload == reference);
      CHECK(std::memcmp(out.data(), decoded.data(), 4 * out.size()) == 0);
      CHECK(std::memcmp(acc.data(), added.data(), 4 * acc.size()) == 0);
    }
  }
}

// The CUDA twins' uniforms (cuda/README.md, "CPU equality"), written out
// here from the formula rather than taken from the codec.
uint64_t RefMix64(uint64_t a, uint64_t b) {
  uint64_t state = a ^ (b * 0x9e3779b97f4a7c15ULL);
  auto split = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  split();
  return split();
}
float RefUniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(RefMix64(seed, i) >> 40) * 0x1p-24f;
}

void PutBits(std::string* out, uint64_t* bitpos, uint32_t v, int bits) {
  for (int b = 0; b < bits; ++b, ++*bitpos) {
    if ((v >> b) & 1) (*out)[*bitpos / 8] |= static_cast<char>(1 << (*bitpos % 8));
  }
}

// QSGD body as QsgdEncodeKernel writes it (scalar, element by element).
std::string RefQsgdBody(const std::vector<float>& x, uint32_t s, size_t bucket,
                        uint64_t seed) {
  const size_t d = x.size(), buckets = (d + bucket - 1) / bucket;
  const int bits = 1 + (32 - __builtin_clz(s));
  std::string body(4 * buckets + (d * bits + 7) / 8, '\0');
  std::vector<float> norms(buckets);
  for (size_t b = 0; b < buckets; ++b) {
    double sq = 0.0;
    for (size_t i = b * bucket; i < std::min(d, (b + 1) * bucket); ++i) {
      sq += static_cast<double>(x[i]) * x[i];
    }
    norms[b] = static_cast<float>(std::sqrt(sq));
    std::memcpy(&body[4 * b], &norms[b], 4);
  }
  uint64_t pos = 8 * 4 * buckets;
  for (size_t i = 0; i < d; ++i) {
    const float unit = norms[i / bucket] / static_cast<float>(s);
    uint32_t level = 0;
    if (unit > 0.0f) {
      double r = std::fabs(static_cast<double>(x[i])) / static_cast<double>(unit);
      double floor_r = std::floor(r);
      level = static_cast<uint32_t>(floor_r < s ? floor_r : s);
      if (level < s && static_cast<double>(RefUniform(seed, i)) < r - floor_r) {
        ++level;
      }
    }
    uint32_t negative = (level > 0 && x[i] < 0.0f) ? 1 : 0;
    PutBits(&body, &pos, (level << 1) | negative, bits);
  }
  return body;
}

// TernGrad body (no clipping) as TernEncodeKernel writes it.
std::string RefTernBody(const std::vector<float>& x, uint64_t seed) {
  const size_t d = x.size();
  float max_abs = 0.0f;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(v));
  std::string body(4 + (d + 3) / 4, '\0');
  std::memcpy(&body[0], &max_abs, 4);
  uint64_t pos = 32;
  for (size_t i = 0; i < d; ++i) {
    uint32_t code = 0;
    if (max_abs > 0.0f && RefUniform(seed, i) < std::fabs(x[i]) / max_abs) {
      code = x[i] < 0.0f ? 2 : 1;
    }
    PutBits(&body, &pos, code, 2);
  }
  return body;
}

TEST_CASE("qsgd and terngrad draw the CUDA twins' counter-based uniforms") {
  for (bool scalar : {false, true}) {
  ThreadsGuard guard(0, scalar);
  for (size_t d : {size_t{1}, size_t{77}, size_t{4099}, kLarge}) {
    INFO("d = " << d);
    std::vector<float> g = TiedGradient(d, 31 + d);
    if (d > 100) std::fill(g.begin() + 64, g.begin() + 1100, 0.0f);  // zero buckets
    for (uint64_t seed : {uint64_t{1}, uint64_t{0x123456789abcdefULL}}) {
      std::unique_ptr<Codec> q = MakeCodec("qsgd:levels=16,bucket=512");
      std::string payload;
      REQUIRE(q->Encode(g, CodecContext{seed}, &payload).ok());
      CHECK(payload.substr(kCodecHeaderBytes) == RefQsgdBody(g, 16, 512, seed));
      std::unique_ptr<Codec> q3 = MakeCodec("qsgd:levels=3,bucket=64");
      REQUIRE(q3->Encode(g, CodecContext{seed}, &payload).ok());
      CHECK(payload.substr(kCodecHeaderBytes) == RefQsgdBody(g, 3, 64, seed));
      // 11- and 17-bit codes: the 128-bit group and the bit-by-bit paths.
      std::unique_ptr<Codec> q11 = MakeCodec("qsgd:levels=1000,bucket=100");
      REQUIRE(q11->Encode(g, CodecContext{seed}, &payload).ok());
      CHECK(payload.substr(kCodecHeaderBytes) == RefQsgdBody(g, 1000, 100, seed));
      std::unique_ptr<Codec> q17 = MakeCodec("qsgd:levels=65535,bucket=512");
      REQUIRE(q17->Encode(g, CodecContext{seed}, &payload).ok());
      CHECK(payload.substr(kCodecHeaderBytes) == RefQsgdBody(g, 65535, 512, seed));
      std::unique_ptr<Codec> t = MakeCodec("terngrad");
      REQUIRE(t->Encode(g, CodecContext{seed}, &payload).ok());
      CHECK(payload.substr(kCodecHeaderBytes) == RefTernBody(g, seed));
    }
  }
  }
}

}  // namespace
}  // namespace testing
}  // namespace harrier
