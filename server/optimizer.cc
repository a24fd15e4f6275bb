#include "server/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace harrier {
namespace {

void EnsureSize(std::vector<float>& v, size_t n) {
  if (v.size() != n) v.assign(n, 0.0f);
}

class Sgd : public Optimizer {
 public:
  explicit Sgd(OptimizerOptions options) : options_(std::move(options)) {}
  const OptimizerOptions& options() const override { return options_; }
  void Step(absl::Span<float> w, absl::Span<const float> g, float scale,
            OptimizerState& state) const override {
    const float lr = options_.lr, wd = options_.weight_decay;
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * (scale * g[i] + wd * w[i]);
    ++state.steps;
  }
  bool PlainSgd(float* lr, float* weight_decay) const override {
    *lr = options_.lr;
    *weight_decay = options_.weight_decay;
    return true;
  }

 private:
  OptimizerOptions options_;
};

// Heavy-ball momentum (u = m u + g; w -= lr u) and its Nesterov form
// (w -= lr (g + m u)), as in PyTorch's SGD.
class Momentum : public Optimizer {
 public:
  Momentum(OptimizerOptions options, bool nesterov)
      : options_(std::move(options)), nesterov_(nesterov) {}
  const OptimizerOptions& options() const override { return options_; }
  void Step(absl::Span<float> w, absl::Span<const float> g, float scale,
            OptimizerState& state) const override {
    EnsureSize(state.first, w.size());
    const float lr = options_.lr, m = options_.momentum, wd = options_.weight_decay;
    float* u = state.first.data();
    for (size_t i = 0; i < w.size(); ++i) {
      const float grad = scale * g[i] + wd * w[i];
      u[i] = m * u[i] + grad;
      w[i] -= lr * (nesterov_ ? grad + m * u[i] : u[i]);
    }
    ++state.steps;
  }

 private:
  OptimizerOptions options_;
  bool nesterov_;
};

class Adam : public Optimizer {
 public:
  explicit Adam(OptimizerOptions options) : options_(std::move(options)) {}
  const OptimizerOptions& options() const override { return options_; }
  void Step(absl::Span<float> w, absl::Span<const float> g, float scale,
            OptimizerState& state) const override {
    EnsureSize(state.first, w.size());
    EnsureSize(state.second, w.size());
    ++state.steps;
    const float b1 = options_.beta1, b2 = options_.beta2, wd = options_.weight_decay;
    const double t = static_cast<double>(state.steps);
    const float step = static_cast<float>(options_.lr * std::sqrt(1.0 - std::pow(b2, t)) /
                                          (1.0 - std::pow(b1, t)));
    float* m = state.first.data();
    float* v = state.second.data();
    for (size_t i = 0; i < w.size(); ++i) {
      const float grad = scale * g[i] + wd * w[i];
      m[i] = b1 * m[i] + (1 - b1) * grad;
      v[i] = b2 * v[i] + (1 - b2) * grad * grad;
      w[i] -= step * m[i] / (std::sqrt(v[i]) + options_.epsilon);
    }
  }

 private:
  OptimizerOptions options_;
};

class AdaGrad : public Optimizer {
 public:
  explicit AdaGrad(OptimizerOptions options) : options_(std::move(options)) {}
  const OptimizerOptions& options() const override { return options_; }
  void Step(absl::Span<float> w, absl::Span<const float> g, float scale,
            OptimizerState& state) const override {
    EnsureSize(state.first, w.size());
    float* acc = state.first.data();
    const float lr = options_.lr, wd = options_.weight_decay;
    for (size_t i = 0; i < w.size(); ++i) {
      const float grad = scale * g[i] + wd * w[i];
      acc[i] += grad * grad;
      w[i] -= lr * grad / (std::sqrt(acc[i]) + options_.epsilon);
    }
    ++state.steps;
  }

 private:
  OptimizerOptions options_;
};

// Local SGD: the pushed "gradient" is the average of the workers' model
// deltas over H steps, so the shard subtracts it as it is.
class Delta : public Optimizer {
 public:
  Delta() { options_.kind = "delta"; }
  const OptimizerOptions& options() const override { return options_; }
  void Step(absl::Span<float> w, absl::Span<const float> delta, float scale,
            OptimizerState& state) const override {
    for (size_t i = 0; i < w.size(); ++i) w[i] -= scale * delta[i];
    ++state.steps;
  }

 private:
  OptimizerOptions options_;
};

class Average : public Optimizer {
 public:
  Average() { options_.kind = "average"; }
  const OptimizerOptions& options() const override { return options_; }
  void Step(absl::Span<float> w, absl::Span<const float> average, float scale,
            OptimizerState& state) const override {
    for (size_t i = 0; i < w.size(); ++i) w[i] = scale * average[i];
    ++state.steps;
  }

 private:
  OptimizerOptions options_;
};

}  // namespace

std::unique_ptr<Optimizer> CreateDeltaOptimizer() { return std::make_unique<Delta>(); }
std::unique_ptr<Optimizer> CreateAverageOptimizer() { return std::make_unique<Average>(); }

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options) {
  if (!(options.lr > 0) || !std::isfinite(options.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("learning rate must be > 0, got ", options.lr));
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("momentum must be in [0, 1), got ", options.momentum));
  }
  if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1)) {
    return absl::InvalidArgumentError("adam betas must be in [0, 1)");
  }
  if (!(options.epsilon > 0)) return absl::InvalidArgumentError("epsilon must be > 0");
  if (!(options.weight_decay >= 0)) return absl::InvalidArgumentError("weight_decay must be >= 0");
  if (options.kind == "sgd") return std::unique_ptr<Optimizer>(new Sgd(options));
  if (options.kind == "momentum") return std::unique_ptr<Optimizer>(new Momentum(options, false));
  if (options.kind == "nesterov") return std::unique_ptr<Optimizer>(new Momentum(options, true));
  if (options.kind == "adam") return std::unique_ptr<Optimizer>(new Adam(options));
  if (options.kind == "adagrad") return std::unique_ptr<Optimizer>(new AdaGrad(options));
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer '", options.kind, "' (expected sgd, momentum, nesterov, adam or adagrad)"));
}

}  // namespace harrier
