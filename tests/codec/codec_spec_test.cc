#include <string>

#include <catch2/catch.hpp>

#include "common/codec/codec.h"

namespace harrier {
namespace {

TEST_CASE("spec strings parse and round-trip", "[spec]") {
  const char* texts[] = {
      "none",   "fp16",  "bf16",  "topk:ratio=0.01", "qsgd:levels=16,bucket=512",
      "powersgd:rank=2", "randomk:ratio=0.01,seed=7", "threshold:tau=0.001",
      "threshold:sample=0.01,ratio=0.01", "terngrad:clip=2.5", "sign:scale=1",
      "efsign", "signum", "onebit", "qsgd:levels=255,bucket=1"};
  for (const char* text : texts) {
    INFO(text);
    absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
    REQUIRE(spec.ok());
    absl::StatusOr<CodecSpec> again = CodecSpec::Parse(spec->ToString());
    REQUIRE(again.ok());
    CHECK(*again == *spec);
    CHECK(again->ToString() == spec->ToString());
  }
}

TEST_CASE("spec values and defaults", "[spec]") {
  CodecSpec q = *CodecSpec::Parse("qsgd:levels=16,bucket=512");
  CHECK(q.id == CodecId::kQsgd);
  CHECK(q.levels == 16);
  CHECK(q.bucket == 512);
  CodecSpec r = *CodecSpec::Parse("randomk:ratio=0.01,seed=7");
  CHECK(r.ratio == 0.01);
  CHECK(r.seed == 7);
  CHECK(r.scaled);  // unbiased by default
  CHECK(r.ToString() == "randomk:ratio=0.01,seed=7,scale=1");
  CHECK(CodecSpec::Parse("topk:ratio=0.01")->ToString() == "topk:ratio=0.01");
  CHECK(CodecSpec::Parse("none")->ToString() == "none");
  CodecSpec t = *CodecSpec::Parse("threshold:tau=0.001");
  CHECK(t.fixed_tau);
  CHECK(t.ToString() == "threshold:tau=0.001");
  CHECK(CodecSpec::Parse("threshold")->ToString() ==
        "threshold:sample=0.01,ratio=0.01");
  CHECK(CodecSpec::Parse("powersgd:rank=2")->rank == 2);
  CHECK_FALSE(CodecSpec::Parse("sign")->scaled);
}

TEST_CASE("spec errors name the problem", "[spec]") {
  struct Case {
    const char* text;
    const char* mention;
  } cases[] = {
      {"zip", "unknown codec \"zip\""},
      {"zip", "(known: none, fp16, bf16, topk, randomk, threshold, qsgd, terngrad, sign, efsign, "
              "signum, onebit, powersgd)"},
      {"topk:k=5", "unknown parameter \"k\""},
      {"topk:ratio=0", "ratio=0 out of range"},
      {"topk:ratio=1.5", "out of range"},
      {"topk:ratio=abc", "not a finite number"},
      {"topk:ratio=nan", "not a finite number"},
      {"topk:ratio", "not key=value"},
      {"topk:", "empty parameter list"},
      {"topk:ratio=0.1,ratio=0.2", "repeated"},
      {"qsgd:levels=0", "levels=0 out of range"},
      {"qsgd:levels=65536", "out of range"},
      {"qsgd:bucket=0", "bucket=0"},
      {"qsgd:levels=-3", "not a non-negative integer"},
      {"powersgd:rank=0", "rank=0"},
      {"powersgd:rank=65", "rank=65"},
      {"threshold:tau=-1", "tau=-1"},
      {"threshold:tau=0.1,ratio=0.1", "either tau or sample/ratio"},
      {"sign:scale=2", "not 0 or 1"},
      {"none:ratio=0.1", "unknown parameter \"ratio\" for codec none"},
      {"terngrad:clip=-1", "clip=-1"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(c.text);
    REQUIRE_FALSE(spec.ok());
    CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    INFO(spec.status().message());
    CHECK(std::string(spec.status().message()).find(c.mention) !=
          std::string::npos);
  }
}

TEST_CASE("CreateCodec refuses hand-built out-of-range specs", "[spec]") {
  CodecSpec spec;
  spec.id = CodecId::kTopK;
  spec.ratio = 0.0;
  CHECK(CreateCodec(spec).status().code() ==
        absl::StatusCode::kInvalidArgument);
  spec.ratio = 0.5;
  REQUIRE(CreateCodec(spec).ok());
  CHECK((*CreateCodec(spec))->id() == CodecId::kTopK);
}

TEST_CASE("threshold takes a DGC momentum in its sampled form only", "[spec]") {
  CodecSpec t = *CodecSpec::Parse("threshold:sample=0.5,ratio=0.1,momentum=0.9");
  CHECK(t.momentum == 0.9);
  CHECK(t.ToString() == "threshold:sample=0.5,ratio=0.1,momentum=0.9");
  CHECK(*CodecSpec::Parse(t.ToString()) == t);
  CHECK(t != *CodecSpec::Parse("threshold:sample=0.5,ratio=0.1"));
  CHECK(CodecSpec::Parse("threshold")->momentum == 0.0);
  for (const char* bad : {"threshold:momentum=1", "threshold:momentum=-0.1",
                          "threshold:tau=0.1,momentum=0.9", "topk:momentum=0.9"}) {
    INFO(bad);
    CHECK(CodecSpec::Parse(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("DeriveSeed is deterministic and sensitive to every field",
          "[seed]") {
  uint64_t base = DeriveSeed("layer1.weight", 0, 5, 2, 42);
  CHECK(base == DeriveSeed("layer1.weight", 0, 5, 2, 42));
  CHECK(base != DeriveSeed("layer1.bias", 0, 5, 2, 42));
  CHECK(base != DeriveSeed("layer1.weight", 1, 5, 2, 42));
  CHECK(base != DeriveSeed("layer1.weight", 0, 6, 2, 42));
  CHECK(base != DeriveSeed("layer1.weight", 0, 5, 3, 42));
  CHECK(base != DeriveSeed("layer1.weight", 0, 5, 2, 43));
}

}  // namespace
}  // namespace harrier
