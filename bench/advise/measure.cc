#include "bench/advise/measure.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/codec/codec.h"
#include "common/codec/codec_backend.h"
#include "common/codec/host_codec_backend.h"
#include "common/cpu_time.h"
#include "common/grpc_limits.h"
#include "common/grpc_security.h"
#include "common/partitioner.h"
#include "common/payload_view.h"
#include "proto/harrier.grpc.pb.h"
#include "worker/workload/cnn.h"
#include "worker/workload/mlp.h"

namespace harrier::advise {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& shard,
                      absl::string_view method) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(shard, ": AdminService.", method, ": ", status.error_message()));
}

// An AdminService call's context: the options' deadline and job token.
void PrepareContext(const LinkOptions& options, grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  if (!options.token.empty()) {
    context->AddMetadata(std::string(kJobTokenMetadataKey), options.token);
  }
}

// One probe's wall time.
absl::StatusOr<double> Probe(proto::AdminService::Stub& stub, const LinkOptions& options,
                             const std::string& name, const std::string& payload,
                             uint64_t reply_bytes) {
  grpc::ClientContext context;
  PrepareContext(options, &context);
  proto::ProbeRequest request;
  request.set_payload(payload);
  request.set_reply_bytes(reply_bytes);
  proto::ProbeResponse response;
  const auto start = Clock::now();
  const grpc::Status status = stub.Probe(&context, request, &response);
  const double took = Seconds(Clock::now() - start);
  if (!status.ok()) return FromGrpc(status, name, "Probe");
  if (response.payload().size() != reply_bytes) {
    return absl::DataLossError(absl::StrCat(name, ": probe reply of ", response.payload().size(),
                                            " bytes, asked for ", reply_bytes));
  }
  return took;
}

}  // namespace

absl::StatusOr<std::vector<ShardLink>> MeasureLinks(const LinkOptions& options) {
  if (options.probe_bytes == 0 || options.probe_bytes > kMaxProbeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--probe_bytes must be in 1..", kMaxProbeBytes, " (64 MiB)"));
  }
  // Not MakeChannelArguments(): its 64 MiB limits would win over larger
  // ones set after them (the first setting of an argument counts), and a
  // probe at the bound needs the room of its envelope on top.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  args.SetInt("grpc.http2.bdp_probe", 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  const auto credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  const std::string large(options.probe_bytes, '\x5a');
  // The shard builds a reply of at most kMaxProbeReplyBytes: larger probes
  // measure the way down with replies of that size.
  const uint64_t reply_bytes = std::min<uint64_t>(options.probe_bytes, kMaxProbeReplyBytes);
  std::vector<ShardLink> links;
  for (size_t i = 0; i < options.servers.size(); ++i) {
    const std::string name = absl::StrCat("shard ", i, " (", options.servers[i], ")");
    auto channel = grpc::CreateCustomChannel(options.servers[i], credentials, args);
    auto stub = proto::AdminService::NewStub(channel);
    ShardLink link;
    link.address = options.servers[i];
    // The first call connects (TCP, HTTP/2, maybe TLS): not a sample.
    if (auto warm = Probe(*stub, options, name, "", 0); !warm.ok()) return warm.status();
    // CPU per call and per byte: medians of each probe's own CPU, so one
    // probe that met a page fault or a scheduler hiccup does not count.
    std::vector<double> rtts, call_cpu;
    for (int k = 0; k < std::max(1, options.small_probes); ++k) {
      const double cpu_before = ProcessCpuSeconds();
      auto took = Probe(*stub, options, name, "", 0);
      if (!took.ok()) return took.status();
      call_cpu.push_back(ProcessCpuSeconds() - cpu_before);
      rtts.push_back(*took);
    }
    link.cpu_s_per_call = Median(call_cpu);
    link.rtt_s = Median(rtts);
    std::vector<double> up, down, byte_cpu;
    const double bytes = static_cast<double>(options.probe_bytes);
    for (int k = 0; k < std::max(1, options.repeats); ++k) {
      double cpu_before = ProcessCpuSeconds();
      auto sent = Probe(*stub, options, name, large, 0);
      if (!sent.ok()) return sent.status();
      byte_cpu.push_back(std::max(0.0, ProcessCpuSeconds() - cpu_before - link.cpu_s_per_call) /
                         bytes);
      up.push_back(bytes / std::max(*sent - link.rtt_s, 1e-9));
      cpu_before = ProcessCpuSeconds();
      auto received = Probe(*stub, options, name, "", reply_bytes);
      if (!received.ok()) return received.status();
      const double down_bytes = static_cast<double>(reply_bytes);
      byte_cpu.push_back(std::max(0.0, ProcessCpuSeconds() - cpu_before - link.cpu_s_per_call) /
                         down_bytes);
      down.push_back(down_bytes / std::max(*received - link.rtt_s, 1e-9));
    }
    link.cpu_s_per_byte = Median(byte_cpu);
    link.up_bytes_per_s = Median(up);
    link.down_bytes_per_s = Median(down);
    links.push_back(link);
  }
  return links;
}

