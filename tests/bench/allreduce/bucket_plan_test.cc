#include "bench/allreduce/bucket_plan.h"

#include <catch2/catch.hpp>
#include <vector>

namespace harrier::allreduce {
namespace {

// Layers 0..2 in forward order; element counts chosen so 4-byte floats make
// round byte sizes.
std::vector<LayerShape> ThreeLayers() {
  return {
      {"l0", {100, 10}, 1, 2},   // 440 bytes
      {"l1", {300}, 1, 2},       // 1200 bytes
      {"l2", {50, 25, 5}, 1, 2}, // 320 bytes
  };
}

TEST_CASE("bucket_bytes 0 puts every gradient in one bucket, ready after layer 0") {
  absl::StatusOr<BucketPlan> plan = PlanBuckets(ThreeLayers(), 0);
  REQUIRE(plan.ok());
  REQUIRE(plan->total_elements == 490);
  REQUIRE(plan->buckets.size() == 1);
  CHECK(plan->buckets[0].buffer_offset == 0);
  CHECK(plan->buckets[0].elements == 490);
  CHECK(plan->buckets[0].ready_after_layer == 0);
}

TEST_CASE("tensors are laid out last layer first, last tensor first") {
  absl::StatusOr<BucketPlan> plan = PlanBuckets(ThreeLayers(), 0);
  REQUIRE(plan.ok());
  REQUIRE(plan->tensors.size() == 6);
  // Buffer order: l2's 5, 25, 50, then l1's 300, then l0's 10, 100.
  const int64_t elements[] = {5, 25, 50, 300, 10, 100};
  const int64_t model_offsets[] = {485, 460, 410, 110, 100, 0};
  const int layers[] = {2, 2, 2, 1, 0, 0};
  int64_t buffer_offset = 0;
  for (int i = 0; i < 6; ++i) {
    CHECK(plan->tensors[i].elements == elements[i]);
    CHECK(plan->tensors[i].model_offset == model_offsets[i]);
    CHECK(plan->tensors[i].layer == layers[i]);
    CHECK(plan->tensors[i].buffer_offset == buffer_offset);
    buffer_offset += elements[i];
  }
}

TEST_CASE("a bucket closes once it reaches the cap; a large tensor is a bucket alone") {
  // Cap 320 bytes = 80 floats: l2's three tensors (80) fill the first
  // bucket exactly, l1's 300 exceeds the cap alone, l0's 10 + 100 close the
  // last.
  absl::StatusOr<BucketPlan> plan = PlanBuckets(ThreeLayers(), 320);
  REQUIRE(plan.ok());
  REQUIRE(plan->buckets.size() == 3);
  CHECK(plan->buckets[0].buffer_offset == 0);
  CHECK(plan->buckets[0].elements == 80);
  CHECK(plan->buckets[0].ready_after_layer == 2);
  CHECK(plan->buckets[1].buffer_offset == 80);
  CHECK(plan->buckets[1].elements == 300);
  CHECK(plan->buckets[1].ready_after_layer == 1);
  CHECK(plan->buckets[2].buffer_offset == 380);
  CHECK(plan->buckets[2].elements == 110);
  CHECK(plan->buckets[2].ready_after_layer == 0);
}

TEST_CASE("a bucket spanning layers is ready after the earliest of them") {
  // Cap 1400 bytes = 350 floats: l2 (80) + l1 (300) = 380 >= 350 closes the
  // first bucket, which needs l1's backward.
  absl::StatusOr<BucketPlan> plan = PlanBuckets(ThreeLayers(), 1400);
  REQUIRE(plan.ok());
  REQUIRE(plan->buckets.size() == 2);
  CHECK(plan->buckets[0].elements == 380);
  CHECK(plan->buckets[0].ready_after_layer == 1);
  CHECK(plan->buckets[1].elements == 110);
  CHECK(plan->buckets[1].ready_after_layer == 0);
}

TEST_CASE("an empty model and a negative cap are refused") {
  CHECK(PlanBuckets({}, 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(PlanBuckets(ThreeLayers(), -1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(PlanBuckets({{"bad", {0}, 1, 1}}, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace harrier::allreduce
