// The trainer's device path against a real harrier-server: a fake
// DeviceResidentModel (workload::Mlp computing on host vectors that stand
// for device memory, registered with the counting fake device backend)
// trains through Train() for a few hundred steps and reaches the loss and
// accuracy of the host path (the plain Mlp, same seeds, same data), with
// gradient momentum and with local SGD too. The host codec backend is never
// called and the model's host interface is never used (its methods fail),
// with and without the comm scheduler.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "testing/server_process.h"
#include "tests/worker/counting_backends.h"
#include "worker/client.h"
#include "worker/trainer.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/mlp.h"
#include "worker/workload/model.h"

namespace harrier {
namespace {

using workload::DeviceResidentModel;

const std::vector<int> kLayers = {784, 128, 10};

// Device memory faked by host vectors the device backend knows.
class FakeDeviceMlp : public workload::Model, public DeviceResidentModel {
 public:
  FakeDeviceMlp(workload::Mlp mlp, CountingBackend* device)
      : initial_(mlp), work_(std::move(mlp)), device_(device) {
    for (const auto& param : initial_.params()) {
      params_.push_back(param.values);
      grads_.emplace_back(param.values.size(), 0.0f);
      momentum_.emplace_back();
      scratch_.emplace_back();
    }
    for (size_t k = 0; k < params_.size(); ++k) {
      device_->AddDeviceRange(params_[k].data(), params_[k].size());
      device_->AddDeviceRange(grads_[k].data(), grads_[k].size());
    }
  }

  int host_calls() const { return host_calls_; }

  // Model: only what registration reads; the host compute paths fail.
  DeviceResidentModel* device() override { return this; }
  std::vector<workload::ParamTensor>& params() override { return initial_.params(); }
  const std::vector<workload::ParamTensor>& params() const override { return initial_.params(); }
  int input_size() const override { return initial_.input_size(); }
  int num_classes() const override { return initial_.num_classes(); }
  int64_t num_parameters() const override { return initial_.num_parameters(); }
  workload::Gradients ZeroGradients() const override { return initial_.ZeroGradients(); }
  absl::StatusOr<float> ComputeGradients(const float*, const uint8_t*, int,
                                         workload::Gradients*) override {
    ++host_calls_;
    return absl::FailedPreconditionError("host ComputeGradients on a device model");
  }
  absl::StatusOr<double> Evaluate(const workload::Dataset&) const override {
    ++host_calls_;
    return absl::FailedPreconditionError("host Evaluate on a device model");
  }
  absl::Status SgdStep(const workload::Gradients&, float) override {
    ++host_calls_;
    return absl::FailedPreconditionError("host SgdStep on a device model");
  }

  // DeviceResidentModel.
  absl::StatusOr<float*> buffer(size_t tensor, Buffer which) override {
    if (tensor >= params_.size()) return absl::InvalidArgumentError("no such tensor");
    std::vector<float>* buffer = nullptr;
    switch (which) {
      case Buffer::kParams:
        return params_[tensor].data();
      case Buffer::kGrads:
        return grads_[tensor].data();
      case Buffer::kMomentum:
        buffer = &momentum_[tensor];
        break;
      case Buffer::kScratch:
        buffer = &scratch_[tensor];
        break;
    }
    if (buffer->empty()) {
      buffer->assign(params_[tensor].size(), 0.0f);
      device_->AddDeviceRange(buffer->data(), buffer->size());
    }
    return buffer->data();
  }
  absl::StatusOr<float> ComputeGradients(const float* images, const uint8_t* labels,
                                         int batch_size) override {
    Upload();
    workload::Gradients grads;
    auto loss = work_.ComputeGradients(images, labels, batch_size, &grads);
    if (!loss.ok()) return loss;
    for (size_t k = 0; k < grads.size(); ++k) {
      std::copy(grads[k].begin(), grads[k].end(), grads_[k].begin());
    }
    return loss;
  }
  absl::Status Axpby(float a, const float* x, float b, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = b == 0.0f ? a * x[i] : a * x[i] + b * y[i];
    return absl::OkStatus();
  }
  absl::Status SgdStep(float lr) override {
    Upload();
    workload::Gradients grads;
    for (const auto& g : grads_) grads.push_back(g);
    if (auto status = work_.SgdStep(grads, lr); !status.ok()) return status;
    for (size_t k = 0; k < params_.size(); ++k) params_[k] = work_.params()[k].values;
    return absl::OkStatus();
  }
  absl::StatusOr<double> Evaluate(const workload::Dataset& data) override {
    Upload();
    return work_.Evaluate(data);
  }

 private:
  // The computing Mlp takes the "device" parameters.
  void Upload() {
    for (size_t k = 0; k < params_.size(); ++k) {
      std::copy(params_[k].begin(), params_[k].end(), work_.params()[k].values.begin());
    }
  }

