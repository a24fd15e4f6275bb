// The limit checks and the log helper of common/request_limits.h on their
// own; //tests/integration:request_limits_test drives them through a shard.
#include "common/request_limits.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace harrier {
namespace {

TEST_CASE("TruncatedForLog keeps short strings, cuts long ones and escapes control bytes") {
  REQUIRE(TruncatedForLog("worker-3") == "worker-3");
  const std::string at_limit(kMaxLoggedStringBytes, 'a');
  REQUIRE(TruncatedForLog(at_limit) == at_limit);
  const std::string long_name(1000, 'b');
  REQUIRE(TruncatedForLog(long_name) ==
          std::string(kMaxLoggedStringBytes, 'b') + "...(1000 bytes)");
  // A newline would start a forged log line.
  REQUIRE(TruncatedForLog("a\nevent=register rank=0") == "a\\nevent=register rank=0");
  REQUIRE(TruncatedForLog(std::string("\x01\xff", 2)) == "\\x01\\xff");
}

TEST_CASE("CheckLength names the field, its size and the limit, and quotes it cut short") {
  REQUIRE(CheckLength("init", "key", std::string(1024, 'k'), 1024).ok());
  const absl::Status over = CheckLength("init", "key", std::string(1u << 20, 'k'), 1024);
  REQUIRE(absl::IsInvalidArgument(over));
  REQUIRE(over.message().find("init: key '") == 0);
  REQUIRE(over.message().find("1048576 bytes, over the limit of 1024 bytes") !=
          absl::string_view::npos);
  REQUIRE(over.message().size() < 400);
}

TEST_CASE("CheckShape bounds the rank, refuses zero dimensions and overflowing products") {
  const std::vector<uint64_t> ok = {2, 3, 4};
  REQUIRE(CheckShape("t", ok.data(), ok.size(), 24).ok());
  REQUIRE(CheckShape("t", ok.data(), ok.size(), 5).ok());  // a chunk of the tensor
  REQUIRE(CheckShape("t", nullptr, 0, 1).ok());            // a scalar
  REQUIRE(absl::IsInvalidArgument(CheckShape("t", ok.data(), ok.size(), 25)));
  const std::vector<uint64_t> zero = {4, 0};
  REQUIRE(CheckShape("t", zero.data(), zero.size(), 0).message().find("dimension 1 is 0") !=
          absl::string_view::npos);
  const std::vector<uint64_t> overflow = {uint64_t{1} << 32, uint64_t{1} << 32, 2};
  REQUIRE(absl::IsInvalidArgument(CheckShape("t", overflow.data(), overflow.size(), 1)));
  const std::vector<uint64_t> ones(kMaxShapeRank + 1, 1);
  const absl::Status deep = CheckShape("t", ones.data(), ones.size(), 1);
  REQUIRE(absl::IsInvalidArgument(deep));
  REQUIRE(deep.message().find("limit of 32 dimensions") != absl::string_view::npos);
  REQUIRE(CheckShape("t", ones.data(), kMaxShapeRank, 1).ok());
}

TEST_CASE("a pull of more chunks than a call may carry is a budget refusal") {
  proto::PullRequest pull;
  for (size_t i = 0; i < kMaxChunksPerCall; ++i) {
    proto::ChunkRef* ref = pull.add_chunks();
    ref->set_key("w");
    ref->set_chunk(static_cast<uint32_t>(i));
  }
  REQUIRE(CheckPullLimits(pull).ok());
  pull.add_chunks()->set_key("w");
  const absl::Status over = CheckPullLimits(pull);
  REQUIRE(absl::IsResourceExhausted(over));
  REQUIRE(over.message().find("limit of 256 chunks per call") != absl::string_view::npos);
}

TEST_CASE("a pull that names one chunk twice is refused whole") {
  proto::PullRequest pull;
  for (uint32_t chunk : {0u, 1u, 2u}) {
    proto::ChunkRef* ref = pull.add_chunks();
    ref->set_key("w");
    ref->set_chunk(chunk);
  }
  pull.add_chunks()->set_key("v");  // chunk 0 of another tensor: fine
  REQUIRE(CheckPullLimits(pull).ok());
  proto::ChunkRef* again = pull.add_chunks();
  again->set_key("w");
  again->set_chunk(1);
  const absl::Status twice = CheckPullLimits(pull);
  REQUIRE(absl::IsInvalidArgument(twice));
  REQUIRE(twice.message().find("chunk 1 of 'w' is named twice") != absl::string_view::npos);
}

}  // namespace
}  // namespace harrier
