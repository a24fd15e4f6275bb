#include "worker/workload/mlp.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "worker/workload/fashion_mnist.h"

namespace harrier::workload {
namespace {

// A straightforward double-precision forward pass over the Mlp's parameter
// layout, independent of the BLAS code, for finite differences.
double ReferenceLoss(const std::vector<int>& sizes,
                     const std::vector<std::vector<double>>& params,
                     const std::vector<float>& images,
                     const std::vector<uint8_t>& labels) {
  const int batch = static_cast<int>(labels.size());
  const int layers = static_cast<int>(sizes.size()) - 1;
  double total = 0.0;
  for (int b = 0; b < batch; ++b) {
    std::vector<double> x(images.begin() + b * sizes[0],
                          images.begin() + (b + 1) * sizes[0]);
    for (int l = 0; l < layers; ++l) {
      const std::vector<double>& w = params[2 * l];
      const std::vector<double>& bias = params[2 * l + 1];
      std::vector<double> y(sizes[l + 1]);
      for (int o = 0; o < sizes[l + 1]; ++o) {
        double sum = bias[o];
        for (int i = 0; i < sizes[l]; ++i) sum += w[o * sizes[l] + i] * x[i];
        y[o] = l + 1 < layers ? std::max(sum, 0.0) : sum;
      }
      x = std::move(y);
    }
    const double max = *std::max_element(x.begin(), x.end());
    double sum = 0.0;
    for (double z : x) sum += std::exp(z - max);
    total += max + std::log(sum) - x[labels[b]];
  }
  return total / batch;
}

struct Batch {
  std::vector<float> images;
  std::vector<uint8_t> labels;
};

Batch RandomBatch(int batch, int input, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Batch out;
  for (int i = 0; i < batch * input; ++i) out.images.push_back(pixel(rng));
  for (int b = 0; b < batch; ++b) {
    out.labels.push_back(static_cast<uint8_t>(rng() % classes));
  }
  return out;
}

TEST_CASE("default MLP has named parameters in layer order") {
  absl::StatusOr<Mlp> mlp = Mlp::Create(MlpOptions{});
  REQUIRE(mlp.ok());
  const std::vector<ParamTensor>& params = mlp->params();
  REQUIRE(params.size() == 6);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"fc0.weight", {256, 784}}, {"fc0.bias", {256}},
      {"fc1.weight", {256, 256}}, {"fc1.bias", {256}},
      {"fc2.weight", {10, 256}},  {"fc2.bias", {10}}};
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].name == expected[i].first);
    CHECK(params[i].shape == expected[i].second);
    const int64_t size = std::accumulate(params[i].shape.begin(),
                                         params[i].shape.end(), int64_t{1},
                                         std::multiplies<int64_t>());
    CHECK(static_cast<int64_t>(params[i].values.size()) == size);
  }
  CHECK(mlp->num_parameters() == 784 * 256 + 256 + 256 * 256 + 256 + 2570);
  // He-uniform bound for the first layer; biases start at zero.
  const float limit = std::sqrt(6.0f / 784.0f);
  float largest = 0.0f;
  for (float w : params[0].values) largest = std::max(largest, std::abs(w));
  CHECK(largest <= limit);
  CHECK(largest > 0.9f * limit);
  for (float b : params[1].values) CHECK(b == 0.0f);
}

TEST_CASE("initialisation is deterministic in the seed") {
  MlpOptions options{{20, 16, 10}, 7};
  absl::StatusOr<Mlp> a = Mlp::Create(options);
  absl::StatusOr<Mlp> b = Mlp::Create(options);
  options.seed = 8;
  absl::StatusOr<Mlp> c = Mlp::Create(options);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  for (size_t i = 0; i < a->params().size(); ++i) {
    CHECK(a->params()[i].values == b->params()[i].values);
  }
  CHECK(a->params()[0].values != c->params()[0].values);
}

