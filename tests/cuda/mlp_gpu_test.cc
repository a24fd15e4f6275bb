// The CUDA MLP (worker/workload/cuda/device_mlp{,_model}.h) against the CPU
// MLP (worker/workload/mlp.h): same seed, same batch -> loss and gradients
// within 1e-4 relative, a few SGD steps (on the device and through the
// workload::Model interface) stay within 1e-4, and Evaluate agrees up to a
// few near-tie examples. Runs only on a machine with a GPU: without one
// every test case fails (the target is tagged manual and gpu).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "cuda/device_codec.h"
#include "cuda/device_memory.h"
#include "worker/workload/cuda/device_mlp.h"
#include "worker/workload/cuda/device_mlp_model.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/mlp.h"
#include "worker/workload/model.h"

namespace harrier {
namespace {

using workload::Dataset;
using workload::DeviceMlp;
using workload::DeviceMlpModel;
using workload::Gradients;
using workload::Mlp;
using workload::MlpOptions;
using workload::ParamTensor;

constexpr double kRel = 1e-4;

// A synthetic data set with Fashion-MNIST's shape conventions: pixels in
// [0, 1), labels given by a fixed random linear rule (learnable, so a few
// SGD steps move the accuracy off chance).
Dataset MakeData(int n, int input, int classes, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rule(static_cast<size_t>(classes) * input);
  for (float& r : rule) r = normal(gen);
  Dataset data;
  data.num_examples = n;
  data.rows = 1;
  data.cols = input;
  data.images.resize(static_cast<size_t>(n) * input);
  for (float& p : data.images) p = pixel(gen);
  data.labels.resize(n);
  for (int b = 0; b < n; ++b) {
    int best = 0;
    double best_score = -1e30;
    for (int c = 0; c < classes; ++c) {
      double score = 0;
      for (int i = 0; i < input; ++i) {
        score += rule[static_cast<size_t>(c) * input + i] *
                 (data.image(b)[i] - 0.5f);
      }
      if (score > best_score) {
        best_score = score;
        best = c;
      }
    }
    data.labels[b] = static_cast<uint8_t>(best);
  }
  return data;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// Max |a - b| relative to the tensor's scale, max |b|: per-element
// relative error is meaningless for entries that cancel to near zero.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  const double scale = MaxAbs(b);
  return scale > 0 ? diff / scale : diff;
}

void RequireClose(const Gradients& gpu, const Gradients& cpu,
                  const std::vector<ParamTensor>& layout,
                  const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  for (size_t t = 0; t < cpu.size(); ++t) {
    INFO(what << ": tensor " << layout[t].name);
    REQUIRE(MaxRelDiff(gpu[t], cpu[t]) <= kRel);
  }
}

void RequireParamsClose(const std::vector<ParamTensor>& gpu,
                        const std::vector<ParamTensor>& cpu,
                        const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  for (size_t t = 0; t < cpu.size(); ++t) {
    INFO(what << ": parameter " << cpu[t].name);
    REQUIRE(gpu[t].name == cpu[t].name);
    REQUIRE(gpu[t].shape == cpu[t].shape);
    REQUIRE(MaxRelDiff(gpu[t].values, cpu[t].values) <= kRel);
  }
}

void RequireLossClose(float gpu, float cpu) {
  INFO("gpu loss " << gpu << " cpu loss " << cpu);
  REQUIRE(std::isfinite(gpu));
  REQUIRE(std::fabs(gpu - cpu) <= kRel * std::fabs(cpu));
}

Mlp MakeCpu(const std::vector<int>& sizes, uint64_t seed) {
  MlpOptions options;
  options.layer_sizes = sizes;
  options.seed = seed;
  auto mlp = Mlp::Create(options);
  REQUIRE(mlp.ok());
  return std::move(*mlp);
}

std::unique_ptr<DeviceMlp> MakeDevice(const Mlp& cpu) {
  auto device = DeviceMlp::Create(cpu.layer_sizes());
  INFO(device.status().ToString());
  REQUIRE(device.ok());
  REQUIRE((*device)->UploadParams(cpu.params()).ok());
  return std::move(*device);
}

const std::vector<std::vector<int>> kShapes = {
    {784, 256, 256, 10}, {13, 7, 5, 3}, {20, 10}};

TEST_CASE("a CUDA device is present") {
  // Fails loudly on a machine without a GPU instead of skipping.
  REQUIRE(cuda::DeviceAvailable());
}

TEST_CASE("device loss and gradients equal the CPU MLP's") {
  REQUIRE(cuda::DeviceAvailable());
  for (const std::vector<int>& sizes : kShapes) {
    Mlp cpu = MakeCpu(sizes, 7);
    auto device = MakeDevice(cpu);
    const Dataset data = MakeData(300, sizes.front(), sizes.back(), 11);
    for (int batch : {1, 7, 64, 300}) {
      INFO("layers " << sizes.size() << " input " << sizes.front()
                     << " batch " << batch);
      Gradients cpu_grads, gpu_grads;
      auto cpu_loss = cpu.ComputeGradients(data.image(0), data.labels.data(),
                                           batch, &cpu_grads);
      auto gpu_loss = device->ComputeGradients(
          data.image(0), data.labels.data(), batch, &gpu_grads);
      REQUIRE(cpu_loss.ok());
      INFO(gpu_loss.status().ToString());
      REQUIRE(gpu_loss.ok());
      RequireLossClose(*gpu_loss, *cpu_loss);
      RequireClose(gpu_grads, cpu_grads, cpu.params(), "gradients");
    }
  }
}

TEST_CASE("SGD steps on the device track the CPU's") {
  REQUIRE(cuda::DeviceAvailable());
  const std::vector<int> sizes = {784, 256, 256, 10};
  Mlp cpu = MakeCpu(sizes, 3);
  auto device = MakeDevice(cpu);
  const Dataset data = MakeData(64 * 5, 784, 10, 5);
  Gradients cpu_grads, gpu_grads;
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const int offset = step * 64;
    auto cpu_loss = cpu.ComputeGradients(
        data.image(offset), data.labels.data() + offset, 64, &cpu_grads);
    // Odd steps keep the gradients on the device only.
    auto gpu_loss = device->ComputeGradients(
        data.image(offset), data.labels.data() + offset, 64,
        step % 2 == 0 ? &gpu_grads : nullptr);
    REQUIRE(cpu_loss.ok());
    REQUIRE(gpu_loss.ok());
    RequireLossClose(*gpu_loss, *cpu_loss);
    REQUIRE(cpu.SgdStep(cpu_grads, 0.1f).ok());
    REQUIRE(device->SgdStep(0.1f).ok());
  }
  std::vector<ParamTensor> downloaded = cpu.params();
  REQUIRE(device->DownloadParams(&downloaded).ok());
  RequireParamsClose(downloaded, cpu.params(), "after 5 device SGD steps");
}

TEST_CASE("DeviceMlpModel through workload::Model matches the CPU Mlp") {
  REQUIRE(cuda::DeviceAvailable());
  MlpOptions options;
  options.seed = 9;
  auto cpu_or = Mlp::Create(options);
  auto gpu_or = DeviceMlpModel::Create(options);
  REQUIRE(cpu_or.ok());
  INFO(gpu_or.status().ToString());
  REQUIRE(gpu_or.ok());
  workload::Model& cpu = *cpu_or;
  workload::Model& gpu = **gpu_or;
  // Same seed, same initial parameters (host mirrors are the CPU's).
  REQUIRE(gpu.num_parameters() == cpu.num_parameters());
  for (size_t t = 0; t < cpu.params().size(); ++t) {
    REQUIRE(gpu.params()[t].name == cpu.params()[t].name);
    REQUIRE(gpu.params()[t].values == cpu.params()[t].values);
  }
  const Dataset data = MakeData(1100, 784, 10, 21);
  Gradients cpu_grads = cpu.ZeroGradients(), gpu_grads = gpu.ZeroGradients();
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    const int offset = step * 100;
    auto cpu_loss = cpu.ComputeGradients(
        data.image(offset), data.labels.data() + offset, 100, &cpu_grads);
    auto gpu_loss = gpu.ComputeGradients(
        data.image(offset), data.labels.data() + offset, 100, &gpu_grads);
    REQUIRE(cpu_loss.ok());
    REQUIRE(gpu_loss.ok());
    RequireLossClose(*gpu_loss, *cpu_loss);
    RequireClose(gpu_grads, cpu_grads, cpu.params(), "model gradients");
    REQUIRE(cpu.SgdStep(cpu_grads, 0.1f).ok());
    REQUIRE(gpu.SgdStep(gpu_grads, 0.1f).ok());
  }
  RequireParamsClose(gpu.params(), cpu.params(), "after 6 model SGD steps");

