#include "worker/workload/replay_models.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

// Shapes: torchvision's resnet50 and vgg16 (torchvision/models/resnet.py,
// vgg.py: the tensor names are their state_dict names, trainable tensors
// only, no BN running statistics) and Hugging Face's BertModel with
// bert-base-uncased's config (including the pooler, no MLM/NSP heads).
// They are built from the architectures' definitions rather than stored as
// a table so that the counts in the test check the construction.
//
// Timing: a model, not a measurement. Each model's iteration time on one
// GPU is split over its layers in proportion to the layer's forward FLOPs
// (from shapes and activation sizes), backward = 2 x forward. The one
// published anchor is ResNet-50's: NVIDIA DeepLearningExamples,
// PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training
// performance: NVIDIA DGX-1 16GB (8x V100 16GB)", 1 GPU, mixed precision,
// 1200 img/s at batch 256 per GPU (pytorch-21.03 container), i.e. 213.3 ms
// per iteration. VGG-16 and BERT-base run at the same V100's effective
// FLOP rate that anchor implies (their FLOPs x the anchor's ms per FLOP):
// no per-model figure for them was found that could be cited, and a
// shared rate keeps the three models' compute comparable.

namespace harrier::workload {

int64_t ReplayTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ReplayModelSpec::num_parameters() const {
  int64_t n = 0;
  for (const ReplayLayer& layer : layers) {
    for (const ReplayTensor& t : layer.tensors) n += t.num_elements();
  }
  return n;
}

int64_t ReplayModelSpec::num_tensors() const {
  int64_t n = 0;
  for (const ReplayLayer& layer : layers) n += static_cast<int64_t>(layer.tensors.size());
  return n;
}

double ReplayModelSpec::compute_ms() const {
  double ms = 0;
  for (const ReplayLayer& layer : layers) ms += layer.forward_ms + layer.backward_ms;
  return ms;
}

namespace {

constexpr int kResNetBatch = 256;
constexpr double kResNetIterationMs = 1000.0 * kResNetBatch / 1200.0;
constexpr int kVggBatch = 64;
constexpr int kBertBatch = 32;
constexpr int64_t kBertSequence = 128;

// Collects layers with their per-sample forward FLOPs, then turns FLOPs
// into milliseconds once the whole model's time is known.
class SpecBuilder {
 public:
  void Add(std::string name, std::vector<ReplayTensor> tensors, double flops) {
    ReplayLayer layer;
    layer.name = std::move(name);
    layer.tensors = std::move(tensors);
    layers_.push_back(std::move(layer));
    flops_.push_back(flops);
  }

  double forward_flops() const {
    double f = 0;
    for (double x : flops_) f += x;
    return f;
  }

  // `iteration_ms`: forward + backward of one batch.
  ReplayModelSpec Finish(std::string name, std::string source, int batch, double iteration_ms) {
    const double total = forward_flops();
    ReplayModelSpec spec;
    spec.name = std::move(name);
    spec.source = std::move(source);
    spec.batch_size = batch;
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i].forward_ms = iteration_ms / 3.0 * flops_[i] / total;
      layers_[i].backward_ms = 2.0 * layers_[i].forward_ms;
    }
    spec.layers = std::move(layers_);
    return spec;
  }

 private:
  std::vector<ReplayLayer> layers_;
  std::vector<double> flops_;
};

ReplayTensor T(std::string name, std::vector<int64_t> shape) {
  return ReplayTensor{std::move(name), std::move(shape)};
}

// A conv (no bias) and its BN; per-sample forward FLOPs at output side
// `out_hw`, counting BN and ReLU as a few element operations.
void AddConvBn(SpecBuilder& b, const std::string& layer, const std::string& conv,
               const std::string& bn, int64_t cout, int64_t cin, int64_t k, int64_t out_hw) {
  const double pixels = static_cast<double>(out_hw * out_hw);
  const double flops = 2.0 * cout * cin * k * k * pixels + 4.0 * cout * pixels;
  b.Add(layer,
        {T(conv + ".weight", {cout, cin, k, k}), T(bn + ".weight", {cout}),
         T(bn + ".bias", {cout})},
        flops);
}

