#ifndef HARRIER_SERVER_OPTIMIZER_H_
#define HARRIER_SERVER_OPTIMIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace harrier {

struct OptimizerOptions {
  std::string kind = "sgd";  // sgd | momentum | nesterov | adam | adagrad
  float lr = 0.01f;
  float momentum = 0.9f;     // momentum, nesterov
  float beta1 = 0.9f;        // adam
  float beta2 = 0.999f;      // adam
  float epsilon = 1e-8f;     // adam, adagrad
  float weight_decay = 0.0f; // L2, added to the gradient
};

// Per-parameter-chunk optimizer state (moments, step count). Owned by the
// shard's slot; serialisable for checkpoints as a flat float vector.
struct OptimizerState {
  std::vector<float> first;   // momentum / Adam m / AdaGrad accumulator
  std::vector<float> second;  // Adam v
  long long steps = 0;
};

// Applies one update w <- w - step(scale * g) in place (the scale folds the
// 1/n of SSP/ASP into the step without a copy of the gradient). Stateless apart from the
// state it is handed, so one Optimizer serves every key of a shard.
// Thread-compatible per state: the caller holds the slot's lock.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const OptimizerOptions& options() const = 0;
  virtual void Step(absl::Span<float> weights, absl::Span<const float> gradient, float scale,
                    OptimizerState& state) const = 0;
  // True for plain SGD (no state but the step count), with its constants:
  // the shard then fuses the step into the pass that checks the payload
  // (server/fused_apply.h), computing exactly Step's expression. The
  // stateful kinds and the delta optimizer answer false and keep the
  // two-step path (a fused check, then Step).
  virtual bool PlainSgd(float* lr, float* weight_decay) const {
    (void)lr;
    (void)weight_decay;
    return false;
  }
};

// InvalidArgument for an unknown kind or a hyper-parameter out of range.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options);

// The optimizer of local SGD, whose pushes are model deltas (the workers ran
// their own optimizer): w <- w - scale * delta, no learning rate, no state
// beyond the step count. options() reports kind "delta".
std::unique_ptr<Optimizer> CreateDeltaOptimizer();

// The step of a tensor whose value is the average of its last round
// (TABLE_AVERAGE): w <- scale * g, no state beyond the step count.
// options() reports kind "average".
std::unique_ptr<Optimizer> CreateAverageOptimizer();

}  // namespace harrier

#endif  // HARRIER_SERVER_OPTIMIZER_H_
