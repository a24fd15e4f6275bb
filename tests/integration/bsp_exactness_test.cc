// 2 shards, 3 workers (threads, each its own Client), 20 BSP iterations of
// SGD with lr = 1 and known integer gradients: every pull and the final
// parameters equal the expected values exactly, so no update was lost or
// applied twice. The 3M-element tensor travels in 3 chunks over both shards.
#include <catch2/catch.hpp>

#include <thread>

#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr int kWorkers = 3;
constexpr int kIterations = 20;

struct TensorCase {
  std::string name;
  size_t elements;
};

// Worker r's gradient at iteration t: (r + 1) * (1 + (i + t) % 7). The sum
// over the 3 workers is 6 * (1 + (i + t) % 7), so the average is an exact
// integer and SGD with lr = 1 stays exact in fp32.
float Gradient(int rank, int t, size_t i) {
  return static_cast<float>((rank + 1) * (1 + (i + t) % 7));
}

float Initial(size_t i) { return static_cast<float>(i % 11); }

// Parameter value after `t` averaged steps.
float Expected(int t, size_t i) {
  float value = Initial(i);
  for (int k = 0; k < t; ++k) value -= 2.0f * (1 + (i + k) % 7);
  return value;
}

TEST_CASE("BSP: 2 shards, 3 workers, 20 iterations are exact") {
  auto servers = testing::StartCluster(2, kWorkers, {"--optimizer=sgd", "--lr=1", "--sync=bsp"});
  REQUIRE(servers.ok());
  const std::vector<TensorCase> tensors = {{"scalar", 1}, {"small", 1000}, {"big", 3000000}};

  std::vector<std::string> failures(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions options;
      options.servers = testing::Addresses(*servers);
      options.rpc_timeout = absl::Seconds(60);
      auto client = Client::Create(options);
      if (!client.ok()) {
        failures[w] = client.status().ToString();
        return;
      }
      const int rank = (*client)->rank();
      std::vector<std::vector<float>> params(tensors.size()), grads(tensors.size());
      for (size_t k = 0; k < tensors.size(); ++k) {
        std::vector<float> init(tensors[k].elements);
        for (size_t i = 0; i < init.size(); ++i) init[i] = Initial(i);
        auto status = (*client)->RegisterTensor(tensors[k].name,
                                                {static_cast<int64_t>(tensors[k].elements)}, init);
        if (!status.ok()) {
          failures[w] = status.ToString();
          return;
        }
        params[k].resize(tensors[k].elements);
        grads[k].resize(tensors[k].elements);
      }
      for (int t = 0; t < kIterations; ++t) {
        std::vector<Client::Handle> pulls;
        for (size_t k = 0; k < tensors.size(); ++k) {
          pulls.push_back((*client)->PullAsync(tensors[k].name, absl::MakeSpan(params[k])));
        }
        for (auto handle : pulls) {
          if (auto status = (*client)->Wait(handle); !status.ok()) {
            failures[w] = status.ToString();
            return;
          }
        }
        for (size_t k = 0; k < tensors.size(); ++k) {
          for (size_t i = 0; i < params[k].size(); ++i) {
            if (params[k][i] != Expected(t, i)) {
              failures[w] = "pull at clock " + std::to_string(t) + " of " + tensors[k].name +
                            "[" + std::to_string(i) + "] = " + std::to_string(params[k][i]) +
                            ", expected " + std::to_string(Expected(t, i));
              return;
            }
          }
          for (size_t i = 0; i < grads[k].size(); ++i) grads[k][i] = Gradient(rank, t, i);
        }
        std::vector<Client::Handle> pushes;
        for (size_t k = 0; k < tensors.size(); ++k) {
          pushes.push_back((*client)->PushAsync(tensors[k].name, grads[k]));
        }
        for (auto handle : pushes) {
          if (auto status = (*client)->Wait(handle); !status.ok()) {
            failures[w] = status.ToString();
            return;
          }
        }
        (*client)->Clock();
      }
      // Final parameters after all 20 rounds.
      for (size_t k = 0; k < tensors.size(); ++k) {
        if (auto status = (*client)->Pull(tensors[k].name, absl::MakeSpan(params[k]));
            !status.ok()) {
          failures[w] = status.ToString();
          return;
        }
        for (size_t i = 0; i < params[k].size(); ++i) {
          if (params[k][i] != Expected(kIterations, i)) {
            failures[w] = "final " + tensors[k].name + "[" + std::to_string(i) + "] wrong";
            return;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int w = 0; w < kWorkers; ++w) {
    INFO("worker thread " << w);
    CHECK(failures[w].empty());
    if (!failures[w].empty()) WARN(failures[w]);
  }
}

}  // namespace
}  // namespace harrier
