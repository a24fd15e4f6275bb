// harrier-advise: measures the link to the shards, the codecs on this host
// and the compute per step, and recommends a sync mode, a codec (and
// pulls) and scheduler settings from the cost model (cost_model.h),
// printing every option's predicted time to the target. See README.md.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/advise/calibration.h"
#include "bench/advise/cost_model.h"
#include "bench/advise/measure.h"
#include "bench/bench_util.h"
#include "common/codec/codec_backend.h"
#include "common/codec/pull_pairing.h"
#include "common/codec/survey_codecs.h"
#include "common/flags.h"
#include "common/grpc_security.h"
#include "common/json.h"
#include "worker/workload/cnn.h"
#include "worker/workload/replay_models.h"
#if HARRIER_WITH_CUDA
#include "cuda/cuda_codec_backend.h"
#endif

ABSL_FLAG(std::string, servers, "", "Comma-separated host:port of every shard, shard 0 first.");
ABSL_FLAG(std::string, model, "mlp",
          "mlp | cnn | replay:resnet50 | replay:vgg16 | replay:bert-base (ignored with --tensors).");
ABSL_FLAG(std::string, tensors, "",
          "NAME:ELEMENTS[,NAME:ELEMENTS...] (ELEMENTS may be a shape, 256x784): the model's "
          "tensors instead of --model; needs --compute_ms.");
ABSL_FLAG(bool, tensors_from_job, false,
          "Take the model's tensors from the shards of a running job (--servers; what its "
          "workers registered) instead of --model's or --tensors. --model still names the "
          "calibration's model and, for mlp or cnn, the step it measures; any other needs "
          "--compute_ms.");
ABSL_FLAG(int, workers, 4, "Workers of the job being planned.");
ABSL_FLAG(int, colocated_cores, 0,
          "The cores every worker and shard of the job shares when one host runs them all "
          "(a test bed, the grid of harrier-bench convergence): their compute, codecs and "
          "transport then compete for these cores. 0: each process has cores of its own.");
ABSL_FLAG(int, batch_size, 64, "Examples per step per worker (mlp: the measured batch).");
ABSL_FLAG(std::string, calibration, "",
          "runs.jsonl of harrier-bench convergence for the same model: steps to the target "
          "per sync x codec x pulls. Without it: the survey's factors (a guess).");
ABSL_FLAG(bool, measured_only, false,
          "With --calibration: rank only the options it holds (reached or not), leaving out "
          "the ones it lacks instead of guessing their steps; for a grid that is not a full "
          "cross product of --syncs x --codecs x --pulls.");
ABSL_FLAG(double, compute_ms, -1,
          "Compute per step in ms (-1: measure a step of the mlp or the cnn, or take the "
          "replay model's figure; required with --tensors).");
ABSL_FLAG(int64_t, probe_bytes, 8 << 20, "Bytes of the large probes (1 .. 64 MiB).");
ABSL_FLAG(int, probe_repeats, 5, "Large probes per direction per shard (the median counts).");
ABSL_FLAG(int, rtt_probes, 20, "Small probes per shard (the median is the round trip).");
ABSL_FLAG(double, link_gbps, 0,
          "Plan for host links of this rate (Gbit/s, both ways) instead of the measured ones, "
          "e.g. a grid's emulated link; 0: the measured rates. The round trip is measured.");
ABSL_FLAG(int, timeout_ms, 30000, "Deadline of every probe.");
ABSL_FLAG(int, chunk_kib, 4096, "The workers' chunk size (harrier-worker --chunk_kib).");
ABSL_FLAG(int, compress_min_bytes, 16384,
          "Chunks smaller than this travel uncompressed (harrier-worker --compress_min_bytes).");
ABSL_FLAG(std::string, syncs, "bsp,ssp2,asp,local4", "Sync modes to rank (the grid's names).");
ABSL_FLAG(std::string, codecs,
          "none,fp16,topk,randomk,dgc,qsgd4,qsgd8,terngrad,signsgd,efsign,signum,onebit,powersgd2",
          "Codecs to rank (the grid's names).");
ABSL_FLAG(std::string, pulls, "off,on,paired",
          "Pull settings to rank: off (dense), on (the grid's pull codec for the codec), paired "
          "(the pull codec paired with the push codec: --pull_codec=paired).");
ABSL_FLAG(std::string, device, "cpu",
          "Where the worker's codecs are timed: cpu, or cuda (the device codecs in device "
          "memory, as harrier-worker --device=cuda runs them; needs a CUDA build, a GPU and "
          "--compute_ms). The shards' side is timed on this host's CPU either way.");
ABSL_FLAG(bool, json, false,
          "Print one JSON line on stdout (the report's advice file); the table goes to stderr.");