  // A pull overwrites the host mirror: the next computation must use it.
  for (size_t t = 0; t < cpu.params().size(); ++t) {
    gpu.params()[t].values = cpu.params()[t].values;
  }
  auto cpu_loss = cpu.ComputeGradients(data.image(700),
                                       data.labels.data() + 700, 50, &cpu_grads);
  auto gpu_loss = gpu.ComputeGradients(data.image(700),
                                       data.labels.data() + 700, 50, &gpu_grads);
  REQUIRE(cpu_loss.ok());
  REQUIRE(gpu_loss.ok());
  RequireLossClose(*gpu_loss, *cpu_loss);
  RequireClose(gpu_grads, cpu_grads, cpu.params(), "after overwrite");

  // Evaluate: 1100 examples = two full device batches of 512 and a partial
  // one. Predictions may differ only where two logits nearly tie.
  auto cpu_acc = cpu.Evaluate(data);
  auto gpu_acc = gpu.Evaluate(data);
  REQUIRE(cpu_acc.ok());
  INFO(gpu_acc.status().ToString());
  REQUIRE(gpu_acc.ok());
  INFO("cpu accuracy " << *cpu_acc << " gpu accuracy " << *gpu_acc);
  REQUIRE(std::fabs(*gpu_acc - *cpu_acc) <= 3.0 / data.num_examples);
}

