// harrier-attack-bench: the shard's memory under every attack at once.
//
// One harrier-server with low budgets serves a 2-worker job: rank 0 is a
// harrier::Client that pushes and pulls a 4 MiB tensor in a loop (push,
// clock, pull), rank 1 a raw-stub partner that pushes each round, so the
// rounds complete under BSP. The loop runs --seconds alone (the baseline),
// then --seconds again while, from other connections, every attack on the
// shard's memory runs at once:
//   push_streams     push streams of 15 MiB messages that never half-close
//   unary_no_token   raw HTTP/2 unary calls without the job token, each
//                    announcing a 60 MiB body (on a shard without a token:
//                    bodies gRPC takes in, bounded by --grpc_memory_bytes)
//   probes_unread    Probe{reply_bytes = 8 MiB} from connections that read
//                    nothing, and typed probes beside them
//   parked_pulls     rank 1's pulls of 256 chunks of its own tensor "held"
//                    for a clock far ahead (BSP parks them)
//   oversized        names, shapes, codec specs, barrier and worker names
//                    over common/request_limits.h
//   many_chunks      pulls of the 256 chunks of "held", read whole, of 257,
//                    and of 256 that name one chunk twice
// The attacks run in a child process of their own (this binary with
// --attack_shard), pinned to CPUs apart from the shard's and the worker's,
// as attackers on other hosts would be: what the worker loses is what the
// shard spends on the attacks, not what the attacking clients spend
// building and reading their traffic. With one CPU nothing is pinned
// ("cpus" in the JSON says which were used).
// The shard's VmRSS is sampled throughout. One JSON line: the resident set
// idle, unattacked (the baseline) and attacked (the peak), the sum of the
// budgets, the allowance for everything else, the steps per second of both
// phases and, per attack, its calls counted by status code. "verdict" is
// "pass" when rss_peak <= rss_baseline + budget_sum + constant and the
// attacked steps per second are at least half the unattacked ones.
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/flags.h"
#include "common/crc32c.h"
#include "common/grpc_limits.h"
#include "common/json.h"
#include "common/request_limits.h"
#include "proto/harrier.grpc.pb.h"
#include "testing/raw_http2.h"
#include "testing/server_process.h"
#include "testing/sessions.h"
#include "worker/client.h"

ABSL_FLAG(int, seconds, 15, "Seconds of each phase: the worker alone, then under attack.");
ABSL_FLAG(std::string, sync, "bsp", "The shard's --sync (bsp parks pulls; asp does not).");
ABSL_FLAG(bool, job_token, true,
          "Start the shard with a job token (--auth_token_file); the worker and the insiders' "
          "attacks hold it, the unary_no_token attack does not.");
ABSL_FLAG(int64_t, max_buffered_bytes, int64_t{128} << 20, "The shard's --max_buffered_bytes.");
ABSL_FLAG(int64_t, max_connection_bytes, int64_t{64} << 20, "The shard's --max_connection_bytes.");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{64} << 20, "The shard's --max_request_bytes.");
ABSL_FLAG(int64_t, max_parked_pull_bytes, int64_t{16} << 20,
          "The shard's --max_parked_pull_bytes.");
ABSL_FLAG(int64_t, max_probe_bytes_in_flight, int64_t{32} << 20,
          "The shard's --max_probe_bytes_in_flight.");
ABSL_FLAG(int64_t, grpc_memory_bytes, int64_t{256} << 20, "The shard's --grpc_memory_bytes.");
ABSL_FLAG(std::string, attacks, "all",
          "The attacks to run at once, comma-separated: push_streams, unary_no_token, probes, "
          "parked_pulls, oversized, many_chunks; \"all\" for every one.");
ABSL_FLAG(int, attack_every_ms, 1000,
          "Each attack starts a round (a batch of streams, of calls, of strings) at most this "
          "often: a round holds what it makes the shard hold until the shard refuses or its "
          "deadline ends it. 0: the next round at once, a flood of the shard's CPU and "
          "bandwidth beside the memory.");
ABSL_FLAG(bool, pin_cpus, true,
          "Run the attacks on CPUs of their own, apart from the shard and the worker (the "
          "upper half of the CPUs this process may use; nothing is pinned with one CPU).");
// The attacking child's flags (the bench sets them; not for a user).
ABSL_FLAG(std::string, attack_shard, "", "Internal: run only the attacks against this shard.");
ABSL_FLAG(std::string, attack_token, "", "Internal: the job token the insiders' attacks hold.");
ABSL_FLAG(std::string, attack_session, "",
          "Internal: rank 1's session (a serialised proto::Session, base64).");
ABSL_FLAG(std::string, attack_cpus, "", "Internal: the CPUs the attacks run on (comma-separated).");
ABSL_FLAG(int, constant_mb, 256,
          "The allowance beyond the budgets, in MiB: what no budget names (gRPC's threads and "
          "per-connection state, replies being written, allocator slack) on top of the "
          "unattacked resident set.");