void BuildResNet50(SpecBuilder& b) {
  AddConvBn(b, "conv1", "conv1", "bn1", 64, 3, 7, 112);
  const int blocks[4] = {3, 4, 6, 3};
  int64_t in_ch = 64;
  int64_t hw = 56;  // after the stem's max pool
  for (int s = 0; s < 4; ++s) {
    const int64_t width = int64_t{64} << s;
    const int64_t out_ch = width * 4;
    const int64_t in_hw = hw;
    if (s > 0) hw /= 2;  // torchvision (v1.5): stride 2 in conv2 and downsample
    for (int k = 0; k < blocks[s]; ++k) {
      const std::string p = absl::StrCat("layer", s + 1, ".", k, ".");
      AddConvBn(b, p + "conv1", p + "conv1", p + "bn1", width, in_ch, 1, k == 0 ? in_hw : hw);
      AddConvBn(b, p + "conv2", p + "conv2", p + "bn2", width, width, 3, hw);
      AddConvBn(b, p + "conv3", p + "conv3", p + "bn3", out_ch, width, 1, hw);
      if (k == 0) {
        AddConvBn(b, p + "downsample", p + "downsample.0", p + "downsample.1", out_ch, in_ch, 1,
                  hw);
      }
      in_ch = out_ch;
    }
  }
  b.Add("fc", {T("fc.weight", {1000, 2048}), T("fc.bias", {1000})},
        2.0 * 2048 * 1000 + 2048.0 * 49 /* average pool */);
}

void BuildVgg16(SpecBuilder& b) {
  // torchvision's cfg "D"; 0 is a max pool. Indices count ReLUs and pools
  // too, as nn.Sequential numbers them.
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  int index = 0;
  int64_t in_ch = 3;
  int64_t hw = 224;
  for (int v : cfg) {
    if (v == 0) {
      hw /= 2;
      ++index;
      continue;
    }
    const std::string p = absl::StrCat("features.", index);
    const double pixels = static_cast<double>(hw * hw);
    b.Add(p, {T(p + ".weight", {v, in_ch, 3, 3}), T(p + ".bias", {v})},
          2.0 * v * in_ch * 9 * pixels + 2.0 * v * pixels);
    in_ch = v;
    index += 2;
  }
  const int64_t fc[][2] = {{4096, 512 * 7 * 7}, {4096, 4096}, {1000, 4096}};
  const int fc_index[] = {0, 3, 6};
  for (int i = 0; i < 3; ++i) {
    const std::string p = absl::StrCat("classifier.", fc_index[i]);
    b.Add(p, {T(p + ".weight", {fc[i][0], fc[i][1]}), T(p + ".bias", {fc[i][0]})},
          2.0 * fc[i][0] * fc[i][1]);
  }
}