TEST_CASE("device evaluation agrees with the CPU's") {
  REQUIRE(cuda::DeviceAvailable());
  for (const std::vector<int>& sizes : kShapes) {
    INFO("input " << sizes.front() << " layers " << sizes.size());
    Mlp cpu = MakeCpu(sizes, 13);
    const Dataset data = MakeData(1500, sizes.front(), sizes.back(), 17);
    Gradients grads;
    for (int step = 0; step < 10; ++step) {
      REQUIRE(cpu.ComputeGradients(data.image(step * 100),
                                   data.labels.data() + step * 100, 100,
                                   &grads).ok());
      REQUIRE(cpu.SgdStep(grads, 0.1f).ok());
    }
    auto device = MakeDevice(cpu);
    for (int n : {1, 511, 512, 1500}) {
      INFO(n << " examples");
      const Dataset subset = workload::Subset(data, n);
      auto cpu_acc = cpu.Evaluate(subset);
      auto gpu_acc = device->Evaluate(subset);
      REQUIRE(cpu_acc.ok());
      REQUIRE(gpu_acc.ok());
      INFO("cpu accuracy " << *cpu_acc << " gpu accuracy " << *gpu_acc);
      REQUIRE(std::fabs(*gpu_acc - *cpu_acc) <= 3.0 / n + 1e-12);
    }
  }
}

