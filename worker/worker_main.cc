// harrier-worker: the training agent. Trains a built-in workload on its shard
// of Fashion-MNIST through the Harrier parameter servers, or replays a real
// model's communication (--workload=replay:NAME) with modelled compute.
#include <cblas.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/grpc_security.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http_server.h"
#include "common/process.h"
#include "common/transport/stream.h"
#include "worker/client.h"
#include "worker/comm_scheduler.h"
#include "worker/replay_trainer.h"
#include "worker/timeline.h"
#include "worker/trainer.h"
#include "worker/workload/cnn.h"
#include "worker/workload/fashion_mnist.h"
#include "worker/workload/mlp.h"
#include "worker/workload/model.h"
#include "worker/workload/replay.h"
#include "worker/workload/replay_models.h"
#if HARRIER_WITH_CUDA
#include "cuda/cuda_codec_backend.h"
#include "cuda/device_codec.h"
#include "worker/workload/cuda/device_mlp_model.h"
#endif

ABSL_FLAG(std::string, servers, "", "Comma-separated host:port of every shard, shard 0 first.");
ABSL_FLAG(int, rank, -1, "This worker's rank; -1 lets the control plane assign one.");
ABSL_FLAG(int, num_workers, 0,
          "Expected number of workers; checked against the servers' (0: take theirs).");
ABSL_FLAG(std::string, job, "harrier",
          "Job name carried in every message; must match the servers' --job (else every call "
          "is refused FAILED_PRECONDITION).");
ABSL_FLAG(std::string, workload, "mlp",
          "Built-in workload: mlp (Fashion-MNIST, --layers), cnn (Fashion-MNIST, the conv 16-32 / "
          "fc 128 net of examples/torch_fashion_mnist.py, 215,370 parameters, CPU only), or "
          "replay:resnet50|replay:vgg16|replay:bert-base (a real model's tensors with seeded "
          "gradients and modelled compute; no data set).");
ABSL_FLAG(double, compute_scale, 1.0,
          "Replay: multiplies the model's per-layer compute times (0: no compute).");
ABSL_FLAG(int64_t, warmup_steps, 1, "Replay: steps run before the --max_steps timed ones.");
ABSL_FLAG(std::string, techniques, "none",
          "Comm overlap: none (today's trainer path, no scheduler) or plain|wfbp|fusion|partition|"
          "credits|priority|all, or several joined by '+', through the comm scheduler.");
ABSL_FLAG(int64_t, fusion_bytes, 0,
          "Fusion bucket size in bytes (0: the technique's default when fusion is on).");
ABSL_FLAG(int64_t, partition_bytes, 0,
          "Piece size in bytes when partitioning is on (0: its default); also the client's chunk "
          "size then.");
ABSL_FLAG(bool, priority_across_workers, false,
          "With priority under BSP and more than one worker, reorder the queues anyway. Off: "
          "every worker sends its pieces in the order of backward, so rounds complete as the "
          "pushes arrive (measured faster; docs/performance.md, \"Where a 4 x 4 step goes\").");
ABSL_FLAG(std::string, forward_order_tail, "measure",
          "With priority where calls keep the order of backward (BSP, several workers): this "
          "fraction of a step's push bytes, the front of the model, goes last and in forward "
          "order, the same plan on every worker (0: off). About 1 - backward time / "
          "communication time; every worker must be given the same value. 'measure' (the "
          "default): every worker times step 1, the workers average their estimates through "
          "the shards and plan that from step 2.");
ABSL_FLAG(std::string, timeline, "",
          "Write a timeline of the worker's pushes and pulls to this file (a Chrome trace: open "
          "it in ui.perfetto.dev or chrome://tracing); with --techniques, the comm scheduler's "
          "calls with their steps, the training loop's waits and each step. '{rank}' in the "
          "path is replaced by the worker's rank; without it only rank 0 writes one.");
ABSL_FLAG(int, timeline_max_mib, 256,
          "Stop recording the --timeline once its file reaches this size.");
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "Credit cap on push bytes in flight (0: the default when the cap is on: 8 MiB, or two "
          "pieces per shard when that is more).");
