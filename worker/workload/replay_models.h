#ifndef HARRIER_WORKER_WORKLOAD_REPLAY_MODELS_H_
#define HARRIER_WORKER_WORKLOAD_REPLAY_MODELS_H_

// Real models' per-layer parameter shapes and a per-layer compute-time
// model, so the communication of a large model can be replayed on a CPU
// machine (--workload=replay:NAME). Sources of shapes and timings are named
// in replay_models.cc and worker/workload/README.md.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace harrier::workload {

struct ReplayTensor {
  std::string name;             // e.g. "layer1.0.conv1.weight"
  std::vector<int64_t> shape;
  int64_t num_elements() const;
};

// One layer in forward order: the tensors its backward produces together
// and its modelled compute time at compute_scale 1 for one batch.
struct ReplayLayer {
  std::string name;
  std::vector<ReplayTensor> tensors;
  double forward_ms = 0;
  double backward_ms = 0;
};

struct ReplayModelSpec {
  std::string name;             // "resnet50", "vgg16", "bert-base"
  std::string source;           // where the shapes and timings come from
  int batch_size = 0;           // the batch the timings are for
  std::vector<ReplayLayer> layers;  // forward order

  int64_t num_parameters() const;
  int64_t num_tensors() const;
  double compute_ms() const;    // sum of forward and backward at scale 1
};

// The names FindReplayModel knows.
std::vector<std::string> ReplayModelNames();
// NOT_FOUND listing the known names otherwise.
absl::StatusOr<ReplayModelSpec> FindReplayModel(absl::string_view name);

}  // namespace harrier::workload

#endif  // HARRIER_WORKER_WORKLOAD_REPLAY_MODELS_H_
