// The pull codec paired with each push codec: the table, "paired" resolved
// against a push codec, and each pair run as the shard runs it (a view that
// advances by what the worker decodes) so that the view reaches the
// parameters while the pair's replies stay smaller than dense ones.

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "common/codec/pull_pairing.h"
#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace {

using testing::MakeCodec;
using testing::RandomGradient;

CodecSpec Spec(const std::string& text) {
  auto spec = CodecSpec::Parse(text);
  INFO(text << ": " << spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

TEST_CASE("every push codec has its pull pair", "[pull_pairing]") {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"none", "none"},
      {"fp16", "fp16"},
      {"bf16", "bf16"},
      {"topk:ratio=0.01", "topk:ratio=0.01"},
      {"topk:ratio=0.05", "topk:ratio=0.05"},
      {"randomk:ratio=0.02,scale=0", "topk:ratio=0.02"},
      {"randomk:ratio=0.1,seed=7", "topk:ratio=0.1"},
      {"threshold:sample=0.01,ratio=0.03,momentum=0.9", "topk:ratio=0.03"},
      {"threshold:tau=0.5", "topk:ratio=0.01"},
      {"qsgd:levels=7,bucket=512", "qsgd:levels=7,bucket=49"},
      {"qsgd:levels=127,bucket=512", "qsgd:levels=127,bucket=512"},
      {"qsgd:levels=16,bucket=64", "qsgd:levels=16,bucket=64"},
      {"terngrad", "efsign"},
      {"terngrad:clip=2.5", "efsign"},
      {"sign", "efsign"},
      {"sign:scale=1", "efsign"},
      {"efsign", "efsign"},
      {"signum", "efsign"},
      {"onebit", "onebit"},
      {"powersgd:rank=2", "powersgd:rank=2"},
      {"powersgd:rank=4,cols=64", "powersgd:rank=4"},
  };
  for (const auto& [push, pull] : pairs) {
    INFO(push);
    CHECK(PairedPullSpec(Spec(push)) == Spec(pull));
    auto resolved = ResolvePullCodec(push, "paired");
    REQUIRE(resolved.ok());
    CHECK(Spec(*resolved) == Spec(pull));
  }
  // Every codec's pair builds.
  for (const std::string& push : testing::AllSpecs()) {
    INFO(push);
    CHECK(CreateCodec(PairedPullSpec(Spec(push))).ok());
  }
}

TEST_CASE("a pull codec other than paired is kept as given", "[pull_pairing]") {
  CHECK(*ResolvePullCodec("topk:ratio=0.01", "fp16") == "fp16");
  CHECK(*ResolvePullCodec("topk:ratio=0.01", "none") == "none");
  CHECK(*ResolvePullCodec("fp16", "") == "");
  // Not checked here: the caller parses it as any other spec.
  CHECK(*ResolvePullCodec("fp16", "nonsense") == "nonsense");
  auto bad = ResolvePullCodec("topk:ratio=2", "paired");
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()).find("paired") != std::string::npos);
}

// What a worker's view of one 64 x 64 chunk does over `steps` pulls, as
// server/pull_views.cc makes them: the first reply dense, then each reply
// C(parameters - view) with the view advanced by its decode. The parameters
// move like training for the first `moving` pulls (steps of 1 % of their
// scale) and then stay. Returns the view's final error relative to how far
// the parameters moved, and the mean reply against a dense one.
struct ViewRun {
  double final_error = 0;
  double bytes_ratio = 0;
};

ViewRun RunView(const std::string& pull_spec, int moving, int steps) {
  constexpr size_t kElements = 64 * 64;
  std::vector<float> params = RandomGradient(kElements, 11);
  const std::vector<float> start = params;
  std::vector<float> view = params;  // the dense first reply
  auto codec = MakeCodec(pull_spec);
  if (pull_spec.rfind("powersgd", 0) == 0) {
    // The shard factors a chunk as its tensor's rows (pull_views.cc).
    CodecSpec spec = Spec(pull_spec);
    spec.cols = 64;
    codec = std::move(*CreateCodec(spec));
  }
  std::vector<float> change(kElements), decoded(kElements);
  double bytes = 0;
  for (int step = 1; step <= steps; ++step) {
    if (step <= moving) {
      const std::vector<float> gradient = RandomGradient(kElements, 100 + step);
      for (size_t i = 0; i < kElements; ++i) params[i] -= 0.01f * gradient[i];
    }
    for (size_t i = 0; i < kElements; ++i) change[i] = params[i] - view[i];
    std::string payload;
    REQUIRE(codec->Encode(change, CodecContext{static_cast<uint64_t>(step)}, &payload).ok());
    REQUIRE(codec->Decode(payload, absl::MakeSpan(decoded)).ok());
    for (size_t i = 0; i < kElements; ++i) view[i] += decoded[i];
    bytes += static_cast<double>(payload.size());
  }
  double error = 0, moved = 0;
  for (size_t i = 0; i < kElements; ++i) {
    error += static_cast<double>(params[i] - view[i]) * (params[i] - view[i]);
    moved += static_cast<double>(params[i] - start[i]) * (params[i] - start[i]);
  }
  return {std::sqrt(error / moved), bytes / steps / (kCodecHeaderBytes + 4.0 * kElements)};
}

TEST_CASE("each pair brings a worker's view to the parameters in fewer bytes",
          "[pull_pairing]") {
  // push codec, the most its pair's mean reply may be of a dense one.
  const std::vector<std::pair<std::string, double>> cases = {
      {"fp16", 0.51},           {"topk:ratio=0.01", 0.03},   {"randomk:ratio=0.01,scale=0", 0.03},
      {"threshold:sample=0.01,ratio=0.01", 0.03},            {"qsgd:levels=7,bucket=512", 0.17},
      {"qsgd:levels=127,bucket=512", 0.27},                  {"terngrad", 0.04},
      {"sign:scale=1", 0.04},   {"efsign", 0.04},            {"signum", 0.04},
      {"onebit", 0.04},         {"powersgd:rank=2", 0.07},
  };
  for (const auto& [push, most_bytes] : cases) {
    const std::string pull = PairedPullSpec(Spec(push)).ToString();
    INFO(push << " pulls with " << pull);
    // 20 pulls while training moves the parameters, then as many as a
    // 1 % top-k needs to send every element once.
    const ViewRun run = RunView(pull, 20, 20 + 150);
    CHECK(run.final_error < 0.05);
    CHECK(run.bytes_ratio <= most_bytes);
  }
}

TEST_CASE("an unbiased random codec as its own pull pair lets the view run away",
          "[pull_pairing]") {
  // Why QSGD's pair has smaller buckets: with 512-element buckets at 7
  // levels the view's error grows with every pull.
  const ViewRun run = RunView("qsgd:levels=7,bucket=512", 20, 60);
  CHECK(run.final_error > 10.0);
}

}  // namespace
}  // namespace harrier
