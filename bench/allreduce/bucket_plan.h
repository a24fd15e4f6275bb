// How the all-reduce baseline lays a model's gradients out in buckets, the
// way PyTorch DDP does: tensors taken in backward order (last layer first)
// and grouped until a bucket holds at least bucket_bytes, so a bucket is
// complete, and can be all-reduced, as soon as backward has passed the layer
// of its last tensor while backward of earlier layers goes on.
//
// The gradient and parameter buffers are laid out in this bucket order, so
// every bucket is one contiguous span reduced in place (DDP copies into
// bucket views instead; the wire traffic is the same).

#ifndef HARRIER_BENCH_ALLREDUCE_BUCKET_PLAN_H_
#define HARRIER_BENCH_ALLREDUCE_BUCKET_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace harrier::allreduce {

// One layer in forward order: the element counts of the tensors its
// backward produces, and its modelled compute at scale 1.
struct LayerShape {
  std::string name;
  std::vector<int64_t> tensor_elements;
  double forward_ms = 0;
  double backward_ms = 0;
};

struct TensorSlot {
  int layer = 0;
  int64_t elements = 0;
  // Where the tensor starts in the model's forward-order concatenation of
  // all tensors: the index the synthetic gradients are a function of, so
  // results do not depend on the bucket size.
  int64_t model_offset = 0;
  // Where it starts in the bucket-ordered buffers.
  int64_t buffer_offset = 0;
};

struct Bucket {
  int64_t buffer_offset = 0;  // elements
  int64_t elements = 0;
  // Backward completes this bucket when it finishes this layer (the
  // lowest-numbered layer among the bucket's tensors).
  int ready_after_layer = 0;
};

struct BucketPlan {
  std::vector<TensorSlot> tensors;  // backward order = buffer order
  std::vector<Bucket> buckets;      // in the order they become ready
  int64_t total_elements = 0;
};

// bucket_bytes 0: one bucket of every gradient, ready when backward ends.
// A tensor larger than bucket_bytes is a bucket of its own. Float32
// gradients. INVALID_ARGUMENT for an empty model or a negative size.
absl::StatusOr<BucketPlan> PlanBuckets(const std::vector<LayerShape>& layers,
                                       int64_t bucket_bytes);

}  // namespace harrier::allreduce

#endif  // HARRIER_BENCH_ALLREDUCE_BUCKET_PLAN_H_
