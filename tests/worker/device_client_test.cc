// The proof that a Client compresses device tensors on the device: against
// a real harrier-server (1 shard, 1 worker, BSP, SGD), a Client whose
// tensors are registered in device memory (a counting fake device backend
// on host memory) pushes a [256,784] weight with topk:ratio=0.01 and a
// small 1-D bias, and pulls them back (dense, then with a compressed pull
// codec). The host backend is never called; the device backend encodes
// every chunk of every step; the parameters pulled are bitwise those of a
// pure-host client given the same gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "testing/server_process.h"
#include "tests/worker/counting_backends.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr int kSteps = 6;
constexpr int64_t kRows = 256, kCols = 784, kBias = 64;

float Gradient(int tensor, int step, size_t i) {
  return std::sin(0.013f * static_cast<float>(i) * (tensor + 1) + 0.7f * step) *
         (1.0f + 0.1f * static_cast<float>(i % 13));
}

struct Run {
  std::vector<std::vector<float>> pulled;  // per step: w then b, concatenated
  std::string error;
};

// Six BSP steps of PushPull against a fresh server. `device` set: the
// tensors are registered as device tensors compressed by it.
Run Train(const std::string& pull_codec, std::shared_ptr<CountingBackend> device,
          std::shared_ptr<CountingBackend> host) {
  Run run;
  auto servers = testing::StartCluster(1, 1, {"--optimizer=sgd", "--lr=0.5", "--sync=bsp"});
  REQUIRE(servers.ok());
  ClientOptions options;
  options.servers = testing::Addresses(*servers);
  options.rpc_timeout = absl::Seconds(30);
  options.connect_timeout = absl::Seconds(30);
  options.codec = "topk:ratio=0.01";
  options.pull_codec = pull_codec;
  // Two chunks of 128 whole rows each.
  options.chunk_bytes = kRows / 2 * kCols * sizeof(float);
  options.device_backend = device;
  options.host_backend = host;
  auto client = Client::Create(options);
  REQUIRE(client.ok());
  const MemoryKind memory = device != nullptr ? MemoryKind::kDevice : MemoryKind::kHost;
  // The "device" buffers: host vectors the fake device owns.
  std::vector<float> w(kRows * kCols), b(kBias), w_grad(w.size()), b_grad(b.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 97);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.5f;
  if (device != nullptr) {
    for (auto* buffer : {&w, &b, &w_grad, &b_grad}) device->AddDeviceRange(buffer->data(), buffer->size());
  }
  REQUIRE((*client)->RegisterTensor("w", {kRows, kCols}, w, memory).ok());
  REQUIRE((*client)->RegisterTensor("b", {kBias}, b, memory).ok());
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < w_grad.size(); ++i) w_grad[i] = Gradient(0, step, i);
    for (size_t i = 0; i < b_grad.size(); ++i) b_grad[i] = Gradient(1, step, i);
    auto hw = (*client)->PushPullAsync("w", w_grad, absl::MakeSpan(w));
    auto hb = (*client)->PushPullAsync("b", b_grad, absl::MakeSpan(b));
    absl::Status sw = (*client)->Wait(hw, absl::Now() + absl::Seconds(60));
    absl::Status sb = (*client)->Wait(hb, absl::Now() + absl::Seconds(60));
    if (!sw.ok() || !sb.ok()) {
      run.error = absl::StrCat("step ", step, ": ", sw.ToString(), " / ", sb.ToString());
      return run;
    }
    (*client)->Clock();
    std::vector<float> both = w;
    both.insert(both.end(), b.begin(), b.end());
    run.pulled.push_back(std::move(both));
  }
  // A plain pull at the end too (Pull rather than PushPull).
  if (auto status = (*client)->Pull("w", absl::MakeSpan(w)); !status.ok()) {
    run.error = status.ToString();
    return run;
  }
  std::vector<float> both = w;
  both.insert(both.end(), b.begin(), b.end());
  run.pulled.push_back(std::move(both));
  return run;
}

void CheckDeviceRun(const std::string& pull_codec) {
  auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
  auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
  const Run on_device = Train(pull_codec, device, host);
  REQUIRE(on_device.error.empty());
  INFO("device: " << device->counts().ToString() << " host: " << host->counts().ToString());
  CHECK(host->counts().total() == 0);
  // Two weight chunks, pushed every step; the bias is below
  // compress_min_bytes: dense, staged (gRPC reads host memory only).
  CHECK(device->counts().new_push_streams == 2);
  CHECK(device->counts().encodes == 2 * kSteps);
  CHECK(device->counts().copy_to_host == kSteps);
  if (pull_codec == "none") {
    CHECK(device->counts().new_pull_mirrors == 0);
    // Every reply chunk of both tensors reached device memory through the
    // backend: 3 chunks per step, then the final pull's 2.
    CHECK(device->counts().copy_from_host == 3 * kSteps + 2);
  } else {
    CHECK(device->counts().new_pull_mirrors == 2);
    CHECK(device->counts().set_dense >= 2);
    CHECK(device->counts().add_compressed >= 2 * kSteps - 2);
    CHECK(device->counts().copy_from_host == kSteps);  // the bias, pulled dense
  }

  auto plain_host = std::make_shared<CountingBackend>(MemoryKind::kHost);
  const Run on_host = Train(pull_codec, nullptr, plain_host);
  REQUIRE(on_host.error.empty());
  CHECK(plain_host->counts().encodes == 2 * kSteps);
  REQUIRE(on_device.pulled.size() == on_host.pulled.size());
  for (size_t step = 0; step < on_host.pulled.size(); ++step) {
    INFO("step " << step);
    const auto& a = on_device.pulled[step];
    const auto& b = on_host.pulled[step];
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
  // And training moved the parameters: the comparison is not of two
  // untouched copies.
  CHECK(on_host.pulled.front() != on_host.pulled.back());
}

TEST_CASE("device tensors are compressed by the device backend only (dense pulls)") {
  CheckDeviceRun("none");
}

TEST_CASE("device tensors' compressed pull replies are decoded into the device mirror") {
  CheckDeviceRun("topk:ratio=0.05");
}

}  // namespace
}  // namespace harrier
