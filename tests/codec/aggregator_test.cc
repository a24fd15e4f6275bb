// Server-side aggregation: averages for decode-first and linear codecs,
// majority vote for sign and signum, and refusal without side effects.

#include <vector>

#include <catch2/catch.hpp>

#include "tests/codec/codec_test_util.h"

namespace harrier {
namespace {

using testing::MakeCodec;
using testing::MustDecode;
using testing::MustEncode;
using testing::RandomGradient;

std::unique_ptr<Aggregator> MakeAggregator(const std::string& spec, size_t d) {
  absl::StatusOr<std::unique_ptr<Aggregator>> agg =
      Aggregator::Create(*CodecSpec::Parse(spec), d);
  REQUIRE(agg.ok());
  return std::move(*agg);
}

TEST_CASE("aggregate of payloads equals the average of their decodes",
          "[aggregator]") {
  const size_t d = 333;
  for (const std::string& spec : testing::AllSpecs()) {
    auto probe = MakeCodec(spec);
    if (probe->IsMajorityVote()) continue;
    INFO(spec);
    auto agg = MakeAggregator(spec, d);
    std::vector<float> sum(d, 0.0f);
    for (uint32_t rank = 0; rank < 3; ++rank) {
      auto codec = MakeCodec(spec);
      std::string p = MustEncode(*codec, RandomGradient(d, 100 + rank),
                                 DeriveSeed("k", 0, 1, rank, 0));
      std::vector<float> dec = MustDecode(*codec, p, d);
      for (size_t i = 0; i < d; ++i) sum[i] += dec[i];
      REQUIRE(agg->Add(p).ok());
    }
    CHECK(agg->count() == 3);
    std::vector<float> out(d);
    REQUIRE(agg->Finish(absl::MakeSpan(out)).ok());
    for (size_t i = 0; i < d; ++i) sum[i] /= 3.0f;
    CHECK(testing::BitwiseEqual(out, sum));
    agg->Reset();
    CHECK(agg->count() == 0);
    CHECK(agg->Finish(absl::MakeSpan(out)).code() ==
          absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("codec none aggregates to the plain average (baseline)",
          "[aggregator][degenerate]") {
  auto agg = MakeAggregator("none", 3);
  auto codec = MakeCodec("none");
  REQUIRE(agg->Add(MustEncode(*codec, {1, 2, 3})).ok());
  REQUIRE(agg->Add(MustEncode(*codec, {3, 4, -3})).ok());
  std::vector<float> out(3);
  REQUIRE(agg->Finish(absl::MakeSpan(out)).ok());
  CHECK(out == std::vector<float>{2, 3, 0});
}

TEST_CASE("majority vote: (+,+,-) -> +, never an average of signs",
          "[aggregator][vote]") {
  for (const char* spec : {"sign", "signum"}) {
    INFO(spec);
    auto codec = MakeCodec(spec);
    REQUIRE(codec->IsMajorityVote());
    auto agg = MakeAggregator(spec, 3);
    REQUIRE(agg->Add(MustEncode(*codec, {1.0f, -1.0f, 5.0f})).ok());
    REQUIRE(agg->Add(MustEncode(*codec, {2.0f, -3.0f, -1.0f})).ok());
    REQUIRE(agg->Add(MustEncode(*codec, {-4.0f, 2.0f, -2.0f})).ok());
    std::vector<float> out(3);
    REQUIRE(agg->Finish(absl::MakeSpan(out)).ok());
    CHECK(out == std::vector<float>{1.0f, -1.0f, -1.0f});  // not 1/3
  }
}

TEST_CASE("scaled sign vote uses the mean of the scales; ties give 0",
          "[aggregator][vote]") {
  auto codec = MakeCodec("sign:scale=1");
  auto agg = MakeAggregator("sign:scale=1", 2);
  REQUIRE(agg->Add(MustEncode(*codec, {1.0f, 3.0f})).ok());    // scale 2
  REQUIRE(agg->Add(MustEncode(*codec, {4.0f, -4.0f})).ok());   // scale 4
  std::vector<float> out(2);
  REQUIRE(agg->Finish(absl::MakeSpan(out)).ok());
  CHECK(out == std::vector<float>{3.0f, 0.0f});
}

TEST_CASE("efsign and onebit are averaged, not voted", "[aggregator]") {
  CHECK_FALSE(MakeCodec("efsign")->IsMajorityVote());
  CHECK_FALSE(MakeCodec("onebit")->IsMajorityVote());
  auto codec = MakeCodec("efsign");
  auto agg = MakeAggregator("efsign", 2);
  REQUIRE(agg->Add(MustEncode(*codec, {1.0f, 1.0f})).ok());   // decodes {1, 1}
  REQUIRE(agg->Add(MustEncode(*codec, {-3.0f, 3.0f})).ok());  // {-3, 3}
  std::vector<float> out(2);
  REQUIRE(agg->Finish(absl::MakeSpan(out)).ok());
  CHECK(out == std::vector<float>{-1.0f, 2.0f});
}

TEST_CASE("a refused payload changes nothing in the aggregator",
          "[aggregator][hostile]") {
  for (const std::string& spec : testing::AllSpecs()) {
    INFO(spec);
    const size_t d = 64;
    auto agg = MakeAggregator(spec, d);
    auto codec = MakeCodec(spec);
    std::string good = MustEncode(*codec, RandomGradient(d, 1));
    REQUIRE(agg->Add(good).ok());
    std::vector<float> before(d), after(d);
    REQUIRE(agg->Finish(absl::MakeSpan(before)).ok());
    std::string truncated = good.substr(0, good.size() - 1);
    CHECK(agg->Add(truncated).code() == absl::StatusCode::kInvalidArgument);
    CHECK(agg->Add(MustEncode(*codec, RandomGradient(d + 1, 1))).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(agg->count() == 1);
    REQUIRE(agg->Finish(absl::MakeSpan(after)).ok());
    CHECK(testing::BitwiseEqual(before, after));
    std::vector<float> wrong(d + 1);
    CHECK(agg->Finish(absl::MakeSpan(wrong)).code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace harrier
