#include "worker/workload/replay_models.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace harrier::workload {
namespace {

ReplayModelSpec Get(const std::string& name) {
  absl::StatusOr<ReplayModelSpec> spec = FindReplayModel(name);
  REQUIRE(spec.ok());
  return *std::move(spec);
}

const ReplayTensor* Find(const ReplayModelSpec& spec, const std::string& name) {
  for (const ReplayLayer& layer : spec.layers) {
    for (const ReplayTensor& t : layer.tensors) {
      if (t.name == name) return &t;
    }
  }
  return nullptr;
}

// Properties every model must have: unique names, positive compute in every
// layer, backward twice forward, a source that names the anchor.
void CheckCommon(const ReplayModelSpec& spec) {
  std::set<std::string> names;
  for (const ReplayLayer& layer : spec.layers) {
    CHECK(!layer.tensors.empty());
    CHECK(layer.forward_ms > 0);
    CHECK(layer.backward_ms == Approx(2 * layer.forward_ms));
    for (const ReplayTensor& t : layer.tensors) {
      CHECK(names.insert(t.name).second);
      CHECK(t.num_elements() > 0);
    }
  }
  CHECK(absl::StrContains(spec.source, "DeepLearningExamples"));
  CHECK(spec.batch_size > 0);
}

TEST_CASE("resnet50 is torchvision's: 161 tensors, 25,557,032 parameters") {
  const ReplayModelSpec spec = Get("resnet50");
  CheckCommon(spec);
  CHECK(spec.num_tensors() == 161);
  CHECK(spec.layers.size() == 1 + 16 * 3 + 4 + 1);  // stem, bottleneck convs, downsamples, fc
  CHECK(spec.num_parameters() == 25557032);
  int convs = 0, bns = 0;
  for (const ReplayLayer& layer : spec.layers) {
    for (const ReplayTensor& t : layer.tensors) {
      if (t.shape.size() == 4) ++convs;
      if (t.shape.size() == 1 && t.name != "fc.bias") ++bns;
    }
  }
  CHECK(convs == 53);
  CHECK(bns == 2 * 53);
  // Forward order and torchvision's names at both ends and at a downsample.
  CHECK(spec.layers.front().tensors.front().name == "conv1.weight");
  CHECK(spec.layers.back().tensors.back().name == "fc.bias");
  const ReplayTensor* ds = Find(spec, "layer3.0.downsample.0.weight");
  REQUIRE(ds != nullptr);
  CHECK(ds->shape == std::vector<int64_t>{1024, 512, 1, 1});
  const ReplayTensor* c2 = Find(spec, "layer4.2.conv2.weight");
  REQUIRE(c2 != nullptr);
  CHECK(c2->shape == std::vector<int64_t>{512, 512, 3, 3});
  CHECK(Find(spec, "fc.weight")->shape == std::vector<int64_t>{1000, 2048});
  // The anchor: 1200 img/s at batch 256 is 213.3 ms per iteration.
  CHECK(spec.compute_ms() == Approx(1000.0 * 256 / 1200));
  CHECK(spec.batch_size == 256);
}

TEST_CASE("vgg16 is torchvision's: 32 tensors, 138,357,544 parameters") {
  const ReplayModelSpec spec = Get("vgg16");
  CheckCommon(spec);
  CHECK(spec.num_tensors() == 32);
  CHECK(spec.num_parameters() == 138357544);
  CHECK(spec.layers.size() == 16);
  CHECK(Find(spec, "features.28.weight")->shape == std::vector<int64_t>{512, 512, 3, 3});
  CHECK(Find(spec, "classifier.0.weight")->shape == std::vector<int64_t>{4096, 25088});
  CHECK(Find(spec, "classifier.6.bias")->shape == std::vector<int64_t>{1000});
  // Conv layers dominate compute though the classifier holds most bytes:
  // the first conv block's time exceeds the 102 M-parameter classifier.0's.
  CHECK(spec.layers[1].forward_ms > spec.layers[13].forward_ms);
}

TEST_CASE("bert-base is bert-base-uncased's BertModel: 199 tensors, 109,482,240 parameters") {
  const ReplayModelSpec spec = Get("bert-base");
  CheckCommon(spec);
  // By arithmetic, independent of the construction.
  const int64_t h = 768, ffn = 3072;
  const int64_t embeddings = 30522 * h + 512 * h + 2 * h + 2 * h;
  const int64_t attention = 4 * (h * h + h) + 2 * h;
  const int64_t mlp = (h * ffn + ffn) + (ffn * h + h) + 2 * h;
  const int64_t pooler = h * h + h;
  const int64_t total = embeddings + 12 * (attention + mlp) + pooler;
  CHECK(total == 109482240);
  CHECK(spec.num_parameters() == total);
  CHECK(spec.num_tensors() == 5 + 12 * 16 + 2);
  CHECK(spec.num_tensors() == 199);
  CHECK(spec.layers.size() == 1 + 12 * 4 + 1);
  CHECK(Find(spec, "encoder.layer.11.output.LayerNorm.bias") != nullptr);
  CHECK(Find(spec, "embeddings.word_embeddings.weight")->shape ==
        std::vector<int64_t>{30522, 768});
  CHECK(spec.layers.back().name == "pooler");
}

TEST_CASE("unknown replay model lists the known ones") {
  CHECK(ReplayModelNames() == std::vector<std::string>{"resnet50", "vgg16", "bert-base"});
  absl::StatusOr<ReplayModelSpec> spec = FindReplayModel("resnet51");
  REQUIRE(!spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kNotFound);
  for (const std::string& name : ReplayModelNames()) {
    CHECK(absl::StrContains(spec.status().message(), name));
  }
}

}  // namespace
}  // namespace harrier::workload