ABSL_FLAG(int64_t, round_window_bytes, -1,
          "Under BSP with several workers: at most this many pushed bytes whose rounds have not "
          "come back, so a worker ahead leaves the shards' links to those completing the rounds "
          "(-1: the credits technique's default, 32 MiB; 0: no window).");
ABSL_FLAG(std::string, optimizer, "sgd",
          "Replay: the servers' --optimizer; the exact check of the final parameters runs under "
          "bsp with sgd only.");
ABSL_FLAG(double, lr, 0.01, "Replay: the servers' --lr, which the exact check assumes.");
constexpr char kDefaultLayers[] = "784,256,256,10";
ABSL_FLAG(std::string, layers, kDefaultLayers,
          "MLP layer sizes, input first, classes last (--workload=mlp only).");
ABSL_FLAG(std::string, data_dir, harrier::workload::kDefaultFashionMnistDir,
          "Directory with Fashion-MNIST IDX files (.gz or plain).");
ABSL_FLAG(int, epochs, 1, "Passes over this worker's shard of the training set.");
ABSL_FLAG(int, batch_size, 64, "Examples per step on this worker.");
ABSL_FLAG(int64_t, max_steps, -1,
          "Stop after this many steps (-1: run all epochs). Replay: the timed steps (-1: 5).");
ABSL_FLAG(int, train_examples, 0, "Use only the first N training examples (0: all).");
ABSL_FLAG(std::string, device, "cpu", "Where the workload runs: cpu|cuda.");
ABSL_FLAG(std::string, metrics_out, "",
          "Write one JSON line per training step here (mlp and cnn workloads; docs/deploy.md).");
ABSL_FLAG(int, log_every, 100, "Steps between progress lines on stderr.");
ABSL_FLAG(int, eval_every, 0,
          "Rank 0 evaluates the test set every N steps: 'eval step=N accuracy=A wall_s=W loss=L' "
          "on stderr, evaluation time excluded from W, L the mean training loss of rank 0's "
          "steps since its previous eval line (0: only at the end).");
ABSL_FLAG(double, target_accuracy, 0,
          "With --eval_every: rank 0 prints time_to_accuracy_s=X on stdout, the training wall "
          "time to the first evaluation at or above this accuracy (-1: never reached).");
ABSL_FLAG(int, step_delay_ms, 0, "Extra delay per step, to play a straggler.");
ABSL_FLAG(double, step_delay_probability, 1.0,
          "Probability that a step gets --step_delay_ms (below 1: a transient straggler).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the model's initial parameters.");
ABSL_FLAG(double, local_lr, 0.1, "Learning rate of the worker's local steps (--sync=local).");
ABSL_FLAG(int, blas_threads, 1, "OpenBLAS threads for this worker.");
ABSL_FLAG(int, rpc_timeout_s, 120, "Deadline of each push/pull, including consistency waits.");
ABSL_FLAG(std::string, codec, "none",
          "Push compression, e.g. topk:ratio=0.01, efsign, qsgd:levels=16, powersgd:rank=2.");
ABSL_FLAG(double, signum_momentum, 0.9,
          "With --codec=signum: the worker pushes its momentum of this factor (Bernstein et al.).");
ABSL_FLAG(std::string, pull_codec, "none",
          "Pull compression: the shard sends C(parameters - the worker's view), e.g. "
          "topk:ratio=0.1 or fp16; paired: the pull codec that goes with --codec "
          "(fp16 with fp16, topk:ratio=R with topk:ratio=R, powersgd with powersgd, sign "
          "codecs with efsign); none: dense pulls.");
ABSL_FLAG(int, compress_min_bytes, 16384, "Chunks smaller than this travel uncompressed.");
ABSL_FLAG(int, chunk_kib, 4096,
          "Tensors above this many KiB are split into chunks spread over the shards.");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics and liveness /healthz over HTTP (-1: off, 0: ephemeral).");