TEST_CASE("bad options and arguments are InvalidArgument") {
  CHECK(Mlp::Create(MlpOptions{{784}, 1}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Mlp::Create(MlpOptions{{784, 0, 10}, 1}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Mlp> mlp = Mlp::Create(MlpOptions{{4, 3, 2}, 1});
  REQUIRE(mlp.ok());
  const float images[8] = {};
  const uint8_t good[2] = {0, 1};
  const uint8_t bad[2] = {0, 2};
  Gradients grads;
  CHECK(mlp->ComputeGradients(images, bad, 2, &grads).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mlp->ComputeGradients(images, good, 0, &grads).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mlp->Loss(nullptr, good, 2).status().code() ==
        absl::StatusCode::kInvalidArgument);
  grads = mlp->ZeroGradients();
  grads[1].pop_back();
  const std::vector<float> before = mlp->params()[0].values;
  CHECK(mlp->SgdStep(grads, 0.1f).code() == absl::StatusCode::kInvalidArgument);
  CHECK(mlp->params()[0].values == before);
  Dataset wrong_size;
  wrong_size.num_examples = 1;
  wrong_size.rows = 2;
  wrong_size.cols = 3;
  wrong_size.images.assign(6, 0.0f);
  wrong_size.labels = {0};
  CHECK(mlp->Evaluate(wrong_size).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("gradients match central finite differences") {
  const std::vector<int> sizes = {20, 16, 12, 10};
  absl::StatusOr<Mlp> mlp = Mlp::Create(MlpOptions{sizes, 42});
  REQUIRE(mlp.ok());
  // Nonzero biases so their gradients are exercised away from the origin.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> small(-0.1f, 0.1f);
  for (ParamTensor& p : mlp->params()) {
    if (p.shape.size() == 1) {
      for (float& v : p.values) v = small(rng);
    }
  }
  const int batch = 8;
  const Batch data = RandomBatch(batch, sizes.front(), sizes.back(), 5);
  Gradients grads;
  absl::StatusOr<float> loss =
      mlp->ComputeGradients(data.images.data(), data.labels.data(), batch,
                            &grads);
  REQUIRE(loss.ok());

  std::vector<std::vector<double>> params;
  for (const ParamTensor& p : mlp->params()) {
    params.emplace_back(p.values.begin(), p.values.end());
  }
  const double reference = ReferenceLoss(sizes, params, data.images, data.labels);
  CHECK(*loss == Approx(reference).epsilon(1e-5));
  absl::StatusOr<float> forward_only =
      mlp->Loss(data.images.data(), data.labels.data(), batch);
  REQUIRE(forward_only.ok());
  CHECK(*forward_only == Approx(reference).epsilon(1e-5));

  REQUIRE(grads.size() == params.size());
  const double h = 1e-5;
  for (size_t t = 0; t < params.size(); ++t) {
    REQUIRE(grads[t].size() == params[t].size());
    for (int trial = 0; trial < 6; ++trial) {
      const size_t k = rng() % params[t].size();
      const double saved = params[t][k];
      params[t][k] = saved + h;
      const double up = ReferenceLoss(sizes, params, data.images, data.labels);
      params[t][k] = saved - h;
      const double down = ReferenceLoss(sizes, params, data.images, data.labels);
      params[t][k] = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grads[t][k];
      // Relative error, with an absolute floor for near-zero gradients
      // (float accumulation in the analytic path limits agreement to ~1e-6).
      const double error = std::abs(analytic - numeric) /
                           std::max(std::abs(analytic) + std::abs(numeric), 1e-4);
      INFO(mlp->params()[t].name << "[" << k << "] analytic=" << analytic
                                 << " numeric=" << numeric);
      CHECK(error < 1e-3);
    }
  }
}

TEST_CASE("scratch reuse across batch sizes gives the same gradients") {
  const std::vector<int> sizes = {20, 16, 10};
  absl::StatusOr<Mlp> mlp = Mlp::Create(MlpOptions{sizes, 1});
  REQUIRE(mlp.ok());
  Mlp fresh = *mlp;
  const Batch small = RandomBatch(3, 20, 10, 1);
  const Batch large = RandomBatch(9, 20, 10, 2);
  Gradients expected, got;
  REQUIRE(fresh.ComputeGradients(small.images.data(), small.labels.data(), 3,
                                 &expected).ok());
  REQUIRE(mlp->ComputeGradients(large.images.data(), large.labels.data(), 9,
                                &got).ok());
  REQUIRE(mlp->ComputeGradients(small.images.data(), small.labels.data(), 3,
                                &got).ok());
  CHECK(got == expected);
}

TEST_CASE("local SGD on a Fashion-MNIST subset learns") {
  absl::StatusOr<Dataset> train =
      LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
  REQUIRE(train.ok());
  absl::StatusOr<Dataset> test =
      LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  REQUIRE(test.ok());
  const Dataset subset = Subset(*train, 2000);
  absl::StatusOr<Mlp> mlp = Mlp::Create(MlpOptions{});
  REQUIRE(mlp.ok());

  absl::StatusOr<float> initial_loss = mlp->Loss(
      subset.images.data(), subset.labels.data(), subset.num_examples);
  REQUIRE(initial_loss.ok());

  const int batch = 64, epochs = 4, size = subset.example_size();
  std::vector<int> order(subset.num_examples);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(11);
  std::vector<float> images(static_cast<size_t>(batch) * size);
  std::vector<uint8_t> labels(batch);
  Gradients grads;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int start = 0; start + batch <= subset.num_examples; start += batch) {
      for (int b = 0; b < batch; ++b) {
        const int i = order[start + b];
        std::copy(subset.image(i), subset.image(i) + size,
                  images.begin() + static_cast<size_t>(b) * size);
        labels[b] = subset.labels[i];
      }
      REQUIRE(mlp->ComputeGradients(images.data(), labels.data(), batch,
                                    &grads).ok());
      REQUIRE(mlp->SgdStep(grads, 0.1f).ok());
    }
  }
  absl::StatusOr<float> final_loss = mlp->Loss(
      subset.images.data(), subset.labels.data(), subset.num_examples);
  REQUIRE(final_loss.ok());
  absl::StatusOr<double> accuracy = mlp->Evaluate(*test);
  REQUIRE(accuracy.ok());
  INFO("loss " << *initial_loss << " -> " << *final_loss << ", test accuracy "
               << *accuracy);
  CHECK(*final_loss < 0.5f * *initial_loss);
  CHECK(*accuracy > 0.6);
}

}  // namespace
}  // namespace harrier::workload
