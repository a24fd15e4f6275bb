// The fused push path through a real harrier-server at a real size (a
// 16 MiB tensor in one chunk, split across apply threads): a push refused
// for its last byte, a NaN or an element at 2^40 changes nothing, and a
// good one applies exactly Optimizer::Step's result.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "server/optimizer.h"
#include "testing/server_process.h"
#include "tests/integration/raw_grpc_shard.h"
#include "testing/sessions.h"

namespace harrier {
namespace {

constexpr size_t kElements = (16u << 20) / sizeof(float);

using Shard = testing::RawGrpcShard;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

proto::InitRequest MakeInit(const std::string& key, const std::vector<float>& values) {
  proto::InitRequest request;
  request.set_key(key);
  request.add_shape(values.size());
  request.set_num_elements(values.size());
  request.set_dtype(proto::DTYPE_FLOAT32);
  request.mutable_initial_values()->assign(reinterpret_cast<const char*>(values.data()),
                                           values.size() * sizeof(float));
  request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
  return request;
}

proto::TensorChunk MakePush(const std::string& key, int64_t clock,
                            const std::vector<float>& gradient) {
  proto::TensorChunk chunk;
  chunk.set_key(key);
  chunk.set_rank(0);
  chunk.set_clock(clock);
  chunk.set_num_elements(gradient.size());
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(reinterpret_cast<const char*>(gradient.data()),
                                  gradient.size() * sizeof(float));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST_CASE("a 16 MiB push: refused ones change nothing, a good one applies exactly") {
  for (const std::string threads : {"1", "4"}) {
    for (const std::string sync : {"asp", "bsp"}) {
      CAPTURE(threads, sync);
      auto servers = testing::StartCluster(
          1, 1, {"--lr=0.25", "--weight_decay=0.01", "--sync=" + sync, "--apply_threads=" + threads});
      REQUIRE(servers.ok());
      Shard shard((*servers)[0]->address());
      const std::vector<float> initial = Random(kElements, 1);
      REQUIRE(shard.Init(MakeInit("w", initial)).ok());
      const std::vector<float> gradient = Random(kElements, 2);

      proto::TensorChunk flipped = MakePush("w", 0, gradient);
      (*flipped.mutable_payload())[flipped.payload().size() - 1] ^= 0x40;
      std::vector<float> nan_last = gradient, at_limit = gradient;
      nan_last.back() = std::numeric_limits<float>::quiet_NaN();
      at_limit.back() = std::ldexp(1.0f, 40);
      const std::pair<proto::TensorChunk, std::string> refused[] = {
          {flipped, "checksum"},
          {MakePush("w", 0, nan_last), "NaN"},
          {MakePush("w", 0, at_limit), "2^40"}};
      for (const auto& [chunk, needle] : refused) {
        const grpc::Status status = shard.Push({chunk});
        INFO(status.error_message());
        REQUIRE(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        REQUIRE(status.error_message().find(needle) != std::string::npos);
        std::vector<float> values;
        REQUIRE(shard.Pull("w", 0, kElements, &values).ok());
        REQUIRE(SameBits(values, initial));
      }

      REQUIRE(shard.Push({MakePush("w", 0, gradient)}).ok());
      OptimizerOptions options;
      options.lr = 0.25f;
      options.weight_decay = 0.01f;
      std::vector<float> expect = initial;
      OptimizerState state;
      (*CreateOptimizer(options))
          ->Step(absl::MakeSpan(expect), absl::MakeConstSpan(gradient), 1.0f, state);
      std::vector<float> values;
      REQUIRE(shard.Pull("w", 1, kElements, &values).ok());
      REQUIRE(SameBits(values, expect));
    }
  }
}

}  // namespace
}  // namespace harrier