ABSL_FLAG(int, connect_timeout_s, 30, "How long to wait for every shard to be reachable.");
ABSL_FLAG(std::string, transport, "auto",
          "Data path of pushes and pulls: auto|tcp|grpc|ucx. auto: per shard, tcp (framed "
          "messages over plain TCP streams) where the shard serves it (harrier-server --tcp, on "
          "by default) and without TLS, gRPC otherwise (tcp is not encrypted). ucx needs "
          "servers started with --ucx.");
ABSL_FLAG(std::string, tcp_congestion, std::string(harrier::transport::kDefaultCongestionControl),
          "TCP congestion control of the tcp data path's connections: the first of these names "
          "the kernel lets this process set; empty: the kernel's default (see harrier-server "
          "--tcp_congestion).");
ABSL_FLAG(int, grpc_connections, 1,
          "gRPC data connections per shard (--transport=grpc): calls of several chunks and at "
          "least 8 MiB are split over them and run in parallel. In [1, 16].");
ABSL_FLAG(bool, pull_connection, true,
          "Pulls on a gRPC connection of their own per shard (--transport=grpc), so pushes and "
          "pulls keep both directions of a link busy at once.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates the shards' certificates must chain to: with it every gRPC "
          "channel uses TLS.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate (with --tls_key and --tls_ca), for shards that require one.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the job token (trailing newline stripped; not readable by others), sent "
          "with every call.");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "harrier-worker: %s\n", message.c_str());
  return 1;
}

// SIGTERM or SIGINT (a pod being stopped, Ctrl-C): the MLP trainer finishes
// its step, leaves the job and exits 0, so the other workers go on without
// it. A second signal, or one before training can stop cleanly (start-up,
// the replay workload), exits at once with 128 + the signal. A handler, not
// sigwait: OpenBLAS starts its threads before main, with the signals
// unblocked, so a blocked mask in main would not keep the default action
// away.
std::atomic<bool> stop_requested{false};
std::atomic<bool> can_stop_cleanly{false};
static_assert(std::atomic<bool>::is_always_lock_free, "used from a signal handler");

extern "C" void OnStopSignal(int signal_number) {
  if (stop_requested.exchange(true) || !can_stop_cleanly.load()) {
    static const char kNow[] = "harrier-worker: signal received: exiting now\n";
    (void)!write(STDERR_FILENO, kNow, sizeof(kNow) - 1);
    _exit(128 + signal_number);
  }
  static const char kLater[] =
      "harrier-worker: signal received: finishing this step, then leaving the job (a second "
      "signal exits at once)\n";
  (void)!write(STDERR_FILENO, kLater, sizeof(kLater) - 1);
}