Link CombineLinks(const std::vector<ShardLink>& links) {
  Link link;
  for (size_t i = 0; i < links.size(); ++i) {
    if (i == 0 || links[i].up_bytes_per_s < link.up_bytes_per_s) {
      link.up_bytes_per_s = links[i].up_bytes_per_s;
    }
    if (i == 0 || links[i].down_bytes_per_s < link.down_bytes_per_s) {
      link.down_bytes_per_s = links[i].down_bytes_per_s;
    }
    link.rtt_s = std::max(link.rtt_s, links[i].rtt_s);
    link.cpu_s_per_byte = std::max(link.cpu_s_per_byte, links[i].cpu_s_per_byte);
    link.cpu_s_per_call = std::max(link.cpu_s_per_call, links[i].cpu_s_per_call);
  }
  return link;
}

absl::StatusOr<std::vector<TensorShape>> ReadJobTensors(const LinkOptions& options) {
  const auto credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  struct Seen {
    std::vector<uint64_t> shape;
    uint64_t elements = 0;
    std::string first_shard;
  };
  std::map<std::string, Seen> seen;
  std::vector<std::string> order;  // as shard 0 lists them, then the others'
  for (size_t i = 0; i < options.servers.size(); ++i) {
    const std::string name = absl::StrCat("shard ", i, " (", options.servers[i], ")");
    auto stub = proto::AdminService::NewStub(
        grpc::CreateChannel(options.servers[i], credentials));
    grpc::ClientContext context;
    PrepareContext(options, &context);
    proto::StatusRequest request;
    request.set_include_tensors(true);
    proto::StatusResponse response;
    const grpc::Status status = stub->GetStatus(&context, request, &response);
    if (!status.ok()) return FromGrpc(status, name, "GetStatus");
    for (const proto::TensorHeld& held : response.tensors()) {
      const std::vector<uint64_t> shape(held.shape().begin(), held.shape().end());
      auto [it, inserted] = seen.try_emplace(held.name());
      if (inserted) {
        it->second.shape = shape;
        it->second.first_shard = name;
        order.push_back(held.name());
      } else if (it->second.shape != shape) {
        return absl::DataLossError(absl::StrCat("tensor '", held.name(), "': ", name,
                                                " holds shape ", absl::StrJoin(shape, "x"), ", ",
                                                it->second.first_shard, " ",
                                                absl::StrJoin(it->second.shape, "x")));
      }
      it->second.elements += held.elements();
    }
  }
  if (order.empty()) {
    return absl::FailedPreconditionError(
        "the shards hold no tensor yet: start the job's workers first (each registers the "
        "model's tensors), or name the model (--model, --tensors)");
  }
  std::vector<TensorShape> tensors;
  for (const std::string& name : order) {
    const Seen& s = seen[name];
    TensorShape tensor{name, {}};
    uint64_t whole = 1;
    for (uint64_t d : s.shape) {
      tensor.shape.push_back(static_cast<int64_t>(d));
      whole *= d;
    }
    if (whole != s.elements) {
      return absl::DataLossError(absl::StrCat("tensor '", name, "': the shards hold ", s.elements,
                                              " elements of a ", absl::StrJoin(s.shape, "x"),
                                              " tensor (", whole,
                                              "): list every shard of the job in --servers"));
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

int64_t TensorShape::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<CodecCost> MeasureCodec(const std::vector<TensorShape>& tensors,
                                       const std::string& push_spec_text,
                                       const std::string& pull_spec_text,
                                       const CodecMeasureOptions& options) {
  auto push_spec = CodecSpec::Parse(push_spec_text);
  if (!push_spec.ok()) return push_spec.status();
  auto pull_spec = CodecSpec::Parse(pull_spec_text);
  if (!pull_spec.ok()) return pull_spec.status();
  const std::shared_ptr<CodecBackend> backend =
      options.backend != nullptr ? options.backend : NewHostCodecBackend();
  const std::shared_ptr<const Partitioner> partitioner =
      options.partitioner != nullptr
          ? options.partitioner
          : std::make_shared<const HashPartitioner>(std::max(1, options.shards));
  const size_t chunk_elements = std::max<size_t>(1, options.chunk_bytes / sizeof(float));

  // Timings per distinct (elements, push cols, pushed compressed): the
  // chunks of a large model repeat a few sizes, measured once each.
  struct Timing {
    double push_bytes, encode_push_s, decode_push_s;
    double pull_bytes, encode_pull_s, decode_pull_s;
  };
  std::map<std::tuple<size_t, uint64_t, bool>, Timing> measured;
  std::mt19937 random(12345);
  std::normal_distribution<float> normal(0.0f, 0.01f);

  // The worker's side (the push's encode, the pull's decode into its
  // mirror) runs on `backend`, in its memory, as the client runs it; the
  // shard's side (the push's decode, the pull's encode) on the host codecs,
  // as the shard runs them.
  const auto measure = [&](size_t n, bool compressed_push,
                           const CodecSpec& spec) -> absl::StatusOr<Timing> {
    Timing timing{};
    std::vector<float> gradient(n);
    for (float& g : gradient) g = normal(random);
    std::vector<float> out(n, 0.0f);
    const int repeats = std::max(1, options.repeats);
    // The gradient and the pull's output in the backend's memory.
    const float* worker_gradient = gradient.data();
    float* worker_out = out.data();
    std::unique_ptr<BackendBuffer> device_gradient, device_out;
    if (backend->memory() == MemoryKind::kDevice) {
      auto in = backend->NewBuffer(n);
      if (!in.ok()) return in.status();
      auto to = backend->NewBuffer(n);
      if (!to.ok()) return to.status();
      device_gradient = *std::move(in);
      device_out = *std::move(to);
      const PayloadView host(absl::string_view(reinterpret_cast<const char*>(gradient.data()),
                                               n * sizeof(float)));
      if (auto s = backend->CopyFromHost(host, device_gradient->data()); !s.ok()) return s;
      worker_gradient = device_gradient->data();
      worker_out = device_out->data();
    }
    if (compressed_push) {
      auto stream = backend->NewPushStream(spec, n);
      if (!stream.ok()) return stream.status();
      auto codec = CreateCodec(spec);
      if (!codec.ok()) return codec.status();
      std::string payload;
      double best_encode = 1e30, best_decode = 1e30;
      for (int r = 0; r < repeats; ++r) {
        CodecContext context{DeriveSeed("advise", 0, r, 0, 1)};
        auto start = Clock::now();
        if (auto s = (*stream)->Encode(worker_gradient, n, context, &payload); !s.ok()) return s;
        best_encode = std::min(best_encode, Seconds(Clock::now() - start));
        start = Clock::now();
        if (auto s = (*codec)->DecodeAdd(payload, 1.0f, absl::MakeSpan(out)); !s.ok()) return s;
        best_decode = std::min(best_decode, Seconds(Clock::now() - start));
      }
      timing.push_bytes = static_cast<double>(payload.size());
      timing.encode_push_s = best_encode;
      timing.decode_push_s = best_decode;
    } else {
      timing.push_bytes = static_cast<double>(n * sizeof(float));
    }
    if (pull_spec->id != CodecId::kNone && n * sizeof(float) >= options.compress_min_bytes) {
      // The shard encodes its pull view's change; the worker adds it to its
      // mirror (PullMirror::AddCompressed: mirror += D(payload), out = mirror).
      auto codec = CreateCodec(*pull_spec);
      if (!codec.ok()) return codec.status();
      auto mirror = backend->NewPullMirror(*pull_spec, n);
      if (!mirror.ok()) return mirror.status();
      const PayloadView dense(absl::string_view(reinterpret_cast<const char*>(out.data()),
                                                n * sizeof(float)));
      if (auto s = (*mirror)->SetDense(dense, worker_out); !s.ok()) return s;
      std::string payload;
      double best_encode = 1e30, best_decode = 1e30;
      for (int r = 0; r < repeats; ++r) {
        CodecContext context{DeriveSeed("advise-pull", 0, r, 0, 1)};
        auto start = Clock::now();
        if (auto s = (*codec)->Encode(gradient, context, &payload); !s.ok()) return s;
        best_encode = std::min(best_encode, Seconds(Clock::now() - start));
        start = Clock::now();
        if (auto s = (*mirror)->AddCompressed(payload, worker_out); !s.ok()) return s;
        best_decode = std::min(best_decode, Seconds(Clock::now() - start));
      }
      timing.pull_bytes = static_cast<double>(payload.size());
      timing.encode_pull_s = best_encode;
      timing.decode_pull_s = best_decode;
    } else {
      timing.pull_bytes = static_cast<double>(n * sizeof(float));
    }
    return timing;
  };

  CodecCost cost;
  for (const TensorShape& tensor : tensors) {
    const size_t elements = static_cast<size_t>(tensor.num_elements());
    for (const ChunkSpan& span :
         SplitIntoChunks(tensor.name, elements, chunk_elements, *partitioner)) {
      const size_t n = span.num_elements;
      // As ChunkCodec: small chunks and codec none travel dense; PowerSGD
      // factors the layer's matrix, a 1-D tensor travels dense, a chunk that
      // cuts a row takes the codec's uncompressed form.
      bool compressed = push_spec->id != CodecId::kNone &&
                        n * sizeof(float) >= options.compress_min_bytes;
      CodecSpec spec = *push_spec;
      if (compressed && spec.id == CodecId::kPowerSgd && spec.cols == 0) {
        if (tensor.shape.size() <= 1) {
          compressed = false;
        } else {
          uint64_t row = 1;
          for (size_t i = 1; i < tensor.shape.size(); ++i) row *= tensor.shape[i];
          spec.cols = (row > 0 && span.offset % row == 0 && n % row == 0) ? row : n + 1;
        }
      }
      const auto key = std::make_tuple(n, compressed ? spec.cols : 0, compressed);
      auto found = measured.find(key);
      if (found == measured.end()) {
        auto timing = measure(n, compressed, spec);
        if (!timing.ok()) {
          return absl::Status(timing.status().code(),
                              absl::StrCat("codec '", push_spec_text, "' (pull '", pull_spec_text,
                                           "') on ", tensor.name, ": ",
                                           timing.status().message()));
        }
        found = measured.emplace(key, *timing).first;
      }
      const Timing& t = found->second;
      cost.push_bytes += t.push_bytes;
      cost.encode_push_s += t.encode_push_s;
      cost.decode_push_s += t.decode_push_s;
      cost.pull_bytes += t.pull_bytes;
      cost.encode_pull_s += t.encode_pull_s;
      cost.decode_pull_s += t.decode_pull_s;
      cost.chunks += 1;
    }
  }
  return cost;
}

absl::StatusOr<double> MeasureModelStepSeconds(workload::Model& model, int batch_size,
                                               int steps) {
  if (batch_size < 1) return absl::InvalidArgumentError("--batch_size must be at least 1");
  if (steps < 1) return absl::InvalidArgumentError("at least one timed step");
  openblas_set_num_threads(1);  // harrier-worker's --blas_threads default
  std::mt19937 random(7);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(static_cast<size_t>(batch_size) * model.input_size());
  for (float& p : images) p = pixel(random);
  std::vector<uint8_t> labels(batch_size);
  for (int i = 0; i < batch_size; ++i) labels[i] = static_cast<uint8_t>(i % model.num_classes());
  workload::Gradients grads;
  std::vector<double> times;
  for (int k = 0; k < steps + 3; ++k) {
    const auto start = Clock::now();
    auto loss = model.ComputeGradients(images.data(), labels.data(), batch_size, &grads);
    if (!loss.ok()) return loss.status();
    // An SGD step too: the worker's local step under local SGD, and about
    // the optimizer's share the trainer also pays.
    if (auto s = model.SgdStep(grads, 0.0f); !s.ok()) return s;
    if (k >= 3) times.push_back(Seconds(Clock::now() - start));  // 3 warm-up steps
  }
  return Median(times);
}

absl::StatusOr<double> MeasureMlpStepSeconds(int batch_size) {
  auto mlp = workload::Mlp::Create(workload::MlpOptions{});
  if (!mlp.ok()) return mlp.status();
  return MeasureModelStepSeconds(*mlp, batch_size, 20);
}

absl::StatusOr<double> MeasureCnnStepSeconds(int batch_size) {
  auto cnn = workload::Cnn::Create(workload::CnnOptions{});
  if (!cnn.ok()) return cnn.status();
  return MeasureModelStepSeconds(*cnn, batch_size, 10);
}

}  // namespace harrier::advise
