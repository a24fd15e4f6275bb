#include "worker/workload/cnn.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/workload/fashion_mnist.h"

// Counts heap allocations, so a test can assert that a training step
// after the first allocates nothing. Not under the sanitizers, which
// replace operator new themselves (ours would pair their new with free).
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HARRIER_CNN_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HARRIER_CNN_TEST_SANITIZED 1
#endif

namespace {
std::atomic<int64_t> allocations{0};
}  // namespace

#ifndef HARRIER_CNN_TEST_SANITIZED
void* operator new(size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
#endif

namespace harrier::workload {
namespace {

using Doubles = std::vector<std::vector<double>>;

// A direct (no im2col, no BLAS) double-precision forward pass with
// PyTorch's conventions: Conv2d is a cross-correlation with weight
// [out][in][ky][kx], zero padding 2, max_pool2d 2, flatten C,H,W, and the
// example's pixel standardisation. Returns each example's logits.
std::vector<std::vector<double>> ReferenceLogits(const Doubles& p, const float* images,
                                                 int batch) {
  auto conv = [](const std::vector<double>& in, int cin, int side, const std::vector<double>& w,
                 const std::vector<double>& bias, int cout) {
    std::vector<double> out(static_cast<size_t>(cout) * side * side);
    for (int o = 0; o < cout; ++o) {
      for (int y = 0; y < side; ++y) {
        for (int x = 0; x < side; ++x) {
          double sum = bias[o];
          for (int c = 0; c < cin; ++c) {
            for (int ky = 0; ky < 5; ++ky) {
              for (int kx = 0; kx < 5; ++kx) {
                const int iy = y + ky - 2, ix = x + kx - 2;
                if (iy < 0 || iy >= side || ix < 0 || ix >= side) continue;
                sum += w[((o * cin + c) * 5 + ky) * 5 + kx] * in[(c * side + iy) * side + ix];
              }
            }
          }
          out[(o * side + y) * side + x] = std::max(sum, 0.0);
        }
      }
    }
    return out;
  };
  auto pool = [](const std::vector<double>& in, int channels, int side) {
    const int half = side / 2;
    std::vector<double> out(static_cast<size_t>(channels) * half * half);
    for (int c = 0; c < channels; ++c) {
      for (int y = 0; y < half; ++y) {
        for (int x = 0; x < half; ++x) {
          double m = -1e300;
          for (int dy = 0; dy < 2; ++dy) {
            for (int dx = 0; dx < 2; ++dx) {
              m = std::max(m, in[(c * side + 2 * y + dy) * side + 2 * x + dx]);
            }
          }
          out[(c * half + y) * half + x] = m;
        }
      }
    }
    return out;
  };
  auto dense = [](const std::vector<double>& in, const std::vector<double>& w,
                  const std::vector<double>& bias, bool relu) {
    const size_t n_in = in.size(), n_out = bias.size();
    std::vector<double> out(n_out);
    for (size_t o = 0; o < n_out; ++o) {
      double sum = bias[o];
      for (size_t i = 0; i < n_in; ++i) sum += w[o * n_in + i] * in[i];
      out[o] = relu ? std::max(sum, 0.0) : sum;
    }
    return out;
  };
  std::vector<std::vector<double>> logits;
  for (int b = 0; b < batch; ++b) {
    std::vector<double> x(784);
    for (int i = 0; i < 784; ++i) x[i] = (images[b * 784 + i] - 0.2860) / 0.3530;
    x = pool(conv(x, 1, 28, p[0], p[1], 16), 16, 28);
    x = pool(conv(x, 16, 14, p[2], p[3], 32), 32, 14);
    x = dense(x, p[4], p[5], true);
    logits.push_back(dense(x, p[6], p[7], false));
  }
  return logits;
}

double ReferenceLoss(const Doubles& p, const float* images, const uint8_t* labels, int batch) {
  double total = 0;
  const auto logits = ReferenceLogits(p, images, batch);
  for (int b = 0; b < batch; ++b) {
    const double max = *std::max_element(logits[b].begin(), logits[b].end());
    double sum = 0;
    for (double z : logits[b]) sum += std::exp(z - max);
    total += max + std::log(sum) - logits[b][labels[b]];
  }
  return total / batch;
}

Doubles AsDoubles(const std::vector<ParamTensor>& params) {
  Doubles out;
  for (const ParamTensor& p : params) out.emplace_back(p.values.begin(), p.values.end());
  return out;
}

const Dataset& TrainSet() {
  static const Dataset* train = [] {
    auto loaded = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
    REQUIRE(loaded.ok());
    return new Dataset(Subset(*loaded, 4096));
  }();
  return *train;
}

const Dataset& TestSet() {
  static const Dataset* test = [] {
    auto loaded = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
    REQUIRE(loaded.ok());
    return new Dataset(std::move(*loaded));
  }();
  return *test;
}

// The last `n` test examples (not the first: a held-out slice no other
// case looks at).
Dataset TestTail(int n) {
  const Dataset& test = TestSet();
  Dataset out;
  out.rows = test.rows;
  out.cols = test.cols;
  out.num_examples = n;
  const int first = test.num_examples - n;
  out.images.assign(test.image(first), test.image(first) + static_cast<size_t>(n) * 784);
  out.labels.assign(test.labels.begin() + first, test.labels.end());
  return out;
}

// Real images (ReLUs and pools see realistic activations) with nonzero
// biases, so every gradient is exercised away from the origin.
Cnn NudgedCnn(uint64_t seed) {
  absl::StatusOr<Cnn> cnn = Cnn::Create(CnnOptions{seed});
  REQUIRE(cnn.ok());
  std::mt19937_64 rng(seed + 100);
  std::uniform_real_distribution<float> small(-0.05f, 0.05f);
  for (ParamTensor& p : cnn->params()) {
    if (p.shape.size() == 1) {
      for (float& v : p.values) v = small(rng);
    }
  }
  return std::move(*cnn);
}

TEST_CASE("layout: names, shapes and 215,370 parameters in the documented order") {
  absl::StatusOr<Cnn> cnn = Cnn::Create(CnnOptions{});
  REQUIRE(cnn.ok());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"conv1.weight", {16, 1, 5, 5}}, {"conv1.bias", {16}},
      {"conv2.weight", {32, 16, 5, 5}}, {"conv2.bias", {32}},
      {"fc1.weight", {128, 1568}},      {"fc1.bias", {128}},
      {"fc2.weight", {10, 128}},        {"fc2.bias", {10}}};
  const std::vector<ParamTensor>& params = cnn->params();
  REQUIRE(params.size() == expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].name == expected[i].first);
    CHECK(params[i].shape == expected[i].second);
    const int64_t size = std::accumulate(params[i].shape.begin(), params[i].shape.end(),
                                         int64_t{1}, std::multiplies<int64_t>());
    CHECK(static_cast<int64_t>(params[i].values.size()) == size);
  }
  CHECK(cnn->num_parameters() == 215370);
  CHECK(Cnn::kNumParameters == 215370);
  CHECK(cnn->input_size() == 784);
  CHECK(cnn->num_classes() == 10);
  CHECK(cnn->device() == nullptr);
  // Bounds sqrt(3 / fan in) (fan in 25, 400, 1568), Glorot for fc2, zero
  // biases.
  const std::vector<std::pair<int, double>> limits = {
      {0, std::sqrt(3.0 / 25)}, {2, std::sqrt(3.0 / 400)}, {4, std::sqrt(3.0 / 1568)},
      {6, std::sqrt(6.0 / 138)}};
  for (const auto& [index, limit] : limits) {
    float largest = 0;
    for (float w : params[index].values) largest = std::max(largest, std::abs(w));
    INFO(params[index].name);
    CHECK(largest <= limit);
    CHECK(largest > 0.9 * limit);
  }
  for (int bias : {1, 3, 5, 7}) {
    for (float b : params[bias].values) CHECK(b == 0.0f);
  }
  const Gradients zero = cnn->ZeroGradients();
  REQUIRE(zero.size() == 8);
  for (size_t i = 0; i < zero.size(); ++i) {
    CHECK(zero[i].size() == params[i].values.size());
    CHECK(std::all_of(zero[i].begin(), zero[i].end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("same seed, same parameters; another seed, others") {
  absl::StatusOr<Cnn> a = Cnn::Create(CnnOptions{7});
  absl::StatusOr<Cnn> b = Cnn::Create(CnnOptions{7});
  absl::StatusOr<Cnn> c = Cnn::Create(CnnOptions{8});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  for (size_t i = 0; i < a->params().size(); ++i) {
    CHECK(a->params()[i].values == b->params()[i].values);
  }
  for (int weight : {0, 2, 4, 6}) CHECK(a->params()[weight].values != c->params()[weight].values);
}

TEST_CASE("bad inputs are InvalidArgument and leave the parameters untouched") {
  Cnn cnn = NudgedCnn(3);
  const std::vector<ParamTensor> before = cnn.params();
  auto unchanged = [&] {
    for (size_t i = 0; i < before.size(); ++i) {
      if (cnn.params()[i].values != before[i].values) return false;
    }
    return true;
  };
  const std::vector<float> images(2 * 784, 0.5f);
  const uint8_t good[2] = {0, 9};
  const uint8_t bad[2] = {0, 10};
  Gradients grads = cnn.ZeroGradients();
  grads[0][0] = 123.0f;  // a refused call must not write the gradients either
  const auto invalid = absl::StatusCode::kInvalidArgument;
  CHECK(cnn.ComputeGradients(images.data(), bad, 2, &grads).status().code() == invalid);
  CHECK(cnn.ComputeGradients(images.data(), good, 0, &grads).status().code() == invalid);
  CHECK(cnn.ComputeGradients(images.data(), good, -1, &grads).status().code() == invalid);
  CHECK(cnn.ComputeGradients(nullptr, good, 2, &grads).status().code() == invalid);
  CHECK(cnn.ComputeGradients(images.data(), nullptr, 2, &grads).status().code() == invalid);
  CHECK(cnn.ComputeGradients(images.data(), good, 2, nullptr).status().code() == invalid);
  CHECK(cnn.Loss(images.data(), bad, 2).status().code() == invalid);
  CHECK(grads[0][0] == 123.0f);
  CHECK(unchanged());

  // Gradients of the wrong layout: SgdStep refuses before touching anything.
  Gradients short_grads = cnn.ZeroGradients();
  for (auto& g : short_grads) std::fill(g.begin(), g.end(), 1.0f);
  short_grads[5].pop_back();
  CHECK(cnn.SgdStep(short_grads, 0.1f).code() == invalid);
  short_grads.pop_back();
  CHECK(cnn.SgdStep(short_grads, 0.1f).code() == invalid);
  CHECK(cnn.SgdStep(Gradients{}, 0.1f).code() == invalid);
  CHECK(unchanged());

  // Parameters a caller resized: refused, not read out of bounds.
  Cnn resized = cnn;
  resized.params()[4].values.pop_back();
  CHECK(resized.ComputeGradients(images.data(), good, 2, &grads).status().code() == invalid);
  CHECK(resized.Evaluate(TestTail(10)).status().code() == invalid);

  Dataset wrong_size;
  wrong_size.num_examples = 1;
  wrong_size.rows = 28;
  wrong_size.cols = 27;
  wrong_size.images.assign(28 * 27, 0.0f);
  wrong_size.labels = {0};
  CHECK(cnn.Evaluate(wrong_size).status().code() == invalid);
  Dataset empty;
  empty.rows = empty.cols = 28;
  CHECK(cnn.Evaluate(empty).status().code() == invalid);
  Dataset bad_label = TestTail(3);
  bad_label.labels[2] = 10;
  CHECK(cnn.Evaluate(bad_label).status().code() == invalid);
  Dataset inconsistent = TestTail(3);
  inconsistent.labels.pop_back();
  CHECK(cnn.Evaluate(inconsistent).status().code() == invalid);
  CHECK(unchanged());

  std::vector<std::vector<double>> wrong(8);
  CHECK(CnnLossAndGradientsDouble(wrong, images.data(), good, 2, nullptr).status().code() ==
        invalid);
}

TEST_CASE("the forward pass is PyTorch's net: loss against a direct reference") {
  Cnn cnn = NudgedCnn(5);
  const Dataset& train = TrainSet();
  const int batch = 3;
  const Doubles params = AsDoubles(cnn.params());
  const double reference =
      ReferenceLoss(params, train.image(100), &train.labels[100], batch);
  absl::StatusOr<double> in_double =
      CnnLossAndGradientsDouble(params, train.image(100), &train.labels[100], batch, nullptr);
  REQUIRE(in_double.ok());
  CHECK(*in_double == Approx(reference).epsilon(1e-12));
  absl::StatusOr<float> in_float = cnn.Loss(train.image(100), &train.labels[100], batch);
  REQUIRE(in_float.ok());
  CHECK(*in_float == Approx(reference).epsilon(1e-5));
  Gradients grads;
  absl::StatusOr<float> with_grads =
      cnn.ComputeGradients(train.image(100), &train.labels[100], batch, &grads);
  REQUIRE(with_grads.ok());
  CHECK(*with_grads == Approx(reference).epsilon(1e-5));
}

TEST_CASE("gradients match central finite differences in double on every tensor") {
  Cnn cnn = NudgedCnn(11);
  const Dataset& train = TrainSet();
  const int batch = 4;
  const float* images = train.image(200);
  const uint8_t* labels = &train.labels[200];
  Doubles params = AsDoubles(cnn.params());
  Doubles analytic;
  absl::StatusOr<double> loss =
      CnnLossAndGradientsDouble(params, images, labels, batch, &analytic);
  REQUIRE(loss.ok());
  REQUIRE(analytic.size() == 8);

  // The float model's gradients are the double ones up to float rounding.
  Gradients grads;
  REQUIRE(cnn.ComputeGradients(images, labels, batch, &grads).ok());
  REQUIRE(grads.size() == 8);
  for (size_t t = 0; t < grads.size(); ++t) {
    REQUIRE(grads[t].size() == analytic[t].size());
    double scale = 0, worst = 0;
    for (size_t i = 0; i < grads[t].size(); ++i) {
      scale = std::max(scale, std::abs(analytic[t][i]));
      worst = std::max(worst, std::abs(grads[t][i] - analytic[t][i]));
    }
    INFO(cnn.params()[t].name << ": max |float - double| " << worst << ", max |grad| " << scale);
    CHECK(scale > 0);
    CHECK(worst <= 1e-4 * scale);
  }

  std::mt19937_64 rng(17);
  const double h = 1e-6;
  for (size_t t = 0; t < params.size(); ++t) {
    // The largest gradient of the tensor plus random coordinates.
    std::vector<size_t> picks = {static_cast<size_t>(
        std::max_element(analytic[t].begin(), analytic[t].end(),
                         [](double a, double b) { return std::abs(a) < std::abs(b); }) -
        analytic[t].begin())};
    for (int trial = 0; trial < 5; ++trial) picks.push_back(rng() % params[t].size());
    for (size_t k : picks) {
      const double saved = params[t][k];
      params[t][k] = saved + h;
      auto up = CnnLossAndGradientsDouble(params, images, labels, batch, nullptr);
      params[t][k] = saved - h;
      auto down = CnnLossAndGradientsDouble(params, images, labels, batch, nullptr);
      params[t][k] = saved;
      REQUIRE(up.ok());
      REQUIRE(down.ok());
      const double numeric = (*up - *down) / (2 * h);
      INFO(cnn.params()[t].name << "[" << k << "] analytic=" << analytic[t][k]
                                << " numeric=" << numeric);
      CHECK(std::abs(analytic[t][k] - numeric) <= 1e-7 + 1e-6 * std::abs(numeric));
    }
  }
}

TEST_CASE("scratch reuse across batch sizes gives the same gradients") {
  Cnn cnn = NudgedCnn(2);
  Cnn fresh = cnn;
  const Dataset& train = TrainSet();
  Gradients expected, got;
  REQUIRE(fresh.ComputeGradients(train.image(0), train.labels.data(), 3, &expected).ok());
  REQUIRE(cnn.ComputeGradients(train.image(10), &train.labels[10], 9, &got).ok());
  REQUIRE(cnn.ComputeGradients(train.image(0), train.labels.data(), 3, &got).ok());
  CHECK(got == expected);
}

TEST_CASE("a step after the first at that batch size allocates nothing") {
  Cnn cnn = NudgedCnn(8);
  const Dataset& train = TrainSet();
  Gradients grads;
  REQUIRE(cnn.ComputeGradients(train.image(0), train.labels.data(), 16, &grads).ok());
  REQUIRE(cnn.SgdStep(grads, 0.01f).ok());
  const int64_t before = allocations.load();
  const bool step_ok =
      cnn.ComputeGradients(train.image(16), &train.labels[16], 16, &grads).ok() &&
      cnn.SgdStep(grads, 0.01f).ok() &&
      cnn.ComputeGradients(train.image(32), &train.labels[32], 8, &grads).ok();
  const int64_t during = allocations.load() - before;
  CHECK(step_ok);
#ifdef HARRIER_CNN_TEST_SANITIZED
  WARN("sanitizer build: allocations not counted");
  (void)during;
#else
  CHECK(during == 0);
#endif
}

TEST_CASE("SgdStep subtracts lr times the gradients") {
  Cnn cnn = NudgedCnn(4);
  const std::vector<ParamTensor> before = cnn.params();
  Gradients grads = cnn.ZeroGradients();
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& g : grads) {
    for (float& v : g) v = value(rng);
  }
  REQUIRE(cnn.SgdStep(grads, 0.25f).ok());
  for (size_t t = 0; t < grads.size(); ++t) {
    float worst = 0;
    for (size_t i = 0; i < grads[t].size(); ++i) {
      worst = std::max(worst, std::abs(cnn.params()[t].values[i] -
                                       (before[t].values[i] - 0.25f * grads[t][i])));
    }
    INFO(before[t].name);
    CHECK(worst <= 1e-6f);
  }
}

TEST_CASE("Evaluate counts the examples whose largest logit is the label") {
  Cnn cnn = NudgedCnn(6);
  // 260 examples: more than one of Evaluate's 256-example batches.
  Dataset data = TestTail(260);
  const auto logits = ReferenceLogits(AsDoubles(cnn.params()), data.images.data(), 260);
  // Labels: the reference's prediction for the first 156, another class for
  // the rest, so the accuracy must be exactly 156 / 260 = 0.6.
  for (int b = 0; b < 260; ++b) {
    const int predicted =
        static_cast<int>(std::max_element(logits[b].begin(), logits[b].end()) - logits[b].begin());
    data.labels[b] = static_cast<uint8_t>(b < 156 ? predicted : (predicted + 1) % 10);
  }
  absl::StatusOr<double> accuracy = cnn.Evaluate(data);
  REQUIRE(accuracy.ok());
  CHECK(*accuracy == Approx(0.6).margin(1e-12));
}

TEST_CASE("a short training reaches 0.72 on held-out test examples") {
  // 200 steps of batch 32 over 4,096 training examples (1.6 epochs), plain
  // SGD at lr 0.1; held out: the last 2,000 test examples. Measured 0.80
  // with seed 1 (0.78 and 0.80 with seeds 2 and 3).
  const Dataset& train = TrainSet();
  const Dataset held_out = TestTail(2000);
  absl::StatusOr<Cnn> cnn = Cnn::Create(CnnOptions{1});
  REQUIRE(cnn.ok());
  absl::StatusOr<double> initial = cnn->Evaluate(held_out);
  REQUIRE(initial.ok());
  // Under the sanitizers (HARRIER_TEST_SLOWDOWN set, tests/sanitizers)
  // 20 steps run the same code for memory errors in a fraction of the time
  // (200 took 150 s of the 190 under ASan); the accuracy is checked in the
  // plain build.
  const char* slowdown = std::getenv("HARRIER_TEST_SLOWDOWN");
  const bool sanitized = slowdown != nullptr && std::atof(slowdown) > 1;
  const int batch = 32, steps = sanitized ? 20 : 200;
  std::vector<int> order(train.num_examples);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(11);
  std::vector<float> images(static_cast<size_t>(batch) * 784);
  std::vector<uint8_t> labels(batch);
  Gradients grads;
  double first_loss = 0, last_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0, at = train.num_examples; step < steps; ++step, at += batch) {
    if (at + batch > train.num_examples) {
      std::shuffle(order.begin(), order.end(), rng);
      at = 0;
    }
    for (int b = 0; b < batch; ++b) {
      const int i = order[at + b];
      std::copy(train.image(i), train.image(i) + 784, images.begin() + b * 784);
      labels[b] = train.labels[i];
    }
    absl::StatusOr<float> loss = cnn->ComputeGradients(images.data(), labels.data(), batch, &grads);
    REQUIRE(loss.ok());
    if (step < 20) first_loss += *loss / 20;
    if (step >= steps - 20) last_loss += *loss / 20;
    REQUIRE(cnn->SgdStep(grads, 0.1f).ok());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  absl::StatusOr<double> accuracy = cnn->Evaluate(held_out);
  REQUIRE(accuracy.ok());
  std::printf("cnn short training: %d steps of %d in %.2f s (%.1f ms/step), loss %.3f -> %.3f, "
              "held-out accuracy %.4f -> %.4f\n",
              steps, batch, seconds, 1000 * seconds / steps, first_loss, last_loss, *initial,
              *accuracy);
  CHECK(*initial < 0.3);
  if (sanitized) {
    WARN("HARRIER_TEST_SLOWDOWN=" << slowdown << ": 20 steps, accuracy not checked");
    return;
  }
  CHECK(last_loss < 0.5 * first_loss);
  CHECK(*accuracy >= 0.72);
}

// Not run by default: `bazel run -c opt //tests/workload:cnn_test -- "[.bench]"`
// (the rule sets OPENBLAS_NUM_THREADS=1 for bazel test; export it for run).
TEST_CASE("ms per step at batch 64", "[.bench]") {
  const Dataset& train = TrainSet();
  absl::StatusOr<Cnn> cnn = Cnn::Create(CnnOptions{1});
  REQUIRE(cnn.ok());
  Gradients grads;
  const int batch = 64, warmup = 5, steps = 100;
  std::chrono::steady_clock::time_point start;
  std::clock_t cpu_start = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      start = std::chrono::steady_clock::now();
      cpu_start = std::clock();
    }
    const int at = (step * batch) % (train.num_examples - batch);
    REQUIRE(cnn->ComputeGradients(train.image(at), &train.labels[at], batch, &grads).ok());
    REQUIRE(cnn->SgdStep(grads, 0.01f).ok());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // CPU time too: on a shared machine wall time includes other processes'.
  const double cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  const auto eval_start = std::chrono::steady_clock::now();
  const std::clock_t eval_cpu_start = std::clock();
  REQUIRE(cnn->Evaluate(TestSet()).ok());
  const double eval_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
  const double eval_cpu_s = static_cast<double>(std::clock() - eval_cpu_start) / CLOCKS_PER_SEC;
  std::printf("cnn batch %d: %.2f ms per step wall, %.2f ms CPU (ComputeGradients + SgdStep, "
              "%d steps); Evaluate of 10,000 test examples %.2f s wall, %.2f s CPU\n",
              batch, 1000 * seconds / steps, 1000 * cpu_seconds / steps, steps, eval_s,
              eval_cpu_s);
}

}  // namespace
}  // namespace harrier::workload