void HandleStopSignals() {
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  // A SIGINT the parent made us ignore (a background job of a script) stays
  // ignored.
  struct sigaction previous {};
  sigaction(SIGINT, nullptr, &previous);
  if (previous.sa_handler != SIG_IGN) sigaction(SIGINT, &action, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  HandleStopSignals();
  harrier::ParseFlags(argc, argv,
                      "The Harrier worker agent: trains a workload through the parameter servers.\n"
                      "Usage: harrier-worker --servers=HOST:PORT,... [--workload=mlp|cnn] "
                      "[--epochs=N] [flags]\n"
                      "       harrier-worker --servers=... --workload=replay:resnet50 "
                      "[--compute_scale=X] [--techniques=all] [--max_steps=N]\n"
                      "Replay prints one line on stdout: replay_summary {json}.\n"
                      "Environment: HARRIER_<FLAG> sets --<flag> (e.g. HARRIER_SERVERS); with "
                      "--transport=ucx, UCX_TLS picks UCX's transports and "
                      "HARRIER_UCX_DEVICE_MEMORY=auto|off|on whether device tensors go over UCX "
                      "from device memory (auto: when UCX reports CUDA memory support).");
  harrier::TuneMallocForLargeBuffers();
  harrier::SkipMutexDeadlockDetection();
  // Library logs go to stderr: stdout carries only the test_accuracy= line.
  harrier::InitLogging("worker");
  openblas_set_num_threads(absl::GetFlag(FLAGS_blas_threads));

  const std::string workload_flag = absl::GetFlag(FLAGS_workload);
  std::optional<harrier::workload::ReplayModelSpec> replay;
  if (absl::StartsWith(workload_flag, "replay:")) {
    auto spec = harrier::workload::FindReplayModel(workload_flag.substr(7));
    if (!spec.ok()) return Fail(absl::StrCat("--workload: ", spec.status().message()));
    replay = std::move(*spec);
  } else if (workload_flag == "cnn") {
    // One CPU implementation only; a device model would have to implement
    // DeviceResidentModel, as cuda::DeviceMlpModel does for the MLP.
    if (absl::GetFlag(FLAGS_device) != "cpu") {
      return Fail("--workload=cnn runs on the CPU only; drop --device=" +
                  absl::GetFlag(FLAGS_device));
    }
    if (absl::GetFlag(FLAGS_layers) != kDefaultLayers) {
      return Fail("--layers applies to --workload=mlp only; the cnn's layers are fixed");
    }
  } else if (workload_flag != "mlp") {
    return Fail(absl::StrCat("unknown --workload='", workload_flag, "' (available: mlp, cnn, replay:",
                             absl::StrJoin(harrier::workload::ReplayModelNames(), ", replay:"),
                             ")"));
  }
  // none: no scheduler at all, the path every run took before it existed.
  std::optional<harrier::CommSchedulerOptions> scheduler;
  const std::string techniques = absl::GetFlag(FLAGS_techniques);
  if (techniques != "none") {
    if (absl::GetFlag(FLAGS_fusion_bytes) < 0 || absl::GetFlag(FLAGS_partition_bytes) < 0 ||
        absl::GetFlag(FLAGS_max_inflight_bytes) < 0) {
      return Fail("--fusion_bytes, --partition_bytes and --max_inflight_bytes must be >= 0");
    }
    if (absl::GetFlag(FLAGS_round_window_bytes) < -1) {
      return Fail("--round_window_bytes must be >= 0, or -1 for the default");
    }
    auto parsed = harrier::ParseTechniques(
        techniques, static_cast<size_t>(absl::GetFlag(FLAGS_fusion_bytes)),
        static_cast<size_t>(absl::GetFlag(FLAGS_partition_bytes)),
        static_cast<size_t>(absl::GetFlag(FLAGS_max_inflight_bytes)));
    if (!parsed.ok()) return Fail(absl::StrCat("--techniques: ", parsed.status().message()));
    scheduler = *parsed;
    scheduler->priority_across_workers = absl::GetFlag(FLAGS_priority_across_workers);
    if (const std::string tail = absl::GetFlag(FLAGS_forward_order_tail); tail == "measure") {
      scheduler->measure_forward_order_tail = true;
    } else if (!absl::SimpleAtod(tail, &scheduler->forward_order_tail) ||
               !(scheduler->forward_order_tail >= 0 && scheduler->forward_order_tail <= 1)) {
      return Fail(absl::StrCat("--forward_order_tail=", tail, ": must be in [0, 1], or 'measure'"));
    }
    if (absl::GetFlag(FLAGS_round_window_bytes) >= 0) {
      scheduler->round_window_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_round_window_bytes));
    }
    // A bucket at or above compress_min_bytes would be compressed as one
    // vector of unrelated tensors (PowerSGD on a fused bucket moved 15x the
    // bytes of per-tensor PowerSGD): with a push codec only the tensors that
    // travel uncompressed anyway are fused.
    const size_t compress_min = static_cast<size_t>(absl::GetFlag(FLAGS_compress_min_bytes));
    if (absl::GetFlag(FLAGS_codec) != "none" && scheduler->fusion_bytes >= compress_min) {
      scheduler->fusion_bytes = compress_min > sizeof(float) ? compress_min - sizeof(float) : 0;
    }
  }
  if (!absl::GetFlag(FLAGS_timeline).empty() && absl::GetFlag(FLAGS_timeline_max_mib) < 1) {
    return Fail("--timeline_max_mib must be >= 1");
  }
  if (replay.has_value()) {
    if (absl::GetFlag(FLAGS_device) != "cpu") {
      return Fail("--workload=replay:* models its compute; it takes --device=cpu only");
    }
    if (!(absl::GetFlag(FLAGS_compute_scale) >= 0)) return Fail("--compute_scale must be >= 0");
    if (absl::GetFlag(FLAGS_warmup_steps) < 0) return Fail("--warmup_steps must be >= 0");
    if (absl::GetFlag(FLAGS_max_steps) == 0 || absl::GetFlag(FLAGS_max_steps) < -1) {
      return Fail("--max_steps must be >= 1 (or -1) with --workload=replay:*");
    }
  }
  const bool use_cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (use_cuda) {
#if HARRIER_WITH_CUDA
    if (!harrier::cuda::DeviceAvailable()) {
      return Fail("--device=cuda: no CUDA device visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
    }
#else
    return Fail("--device=cuda needs a build with --config=cuda on a GPU node; this binary is CPU-only");
#endif
  } else if (absl::GetFlag(FLAGS_device) != "cpu") {
    return Fail(absl::StrCat("unknown --device='", absl::GetFlag(FLAGS_device), "' (cpu|cuda)"));
  }
  harrier::workload::MlpOptions mlp_options;
  mlp_options.layer_sizes.clear();
  for (absl::string_view size : absl::StrSplit(absl::GetFlag(FLAGS_layers), ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(size, &value) || value < 1) {
      return Fail(absl::StrCat("bad --layers='", absl::GetFlag(FLAGS_layers), "'"));
    }
    mlp_options.layer_sizes.push_back(value);
  }
  mlp_options.seed = absl::GetFlag(FLAGS_seed);

  harrier::ClientOptions client_options;
  client_options.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  if (client_options.servers.empty()) return Fail("--servers is required (host:port,...)");
  client_options.rank = absl::GetFlag(FLAGS_rank);
  client_options.job = absl::GetFlag(FLAGS_job);
  client_options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  client_options.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  client_options.codec = absl::GetFlag(FLAGS_codec);
  client_options.pull_codec = absl::GetFlag(FLAGS_pull_codec);
  client_options.transport = absl::GetFlag(FLAGS_transport);
  client_options.tcp_congestion_control = absl::GetFlag(FLAGS_tcp_congestion);
  client_options.grpc_connections = absl::GetFlag(FLAGS_grpc_connections);
  client_options.pull_connection = absl::GetFlag(FLAGS_pull_connection);
  client_options.compress_min_bytes = std::max(0, absl::GetFlag(FLAGS_compress_min_bytes));
  client_options.chunk_bytes = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_chunk_kib)))
                               << 10;
  // A piece of a partitioned tensor is one client chunk, so the shards
  // spread and pipeline exactly the pieces the scheduler plans.
  if (scheduler.has_value() && scheduler->partition_bytes > 0) {
    client_options.chunk_bytes = scheduler->partition_bytes;
  }
  client_options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  client_options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  client_options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  if (const std::string token_file = absl::GetFlag(FLAGS_auth_token_file); !token_file.empty()) {
    auto token = harrier::ReadJobTokenFile(token_file);
    if (!token.ok()) return Fail(std::string(token.status().message()));
    client_options.auth_token = *token;
  }

  // A replayed model needs no data set and no model object.
  harrier::workload::Dataset train;
  std::unique_ptr<harrier::workload::Model> model;
  if (!replay.has_value()) {
    auto loaded_train = harrier::workload::LoadFashionMnist(absl::GetFlag(FLAGS_data_dir),
                                                            harrier::workload::Split::kTrain);
    if (!loaded_train.ok()) return Fail(std::string(loaded_train.status().message()));
    train = std::move(*loaded_train);
    if (absl::GetFlag(FLAGS_train_examples) > 0) {
      train = harrier::workload::Subset(train, absl::GetFlag(FLAGS_train_examples));
    }
    if (workload_flag == "cnn") {
      harrier::workload::CnnOptions cnn_options;
      cnn_options.seed = absl::GetFlag(FLAGS_seed);
      auto cnn = harrier::workload::Cnn::Create(cnn_options);
      if (!cnn.ok()) return Fail(std::string(cnn.status().message()));
      model = std::make_unique<harrier::workload::Cnn>(std::move(*cnn));
    } else if (!use_cuda) {
      auto mlp = harrier::workload::Mlp::Create(mlp_options);
      if (!mlp.ok()) return Fail(std::string(mlp.status().message()));
      model = std::make_unique<harrier::workload::Mlp>(std::move(*mlp));
    } else {
#if HARRIER_WITH_CUDA
      auto device_model = harrier::workload::DeviceMlpModel::Create(mlp_options);
      if (!device_model.ok()) {
        return Fail(absl::StrCat("--device=cuda: ", device_model.status().message()));
      }
      model = std::move(*device_model);
#endif
    }
    if (model->input_size() != train.example_size()) {
      return Fail(absl::StrCat("--layers input size ", model->input_size(),
                               " does not match the data's ", train.example_size(), " pixels"));
    }
  }

  // The worker's own checks come before it takes a rank, so a mistake here
  // never holds one (a failure after Create still gives the rank back as
  // the client is destroyed).
  if (absl::GetFlag(FLAGS_batch_size) < 1) return Fail("--batch_size must be >= 1");
  if (absl::GetFlag(FLAGS_epochs) < 1) return Fail("--epochs must be >= 1");
  if (!(absl::GetFlag(FLAGS_step_delay_probability) >= 0 &&
        absl::GetFlag(FLAGS_step_delay_probability) <= 1)) {
    return Fail("--step_delay_probability must be in [0, 1]");
  }
  if (absl::GetFlag(FLAGS_eval_every) < 0) return Fail("--eval_every must be >= 0");
  if (!(absl::GetFlag(FLAGS_target_accuracy) >= 0 && absl::GetFlag(FLAGS_target_accuracy) <= 1)) {
    return Fail("--target_accuracy must be in [0, 1]");
  }
  if (const int port = absl::GetFlag(FLAGS_metrics_port); port > 0) {
    if (auto free = harrier::CheckTcpPortFree("0.0.0.0", port); !free.ok()) {
      return Fail(absl::StrCat("--metrics_port=", port, ": ", free.message()));
    }
  }

  // Where the tensors' compression runs: a model with device buffers has
  // its tensors registered in device memory, compressed by the CUDA codec
  // backend; every other model's by the CPU codecs.
  const bool device_tensors = model != nullptr && model->device() != nullptr;
