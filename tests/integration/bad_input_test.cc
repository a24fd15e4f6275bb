// Bad input through a real harrier-server: each malformed call gets a clear
// status naming the key, changes nothing, and the shard keeps serving.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <signal.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/server_process.h"
#include "tests/integration/raw_grpc_shard.h"
#include "testing/sessions.h"

namespace harrier {
namespace {

constexpr size_t kElements = 8;

using Shard = testing::RawGrpcShard;

proto::InitRequest MakeInit(const std::string& key, size_t n) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
  proto::InitRequest request;
  request.set_key(key);
  request.add_shape(n);
  request.set_num_elements(n);
  request.set_dtype(proto::DTYPE_FLOAT32);
  request.mutable_initial_values()->assign(reinterpret_cast<const char*>(values.data()),
                                           n * sizeof(float));
  request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
  return request;
}

proto::TensorChunk MakePush(const std::string& key, uint32_t rank, int64_t clock, size_t n,
                            float value) {
  std::vector<float> gradient(n, value);
  proto::TensorChunk chunk;
  chunk.set_key(key);
  chunk.set_rank(rank);
  chunk.set_clock(clock);
  chunk.set_num_elements(n);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(reinterpret_cast<const char*>(gradient.data()),
                                  n * sizeof(float));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

void RequireRefused(const grpc::Status& status, grpc::StatusCode code, const std::string& needle) {
  INFO("status: " << status.error_code() << " " << status.error_message());
  REQUIRE(status.error_code() == code);
  REQUIRE(status.error_message().find(needle) != std::string::npos);
}

TEST_CASE("bad input is refused with a clear status and changes nothing") {
  // One shard, one worker: a push completes a BSP round at once.
  auto servers = testing::StartCluster(1, 1, {"--lr=1"});
  REQUIRE(servers.ok());
  Shard shard((*servers)[0]->address());
  REQUIRE(shard.Init(MakeInit("w", kElements)).ok());
  std::vector<float> before;
  REQUIRE(shard.Pull("w", 0, kElements, &before).ok());

  SECTION("unknown key") {
    RequireRefused(shard.Push({MakePush("nope", 0, 0, kElements, 1)}), grpc::StatusCode::NOT_FOUND,
                   "'nope'");
    std::vector<float> values;
    RequireRefused(shard.Pull("nope", 0, kElements, &values), grpc::StatusCode::NOT_FOUND, "'nope'");
  }
  SECTION("re-registration with another shape") {
    RequireRefused(shard.Init(MakeInit("w", kElements + 1)), grpc::StatusCode::INVALID_ARGUMENT,
                   "'w'");
  }
  SECTION("wrong dtype") {
    auto chunk = MakePush("w", 0, 0, kElements, 1);
    chunk.set_dtype(proto::DTYPE_INVALID);
    RequireRefused(shard.Push({chunk}), grpc::StatusCode::INVALID_ARGUMENT, "dtype");
  }
  SECTION("wrong element count") {
    RequireRefused(shard.Push({MakePush("w", 0, 0, kElements - 1, 1)}),
                   grpc::StatusCode::INVALID_ARGUMENT, "'w'");
    auto chunk = MakePush("w", 0, 0, kElements, 1);
    chunk.mutable_payload()->resize(kElements * 4 - 4);
    chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
    RequireRefused(shard.Push({chunk}), grpc::StatusCode::INVALID_ARGUMENT, "payload");
  }
  SECTION("checksum mismatch") {
    auto chunk = MakePush("w", 0, 0, kElements, 1);
    chunk.set_checksum(chunk.checksum() ^ 1);
    RequireRefused(shard.Push({chunk}), grpc::StatusCode::INVALID_ARGUMENT, "checksum");
  }
  SECTION("clock from the future") {
    RequireRefused(shard.Push({MakePush("w", 0, 5, kElements, 1)}),
                   grpc::StatusCode::FAILED_PRECONDITION, "future");
  }
  SECTION("rank out of range") {
    RequireRefused(shard.Push({MakePush("w", 7, 0, kElements, 1)}),
                   grpc::StatusCode::INVALID_ARGUMENT, "rank 7");
  }
  SECTION("NaN in a gradient") {
    RequireRefused(shard.Push({MakePush("w", 0, 0, kElements, std::nanf(""))}),
                   grpc::StatusCode::INVALID_ARGUMENT, "NaN");
  }
  SECTION("one bad chunk refuses the whole push") {
    auto good = MakePush("w", 0, 0, kElements, 1);
    auto bad = MakePush("nope", 0, 0, kElements, 1);
    RequireRefused(shard.Push({good, bad}), grpc::StatusCode::NOT_FOUND, "'nope'");
  }

  // Nothing changed, and the shard still serves: the next good push applies.
  std::vector<float> after;
  REQUIRE(shard.Pull("w", 0, kElements, &after).ok());
  REQUIRE(after == before);
  REQUIRE(shard.Push({MakePush("w", 0, 0, kElements, 1)}).ok());
  REQUIRE(shard.Pull("w", 1, kElements, &after).ok());
  for (size_t i = 0; i < kElements; ++i) REQUIRE(after[i] == before[i] - 1.0f);
}

TEST_CASE("a pull past its deadline names the clock and the slowest worker") {
  auto servers = testing::StartCluster(1, 2, {"--lr=1"});
  REQUIRE(servers.ok());
  Shard shard((*servers)[0]->address());
  REQUIRE(shard.Init(MakeInit("w", kElements)).ok());
  REQUIRE(shard.Push({MakePush("w", 0, 0, kElements, 1)}).ok());
  std::vector<float> values;
  // Rank 0 pushed clock 0; rank 1 pushed nothing, so a BSP pull at clock 1 waits.
  auto status = shard.Pull("w", 1, kElements, &values, 300, 0);
  RequireRefused(status, grpc::StatusCode::DEADLINE_EXCEEDED, "slowest worker is rank 1 at clock 0");
}

TEST_CASE("SIGTERM stops the server cleanly with exit code 0") {
  auto servers = testing::StartCluster(1, 1, {});
  REQUIRE(servers.ok());
  auto& process = (*servers)[0]->process();
  process.Signal(SIGTERM);
  REQUIRE(process.WaitForExit(10000) == 0);
}

TEST_CASE("bad flags exit non-zero with one line on stderr") {
  auto server = testing::ServerProcess::Start({"--sync=sometimes"});
  REQUIRE_FALSE(server.ok());
}

}  // namespace
}  // namespace harrier