TEST_CASE("device MLP refusals") {
  REQUIRE(cuda::DeviceAvailable());
  REQUIRE(DeviceMlp::Create({784}).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(DeviceMlp::Create({784, 0, 10}).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(DeviceMlp::Create({784, 300}).status().code() ==
          absl::StatusCode::kInvalidArgument);

  Mlp cpu = MakeCpu({20, 10}, 1);
  auto created = DeviceMlp::Create({20, 10});
  REQUIRE(created.ok());
  DeviceMlp& device = **created;
  const Dataset data = MakeData(8, 20, 10, 2);
  Gradients grads;
  // Nothing uploaded yet.
  REQUIRE(device.ComputeGradients(data.image(0), data.labels.data(), 8, &grads)
              .status()
              .code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(device.Evaluate(data).status().code() ==
          absl::StatusCode::kFailedPrecondition);
  REQUIRE(device.SgdStep(0.1f).code() == absl::StatusCode::kFailedPrecondition);

  std::vector<ParamTensor> wrong = cpu.params();
  wrong[0].shape = {20, 10};
  REQUIRE(device.UploadParams(wrong).code() ==
          absl::StatusCode::kInvalidArgument);
  wrong = cpu.params();
  wrong.pop_back();
  REQUIRE(device.UploadParams(wrong).code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(device.UploadParams(cpu.params()).ok());

  std::vector<uint8_t> labels = data.labels;
  labels[3] = 10;
  auto bad = device.ComputeGradients(data.image(0), labels.data(), 8, &grads);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(bad.status().message() ==
          cpu.ComputeGradients(data.image(0), labels.data(), 8, &grads)
              .status()
              .message());
  REQUIRE(device.ComputeGradients(data.image(0), data.labels.data(), 0, &grads)
              .status()
              .code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(device.ComputeGradients(nullptr, data.labels.data(), 8, &grads)
              .status()
              .code() == absl::StatusCode::kInvalidArgument);

  Dataset mismatched = MakeData(8, 21, 10, 3);
  REQUIRE(device.Evaluate(mismatched).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(device.Evaluate(Dataset{}).status().code() ==
          absl::StatusCode::kInvalidArgument);
}

std::vector<float> DownloadFloats(const float* device, size_t n) {
  std::vector<float> host(n);
  absl::StatusOr<cuda::DeviceArray> staging = cuda::DeviceArray::Create(n);
  REQUIRE(staging.ok());
  REQUIRE(cuda::CopyDeviceToDevice(staging->data(), device, 4 * n).ok());
  REQUIRE(staging->CopyToHost(host.data(), n).ok());
  return host;
}

void UploadFloats(const std::vector<float>& host, float* device) {
  absl::StatusOr<cuda::DeviceArray> staging = cuda::DeviceArray::Create(host.size());
  REQUIRE(staging.ok());
  REQUIRE(staging->CopyFromHost(host.data(), host.size()).ok());
  REQUIRE(cuda::CopyDeviceToDevice(device, staging->data(), 4 * host.size()).ok());
}

TEST_CASE("DeviceMlpModel's device-resident interface matches its host interface") {
  REQUIRE(cuda::DeviceAvailable());
  MlpOptions options;
  options.seed = 5;
  auto host_or = DeviceMlpModel::Create(options);
  auto resident_or = DeviceMlpModel::Create(options);
  auto cpu_or = Mlp::Create(options);
  REQUIRE(host_or.ok());
  REQUIRE(resident_or.ok());
  REQUIRE(cpu_or.ok());
  workload::Model& host = **host_or;
  workload::Model& cpu = *cpu_or;
  REQUIRE(host.device() != nullptr);
  workload::DeviceResidentModel& dev = *(*resident_or)->device();
  using Buffer = workload::DeviceResidentModel::Buffer;
  const size_t tensors = cpu.params().size();

  // kParams starts as the initial parameters; kGrads is defined (zero).
  for (size_t t = 0; t < tensors; ++t) {
    INFO("tensor " << t);
    auto params = dev.buffer(t, Buffer::kParams);
    auto grads = dev.buffer(t, Buffer::kGrads);
    REQUIRE(params.ok());
    REQUIRE(grads.ok());
    const size_t n = cpu.params()[t].values.size();
    REQUIRE(DownloadFloats(*params, n) == cpu.params()[t].values);
    REQUIRE(DownloadFloats(*grads, n) == std::vector<float>(n, 0.0f));
    // The same buffer every time (the trainer registers these pointers).
    REQUIRE(*dev.buffer(t, Buffer::kParams) == *params);
  }
  REQUIRE(dev.buffer(tensors, Buffer::kParams).status().code() ==
          absl::StatusCode::kInvalidArgument);

  const Dataset data = MakeData(700, 784, 10, 23);
  Gradients host_grads = host.ZeroGradients(), cpu_grads = cpu.ZeroGradients();
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    const int offset = step * 100;
    auto host_loss = host.ComputeGradients(data.image(offset), data.labels.data() + offset,
                                           100, &host_grads);
    auto dev_loss = dev.ComputeGradients(data.image(offset), data.labels.data() + offset, 100);
    auto cpu_loss = cpu.ComputeGradients(data.image(offset), data.labels.data() + offset,
                                         100, &cpu_grads);
    REQUIRE(host_loss.ok());
    INFO(dev_loss.status().ToString());
    REQUIRE(dev_loss.ok());
    REQUIRE(cpu_loss.ok());
    // Step 0: same device, same parameters, same kernels, so the two
    // interfaces agree exactly. Later the host interface's parameters come
    // from the CPU's SGD (OpenBLAS saxpy, maybe FMA), the device's from the
    // SGD kernel, so they agree within rounding. Both stay within kRel of
    // the CPU.
    const bool exact = step == 0;
    if (exact) REQUIRE(*dev_loss == *host_loss);
    RequireLossClose(*dev_loss, *host_loss);
    RequireLossClose(*dev_loss, *cpu_loss);
    Gradients dev_grads(tensors);
    for (size_t t = 0; t < tensors; ++t) {
      dev_grads[t] = DownloadFloats(*dev.buffer(t, Buffer::kGrads), host_grads[t].size());
      INFO("tensor " << t);
      if (exact) REQUIRE(dev_grads[t] == host_grads[t]);
      REQUIRE(MaxRelDiff(dev_grads[t], host_grads[t]) <= kRel);
    }
    RequireClose(dev_grads, cpu_grads, cpu.params(), "device-resident gradients");
    // Local SGD on the device; the host interface and the CPU step on the host.
    REQUIRE(dev.SgdStep(0.1f).ok());
    REQUIRE(host.SgdStep(host_grads, 0.1f).ok());
    REQUIRE(cpu.SgdStep(cpu_grads, 0.1f).ok());
  }
  std::vector<ParamTensor> dev_params = cpu.params();
  for (size_t t = 0; t < tensors; ++t) {
    dev_params[t].values =
        DownloadFloats(*dev.buffer(t, Buffer::kParams), dev_params[t].values.size());
    INFO("tensor " << t);
    REQUIRE(MaxRelDiff(dev_params[t].values, host.params()[t].values) <= 1e-6);
  }
  RequireParamsClose(dev_params, cpu.params(), "after 4 device-resident SGD steps");

  // Evaluate with the device parameters equals the host interface's.
  auto dev_acc = dev.Evaluate(data);
  auto host_acc = host.Evaluate(data);
  REQUIRE(dev_acc.ok());
  REQUIRE(host_acc.ok());
  REQUIRE(std::fabs(*dev_acc - *host_acc) <= 3.0 / data.num_examples);

  // A pull written straight into kParams is what the next step uses.
  for (size_t t = 0; t < tensors; ++t) {
    UploadFloats(cpu.params()[t].values, *dev.buffer(t, Buffer::kParams));
    host.params()[t].values = cpu.params()[t].values;
  }
  auto host_loss = host.ComputeGradients(data.image(500), data.labels.data() + 500, 50,
                                         &host_grads);
  auto dev_loss = dev.ComputeGradients(data.image(500), data.labels.data() + 500, 50);
  REQUIRE(host_loss.ok());
  REQUIRE(dev_loss.ok());
  REQUIRE(*dev_loss == *host_loss);

  // kMomentum and kScratch: zeroed on first use, stable afterwards; Axpby
  // is fl(fl(a x) + fl(b y)), and y = a x when b = 0 even over NaN.
  const size_t n = cpu.params()[0].values.size();
  auto mom = dev.buffer(0, Buffer::kMomentum);
  auto scratch = dev.buffer(0, Buffer::kScratch);
  REQUIRE(mom.ok());
  REQUIRE(scratch.ok());
  REQUIRE(*mom != *scratch);
  REQUIRE(DownloadFloats(*mom, n) == std::vector<float>(n, 0.0f));
  REQUIRE(*dev.buffer(0, Buffer::kMomentum) == *mom);
  std::vector<float> x = cpu.params()[0].values, y(n);
  for (size_t i = 0; i < n; ++i) y[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
  UploadFloats(x, *scratch);
  UploadFloats(y, *mom);
  REQUIRE(dev.Axpby(0.5f, *scratch, 0.9f, *mom, n).ok());
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) {
    const float ax = 0.5f * x[i], by = 0.9f * y[i];
    want[i] = ax + by;
  }
  REQUIRE(DownloadFloats(*mom, n) == want);
  UploadFloats(std::vector<float>(n, std::nanf("")), *mom);
  REQUIRE(dev.Axpby(2.0f, *scratch, 0.0f, *mom, n).ok());
  for (size_t i = 0; i < n; ++i) want[i] = 2.0f * x[i];
  REQUIRE(DownloadFloats(*mom, n) == want);
}

}  // namespace
}  // namespace harrier
