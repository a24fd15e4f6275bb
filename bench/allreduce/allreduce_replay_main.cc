// harrier-allreduce-replay: the all-reduce baseline of the overlap bench. One
// process per rank replays a model's training steps with DDP-style bucketed
// ring all-reduce over gloo's tcp transport, then prints one replay_summary
// line (the same fields as harrier-worker --workload=replay:NAME) on stdout.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/allreduce/allreduce_replay.h"
#include "bench/allreduce/bucket_plan.h"
#include "bench/allreduce/gloo_ring.h"
#include "common/flags.h"
#include "common/json.h"
#include "common/process.h"
#include "spdlog/spdlog.h"
#include "worker/workload/replay_models.h"

ABSL_FLAG(std::string, model, "", "Replayed model: resnet50|vgg16|bert-base.");
ABSL_FLAG(int, rank, -1, "This rank, 0 .. world-1.");
ABSL_FLAG(int, world, 0, "Number of ranks.");
ABSL_FLAG(std::string, rendezvous_dir, "",
          "Directory shared by every rank (gloo FileStore), fresh for each run.");
ABSL_FLAG(std::string, address, "127.0.0.1", "IP this rank's gloo tcp device binds to.");
ABSL_FLAG(int, steps, 5, "Steps to run, warm-up included.");
ABSL_FLAG(int, warmup_steps, 1, "First steps not timed.");
ABSL_FLAG(double, compute_scale, 1.0, "Multiplies the model's per-layer compute times.");
ABSL_FLAG(int64_t, bucket_bytes, 25 << 20,
          "Gradient bucket cap (DDP's 25 MiB); 0 = one all-reduce of everything after backward.");
ABSL_FLAG(int, timeout_s, 120,
          "Bound of the rendezvous, of each all-reduce and of every wait between the threads.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the synthetic gradients and initial parameters.");
ABSL_FLAG(int, check_samples, 4096, "Random parameters checked exactly at the end (besides 3 per bucket).");
ABSL_FLAG(std::string, test_layers, "",
          "Tests only, instead of --model: N:ELEMENTS:FORWARD_MS:BACKWARD_MS, N layers of one tensor.");
ABSL_FLAG(int, test_skip_bucket, -1,
          "Tests only: never all-reduce this bucket (the check must then fail).");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "harrier-allreduce-replay: %s\n", message.c_str());
  return 1;
}