#if HARRIER_WITH_CUDA
  if (device_tensors) {
    auto backend = harrier::cuda::NewCudaCodecBackend();
    if (!backend.ok()) return Fail(absl::StrCat("--device=cuda: ", backend.status().message()));
    client_options.device_backend = std::move(*backend);
  }
#endif
  std::string compression_line = "compression on host (cpu backend)";
  if (device_tensors && client_options.device_backend != nullptr) {
    compression_line =
        absl::StrCat("compression on device (", client_options.device_backend->name(), " backend)");
  } else if (use_cuda) {
    compression_line = "compression on host (cpu backend: the model has no device buffers)";
  }
  client_options.resume_clock = true;  // a restarted worker goes on from its clock
  auto client = harrier::Client::Create(client_options);
  if (!client.ok()) return Fail(std::string(client.status().message()));
  const int rank = (*client)->rank();
  if (absl::GetFlag(FLAGS_num_workers) > 0 &&
      absl::GetFlag(FLAGS_num_workers) != (*client)->num_workers()) {
    return Fail(absl::StrCat("--num_workers=", absl::GetFlag(FLAGS_num_workers),
                             " but the servers expect ", (*client)->num_workers()));
  }
  std::fprintf(stderr, "[worker %d] rank %d of %d, %d shards, sync %s, %lld parameters\n", rank,
               rank, (*client)->num_workers(), (*client)->num_shards(),
               (*client)->sync().mode.c_str(),
               static_cast<long long>(replay.has_value() ? replay->num_parameters()
                                                         : model->num_parameters()));
  std::fprintf(stderr, "[worker %d] %s\n", rank, compression_line.c_str());
  std::fprintf(stderr, "[worker %d] data path per shard: %s (--transport=%s)\n", rank,
               absl::StrJoin((*client)->data_paths(), ",").c_str(),
               client_options.transport.c_str());

  if (scheduler.has_value()) {
    std::fprintf(stderr,
                 "[worker %d] comm scheduler: techniques=%s wfbp=%d fusion_bytes=%zu "
                 "partition_bytes=%zu priority=%d max_inflight_bytes=%zu round_window_bytes=%zu\n",
                 rank, techniques.c_str(), scheduler->wait_free_backprop ? 1 : 0,
                 scheduler->fusion_bytes, scheduler->partition_bytes, scheduler->priority ? 1 : 0,
                 harrier::CreditCap(*scheduler, (*client)->num_shards()),
                 scheduler->round_window_bytes);
    if (scheduler->priority && !scheduler->priority_across_workers &&
        (*client)->num_workers() > 1 && (*client)->sync().mode == "bsp") {
      std::fprintf(stderr,
                   "[worker %d] comm scheduler: calls go in the order of backward, as on every "
                   "worker (BSP with %d workers; --priority_across_workers reorders them)%s\n",
                   rank, (*client)->num_workers(),
                   scheduler->measure_forward_order_tail
                       ? ", except a tail of the push bytes, measured in step 1 and agreed by "
                         "the workers, which goes front first from step 2"
                   : scheduler->forward_order_tail > 0
                       ? absl::StrCat(", except the last ", scheduler->forward_order_tail,
                                      " of the push bytes, which go front first")
                             .c_str()
                       : "");
    }
  }
  // Opened once the rank is known; outlives every scheduler below.
  std::shared_ptr<harrier::Timeline> timeline;
  if (const std::string path = harrier::TimelinePathFor(absl::GetFlag(FLAGS_timeline), rank);
      !path.empty()) {
    if (absl::Status started = (*client)->StartTimeline(
            path, static_cast<uint64_t>(absl::GetFlag(FLAGS_timeline_max_mib)) << 20);
        !started.ok()) {
      return Fail(std::string(started.message()));
    }
    timeline = (*client)->timeline();
    // The scheduler records its own calls, with their steps; the client
    // records every other operation.
    if (scheduler.has_value()) scheduler->timeline = timeline.get();
    std::fprintf(stderr, "[worker %d] timeline: %s\n", rank, path.c_str());
  }

  // The worker's own metrics and liveness endpoint, read from the client's
  // counters when scraped.
  harrier::MetricsRegistry metrics;
  std::unique_ptr<harrier::MetricsHttpServer> metrics_http;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    harrier::Client* raw = client->get();
    const harrier::MetricLabels labels = {{"rank", std::to_string(rank)}};
    metrics.AddCallbackCounter("harrier_worker_bytes_pushed_total", "Push payload bytes sent.",
                               [raw] { return raw->stats().bytes_pushed; }, labels);
    metrics.AddCallbackCounter("harrier_worker_bytes_pulled_total", "Pull payload bytes received.",
                               [raw] { return raw->stats().bytes_pulled; }, labels);
    metrics.AddCallbackCounter("harrier_worker_pushes_total", "Tensor pushes.",
                               [raw] { return raw->stats().pushes; }, labels);
    metrics.AddCallbackCounter("harrier_worker_pulls_total", "Tensor pulls.",
                               [raw] { return raw->stats().pulls; }, labels);
    metrics.AddCallbackCounter(
        "harrier_worker_push_wait_seconds_total", "Time spent waiting for pushes.",
        [raw] { return absl::ToDoubleSeconds(raw->stats().push_wait); }, labels);
    metrics.AddCallbackCounter(
        "harrier_worker_pull_wait_seconds_total", "Time spent waiting for pulls.",
        [raw] { return absl::ToDoubleSeconds(raw->stats().pull_wait); }, labels);
    metrics.AddCallbackGauge("harrier_worker_clock", "The worker's current iteration.",
                             [raw] { return static_cast<double>(raw->clock()); }, labels);
    auto http = harrier::MetricsHttpServer::Start("0.0.0.0", absl::GetFlag(FLAGS_metrics_port),
                                                  &metrics);
    if (!http.ok()) return Fail(std::string(http.status().message()));
    metrics_http = std::move(*http);
    std::fprintf(stderr, "[worker %d] metrics on port %d\n", rank, metrics_http->port());
  }

  if (replay.has_value()) {
    harrier::ReplayTrainerOptions replay_options;
    replay_options.compute_scale = absl::GetFlag(FLAGS_compute_scale);
    replay_options.steps = absl::GetFlag(FLAGS_max_steps) < 0 ? 5 : absl::GetFlag(FLAGS_max_steps);
    replay_options.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
    replay_options.seed = absl::GetFlag(FLAGS_seed);
    replay_options.scheduler = scheduler;
    replay_options.techniques = techniques;
    replay_options.optimizer = absl::GetFlag(FLAGS_optimizer);
    replay_options.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
    replay_options.wait_timeout = client_options.rpc_timeout;
    auto summary = harrier::RunReplay(**client, *replay, replay_options);
    if (!summary.ok()) return Fail(std::string(summary.status().message()));
    std::fprintf(stderr, "[worker %d] replay of %s done: %.1f ms per step\n", rank,
                 replay->name.c_str(), summary->iter_ms);
    std::printf("%s\n", harrier::workload::FormatReplaySummary(*summary).c_str());
    std::fflush(stdout);
    return 0;
  }

  harrier::workload::Dataset test;
  if (rank == 0) {
    auto loaded = harrier::workload::LoadFashionMnist(absl::GetFlag(FLAGS_data_dir),
                                                      harrier::workload::Split::kTest);
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    test = std::move(*loaded);
  }

  harrier::TrainerOptions options;
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.max_steps = absl::GetFlag(FLAGS_max_steps);
  options.log_every = std::max(1, absl::GetFlag(FLAGS_log_every));
  options.step_delay_ms = absl::GetFlag(FLAGS_step_delay_ms);
  options.step_delay_probability = absl::GetFlag(FLAGS_step_delay_probability);
  if (!(options.step_delay_probability >= 0 && options.step_delay_probability <= 1)) {
    return Fail("--step_delay_probability must be in [0, 1]");
  }
  options.local_lr = static_cast<float>(absl::GetFlag(FLAGS_local_lr));
  if (absl::StartsWith(absl::GetFlag(FLAGS_codec), "signum")) {
    options.gradient_momentum = static_cast<float>(absl::GetFlag(FLAGS_signum_momentum));
  }
  options.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  options.eval_every_steps = absl::GetFlag(FLAGS_eval_every);
  options.target_accuracy = absl::GetFlag(FLAGS_target_accuracy);
  if (options.eval_every_steps < 0) return Fail("--eval_every must be >= 0");
  if (!(options.target_accuracy >= 0 && options.target_accuracy <= 1)) {
    return Fail("--target_accuracy must be in [0, 1]");
  }
  options.scheduler = scheduler;
  options.stop_requested = &stop_requested;
  can_stop_cleanly = true;
  auto result = harrier::Train(**client, *model, train, rank == 0 ? &test : nullptr, options);
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (result->stopped) {
    std::fprintf(stderr, "[worker %d] stopped by signal after %lld steps; left the job\n", rank,
                 static_cast<long long>(result->steps));
    return 0;
  }

  std::fprintf(stderr,
               "[worker %d] done: %lld steps in %.1f s, %.0f samples/s, loss %.4f -> %.4f, max "
               "staleness %lld\n",
               rank, static_cast<long long>(result->steps), result->seconds,
               result->samples_per_second, result->first_loss, result->last_loss,
               static_cast<long long>(result->max_staleness));
  if (rank == 0 && result->test_accuracy >= 0) {
    std::printf("test_accuracy=%.4f\n", result->test_accuracy);
    std::fflush(stdout);
  }
  if (rank == 0 && options.eval_every_steps > 0) {
    std::printf("time_to_accuracy_s=%.3f\n", result->time_to_target_s);
    std::fflush(stdout);
  }
  return 0;
}