void BuildBertBase(SpecBuilder& b) {
  constexpr int64_t kVocab = 30522, kPositions = 512, kTypes = 2, kLayers = 12, kHidden = 768,
                    kFfn = 3072, kHeads = 12;
  const double s = kBertSequence;
  const double h = kHidden;
  b.Add("embeddings",
        {T("embeddings.word_embeddings.weight", {kVocab, kHidden}),
         T("embeddings.position_embeddings.weight", {kPositions, kHidden}),
         T("embeddings.token_type_embeddings.weight", {kTypes, kHidden}),
         T("embeddings.LayerNorm.weight", {kHidden}), T("embeddings.LayerNorm.bias", {kHidden})},
        10.0 * s * h);
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = absl::StrCat("encoder.layer.", l, ".");
    const std::string a = p + "attention.self.";
    b.Add(p + "attention.self",
          {T(a + "query.weight", {kHidden, kHidden}), T(a + "query.bias", {kHidden}),
           T(a + "key.weight", {kHidden, kHidden}), T(a + "key.bias", {kHidden}),
           T(a + "value.weight", {kHidden, kHidden}), T(a + "value.bias", {kHidden})},
          3 * 2.0 * h * h * s + 2 * 2.0 * s * s * h + 5.0 * kHeads * s * s);
    const std::string o = p + "attention.output.";
    b.Add(p + "attention.output",
          {T(o + "dense.weight", {kHidden, kHidden}), T(o + "dense.bias", {kHidden}),
           T(o + "LayerNorm.weight", {kHidden}), T(o + "LayerNorm.bias", {kHidden})},
          2.0 * h * h * s + 10.0 * s * h);
    b.Add(p + "intermediate",
          {T(p + "intermediate.dense.weight", {kFfn, kHidden}),
           T(p + "intermediate.dense.bias", {kFfn})},
          2.0 * h * kFfn * s + 8.0 * kFfn * s);
    b.Add(p + "output",
          {T(p + "output.dense.weight", {kHidden, kFfn}), T(p + "output.dense.bias", {kHidden}),
           T(p + "output.LayerNorm.weight", {kHidden}), T(p + "output.LayerNorm.bias", {kHidden})},
          2.0 * kFfn * h * s + 10.0 * s * h);
  }
  b.Add("pooler", {T("pooler.dense.weight", {kHidden, kHidden}), T("pooler.dense.bias", {kHidden})},
        2.0 * h * h + 2.0 * h);
}

// The anchor's milliseconds per forward FLOP of one sample.
double AnchorMsPerFlop() {
  SpecBuilder resnet;
  BuildResNet50(resnet);
  return kResNetIterationMs / (resnet.forward_flops() * kResNetBatch);
}

constexpr char kAnchor[] =
    "NVIDIA DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
    "Training performance: DGX-1 16GB, 1x V100 16GB, mixed precision, 1200 img/s at batch 256";

}  // namespace

std::vector<std::string> ReplayModelNames() { return {"resnet50", "vgg16", "bert-base"}; }

absl::StatusOr<ReplayModelSpec> FindReplayModel(absl::string_view name) {
  SpecBuilder b;
  if (name == "resnet50") {
    BuildResNet50(b);
    return b.Finish("resnet50",
                    absl::StrCat("shapes: torchvision resnet50; timing: ", kAnchor,
                                 " (213.3 ms/iter) split by per-layer forward FLOPs, bwd = 2x fwd"),
                    kResNetBatch, kResNetIterationMs);
  }
  if (name == "vgg16") {
    BuildVgg16(b);
    const double ms = AnchorMsPerFlop() * b.forward_flops() * kVggBatch;
    return b.Finish("vgg16",
                    absl::StrCat("shapes: torchvision vgg16; timing: batch 64 at the V100 FLOP rate "
                                 "of the resnet50 anchor (",
                                 kAnchor, "), split by per-layer forward FLOPs, bwd = 2x fwd"),
                    kVggBatch, ms);
  }
  if (name == "bert-base") {
    BuildBertBase(b);
    const double ms = AnchorMsPerFlop() * b.forward_flops() * kBertBatch;
    return b.Finish(
        "bert-base",
        absl::StrCat("shapes: Hugging Face BertModel, bert-base-uncased config (with pooler); "
                     "timing: batch 32 x sequence 128 at the V100 FLOP rate of the resnet50 "
                     "anchor (",
                     kAnchor, "), split by per-layer forward FLOPs, bwd = 2x fwd"),
        kBertBatch, ms);
  }
  return absl::NotFoundError(absl::StrCat("unknown replay model '", name,
                                          "'; known: ", absl::StrJoin(ReplayModelNames(), ", ")));
}

}  // namespace harrier::workload