bool ParseTestLayers(const std::string& text, std::vector<harrier::allreduce::LayerShape>* layers) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  int count = 0;
  int64_t elements = 0;
  double forward_ms = 0, backward_ms = 0;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &count) ||
      !absl::SimpleAtoi(parts[1], &elements) || !absl::SimpleAtod(parts[2], &forward_ms) ||
      !absl::SimpleAtod(parts[3], &backward_ms) || count < 1 || elements < 1) {
    return false;
  }
  for (int i = 0; i < count; ++i) {
    layers->push_back({absl::StrCat("test", i), {elements}, forward_ms, backward_ms});
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  harrier::ParseFlags(
      argc, argv,
      "The all-reduce baseline: replays a model's training steps with bucketed ring\n"
      "all-reduce (gloo, tcp) and prints one replay_summary JSON line on stdout.\n"
      "Usage: harrier-allreduce-replay --model=resnet50 --rank=R --world=N\n"
      "         --rendezvous_dir=DIR [--address=IP] [--steps=5] [--compute_scale=1]");
  harrier::TuneMallocForLargeBuffers();
  harrier::InitLogging("allreduce-replay");

  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_world);
  if (world < 1) return Fail("--world must be >= 1");
  if (rank < 0 || rank >= world) return Fail(absl::StrCat("--rank=", rank, " is not in 0..", world - 1));
  if (absl::GetFlag(FLAGS_rendezvous_dir).empty()) return Fail("--rendezvous_dir is required");
  if (absl::GetFlag(FLAGS_timeout_s) < 1) return Fail("--timeout_s must be >= 1");

  std::vector<harrier::allreduce::LayerShape> layers;
  std::string model = absl::GetFlag(FLAGS_model);
  if (!absl::GetFlag(FLAGS_test_layers).empty()) {
    if (!model.empty()) return Fail("--model and --test_layers exclude each other");
    if (!ParseTestLayers(absl::GetFlag(FLAGS_test_layers), &layers)) {
      return Fail(absl::StrCat("bad --test_layers='", absl::GetFlag(FLAGS_test_layers),
                               "' (N:ELEMENTS:FORWARD_MS:BACKWARD_MS)"));
    }
    model = "test";
  } else {
    if (model.empty()) return Fail("--model is required (resnet50|vgg16|bert-base)");
    absl::StatusOr<harrier::workload::ReplayModelSpec> spec =
        harrier::workload::FindReplayModel(model);
    if (!spec.ok()) return Fail(std::string(spec.status().message()));
    for (const harrier::workload::ReplayLayer& layer : spec->layers) {
      harrier::allreduce::LayerShape shape{layer.name, {}, layer.forward_ms, layer.backward_ms};
      for (const harrier::workload::ReplayTensor& tensor : layer.tensors) {
        shape.tensor_elements.push_back(tensor.num_elements());
      }
      layers.push_back(std::move(shape));
    }
  }

  harrier::allreduce::GlooRingOptions ring_options;
  ring_options.rank = rank;
  ring_options.world = world;
  ring_options.rendezvous_dir = absl::GetFlag(FLAGS_rendezvous_dir);
  ring_options.address = absl::GetFlag(FLAGS_address);
  ring_options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  absl::StatusOr<std::unique_ptr<harrier::allreduce::GlooRing>> ring =
      harrier::allreduce::GlooRing::Connect(ring_options);
  if (!ring.ok()) return Fail(ring.status().ToString());
  spdlog::info("allreduce_replay: event=connected rank={} world={} address={}", rank, world,
               ring_options.address);

  harrier::allreduce::ReplayRunOptions options;
  options.bucket_bytes = absl::GetFlag(FLAGS_bucket_bytes);
  options.compute_scale = absl::GetFlag(FLAGS_compute_scale);
  options.steps = absl::GetFlag(FLAGS_steps);
  options.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.timeout = ring_options.timeout;
  options.check_samples = absl::GetFlag(FLAGS_check_samples);
  options.fault_skip_bucket = absl::GetFlag(FLAGS_test_skip_bucket);
  absl::StatusOr<harrier::allreduce::ReplayRunResult> result =
      harrier::allreduce::RunAllreduceReplay(layers, **ring, options);
  if (!result.ok()) return Fail(result.status().ToString());
  for (size_t s = 0; s < result->step_ms.size(); ++s) {
    spdlog::info("allreduce_replay: event=step rank={} step={} ms={:.1f} warmup={}", rank, s,
                 result->step_ms[s], static_cast<int>(s) < options.warmup_steps);
  }

  const harrier::Json summary = {
      {"model", model},
      {"techniques", "allreduce"},
      {"compute_scale", harrier::RoundToSignificant(options.compute_scale, 6)},
      {"rank", rank},
      {"workers", world},
      {"shards", 0},
      {"steps", result->steps},
      {"warmup_steps", result->warmup_steps},
      {"iter_ms", harrier::RoundTo(result->iter_ms, 1)},
      {"compute_ms", harrier::RoundTo(result->compute_ms, 1)},
      {"bytes_pushed_per_iter", result->bytes_sent_per_iter},
      {"bytes_pulled_per_iter", result->bytes_received_per_iter},
      {"bytes_per_iter", result->bytes_sent_per_iter + result->bytes_received_per_iter},
      {"checked", result->checked},
      {"bucket_bytes", options.bucket_bytes},
      {"buckets", result->buckets},
      {"model_bytes", result->model_bytes},
      {"exposed_comm_ms", harrier::RoundTo(result->exposed_comm_ms, 1)},
      {"overlapped_buckets", harrier::RoundTo(result->overlapped_buckets, 2)},
      {"compute_overrun_ms", harrier::RoundTo(result->compute_overrun_ms, 1)},
      {"measured_bytes_sent_per_iter", result->measured_bytes_sent_per_iter},
      {"measured_bytes_received_per_iter", result->measured_bytes_received_per_iter},
      {"checked_elements", result->checked_elements},
      {"cpu_seconds_per_iter", harrier::RoundToSignificant(result->cpu_seconds_per_iter, 6)},
      {"gradient_write_cpu_seconds_per_iter",
       harrier::RoundToSignificant(result->gradient_write_cpu_seconds_per_iter, 6)},
      {"timed_start_monotonic_ns", result->timed_start_monotonic_ns},
      {"timed_end_monotonic_ns", result->timed_end_monotonic_ns},
  };
  std::printf("replay_summary %s\n", harrier::DumpJson(summary).c_str());
  std::fflush(stdout);
  if (!result->checked) {
    return Fail(absl::StrCat("rank ", rank, ": check failed: ", result->mismatches, " of ",
                             result->checked_elements, " sampled parameters wrong, first ",
                             result->first_mismatch));
  }
  return 0;
}