  workload::Mlp initial_;  // params(): the initial values, read at registration
  workload::Mlp work_;
  CountingBackend* const device_;
  // Sized once: pointers stay valid (params_ is assigned element-wise).
  std::vector<std::vector<float>> params_, grads_, momentum_, scratch_;
  mutable int host_calls_ = 0;
};

const workload::Dataset& TrainSet() {
  static const workload::Dataset* const data = [] {
    auto train = workload::LoadFashionMnist(workload::kDefaultFashionMnistDir,
                                            workload::Split::kTrain);
    REQUIRE(train.ok());
    return new workload::Dataset(workload::Subset(*train, 300 * 32));
  }();
  return *data;
}

const workload::Dataset& TestSet() {
  static const workload::Dataset* const data = [] {
    auto test = workload::LoadFashionMnist(workload::kDefaultFashionMnistDir,
                                           workload::Split::kTest);
    REQUIRE(test.ok());
    return new workload::Dataset(workload::Subset(*test, 2000));
  }();
  return *data;
}

struct Outcome {
  TrainResult result;
  int64_t device_encodes = 0;
  int64_t host_calls_total = 0;  // host backend calls
  int model_host_calls = 0;
};

Outcome TrainOnce(bool on_device, const std::vector<std::string>& server_flags,
                  const TrainerOptions& options) {
  auto servers = testing::StartCluster(1, 1, server_flags);
  REQUIRE(servers.ok());
  auto device = std::make_shared<CountingBackend>(MemoryKind::kDevice);
  auto host = std::make_shared<CountingBackend>(MemoryKind::kHost);
  ClientOptions client_options;
  client_options.servers = testing::Addresses(*servers);
  client_options.codec = "topk:ratio=0.05";
  client_options.host_backend = host;
  if (on_device) client_options.device_backend = device;
  auto client = Client::Create(client_options);
  REQUIRE(client.ok());
  workload::MlpOptions mlp_options;
  mlp_options.layer_sizes = kLayers;
  auto mlp = workload::Mlp::Create(mlp_options);
  REQUIRE(mlp.ok());
  Outcome outcome;
  if (on_device) {
    FakeDeviceMlp model(*mlp, device.get());
    auto result = Train(**client, model, TrainSet(), &TestSet(), options);
    REQUIRE(result.ok());
    outcome.result = *result;
    outcome.model_host_calls = model.host_calls();
  } else {
    auto result = Train(**client, *mlp, TrainSet(), &TestSet(), options);
    REQUIRE(result.ok());
    outcome.result = *result;
  }
  outcome.device_encodes = device->counts().encodes;
  outcome.host_calls_total = host->counts().total();
  return outcome;
}

void CheckSame(const Outcome& device, const Outcome& host, int64_t steps, int64_t pushes) {
  INFO("device loss " << device.result.first_loss << " -> " << device.result.last_loss
                      << " acc " << device.result.test_accuracy << "; host loss "
                      << host.result.first_loss << " -> " << host.result.last_loss << " acc "
                      << host.result.test_accuracy);
  CHECK(device.result.steps == steps);
  CHECK(host.result.steps == steps);
  CHECK(device.model_host_calls == 0);
  CHECK(device.host_calls_total == 0);
  // One compressed chunk (the 784x128 weight; the rest is below
  // compress_min_bytes) per push.
  CHECK(device.device_encodes == pushes);
  CHECK(host.device_encodes == 0);
  CHECK(std::abs(device.result.first_loss - host.result.first_loss) < 1e-5);
  CHECK(std::abs(device.result.last_loss - host.result.last_loss) < 1e-4);
  CHECK(std::abs(device.result.test_accuracy - host.result.test_accuracy) < 1e-3);
  CHECK(host.result.last_loss < 0.8 * host.result.first_loss);  // it learned
}

TrainerOptions Options(int64_t steps) {
  TrainerOptions options;
  options.batch_size = 32;
  options.max_steps = steps;
  options.log_every = 100;
  options.evaluate = true;
  return options;
}

TEST_CASE("a device model trains through the device backend to the host path's loss (BSP)") {
  const std::vector<std::string> flags = {"--optimizer=nesterov", "--lr=0.05", "--momentum=0.9",
                                          "--sync=bsp"};
  const TrainerOptions options = Options(300);
  const Outcome device = TrainOnce(true, flags, options);
  const Outcome host = TrainOnce(false, flags, options);
  CheckSame(device, host, 300, 300);
  CHECK(host.result.test_accuracy > 0.6);
}

TEST_CASE("gradient momentum and local SGD on the device buffers match the host path") {
  SECTION("signum-style gradient momentum") {
    const std::vector<std::string> flags = {"--optimizer=sgd", "--lr=0.1", "--sync=bsp"};
    TrainerOptions options = Options(150);
    options.gradient_momentum = 0.9f;
    CheckSame(TrainOnce(true, flags, options), TrainOnce(false, flags, options), 150, 150);
  }
  SECTION("local SGD, H = 4") {
    const std::vector<std::string> flags = {"--optimizer=sgd", "--lr=1", "--sync=local",
                                            "--local_steps=4"};
    TrainerOptions options = Options(150);
    options.local_lr = 0.1f;
    // 150 steps: 37 rounds of 4, and the last 2 steps push too.
    CheckSame(TrainOnce(true, flags, options), TrainOnce(false, flags, options), 150, 38);
  }
}

TEST_CASE("the comm scheduler moves a device model's tensors from and into device memory") {
  const std::vector<std::string> flags = {"--optimizer=nesterov", "--lr=0.05", "--momentum=0.9",
                                          "--sync=bsp"};
  SECTION("wait-free backprop, partitioning, priority, credits: the host path's loss") {
    TrainerOptions options = Options(200);
    options.scheduler = *ParseTechniques("wfbp+priority");
    CheckSame(TrainOnce(true, flags, options), TrainOnce(false, flags, options), 200, 200);
  }
  SECTION("with fusion on, device tensors travel unfused and still never touch the host") {
    TrainerOptions options = Options(200);
    options.scheduler = *ParseTechniques("all");
    const Outcome device = TrainOnce(true, flags, options);
    CHECK(device.result.steps == 200);
    CHECK(device.model_host_calls == 0);
    CHECK(device.host_calls_total == 0);
    CHECK(device.device_encodes == 200);  // the 784x128 weight alone, every step
    CHECK(device.result.last_loss < 0.8 * device.result.first_loss);
  }
}

}  // namespace
}  // namespace harrier
