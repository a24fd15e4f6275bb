// The bench's push path without a GPU: a real shard over UCX (tcp), host
// pushes applied at sequential clocks, and a device-memory push refused by
// this UCX (no CUDA) without using up its clock.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "bench/cuda_transport/ucx_push_target.h"

namespace harrier::bench {
namespace {

TEST_CASE("host pushes over UCX succeed; a device push is refused on this UCX") {
  // 1 MiB chunks: the 3 MiB tensor goes out as three.
  auto target = UcxPushTarget::Start(UcxDeviceMemory::kAuto, size_t{1} << 20);
  INFO(target.status().ToString());
  REQUIRE(target.ok());
  REQUIRE_FALSE((*target)->sends_from_device_memory());
  std::vector<float> values((size_t{3} << 20) / sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 13);
  REQUIRE((*target)->AddTensor("t", values).ok());
  for (int i = 0; i < 3; ++i) {
    const absl::Status pushed = (*target)->Push("t", values.data(), MemoryKind::kHost);
    INFO("push " << i << ": " << pushed.ToString());
    REQUIRE(pushed.ok());
  }
  const absl::Status device = (*target)->Push("t", values.data(), MemoryKind::kDevice);
  INFO(device.ToString());
  REQUIRE(device.code() == absl::StatusCode::kFailedPrecondition);
  // The refused push did not take a clock: the next one is still in sequence.
  REQUIRE((*target)->Push("t", values.data(), MemoryKind::kHost).ok());
  REQUIRE((*target)->Push("nope", values.data(), MemoryKind::kHost).code() ==
          absl::StatusCode::kNotFound);

  // Pulls land in place: the 1 MiB chunks go by rendezvous. lr is tiny, so
  // the five pushes of these small values left them as they were.
  REQUIRE_FALSE((*target)->receives_into_device_memory());
  std::vector<float> pulled(values.size(), -1.0f);
  auto landed = (*target)->Pull("t", pulled.data(), MemoryKind::kHost);
  INFO(landed.status().ToString());
  REQUIRE(landed.ok());
  REQUIRE(*landed == values.size() * sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) REQUIRE(std::abs(pulled[i] - values[i]) < 1e-3f);
  // Device memory cannot be landed in on this UCX: refused, not written.
  std::vector<float> untouched(values.size(), -1.0f);
  auto device_pull = (*target)->Pull("t", untouched.data(), MemoryKind::kDevice);
  REQUIRE(device_pull.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(untouched == std::vector<float>(values.size(), -1.0f));
}

}  // namespace
}  // namespace harrier::bench
