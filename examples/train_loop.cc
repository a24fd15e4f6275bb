// A complete training loop against worker/client.h: least-squares regression
// of y = <w_true, x> with the parameters on the Harrier servers.
//   train_loop --servers=127.0.0.1:5000[,...] [--steps=200]
// Prints the final loss; exits non-zero if training did not converge.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/client.h"

int main(int argc, char** argv) {
  harrier::ClientOptions options;
  int steps = 200;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--servers=")) {
      options.servers = absl::StrSplit(arg, ',', absl::SkipEmpty());
    } else if (absl::ConsumePrefix(&arg, "--steps=")) {
      if (!absl::SimpleAtoi(arg, &steps)) steps = -1;
    } else {
      std::fprintf(stderr, "usage: train_loop --servers=HOST:PORT,... [--steps=N]\n");
      return 2;
    }
  }
  auto client = harrier::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "train_loop: %s\n", client.status().ToString().c_str());
    return 1;
  }
  constexpr int kDim = 16, kBatch = 32;
  std::vector<float> w(kDim, 0.0f), grad(kDim), w_true(kDim);
  for (int i = 0; i < kDim; ++i) w_true[i] = 0.5f * static_cast<float>(i % 5) - 1.0f;
  if (auto status = (*client)->RegisterTensor("w", {kDim}, w); !status.ok()) {
    std::fprintf(stderr, "train_loop: %s\n", status.ToString().c_str());
    return 1;
  }
  std::mt19937 rng(42 + (*client)->rank());
  std::normal_distribution<float> normal;
  float loss = 0;
  for (int step = 0; step < steps; ++step) {
    if (auto status = (*client)->Pull("w", absl::MakeSpan(w)); !status.ok()) {
      std::fprintf(stderr, "train_loop: %s\n", status.ToString().c_str());
      return 1;
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    loss = 0;
    for (int b = 0; b < kBatch; ++b) {
      std::vector<float> x(kDim);
      float error = 0;
      for (int i = 0; i < kDim; ++i) {
        x[i] = normal(rng);
        error += (w[i] - w_true[i]) * x[i];
      }
      loss += 0.5f * error * error / kBatch;
      for (int i = 0; i < kDim; ++i) grad[i] += error * x[i] / kBatch;
    }
    if (auto status = (*client)->Push("w", grad); !status.ok()) {
      std::fprintf(stderr, "train_loop: %s\n", status.ToString().c_str());
      return 1;
    }
    (*client)->Clock();
  }
  if (auto status = (*client)->Leave(); !status.ok()) {
    std::fprintf(stderr, "train_loop: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("final_loss=%.6f\n", loss);
  return loss < 1e-3f ? 0 : 1;
}