namespace harrier::bench {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr char kToken[] = "attack-bench-token";
constexpr char kTokenKey[] = "harrier-job-token";  // kJobTokenMetadataKey
constexpr uint64_t kElements = uint64_t{1} << 20;  // "w": 4 MiB, one chunk

constexpr const char* kUsage =
    "usage: harrier-attack-bench [flags]\n"
    "  One shard with low budgets, a worker pushing and pulling a 4 MiB tensor alone and then\n"
    "  while every attack on the shard's memory runs at once; prints one JSON line (RSS,\n"
    "  budgets, steps/s, refusals per attack, verdict). About 2 x --seconds + 10 s.\n"
    "  --seconds=15 --sync=bsp|asp --job_token=true --constant_mb=256 --attacks=all\n"
    "  --attack_every_ms=1000 (0: every attack as fast as the shard answers)\n"
    "  --pin_cpus=true (the attacks on CPUs apart from the shard's and the worker's)\n"
    "  --max_buffered_bytes --max_connection_bytes --max_request_bytes\n"
    "  --max_parked_pull_bytes --max_probe_bytes_in_flight --grpc_memory_bytes\n";

// Calls counted by status code name, per attack.
class Tally {
 public:
  void Count(const std::string& attack, const std::string& outcome) {
    absl::MutexLock lock(&mutex_);
    ++counts_[attack][outcome];
  }
  void Count(const std::string& attack, const grpc::Status& status) {
    Count(attack, CodeName(status.error_code()));
  }
  Json ToJson() {
    absl::MutexLock lock(&mutex_);
    Json json = Json::object();
    for (const auto& [attack, outcomes] : counts_) {
      for (const auto& [outcome, count] : outcomes) json[attack][outcome] = count;
    }
    return json;
  }
  static std::string CodeName(grpc::StatusCode code) {
    switch (code) {
      case grpc::StatusCode::OK:
        return "OK";
      case grpc::StatusCode::CANCELLED:
        return "CANCELLED";
      case grpc::StatusCode::INVALID_ARGUMENT:
        return "INVALID_ARGUMENT";
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return "DEADLINE_EXCEEDED";
      case grpc::StatusCode::NOT_FOUND:
        return "NOT_FOUND";
      case grpc::StatusCode::PERMISSION_DENIED:
        return "PERMISSION_DENIED";
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        return "RESOURCE_EXHAUSTED";
      case grpc::StatusCode::FAILED_PRECONDITION:
        return "FAILED_PRECONDITION";
      case grpc::StatusCode::ABORTED:
        return "ABORTED";
      case grpc::StatusCode::OUT_OF_RANGE:
        return "OUT_OF_RANGE";
      case grpc::StatusCode::UNAVAILABLE:
        return "UNAVAILABLE";
      case grpc::StatusCode::UNAUTHENTICATED:
        return "UNAUTHENTICATED";
      default:
        return absl::StrCat("CODE_", static_cast<int>(code));
    }
  }

 private:
  absl::Mutex mutex_;
  std::map<std::string, std::map<std::string, int64_t>> counts_ ABSL_GUARDED_BY(mutex_);
};

// The shard's VmRSS, sampled every 20 ms; the peak since the last Reset.
class RssSampler {
 public:
  explicit RssSampler(int pid) : pid_(pid), thread_([this] { Loop(); }) {}
  ~RssSampler() {
    stop_ = true;
    thread_.join();
  }
  int64_t ResetPeak() {
    absl::MutexLock lock(&mutex_);
    const int64_t peak = peak_;
    peak_ = 0;
    return peak;
  }
  int64_t Now() const { return testing::ResidentBytes(pid_); }