ABSL_FLAG(std::string, auth_token_file, "", "File holding the shards' job token.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificates: talk TLS to the shards.");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate chain (mutual TLS, with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");

namespace harrier::advise {
namespace {

constexpr char kUsage[] =
    "Recommends a sync mode, a codec and scheduler settings for a Harrier job.\n"
    "Usage: harrier-advise --servers=H:P[,H:P...] [--model=mlp|cnn|replay:NAME | "
    "--tensors=NAME:ELEMENTS,... | --tensors_from_job] [--workers=4] [--batch_size=64] [--calibration=runs.jsonl [--measured_only]] "
    "[--compute_ms=-1] [--link_gbps=0] [--colocated_cores=0] [--device=cpu|cuda] "
    "[--probe_bytes=8388608] [--json] "
    "[--auth_token_file=F --tls_*]\n"
    "Measures the link to every shard (AdminService.Probe), every codec on this host at the "
    "model's chunk sizes and the compute per step, then predicts each option's step time "
    "(compute + codec + communication) and time to the target (steps from --calibration, "
    "else the survey's factors), and picks the least. Exit 0 done, 1 a measurement failed, "
    "2 a usage error.";

int Fail(const std::string& why, int code) {
  std::fprintf(stderr, "harrier-advise: %s\n", why.c_str());
  return code;
}

// %.6g as a JSON number; -1 for what JSON has no number for (nan, inf).
double JsonNumber(double value) {
  if (!(value == value) || value > 1e300 || value < -1e300) return -1;
  return RoundToSignificant(value, 6);
}

// The CNN's tensors, from the model itself (worker/workload/cnn.h).
std::vector<TensorShape> CnnTensors() {
  std::vector<TensorShape> tensors;
  auto cnn = workload::Cnn::Create(workload::CnnOptions{});
  if (!cnn.ok()) return tensors;  // a fixed layout: cannot fail
  for (const workload::ParamTensor& param : cnn->params()) {
    tensors.push_back({param.name, param.shape});
  }
  return tensors;
}

std::vector<TensorShape> MlpTensors() {
  return {{"fc0.weight", {256, 784}}, {"fc0.bias", {256}}, {"fc1.weight", {256, 256}},
          {"fc1.bias", {256}},        {"fc2.weight", {10, 256}}, {"fc2.bias", {10}}};
}

absl::StatusOr<std::vector<TensorShape>> ParseTensors(const std::string& text) {
  std::vector<TensorShape> tensors;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    TensorShape tensor;
    if (parts.size() != 2 || parts[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tensors: '", item, "' is not NAME:ELEMENTS"));
    }
    tensor.name = parts[0];
    for (absl::string_view dim : absl::StrSplit(parts[1], 'x')) {
      int64_t d = 0;
      if (!absl::SimpleAtoi(dim, &d) || d < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tensors: '", item, "': '", dim, "' is not a positive size"));
      }
      tensor.shape.push_back(d);
    }
    tensors.push_back(std::move(tensor));
  }
  if (tensors.empty()) return absl::InvalidArgumentError("--tensors names no tensor");
  return tensors;
}

// Built-in steps of bsp/none to the target when no grid says (a guess
// about 1.5 epochs of 4 x 64 examples a step for the MLP's 0.85, 2.5 for
// the CNN's 0.88).
double BaseSteps(const std::string& model) {
  if (model == "mlp") return 350;
  if (model == "cnn") return 600;
  return 1000;
}

struct Scheduler {
  std::string techniques = "none";
  int64_t fusion_bytes = 0;
  int64_t partition_bytes = 0;
  std::string why;
};

// Rules, not a model: overlap and fusion pay when communication is a large
// share of a synchronous step and the model has several tensors;
// partitioning when a tensor spans several chunks.
Scheduler ChooseScheduler(const OptionResult& pick, const std::vector<TensorShape>& tensors,
                          const Link& link, size_t chunk_bytes, size_t compress_min_bytes) {
  Scheduler s;
  if (pick.sync == "local4") {
    // harrier-worker refuses --techniques with --sync=local (trainer.cc).
    s.why =
        "local SGD pushes one model delta per round, not per-layer gradients as backward "
        "produces them: no comm scheduler (techniques none)";
    return s;
  }
  const bool synchronous = pick.sync == "bsp";
  const double comm_share =
      pick.terms.step_s > 0 ? pick.terms.comm_s / pick.terms.step_s : 0.0;
  int64_t largest = 0;
  int small = 0;
  for (const TensorShape& t : tensors) {
    largest = std::max<int64_t>(largest, t.num_elements() * 4);
    if (static_cast<size_t>(t.num_elements() * 4) < compress_min_bytes) ++small;
  }
  if (!synchronous) {
    s.why = absl::StrCat(pick.sync,
                         " already overlaps communication with compute: techniques none");
    return s;
  }
  if (tensors.size() < 2) {
    s.why = "one tensor: nothing to overlap or fuse, techniques none";
    return s;
  }
  if (comm_share < 0.2) {
    s.why = absl::StrFormat(
        "communication is %.0f%% of the step (under 20%%): little to hide, techniques none",
        100 * comm_share);
    return s;
  }
  std::vector<std::string> parts = {"wfbp"};
  // A bucket worth one round trip of the link: fewer calls, none too small
  // to fill the pipe.
  const double bdp = link.rtt_s * link.up_bytes_per_s;
  s.fusion_bytes = std::clamp<int64_t>(static_cast<int64_t>(bdp), 1 << 20, 4 << 20);
  parts.push_back("fusion");
  if (largest > static_cast<int64_t>(chunk_bytes)) {
    parts.push_back("partition");
    s.partition_bytes = static_cast<int64_t>(chunk_bytes);
  }
  s.techniques = absl::StrJoin(parts, "+");
  s.why = absl::StrFormat(
      "communication is %.0f%% of a %s step: overlap it with the backward pass (wfbp), fuse "
      "the %d small tensor(s) into %lld-byte buckets (about the link's bandwidth x round trip, "
      "1..4 MiB)%s",
      100 * comm_share, pick.sync, small, static_cast<long long>(s.fusion_bytes),
      s.partition_bytes > 0 ? absl::StrCat(", partition tensors over ", s.partition_bytes,
                                           " bytes into pieces")
                            : "");
  return s;
}

std::string SourceName(StepsSource source) {
  switch (source) {
    case StepsSource::kCalibration: return "grid";
    case StepsSource::kNeverReached: return "never";
    case StepsSource::kSurveyGuess: return "guess";
  }
  return "?";
}

int Run() {
  const std::string servers_flag = absl::GetFlag(FLAGS_servers);
  if (servers_flag.empty()) return Fail("--servers is required (host:port of every shard)", 2);
  const std::vector<std::string> servers = absl::StrSplit(servers_flag, ',', absl::SkipEmpty());
  const int workers = absl::GetFlag(FLAGS_workers);
  if (workers < 1) return Fail("--workers must be at least 1", 2);
  if (absl::GetFlag(FLAGS_colocated_cores) < 0) {
    return Fail("--colocated_cores must not be negative (0: no shared cores)", 2);
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    return Fail(absl::StrCat("--device=", device, ": not cpu or cuda"), 2);
  }
  std::shared_ptr<CodecBackend> device_backend;  // null: the CPU codecs
  if (device == "cuda") {
#if HARRIER_WITH_CUDA
    auto backend = cuda::NewCudaCodecBackend();
    if (!backend.ok()) return Fail(absl::StrCat("--device=cuda: ", backend.status().message()), 1);
    device_backend = *std::move(backend);
#else
    return Fail("--device=cuda: this build has no CUDA (bazel build --config=cuda)", 2);
#endif
    if (absl::GetFlag(FLAGS_compute_ms) < 0) {
      return Fail("--device=cuda needs --compute_ms: the step is timed on the CPU models only", 2);
    }
  }
  const int64_t probe_bytes = absl::GetFlag(FLAGS_probe_bytes);
  if (probe_bytes < 1 || probe_bytes > static_cast<int64_t>(64) << 20) {
    return Fail("--probe_bytes must be in 1..67108864 (the shard's 64 MiB bound)", 2);
  }
  if (absl::GetFlag(FLAGS_link_gbps) < 0) return Fail("--link_gbps must not be negative", 2);
  if (absl::GetFlag(FLAGS_chunk_kib) < 1) return Fail("--chunk_kib must be at least 1", 2);
  if (absl::GetFlag(FLAGS_compress_min_bytes) < 0) {
    return Fail("--compress_min_bytes must not be negative", 2);
  }
  const std::vector<std::string> syncs = absl::StrSplit(absl::GetFlag(FLAGS_syncs), ',');
  const std::vector<std::string> codecs = absl::StrSplit(absl::GetFlag(FLAGS_codecs), ',');
  const std::vector<std::string> pulls = absl::StrSplit(absl::GetFlag(FLAGS_pulls), ',');
  for (const std::string& sync : syncs) {
    if (auto r = RoundsPerStep(sync); !r.ok()) return Fail(absl::StrCat("--syncs: ", r.status().message()), 2);
  }
  for (const std::string& codec : codecs) {
    if (auto r = CodecSpecFor(codec); !r.ok()) return Fail(absl::StrCat("--codecs: ", r.status().message()), 2);
  }
  for (const std::string& p : pulls) {
    if (p != "off" && p != "on" && p != "paired") {
      return Fail(absl::StrCat("--pulls: '", p, "' is not off, on or paired"), 2);
    }
  }

  // The model: its tensors and compute per step.
  std::string model = absl::GetFlag(FLAGS_model);
  std::vector<TensorShape> tensors;
  double compute_s = absl::GetFlag(FLAGS_compute_ms) / 1000.0;
  std::string compute_how = "given (--compute_ms)";
  const bool compute_given = absl::GetFlag(FLAGS_compute_ms) >= 0;
  const bool from_job = absl::GetFlag(FLAGS_tensors_from_job);
  if (from_job && !absl::GetFlag(FLAGS_tensors).empty()) {
    return Fail("--tensors_from_job reads the tensors from the shards: leave out --tensors", 2);
  }
  const bool model_known = model == "mlp" || model == "cnn" || model.rfind("replay:", 0) == 0;
  if (from_job && !model_known && !compute_given) {
    return Fail(absl::StrCat("--tensors_from_job with --model=", model,
                             " needs --compute_ms (only the mlp's and the cnn's steps are "
                             "measured here)"),
                2);
  }
  if (from_job && !model_known) {
    // Only a name here: the calibration's model; the tensors come from the job.
  } else if (!absl::GetFlag(FLAGS_tensors).empty()) {
    auto parsed = ParseTensors(absl::GetFlag(FLAGS_tensors));
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()), 2);
    tensors = *std::move(parsed);
    model = "tensors";
    if (!compute_given) return Fail("--tensors needs --compute_ms (nothing to measure)", 2);
  } else if (model == "mlp") {
    tensors = MlpTensors();
    if (!compute_given) {
      auto measured = MeasureMlpStepSeconds(absl::GetFlag(FLAGS_batch_size));
      if (!measured.ok()) return Fail(std::string(measured.status().message()), 2);
      compute_s = *measured;
      compute_how = absl::StrFormat("measured: median of 20 steps, batch %d, 1 BLAS thread",
                                    absl::GetFlag(FLAGS_batch_size));
    }
  } else if (model == "cnn") {
    tensors = CnnTensors();
    if (!compute_given) {
      auto measured = MeasureCnnStepSeconds(absl::GetFlag(FLAGS_batch_size));
      if (!measured.ok()) return Fail(std::string(measured.status().message()), 2);
      compute_s = *measured;
      compute_how = absl::StrFormat("measured: median of 10 steps, batch %d, 1 BLAS thread",
                                    absl::GetFlag(FLAGS_batch_size));
    }
  } else if (model.rfind("replay:", 0) == 0) {
    auto spec = workload::FindReplayModel(model.substr(7));
    if (!spec.ok()) return Fail(absl::StrCat("--model: ", spec.status().message()), 2);
    for (const workload::ReplayLayer& layer : spec->layers) {
      for (const workload::ReplayTensor& t : layer.tensors) tensors.push_back({t.name, t.shape});
    }
    if (!compute_given) {
      compute_s = spec->compute_ms() / 1000.0;
      compute_how = absl::StrFormat("modelled (replay_models.cc, batch %d; --batch_size "
                                    "does not apply)",
                                    spec->batch_size);
    }
  } else {
    return Fail(absl::StrCat("--model='", model,
                             "': not mlp, cnn or replay:NAME (or give --tensors)"),
                2);
  }
  // Steps to the target.
  Calibration calibration;
  const bool calibrated = !absl::GetFlag(FLAGS_calibration).empty();
  if (calibrated) {
    auto read = ReadCalibration(absl::GetFlag(FLAGS_calibration), model);
    if (!read.ok()) return Fail(std::string(read.status().message()), 2);
    calibration = *std::move(read);
  }

  // The link.
  LinkOptions link_options;
  link_options.servers = servers;
  link_options.probe_bytes = static_cast<uint64_t>(probe_bytes);
  link_options.repeats = std::max(1, absl::GetFlag(FLAGS_probe_repeats));
  link_options.small_probes = std::max(1, absl::GetFlag(FLAGS_rtt_probes));
  link_options.timeout = absl::Milliseconds(std::max(1, absl::GetFlag(FLAGS_timeout_ms)));
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    auto token = ReadJobTokenFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!token.ok()) return Fail(std::string(token.status().message()), 2);
    link_options.token = *token;
  }
  TlsFiles tls;
  tls.ca = absl::GetFlag(FLAGS_tls_ca);
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  auto credentials = MakeChannelCredentials(tls);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()), 2);
  link_options.credentials = *credentials;
  if (from_job) {
    auto held = ReadJobTensors(link_options);
    if (!held.ok()) return Fail(std::string(held.status().message()), 1);
    tensors = *std::move(held);
  }
  int64_t parameters = 0;
  for (const TensorShape& t : tensors) parameters += t.num_elements();
  auto links = MeasureLinks(link_options);
  if (!links.ok()) return Fail(std::string(links.status().message()), 1);
  Link link = CombineLinks(*links);
  const Link measured_link = link;
  const double link_gbps = absl::GetFlag(FLAGS_link_gbps);
  if (link_gbps > 0) {
    link.up_bytes_per_s = link_gbps * 1e9 / 8;
    link.down_bytes_per_s = link_gbps * 1e9 / 8;
  }
  Cluster cluster;
  cluster.workers = workers;
  cluster.shards = static_cast<int>(servers.size());
  cluster.colocated_cores = absl::GetFlag(FLAGS_colocated_cores);

  // The codecs, each with the spec the grid ran when the calibration says.
  std::map<std::string, std::string> push_specs, pull_specs;
  for (const std::string& codec : codecs) push_specs[codec] = *CodecSpecFor(codec);
  for (const CalibrationRun& run : calibration.runs) {
    if (!run.codec_spec.empty()) push_specs[run.codec] = run.codec_spec;
    if (run.pulls == "on" && !run.pull_codec.empty() && run.pull_codec != "none") {
      pull_specs[run.codec] = run.pull_codec;
    }
  }
  CodecMeasureOptions codec_options;
  codec_options.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
  codec_options.compress_min_bytes = absl::GetFlag(FLAGS_compress_min_bytes);
  codec_options.shards = cluster.shards;
  codec_options.backend = device_backend;
  std::map<std::string, CodecCost> costs;  // key: codec/pulls
  std::map<std::string, std::string> paired_specs;
  for (const std::string& codec : codecs) {
    for (const std::string& p : pulls) {
      // Compressed pulls: the pull codec the grid ran, else the grid table's;
      // paired: the push codec's pair.
      std::string pull_spec = "none";
      if (p == "on") {
        pull_spec = pull_specs.count(codec) ? pull_specs[codec] : *PullCodecSpecFor(codec);
      } else if (p == "paired") {
        auto pair = ResolvePullCodec(push_specs[codec], kPairedPullCodec);
        if (!pair.ok()) return Fail(std::string(pair.status().message()), 2);
        pull_spec = *pair;
        paired_specs[codec] = pull_spec;
      }
      auto cost = MeasureCodec(tensors, push_specs[codec], pull_spec, codec_options);
      if (!cost.ok()) return Fail(std::string(cost.status().message()), 1);
      costs[codec + "/" + p] = *cost;
      if (p == "on") pull_specs[codec] = pull_spec;
    }
  }

  const bool measured_only = calibrated && absl::GetFlag(FLAGS_measured_only);
  std::vector<OptionResult> options;
  int left_out = 0;
  for (const std::string& sync : syncs) {
    for (const std::string& codec : codecs) {
      for (const std::string& p : pulls) {
        OptionResult option;
        option.sync = sync;
        option.codec = codec;
        option.pulls = p;
        option.steps = EstimateSteps(calibrated ? &calibration : nullptr, sync, codec, p,
                                     BaseSteps(model));
        if (measured_only && option.steps.source == StepsSource::kSurveyGuess) {
          ++left_out;
          continue;
        }
        auto terms = PredictStep(sync, costs[codec + "/" + p], link, cluster, compute_s);
        if (!terms.ok()) return Fail(std::string(terms.status().message()), 1);
        option.terms = *terms;
        options.push_back(option);
      }
    }
  }
  if (options.empty()) {
    return Fail(absl::StrCat("--measured_only: no option of --syncs x --codecs x --pulls is in --calibration=",
                             absl::GetFlag(FLAGS_calibration), " for model ", model),
                2);
  }
  RankOptions(&options);
  const OptionResult& pick = options.front();
  const std::string pick_pull_codec = pick.pulls == "on"       ? pull_specs[pick.codec]
                                      : pick.pulls == "paired" ? paired_specs[pick.codec]
                                                               : "none";
  const Scheduler scheduler =
      ChooseScheduler(pick, tensors, link, codec_options.chunk_bytes,
                      codec_options.compress_min_bytes);

  // The report.
  FILE* out = absl::GetFlag(FLAGS_json) ? stderr : stdout;
  const double gbit = 8e-9;
  std::fprintf(out, "harrier-advise: model %s, %lld parameters in %zu tensors%s, %d workers, %d shards\n",
               model.c_str(), static_cast<long long>(parameters), tensors.size(),
               from_job ? " (as the running job's shards hold them)" : "", workers,
               cluster.shards);
  for (const ShardLink& l : *links) {
    std::fprintf(out, "  link to %s: rtt %.3f ms, up %.3f Gbit/s, down %.3f Gbit/s (median of %d probes of %lld bytes); this end's CPU %.3f ns per byte, %.1f us per call\n",
                 l.address.c_str(), l.rtt_s * 1e3, l.up_bytes_per_s * gbit,
                 l.down_bytes_per_s * gbit, link_options.repeats,
                 static_cast<long long>(probe_bytes), l.cpu_s_per_byte * 1e9,
                 l.cpu_s_per_call * 1e6);
  }
  if (link_gbps > 0) {
    std::fprintf(out, "  planning for %g Gbit/s links (--link_gbps), not the measured rates\n",
                 link_gbps);
  }
  std::fprintf(out, "  compute per step: %.3f ms, %s\n", compute_s * 1e3, compute_how.c_str());
  std::vector<std::string> dense;
  for (const TensorShape& t : tensors) {
    if (static_cast<size_t>(t.num_elements() * 4) < codec_options.compress_min_bytes) {
      dense.push_back(t.name);
    }
  }
  if (!dense.empty()) {
    std::fprintf(out, "  travel dense under every codec (< %zu bytes): %s\n",
                 codec_options.compress_min_bytes, absl::StrJoin(dense, ", ").c_str());
  }
  std::fprintf(out, "\ncodecs (the worker's side on %s, the shards' on this host's cpu), one worker's round:\n",
               device_backend != nullptr ? device_backend->name().c_str() : "this host's cpu");
  std::fprintf(out, "  %-10s %-5s %12s %12s %10s %10s %10s %10s  %s\n", "codec", "pulls",
               "push_bytes", "pull_bytes", "enc_ms", "dec_ms", "penc_ms", "pdec_ms", "spec");
  for (const std::string& codec : codecs) {
    for (const std::string& p : pulls) {
      const CodecCost& c = costs[codec + "/" + p];
      std::fprintf(out, "  %-10s %-5s %12.0f %12.0f %10.3f %10.3f %10.3f %10.3f  %s%s\n",
                   codec.c_str(), p.c_str(), c.push_bytes, c.pull_bytes, c.encode_push_s * 1e3,
                   c.decode_push_s * 1e3, c.encode_pull_s * 1e3, c.decode_pull_s * 1e3,
                   push_specs[codec].c_str(),
                   p == "on" ? absl::StrCat(" / pull ", pull_specs[codec]).c_str() : "");
    }
  }
  std::fprintf(out, "\noptions, best first (times per step in ms; steps to the target):\n");
  // The grid's measured step at the planned link, beside the prediction.
  const auto grid_step_ms = [&](const OptionResult& o) -> std::string {
    if (!calibrated || link_gbps <= 0) return "-";
    std::vector<double> steps;
    for (const CalibrationRun& run : calibration.runs) {
      if (run.sync == o.sync && run.codec == o.codec && run.pulls == o.pulls &&
          run.link_gbps == link_gbps && run.step_s > 0) {
        steps.push_back(run.step_s);
      }
    }
    if (steps.empty()) return "-";
    std::sort(steps.begin(), steps.end());
    return absl::StrFormat("%.3f", steps[steps.size() / 2] * 1e3);
  };
  std::fprintf(out, "  %-4s %-7s %-10s %-5s %9s %9s %9s %9s %9s %9s %9s %10s %12s  %s\n",
               "rank", "sync", "codec", "pulls", "compute", "codec", "comm", "rtt", "cores",
               "step", "grid_step", "steps", "time_s", "steps from");
  int never = 0;
  for (size_t i = 0; i < options.size(); ++i) {
    const OptionResult& o = options[i];
    if (o.steps.source == StepsSource::kNeverReached) ++never;
    std::fprintf(out, "  %-4zu %-7s %-10s %-5s %9.3f %9.3f %9.3f %9.3f %9s %9.3f %9s %10s %12s  %s\n",
                 i + 1, o.sync.c_str(), o.codec.c_str(), o.pulls.c_str(),
                 o.terms.compute_s * 1e3, o.terms.codec_s * 1e3, o.terms.comm_s * 1e3,
                 o.terms.rtt_s * 1e3,
                 cluster.colocated_cores > 0
                     ? absl::StrFormat("%.3f", o.terms.cpu_bound_s * 1e3).c_str()
                     : "-",
                 o.terms.step_s * 1e3, grid_step_ms(o).c_str(),
                 o.steps.steps < 0 ? "never" : absl::StrFormat("%.0f", o.steps.steps).c_str(),
                 o.time_to_target_s < 0 ? "-" : absl::StrFormat("%.3f", o.time_to_target_s).c_str(),
                 o.steps.note.c_str());
  }

  // The reasoning.
  std::fprintf(out, "\nreasoning:\n");
  std::fprintf(out,
               "  step = cpu + comm (bsp); max(cpu, comm) (ssp2, asp: the round overlaps the next "
               "step's compute); as bsp with codec and comm / 4 (local4); cpu = compute + codec%s.\n",
               cluster.colocated_cores > 0 ? ", or the cores column when larger" : "");
  if (cluster.colocated_cores > 0) {
    std::fprintf(out,
                 "  cores = %d workers x (compute + a round's codec work on both sides + the "
                 "transport at both ends: %.3f ns per byte, %.1f us per call, as the probes cost "
                 "this process) / %d shared cores (--colocated_cores).\n",
                 workers, link.cpu_s_per_byte * 1e9, link.cpu_s_per_call * 1e6,
                 cluster.colocated_cores);
  }
  std::fprintf(out,
               "  comm = max(worker link, shard links carrying %d/%d of the workers' bytes) for the "
               "push (up %.3f Gbit/s) and the pull (down %.3f Gbit/s), + %d round trips of %.3f ms.\n",
               workers, cluster.shards, link.up_bytes_per_s * gbit, link.down_bytes_per_s * gbit,
               kRoundTripsPerRound, link.rtt_s * 1e3);
  if (calibrated) {
    std::fprintf(out, "  steps to the target: from %s (%zu ok runs of %s, median over its links)%s.\n",
                 absl::GetFlag(FLAGS_calibration).c_str(), calibration.runs.size(), model.c_str(),
                 never > 0 ? absl::StrFormat("; %d option(s) never reached it there and rank last",
                                             never).c_str()
                           : "");
    if (left_out > 0) {
      std::fprintf(out, "  --measured_only: %d option(s) not in it were left out.\n", left_out);
    }
  } else {
    std::fprintf(out,
                 "  steps to the target: a GUESS, base %.0f steps (bsp/none) x factors from the "
                 "convergence rates of Tang et al.'s survey: %s %s (x%.2f), %s %s (x%.2f)%s.\n",
                 BaseSteps(model), pick.sync.c_str(), SyncRate(pick.sync).c_str(),
                 SyncFactor(pick.sync), pick.codec.c_str(), CodecRate(pick.codec).c_str(),
                 CodecFactor(pick.codec),
                 pick.pulls != "off" ? absl::StrFormat(", compressed pulls x%.2f",
                                                      kCompressedPullFactor).c_str()
                                    : "");
  }
  const double pick_cpu_s =
      std::max(pick.terms.compute_s + pick.terms.codec_s, pick.terms.cpu_bound_s);
  const char* dominant =
      pick.terms.comm_s > pick_cpu_s
          ? "communication"
          : (pick.terms.cpu_bound_s > pick.terms.compute_s + pick.terms.codec_s
                 ? "the shared cores' CPU work"
                 : (pick.terms.codec_s > pick.terms.compute_s ? "codec" : "compute"));
  if (pick.steps.source == StepsSource::kNeverReached) {
    std::fprintf(out, "  no option reached the target in the grid: the pick is the fastest step\n");
  }
  std::fprintf(out, "  pick: %s / %s / pulls %s: %.0f steps x %.3f ms = %.3f s (its step is mostly %s)\n",
               pick.sync.c_str(), pick.codec.c_str(), pick.pulls.c_str(), pick.steps.steps,
               pick.terms.step_s * 1e3, pick.time_to_target_s, dominant);
  if (options.size() > 1 && options[1].time_to_target_s > 0) {
    std::fprintf(out, "  runner-up: %s / %s / pulls %s at %.3f s (x%.2f)\n",
                 options[1].sync.c_str(), options[1].codec.c_str(), options[1].pulls.c_str(),
                 options[1].time_to_target_s,
                 options[1].time_to_target_s / std::max(pick.time_to_target_s, 1e-12));
  }
  for (const OptionResult& o : options) {
    if (o.sync == pick.sync && o.codec == "none" && o.pulls == "off" && &o != &pick &&
        o.time_to_target_s > 0) {
      std::fprintf(out, "  uncompressed %s: %.3f s (x%.2f of the pick)\n", o.sync.c_str(),
                   o.time_to_target_s, o.time_to_target_s / std::max(pick.time_to_target_s, 1e-12));
    }
  }
  // Per tensor, where the pick's codec matters: which tensors it
  // compresses and how much of the push each keeps.
  if (pick.codec != "none") {
    // The largest first; a big model's list is cut at 10.
    std::vector<TensorShape> by_size = tensors;
    std::stable_sort(by_size.begin(), by_size.end(),
                     [](const TensorShape& a, const TensorShape& b) {
                       return a.num_elements() > b.num_elements();
                     });
    const size_t shown = std::min<size_t>(by_size.size(), 10);
    std::vector<std::string> rows;
    for (size_t i = 0; i < shown; ++i) {
      const TensorShape& t = by_size[i];
      auto cost = MeasureCodec({t}, push_specs[pick.codec], "none", codec_options);
      if (!cost.ok()) continue;
      const double dense_bytes = 4.0 * static_cast<double>(t.num_elements());
      rows.push_back(absl::StrFormat("%s %.0f -> %.0f bytes%s", t.name, dense_bytes,
                                     cost->push_bytes,
                                     cost->push_bytes >= dense_bytes ? " (dense)" : ""));
    }
    if (shown < by_size.size()) rows.push_back(absl::StrCat(by_size.size() - shown, " smaller"));
    std::fprintf(out, "  per tensor, %s pushes: %s\n", pick.codec.c_str(),
                 absl::StrJoin(rows, "; ").c_str());
  }
  std::fprintf(out, "  scheduler: %s\n", scheduler.why.c_str());
  // The run to start: the sync mode is the shards' (harrier-server
  // --sync), the codecs and the scheduler the workers'; the training flags
  // are the grid's recipe for the codec, which its steps were measured
  // with (common/codec/survey_codecs.h).
  const SurveyCodec* recipe = FindSurveyCodec(pick.codec);  // --codecs were checked
  std::vector<std::string> server_args = *bench::SyncServerFlags(pick.sync);  // a cost model row
  server_args.insert(server_args.end(), recipe->server_flags.begin(), recipe->server_flags.end());
  std::vector<std::string> worker_args = {"--codec=" + push_specs[pick.codec],
                                          "--pull_codec=" + pick_pull_codec,
                                          "--techniques=" + scheduler.techniques};
  if (scheduler.fusion_bytes > 0) {
    worker_args.push_back(absl::StrCat("--fusion_bytes=", scheduler.fusion_bytes));
  }
  if (scheduler.partition_bytes > 0) {
    worker_args.push_back(absl::StrCat("--partition_bytes=", scheduler.partition_bytes));
  }
  worker_args.insert(worker_args.end(), recipe->worker_flags.begin(), recipe->worker_flags.end());
  std::fprintf(out,
               "\nrecommendation (every shard, then every worker; the training flags are the "
               "grid's for %s):\n  harrier-server %s\n  harrier-worker %s\n",
               pick.codec.c_str(), absl::StrJoin(server_args, " ").c_str(),
               absl::StrJoin(worker_args, " ").c_str());
  std::fflush(out);

  if (absl::GetFlag(FLAGS_json)) {
    Json json = {
        {"bench", "advise"},
        {"model", model},
        {"link_gbps_measured_up", JsonNumber(measured_link.up_bytes_per_s * gbit)},
        {"link_gbps_measured_down", JsonNumber(measured_link.down_bytes_per_s * gbit)},
        {"rtt_ms", JsonNumber(link.rtt_s * 1e3)},
        {"pick",
         {
             {"sync", pick.sync},
             {"codec", pick.codec},
             {"pulls", pick.pulls},
             {"pull_codec", pick_pull_codec},
             {"techniques", scheduler.techniques},
             {"predicted_time_to_target_s", JsonNumber(pick.time_to_target_s)},
             {"codec_spec", push_specs[pick.codec]},
             {"fusion_bytes", scheduler.fusion_bytes},
             {"partition_bytes", scheduler.partition_bytes},
         }},
    };
    Json& options_json = json["options"] = Json::array();
    for (const OptionResult& o : options) {
      const CodecCost& c = costs[o.codec + "/" + o.pulls];
      options_json.push_back({
          {"sync", o.sync},
          {"codec", o.codec},
          {"pulls", o.pulls},
          {"predicted_step_s", JsonNumber(o.terms.step_s)},
          {"predicted_steps", JsonNumber(o.steps.steps)},
          {"predicted_time_to_target_s", JsonNumber(o.time_to_target_s)},
          {"compute_s", JsonNumber(o.terms.compute_s)},
          {"codec_s", JsonNumber(o.terms.codec_s)},
          {"comm_s", JsonNumber(o.terms.comm_s)},
          {"cpu_bound_s", JsonNumber(o.terms.cpu_bound_s)},
          {"push_bytes", JsonNumber(c.push_bytes)},
          {"pull_bytes", JsonNumber(c.pull_bytes)},
          {"encode_push_ms", JsonNumber(c.encode_push_s * 1e3)},
          {"decode_push_ms", JsonNumber(c.decode_push_s * 1e3)},
          {"encode_pull_ms", JsonNumber(c.encode_pull_s * 1e3)},
          {"decode_pull_ms", JsonNumber(c.decode_pull_s * 1e3)},
          {"chunks", c.chunks},
          {"steps_source", SourceName(o.steps.source)},
      });
    }
    json["link_gbps_planned"] = JsonNumber(link.up_bytes_per_s * gbit);
    json["calibrated"] = calibrated;
    json["workers"] = workers;
    json["shards"] = cluster.shards;
    json["colocated_cores"] = cluster.colocated_cores;
    json["device"] = device;
    json["parameters"] = parameters;
    json["tensors"] = tensors.size();
    json["tensors_from_job"] = from_job;
    json["transport_cpu_ns_per_byte"] = JsonNumber(link.cpu_s_per_byte * 1e9);
    json["transport_cpu_us_per_call"] = JsonNumber(link.cpu_s_per_call * 1e6);
    json["compute_ms"] = JsonNumber(compute_s * 1e3);
    json["options_left_out"] = left_out;
    std::printf("%s\n", DumpJson(json).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace harrier::advise

int main(int argc, char** argv) {
  const std::vector<std::string> rest = harrier::ParseFlags(argc, argv, harrier::advise::kUsage);
  if (rest.size() > 1) {
    return harrier::advise::Fail(absl::StrCat("unexpected argument '", rest[1], "'"), 2);
  }
  return harrier::advise::Run();
}
