#include "bench/allreduce/bucket_plan.h"

#include "absl/strings/str_cat.h"

namespace harrier::allreduce {

absl::StatusOr<BucketPlan> PlanBuckets(const std::vector<LayerShape>& layers,
                                       int64_t bucket_bytes) {
  if (bucket_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bucket_bytes ", bucket_bytes, " < 0"));
  }
  BucketPlan plan;
  std::vector<int64_t> model_offsets;  // per layer, forward order
  int64_t offset = 0;
  for (const LayerShape& layer : layers) {
    model_offsets.push_back(offset);
    for (int64_t elements : layer.tensor_elements) {
      if (elements <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer.name, " has a tensor of ", elements, " elements"));
      }
      offset += elements;
    }
  }
  if (offset == 0) return absl::InvalidArgumentError("the model has no parameters");

  const int64_t bucket_elements = bucket_bytes / static_cast<int64_t>(sizeof(float));
  Bucket open;
  bool has_open = false;
  for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
    const std::vector<int64_t>& tensors = layers[l].tensor_elements;
    // Within a layer, backward order too: DDP's buckets follow the
    // reverse of the parameters' registration order.
    int64_t layer_end = model_offsets[l];
    for (int64_t elements : tensors) layer_end += elements;
    int64_t model_offset = layer_end;
    for (int t = static_cast<int>(tensors.size()) - 1; t >= 0; --t) {
      model_offset -= tensors[t];
      TensorSlot slot;
      slot.layer = l;
      slot.elements = tensors[t];
      slot.model_offset = model_offset;
      slot.buffer_offset = plan.total_elements;
      plan.tensors.push_back(slot);
      plan.total_elements += tensors[t];
      if (!has_open) {
        open = Bucket{slot.buffer_offset, 0, l};
        has_open = true;
      }
      open.elements += tensors[t];
      open.ready_after_layer = l;
      if (bucket_elements > 0 && open.elements >= bucket_elements) {
        plan.buckets.push_back(open);
        has_open = false;
      }
    }
  }
  if (has_open) plan.buckets.push_back(open);
  return plan;
}

}  // namespace harrier::allreduce