 private:
  void Loop() {
    while (!stop_) {
      const int64_t bytes = testing::ResidentBytes(pid_);
      {
        absl::MutexLock lock(&mutex_);
        peak_ = std::max(peak_, bytes);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const int pid_;
  std::atomic<bool> stop_{false};
  absl::Mutex mutex_;
  int64_t peak_ ABSL_GUARDED_BY(mutex_) = 0;
  std::thread thread_;
};

struct Shard {
  std::string address;
  int port = 0;
  std::string token;  // "" on a shard without one
};

// An attack's rounds until `end`: each starts at least --attack_every_ms
// after the one before (0: at once, as fast as the shard answers). The
// first round always runs, so every attack is tallied even when building
// its hostile messages took the whole phase (a short --seconds on loaded
// cores).
class AttackRounds {
 public:
  explicit AttackRounds(absl::Time end)
      : end_(end), every_(absl::Milliseconds(absl::GetFlag(FLAGS_attack_every_ms))) {}
  // Waits for the next round's start; false once `end` has come (never for
  // the first round).
  bool Next() {
    const bool first = !started_;
    if (started_) absl::SleepFor(std::min(end_, last_ + every_) - absl::Now());
    started_ = true;
    last_ = absl::Now();
    first_ = first;
    return first || last_ < end_;
  }
  // When this round's work must stop: the phase's end, but the first round
  // gets at least `least` (on loaded cores a short phase may be over before
  // the first round has opened anything).
  absl::Time RoundEnd(absl::Duration least) const {
    return first_ ? std::max(end_, last_ + least) : end_;
  }

 private:
  const absl::Time end_;
  const absl::Duration every_;
  absl::Time last_;
  bool started_ = false;
  bool first_ = false;
};

// A channel of its own (gRPC shares connections between channels with the
// same arguments): `connection` tells them apart.
std::shared_ptr<grpc::Channel> OwnChannel(const Shard& shard, int connection) {
  grpc::ChannelArguments args = MakeChannelArguments();
  args.SetInt("harrier.attack_bench.connection", connection);
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes + kProbeEnvelopeBytes);
  return grpc::CreateCustomChannel(shard.address, grpc::InsecureChannelCredentials(), args);
}

void Prepare(grpc::ClientContext* context, const Shard& shard, absl::Time deadline) {
  context->set_deadline(absl::ToChronoTime(deadline));
  if (!shard.token.empty()) context->AddMetadata(kTokenKey, shard.token);
}

proto::TensorChunk ChunkOf(testing::Sessions& sessions, int64_t clock, float value) {
  std::vector<float> gradient(kElements, value);
  proto::TensorChunk chunk;
  chunk.set_rank(1);
  sessions.Attach(&chunk);
  chunk.set_key("w");
  chunk.set_chunk(0);
  chunk.set_clock(clock);
  chunk.set_num_elements(kElements);
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(reinterpret_cast<const char*>(gradient.data()),
                                  kElements * sizeof(float));
  chunk.set_checksum(Crc32c(chunk.payload().data(), chunk.payload().size()));
  return chunk;
}

// The attacker's own tensor: kHeldChunks chunks of kHeldChunkElements
// (4 MiB in all), so that its pulls may name as many distinct chunks as a
// call carries (a pull naming one chunk twice is refused).
constexpr char kHeld[] = "held";
constexpr uint32_t kHeldChunks = 256;
constexpr uint64_t kHeldChunkElements = 4096;

// Rank 1's pull at `clock` of chunk 0 of "w" (chunks = 1), or of the first
// `chunks` chunks of "held" (chunk indices past kHeldChunks name none).
proto::PullRequest PullOf(testing::Sessions& sessions, int64_t clock, size_t chunks) {
  proto::PullRequest request;
  request.set_rank(1);
  sessions.Attach(&request);
  request.set_clock(clock);
  for (size_t i = 0; i < chunks; ++i) {
    proto::ChunkRef* ref = request.add_chunks();
    ref->set_key(chunks == 1 ? "w" : kHeld);
    ref->set_chunk(static_cast<uint32_t>(i));
    ref->set_num_elements(chunks == 1 ? kElements : kHeldChunkElements);
  }
  return request;
}

// Rank 1 creates "held" (every chunk, zeros).
absl::Status InitHeld(const Shard& shard, testing::Sessions& sessions) {
  auto stub = proto::ParameterService::NewStub(OwnChannel(shard, 5));
  for (uint32_t chunk = 0; chunk < kHeldChunks; ++chunk) {
    proto::InitRequest request;
    request.set_rank(1);
    sessions.Attach(&request);
    request.set_key(kHeld);
    request.set_chunk(chunk);
    request.add_shape(kHeldChunks * kHeldChunkElements);
    request.set_num_elements(kHeldChunkElements);
    request.set_dtype(proto::DTYPE_FLOAT32);
    request.mutable_initial_values()->assign(kHeldChunkElements * sizeof(float), '\0');
    request.set_checksum(Crc32c(request.initial_values().data(), request.initial_values().size()));
    grpc::ClientContext context;
    Prepare(&context, shard, absl::Now() + absl::Seconds(10));
    proto::InitResponse response;
    if (grpc::Status status = stub->Init(&context, request, &response); !status.ok()) {
      return absl::Status(
          static_cast<absl::StatusCode>(status.error_code()),
          absl::StrCat("Init of '", kHeld, "' chunk ", chunk, ": ", status.error_message()));
    }
  }
  return absl::OkStatus();
}

// A pull's status; its reply chunks are read whole.
grpc::Status RunPull(proto::ParameterService::Stub& stub, const Shard& shard,
                     const proto::PullRequest& request, absl::Time deadline) {
  grpc::ClientContext context;
  Prepare(&context, shard, deadline);
  auto reader = stub.Pull(&context, request);
  proto::TensorChunk reply;
  while (reader->Read(&reply)) {
  }
  return reader->Finish();
}

// Rank 1 of the job, well behaved: pushes clock c, then pulls clock c + 1
// (which waits for rank 0's push under BSP; a pull that timed out is sent
// again).
void RunPartner(const Shard& shard, testing::Sessions& sessions, const std::atomic<bool>& stop,
                std::atomic<int64_t>& failures) {
  auto stub = proto::ParameterService::NewStub(OwnChannel(shard, 1));
  for (int64_t clock = 0; !stop; ++clock) {
    const proto::TensorChunk chunk = ChunkOf(sessions, clock, 0.001f);
    for (bool pushed = false; !pushed && !stop;) {
      grpc::ClientContext context;
      Prepare(&context, shard, absl::Now() + absl::Seconds(10));
      proto::PushResponse response;
      auto writer = stub->Push(&context, &response);
      writer->Write(chunk);
      writer->WritesDone();
      pushed = writer->Finish().ok();
      if (!pushed) {
        ++failures;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    for (bool pulled = false; !pulled && !stop;) {
      pulled = RunPull(*stub, shard, PullOf(sessions, clock + 1, 1), absl::Now() + absl::Seconds(2))
                   .ok();
      if (!pulled) {
        ++failures;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
}

// Push streams of 15 MiB messages, never half-closed: each stream holds what
// it sent until its deadline, 3 s; then another.
void AttackPushStreams(const Shard& shard, int connection, absl::Time end, Tally& tally) {
  auto stub = proto::ParameterService::NewStub(OwnChannel(shard, connection));
  proto::TensorChunk chunk;
  chunk.set_key("held");
  chunk.set_num_elements(static_cast<uint64_t>(15 * kMiB / 4));
  chunk.set_dtype(proto::DTYPE_FLOAT32);
  chunk.mutable_payload()->assign(static_cast<size_t>(15 * kMiB), '\x01');
  for (AttackRounds rounds(end); rounds.Next();) {
    grpc::ClientContext context;
    // Not cut at `end`: the shard's refusal, not the phase's end, must
    // close the stream (3 s is far above the time to fill the budget).
    Prepare(&context, shard, absl::Now() + absl::Seconds(3));
    proto::PushResponse response;
    auto writer = stub->Push(&context, &response);
    for (int i = 0; i < 8 && writer->Write(chunk); ++i) {
    }
    tally.Count("push_streams", writer->Finish());
  }
}

// Raw HTTP/2 unary calls without the token, six per connection, each
// announcing a 60 MiB message and sending all of it but the last byte (as
// the windows allow). Counts streams the shard ended (refused at their
// headers, or cancelled by gRPC's quota) and those still open after 2 s.
void AttackUnaryWithoutToken(const Shard& shard, absl::Time end, Tally& tally) {
  const uint32_t message = static_cast<uint32_t>(60 * kMiB);
  const std::string body =
      testing::RawHttp2Connection::MessagePrefix(message) + std::string(message - 1, '\x07');
  for (AttackRounds rounds(end); rounds.Next();) {
    auto connection = testing::RawHttp2Connection::Connect(shard.port, absl::Seconds(5));
    if (connection == nullptr) {
      tally.Count("unary_no_token", "connect_failed");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    const absl::Time round_end = rounds.RoundEnd(absl::Seconds(3));
    std::vector<uint32_t> streams;
    for (uint32_t id = 1; id <= 11 && absl::Now() < round_end; id += 2) {
      if (!connection->OpenStream(id, "/harrier.proto.ParameterService/Init", {})) break;
      connection->SendData(id, body, /*end_stream=*/false,
                           std::min(round_end, absl::Now() + absl::Seconds(1)));
      streams.push_back(id);
    }
    for (uint32_t id : streams) {
      tally.Count("unary_no_token", connection->WaitEnded(id, absl::Now() + absl::Seconds(2))
                                        ? "ended_by_shard"
                                        : "still_open");
    }
  }
}

proto::ProbeRequest ProbeFor(uint64_t reply_bytes) {
  proto::ProbeRequest request;
  request.set_reply_bytes(reply_bytes);
  return request;
}

// 16 connections that each ask for the largest probe reply and read none of
// it, held to the end; beside them typed probes of 1 MiB, counted.
void AttackProbes(const Shard& shard, absl::Time end, Tally& tally) {
  std::string request;
  ProbeFor(kMaxProbeReplyBytes).SerializeToString(&request);
  const std::string message =
      testing::RawHttp2Connection::MessagePrefix(static_cast<uint32_t>(request.size())) + request;
  std::vector<std::pair<std::string, std::string>> metadata;
  if (!shard.token.empty()) metadata.emplace_back(kTokenKey, shard.token);
  std::vector<std::unique_ptr<testing::RawHttp2Connection>> readers_of_nothing;
  for (int i = 0; i < 16 && absl::Now() < end; ++i) {
    auto connection = testing::RawHttp2Connection::Connect(shard.port, absl::Seconds(5));
    if (connection == nullptr ||
        !connection->OpenStream(1, "/harrier.proto.AdminService/Probe", metadata)) {
      tally.Count("probes_unread", "connect_failed");
      continue;
    }
    connection->SendData(1, message, /*end_stream=*/true, absl::Now() + absl::Seconds(5));
    tally.Count("probes_unread", "unread_8MiB_reply");
    readers_of_nothing.push_back(std::move(connection));
  }
  auto stub = proto::AdminService::NewStub(OwnChannel(shard, 2));
  while (absl::Now() < end) {
    grpc::ClientContext context;
    Prepare(&context, shard, absl::Now() + absl::Seconds(5));
    proto::ProbeResponse response;
    tally.Count("probes_typed", stub->Probe(&context, ProbeFor(kMiB), &response));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Rank 1's pulls for a clock far ahead, the 256 chunks of "held" each with a
// 256-byte codec spec (70 KiB a request), 400 at a time on one connection: parked
// under BSP until their deadline (3 s), or refused once
// --max_parked_pull_bytes is full.
void AttackParkedPulls(const Shard& shard, testing::Sessions& sessions, int connection,
                       absl::Time end, Tally& tally) {
  auto stub = proto::ParameterService::NewStub(OwnChannel(shard, connection));
  proto::PullRequest request = PullOf(sessions, int64_t{1} << 40, kMaxChunksPerCall);
  std::string spec = "topk:ratio=0.01";
  spec.resize(kMaxCodecSpecBytes, '0');
  for (proto::ChunkRef& ref : *request.mutable_chunks()) ref.set_codec_params(spec);
  constexpr int kAtOnce = 400;
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncReader<proto::TensorChunk>> reader;
    grpc::Status status;
  };
  for (AttackRounds rounds(end); rounds.Next();) {
    grpc::CompletionQueue queue;
    std::vector<std::unique_ptr<Call>> calls;
    for (int i = 0; i < kAtOnce; ++i) {
      auto call = std::make_unique<Call>();
      Prepare(&call->context, shard, std::min(end, absl::Now() + absl::Seconds(3)));
      call->reader = stub->PrepareAsyncPull(&call->context, request, &queue);
      call->reader->StartCall(reinterpret_cast<void*>(uintptr_t{2} * i));
      call->reader->Finish(&call->status, reinterpret_cast<void*>(uintptr_t{2} * i + 1));
      calls.push_back(std::move(call));
    }
    int finished = 0;
    void* tag = nullptr;
    bool ok = false;
    while (finished < kAtOnce && queue.Next(&tag, &ok)) {
      const uintptr_t value = reinterpret_cast<uintptr_t>(tag);
      if (value % 2 == 1) {
        tally.Count("parked_pulls", calls[value / 2]->status);
        ++finished;
      }
    }
    queue.Shutdown();
    while (queue.Next(&tag, &ok)) {
    }
  }
}

// Strings and lists over their limits, 16 MiB each, in turn (the requests
// are built once: the bench's own CPU is not the attack).
void AttackOversized(const Shard& shard, testing::Sessions& sessions, absl::Time end,
                     Tally& tally) {
  auto channel = OwnChannel(shard, 3);
  auto parameters = proto::ParameterService::NewStub(channel);
  auto control = proto::ControlService::NewStub(channel);
  const std::string hostile(16 * kMiB, 'k');
  proto::InitRequest long_name;
  long_name.set_rank(1);
  sessions.Attach(&long_name);
  long_name.set_key(hostile);
  long_name.add_shape(4);
  long_name.set_num_elements(4);
  long_name.set_dtype(proto::DTYPE_FLOAT32);
  long_name.mutable_initial_values()->assign(16, '\0');
  proto::InitRequest wide_shape = long_name;
  wide_shape.set_key("wide");
  wide_shape.clear_shape();
  for (int i = 0; i < (4 << 20); ++i) wide_shape.add_shape(1);
  wide_shape.set_num_elements(1);
  wide_shape.mutable_initial_values()->assign(4, '\0');
  proto::PullRequest long_spec = PullOf(sessions, 0, 1);
  long_spec.mutable_chunks(0)->set_codec_params(hostile);
  proto::BarrierRequest long_barrier;
  long_barrier.set_rank(1);
  sessions.Attach(&long_barrier);
  long_barrier.set_name(hostile);
  proto::RegisterRequest long_worker;
  long_worker.set_job(sessions.job());
  long_worker.set_requested_rank(-1);
  long_worker.set_worker_name(hostile);
  auto deadline = [] { return absl::Now() + absl::Seconds(10); };
  for (AttackRounds rounds(end); rounds.Next();) {
    for (const proto::InitRequest* request : {&long_name, &wide_shape}) {
      grpc::ClientContext context;
      Prepare(&context, shard, deadline());
      proto::InitResponse response;
      tally.Count(request == &long_name ? "oversized_tensor_name" : "oversized_shape",
                  parameters->Init(&context, *request, &response));
    }
    tally.Count("oversized_codec_spec", RunPull(*parameters, shard, long_spec, deadline()));
    {
      grpc::ClientContext context;
      Prepare(&context, shard, deadline());
      proto::BarrierResponse response;
      tally.Count("oversized_barrier_name", control->Barrier(&context, long_barrier, &response));
    }
    {
      grpc::ClientContext context;
      Prepare(&context, shard, deadline());
      proto::RegisterResponse response;
      tally.Count("oversized_worker_name", control->Register(&context, long_worker, &response));
    }
  }
}

// Pulls at clock 0 (never waited for) of the 256 chunks of "held", read
// whole; of 257 chunks (over the per-call limit); and of 256 chunks that
// name chunk 0 twice (one chunk named 256 times was 1 GiB of replies, or 256
// encodings of one chunk, for a 70 KiB request).
void AttackManyChunks(const Shard& shard, testing::Sessions& sessions, absl::Time end,
                      Tally& tally) {
  auto stub = proto::ParameterService::NewStub(OwnChannel(shard, 4));
  const proto::PullRequest most = PullOf(sessions, 0, kMaxChunksPerCall);
  const proto::PullRequest over = PullOf(sessions, 0, kMaxChunksPerCall + 1);
  proto::PullRequest twice = most;
  twice.mutable_chunks(kMaxChunksPerCall - 1)->set_chunk(0);
  for (AttackRounds rounds(end); rounds.Next();) {
    tally.Count("many_chunks_256", RunPull(*stub, shard, most, absl::Now() + absl::Seconds(20)));
    tally.Count("many_chunks_257", RunPull(*stub, shard, over, absl::Now() + absl::Seconds(20)));
    tally.Count("many_chunks_named_twice",
                RunPull(*stub, shard, twice, absl::Now() + absl::Seconds(20)));
  }
}

// Every chosen attack at once until `end`, each on threads of its own.
void RunAttacks(const Shard& shard, testing::Sessions& sessions, absl::Time end, Tally& tally) {
  const std::string attacks = absl::GetFlag(FLAGS_attacks);
  const std::vector<std::string> chosen = absl::StrSplit(attacks, ',');
  auto on = [&](const std::string& name) {
    return attacks == "all" || std::find(chosen.begin(), chosen.end(), name) != chosen.end();
  };
  std::vector<std::thread> attackers;
  for (int connection : {10, 11}) {
    if (!on("push_streams")) break;
    attackers.emplace_back([&, connection] { AttackPushStreams(shard, connection, end, tally); });
  }
  if (on("unary_no_token")) {
    attackers.emplace_back([&] { AttackUnaryWithoutToken(shard, end, tally); });
  }
  if (on("probes")) attackers.emplace_back([&] { AttackProbes(shard, end, tally); });
  for (int connection : {20, 21}) {
    if (!on("parked_pulls")) break;
    attackers.emplace_back(
        [&, connection] { AttackParkedPulls(shard, sessions, connection, end, tally); });
  }
  if (on("oversized")) {
    attackers.emplace_back([&] { AttackOversized(shard, sessions, end, tally); });
  }
  if (on("many_chunks")) {
    attackers.emplace_back([&] { AttackManyChunks(shard, sessions, end, tally); });
  }
  for (std::thread& attacker : attackers) attacker.join();
}

// The CPUs this process may run on.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Pins the calling thread, and every thread and process it starts from now
// on, to `cpus`.
bool PinTo(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

// The child: the attacks alone against --attack_shard for --seconds; one
// JSON line of refusals on stdout.
int RunAttackerProcess() {
  std::vector<int> cpus;
  for (absl::string_view cpu :
       absl::StrSplit(absl::GetFlag(FLAGS_attack_cpus), ',', absl::SkipEmpty())) {
    int value = 0;
    if (absl::SimpleAtoi(cpu, &value)) cpus.push_back(value);
  }
  if (!cpus.empty() && !PinTo(cpus)) {
    std::fprintf(stderr, "harrier-attack-bench: cannot pin the attacks to CPUs %s\n",
                 absl::GetFlag(FLAGS_attack_cpus).c_str());
  }
  Shard shard;
  shard.address = absl::GetFlag(FLAGS_attack_shard);
  const size_t colon = shard.address.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(shard.address).substr(colon + 1), &shard.port)) {
    std::fprintf(stderr, "harrier-attack-bench: --attack_shard=%s is not host:port\n",
                 shard.address.c_str());
    return 2;
  }
  shard.token = absl::GetFlag(FLAGS_attack_token);
  std::string bytes;
  proto::Session session;
  if (!absl::Base64Unescape(absl::GetFlag(FLAGS_attack_session), &bytes) ||
      !session.ParseFromString(bytes)) {
    std::fprintf(stderr, "harrier-attack-bench: --attack_session is not a session\n");
    return 2;
  }
  testing::Sessions sessions(OwnChannel(shard, 0), "harrier", shard.token);
  sessions.Adopt(1, session);
  if (absl::Status held = InitHeld(shard, sessions); !held.ok()) {
    std::fprintf(stderr, "harrier-attack-bench: %s\n", held.ToString().c_str());
    return 1;
  }
  Tally tally;
  RunAttacks(shard, sessions, absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds)), tally);
  std::printf("%s\n", DumpJson(tally.ToJson()).c_str());
  return 0;
}

// The last line of `path` that parses as a JSON object (the child's tally).
Json LastJsonLine(const std::string& path) {
  std::ifstream file(path);
  Json found = Json::object();
  for (std::string line; std::getline(file, line);) {
    if (line.empty() || line[0] != '{') continue;
    Json parsed = ParseJson(line);
    if (!parsed.is_discarded()) found = std::move(parsed);
  }
  return found;
}

struct Phase {
  int64_t steps = 0;
  int64_t failed_calls = 0;
  double seconds = 0;
  bool stalled = false;  // a call still failed 30 s after the phase's end
};

// Rank 0's loop for `seconds`: push, clock, pull; a refused call is retried
// until 30 s past the phase's end (then the phase ends as stalled).
Phase RunWorker(Client& client, int seconds) {
  Phase phase;
  std::vector<float> gradient(kElements, 0.001f);
  std::vector<float> values(kElements);
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  const absl::Time give_up = end + absl::Seconds(30);
  auto retried = [&](auto call) {
    while (!call().ok()) {
      ++phase.failed_calls;
      if (absl::Now() > give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  };
  while (absl::Now() < end) {
    if (!retried([&] { return client.Push("w", gradient); })) break;
    client.Clock();
    if (!retried([&] { return client.Pull("w", absl::MakeSpan(values)); })) break;
    ++phase.steps;
  }
  phase.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  phase.stalled = absl::Now() > give_up;
  return phase;
}

double Mib(int64_t bytes) { return RoundTo(static_cast<double>(bytes) / kMiB, 1); }

int Run(const std::string& self) {
  const int seconds = absl::GetFlag(FLAGS_seconds);
  // Before any thread or child starts: the shard, the worker and its
  // partner inherit the lower CPUs; the attacking child pins itself to the
  // upper ones.
  const std::vector<int> cpus = AllowedCpus();
  std::vector<int> job_cpus = cpus, attack_cpus = cpus;
  if (absl::GetFlag(FLAGS_pin_cpus) && cpus.size() >= 2) {
    const size_t split = cpus.size() - cpus.size() / 2;
    job_cpus.assign(cpus.begin(), cpus.begin() + split);
    attack_cpus.assign(cpus.begin() + split, cpus.end());
    if (!PinTo(job_cpus)) {
      std::fprintf(stderr, "harrier-attack-bench: cannot pin to CPUs %s\n",
                   absl::StrJoin(job_cpus, ",").c_str());
      return 1;
    }
  }
  Shard shard;

  std::vector<std::string> flags = {
      "--sync=" + absl::GetFlag(FLAGS_sync),
      "--heartbeat_timeout_ms=600000",
      absl::StrCat("--max_buffered_bytes=", absl::GetFlag(FLAGS_max_buffered_bytes)),
      absl::StrCat("--max_connection_bytes=", absl::GetFlag(FLAGS_max_connection_bytes)),
      absl::StrCat("--max_request_bytes=", absl::GetFlag(FLAGS_max_request_bytes)),
      absl::StrCat("--max_parked_pull_bytes=", absl::GetFlag(FLAGS_max_parked_pull_bytes)),
      absl::StrCat("--max_probe_bytes_in_flight=", absl::GetFlag(FLAGS_max_probe_bytes_in_flight)),
      absl::StrCat("--grpc_memory_bytes=", absl::GetFlag(FLAGS_grpc_memory_bytes))};
  if (absl::GetFlag(FLAGS_job_token)) {
    const std::string path = absl::StrCat(testing::TempDir(), "/attack_bench_token_", getpid());
    {
      std::ofstream file(path);
      file << kToken << "\n";
    }
    chmod(path.c_str(), 0600);
    flags.push_back("--auth_token_file=" + path);
    shard.token = kToken;
  }
  const std::string log_path =
      absl::StrCat(testing::TempDir(), "/attack_bench_shard_", getpid(), ".log");
  flags.insert(flags.begin(), {"--shard=0", "--num_shards=1", "--num_workers=2"});
  auto server = testing::ServerProcess::Start(flags, log_path);
  if (!server.ok()) {
    std::fprintf(stderr, "harrier-attack-bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  shard.address = (*server)->address();
  shard.port = (*server)->port();
  RssSampler rss((*server)->process().pid());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t rss_idle = rss.Now();

  ClientOptions options;
  options.servers = {shard.address};
  options.rank = 0;
  options.auth_token = shard.token;
  options.rpc_timeout = absl::Seconds(30);
  options.retry_timeout = absl::Seconds(5);
  auto client = Client::Create(options);
  if (!client.ok() || !(*client)->RegisterTensor("w", {static_cast<int64_t>(kElements)}).ok()) {
    std::fprintf(stderr, "harrier-attack-bench: worker: %s\n", client.status().ToString().c_str());
    return 1;
  }
  testing::Sessions sessions(OwnChannel(shard, 0), "harrier", shard.token);
  std::atomic<bool> stop_partner{false};
  std::atomic<int64_t> partner_failures{0};
  std::thread partner([&] { RunPartner(shard, sessions, stop_partner, partner_failures); });

  RunWorker(**client, 1);  // warm-up
  rss.ResetPeak();
  const Phase alone = RunWorker(**client, seconds);
  const int64_t rss_baseline = rss.ResetPeak();

  std::string session_bytes;
  sessions.For(1).SerializeToString(&session_bytes);
  const std::string tally_path =
      absl::StrCat(testing::TempDir(), "/attack_bench_attacker_", getpid(), ".log");
  auto attacker = testing::ChildProcess::Start(
      self,
      {"--attack_shard=" + shard.address, "--attack_token=" + shard.token,
       "--attack_session=" + absl::Base64Escape(session_bytes),
       "--attack_cpus=" + absl::StrJoin(attack_cpus, ","), absl::StrCat("--seconds=", seconds),
       absl::StrCat("--attack_every_ms=", absl::GetFlag(FLAGS_attack_every_ms)),
       "--attacks=" + absl::GetFlag(FLAGS_attacks)},
      tally_path);
  if (!attacker.ok()) {
    std::fprintf(stderr, "harrier-attack-bench: attacks: %s\n",
                 attacker.status().ToString().c_str());
    return 1;
  }
  const Phase attacked = RunWorker(**client, seconds);
  // The attacks end --seconds after they started; a call of theirs may run
  // on to its own deadline (20 s at most).
  const int attacker_exit = (*attacker)->WaitForExit(60000);
  if (attacker_exit < 0) (*attacker)->Signal(SIGKILL);
  const int64_t rss_peak = rss.ResetPeak();

  // Exited (crashed) under attack: its exit status, else -1.
  const int shard_exit = (*server)->process().WaitForExit(0);
  // The partner's last pull waits for a push of rank 0 that never comes:
  // it ends at its 2 s deadline.
  stop_partner = true;
  partner.join();

  const int64_t budget_sum =
      absl::GetFlag(FLAGS_max_buffered_bytes) + absl::GetFlag(FLAGS_max_parked_pull_bytes) +
      absl::GetFlag(FLAGS_max_probe_bytes_in_flight) + absl::GetFlag(FLAGS_grpc_memory_bytes);
  const int64_t constant = absl::GetFlag(FLAGS_constant_mb) * kMiB;
  const double unattacked_rate = alone.steps / alone.seconds;
  const double attacked_rate = attacked.steps / attacked.seconds;
  const double ratio = unattacked_rate > 0 ? attacked_rate / unattacked_rate : 0;
  const bool rss_within = rss_peak <= rss_baseline + budget_sum + constant;
  Json json = {
      {"bench", "attack"},
      {"sync", absl::GetFlag(FLAGS_sync)},
      {"job_token", !shard.token.empty()},
      {"seconds", seconds},
      {"attacks", absl::GetFlag(FLAGS_attacks)},
      {"attack_every_ms", absl::GetFlag(FLAGS_attack_every_ms)},
      {"cpus_shard_and_worker", job_cpus},
      {"cpus_attacks", attack_cpus},
      {"attacker_exit_status", attacker_exit},
      {"rss_idle_mb", Mib(rss_idle)},
      {"rss_baseline_mb", Mib(rss_baseline)},
      {"rss_peak_mb", Mib(rss_peak)},
      {"budget_sum_mb", Mib(budget_sum)},
      {"constant_mb", Mib(constant)},
      {"rss_bound_mb", Mib(rss_baseline + budget_sum + constant)},
      {"rss_within_bound", rss_within},
      {"steps_per_s_unattacked", RoundTo(unattacked_rate, 2)},
      {"steps_per_s_attacked", RoundTo(attacked_rate, 2)},
      {"ratio", RoundTo(ratio, 3)},
      {"worker_failed_calls_unattacked", alone.failed_calls},
      {"worker_failed_calls_attacked", attacked.failed_calls},
      {"shard_exit_status", shard_exit},
      {"worker_stalled", alone.stalled || attacked.stalled},
      {"partner_failed_calls", partner_failures.load()},
      {"refusals", LastJsonLine(tally_path)},
      {"shard_log", log_path},
      {"verdict",
       shard_exit < 0 && rss_within && ratio >= 0.5 && !attacked.stalled ? "pass" : "fail"},
  };
  std::printf("%s\n", DumpJson(json).c_str());
  return 0;
}

// ServerProcess finds harrier-server under $TEST_SRCDIR: outside `bazel
// test`, point it at this binary's runfiles (bazel-bin and bazel run).
void UseOwnRunfiles(const char* argv0) {
  if (std::getenv("TEST_SRCDIR") != nullptr) return;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string binary = n > 0 ? std::string(self, n) : std::string(argv0);
  setenv("TEST_SRCDIR", (binary + ".runfiles").c_str(), 1);
  setenv("TEST_WORKSPACE", "harrier", 1);
}

}  // namespace
}  // namespace harrier::bench

int main(int argc, char** argv) {
  if (std::optional<int> exit_code = harrier::bench::ParseBenchFlags(
          argc, argv, harrier::bench::kUsage,
          {"seconds", "sync", "job_token", "max_buffered_bytes", "max_connection_bytes",
           "max_request_bytes", "max_parked_pull_bytes", "max_probe_bytes_in_flight",
           "grpc_memory_bytes", "constant_mb", "attacks", "attack_every_ms", "pin_cpus",
           "attack_shard", "attack_token", "attack_session", "attack_cpus"})) {
    return *exit_code;
  }
  if (!absl::GetFlag(FLAGS_attack_shard).empty()) return harrier::bench::RunAttackerProcess();
  harrier::bench::UseOwnRunfiles(argv[0]);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return harrier::bench::Run(n > 0 ? std::string(self, n) : std::string(argv[0]));
}
