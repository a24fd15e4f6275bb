// The README's program, built outside the repository against the installed
// client library (README "Writing your own training loop"): least-squares
// regression of y = <w_true, x> with the parameters on Harrier's servers.
//   own_loop HOST:PORT [HOST:PORT ...]       (every shard, shard 0 first)
// Exits 0 if the loss fell below 1e-3; 1 on any error or if it did not.
#include <cstdio>
#include <random>
#include <vector>

#include "worker/client.h"

static int Fail(const absl::Status& status) {
  std::fprintf(stderr, "own_loop: %s\n", status.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  harrier::ClientOptions options;
  options.servers.assign(argv + 1, argv + argc);
  auto client = harrier::Client::Create(options);  // connects, registers, gets a rank
  if (!client.ok()) return Fail(client.status());
  harrier::Client& c = **client;
  constexpr int kDim = 16, kBatch = 32, kSteps = 1000;
  std::vector<float> w(kDim, 0.0f), grad(kDim), x(kDim);
  if (absl::Status s = c.RegisterTensor("w", {kDim}, w); !s.ok()) return Fail(s);
  std::mt19937 rng(c.rank());
  std::normal_distribution<float> normal;
  float loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (absl::Status s = c.Pull("w", absl::MakeSpan(w)); !s.ok()) return Fail(s);
    grad.assign(kDim, 0.0f);
    loss = 0;
    for (int b = 0; b < kBatch; ++b) {
      float error = 0;  // <w - w_true, x> with w_true[i] = i / kDim
      for (int i = 0; i < kDim; ++i) error += (w[i] - float(i) / kDim) * (x[i] = normal(rng));
      loss += 0.5f * error * error / kBatch;
      for (int i = 0; i < kDim; ++i) grad[i] += error * x[i] / kBatch;
    }
    if (absl::Status s = c.Push("w", grad); !s.ok()) return Fail(s);
    c.Clock();  // the next pull waits for this step's pushes (BSP)
  }
  if (absl::Status s = c.Leave(); !s.ok()) return Fail(s);  // no round waits for us now
  std::printf("rank=%d final_loss=%.3g\n", c.rank(), loss);
  return loss < 1e-3f ? 0 : 1;
}
