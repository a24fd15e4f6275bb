// harrier-server: one shard of the Harrier parameter store.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/process.h"
#include "common/request_limits.h"
#include "common/transport/stream.h"
#include "server/shard_server.h"
#include "server/tcp/tcp_listener.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on (127.0.0.1 for local-only).");
ABSL_FLAG(int, port, 0, "gRPC port; 0 picks a free one (see --port_file).");
ABSL_FLAG(std::string, port_file, "", "Write the bound port to this file once serving.");
ABSL_FLAG(int, shard, 0, "This shard's index in [0, num_shards). Shard 0 also serves control.");
ABSL_FLAG(int, num_shards, 1, "Number of server shards in the job.");
ABSL_FLAG(int, num_workers, 1, "Number of workers in the job.");
ABSL_FLAG(std::string, optimizer, "sgd", "Server optimizer: sgd|momentum|nesterov|adam|adagrad.");
ABSL_FLAG(double, lr, 0.01, "Learning rate of the server optimizer.");
ABSL_FLAG(double, momentum, 0.9, "Momentum for momentum/nesterov.");
ABSL_FLAG(double, beta1, 0.9, "Adam beta1.");
ABSL_FLAG(double, beta2, 0.999, "Adam beta2.");
ABSL_FLAG(double, epsilon, 1e-8, "Adam/AdaGrad epsilon.");
ABSL_FLAG(double, weight_decay, 0.0, "L2 weight decay added to each gradient.");
ABSL_FLAG(std::string, sync, "bsp", "Consistency model: bsp|ssp|asp|local.");
ABSL_FLAG(int64_t, staleness, 1, "SSP staleness bound s (>= 1; only with --sync=ssp).");
ABSL_FLAG(int64_t, local_steps, 1, "Local SGD steps H between pushes (only with --sync=local).");
ABSL_FLAG(std::string, servers, "",
          "Optional comma-separated host:port of every shard, served to workers by shard 0.");
ABSL_FLAG(bool, staleness_aware_lr, false,
          "SSP/ASP: divide each push's step by the staleness it arrives with.");
ABSL_FLAG(int64_t, max_pending_rounds, harrier::ConsistencyController::kDefaultMaxPendingRounds,
          "BSP/local: a push for a clock this many rounds ahead of the slowest live worker is "
          "refused (FAILED_PRECONDITION), bounding the round sums a shard holds.");
ABSL_FLAG(std::string, on_worker_loss, "fail",
          "A worker silent for --heartbeat_timeout_ms: fail (abort the job with a clear error) or "
          "continue (drop it from the clock and the average).");
ABSL_FLAG(int, heartbeat_timeout_ms, 10000,
          "Silence after which a worker counts as lost. Also: a rank handed out by Register "
          "and not used within it is handed out again, and a Register for a rank whose session "
          "is silent this long replaces that session.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Restore the shard from here on start and write checkpoints here.");
ABSL_FLAG(int, checkpoint_every_s, 0,
          "Seconds between checkpoints (0: only at shutdown; needs --checkpoint_dir).");
ABSL_FLAG(int, checkpoint_keep, 3, "Checkpoint versions kept per shard.");
ABSL_FLAG(int, checkpoint_full_every, 1,
          "Every N-th checkpoint is complete; the ones between hold only the sparse tables' "
          "rows written (and ids evicted) since the previous checkpoint, and a restore loads "
          "them on top of it. 1: every checkpoint complete.");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics and /healthz over HTTP on this port (-1: off, 0: ephemeral).");
ABSL_FLAG(int, shutdown_grace_ms, 5000, "On SIGTERM/SIGINT, time in-flight calls get to finish.");
ABSL_FLAG(int, push_threads, 2,
          "Threads applying UCX pushes (gRPC applies them in its callback threads); pushes "
          "never wait for other workers.");
ABSL_FLAG(int, pull_threads, 64,
          "Threads answering pulls that wait for the consistency model (each holds one), and "
          "every UCX pull.");
ABSL_FLAG(int, max_queued_calls, 1024,
          "Calls waiting for a push or pull thread, per pool; more are refused with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{512} << 20,
          "Payload bytes one push or push-pull call may send before the shard refuses it "
          "(RESOURCE_EXHAUSTED); bounds what a call buffers before validation.");
ABSL_FLAG(int64_t, max_connection_bytes, int64_t{1} << 30,
          "Payload bytes the unfinished push and push-pull calls of one connection may hold "
          "before the shard refuses more (RESOURCE_EXHAUSTED).");
ABSL_FLAG(int64_t, max_buffered_bytes, int64_t{4} << 30,
          "Payload bytes the unfinished push and push-pull calls of all connections may hold "
          "before the shard refuses more (RESOURCE_EXHAUSTED).");
ABSL_FLAG(int64_t, max_parked_pull_bytes, int64_t{256} << 20,
          "Bytes the pulls waiting on the consistency model may hold (their chunk lists and "
          "the reply chunks queued before they waited); one more is refused "
          "(RESOURCE_EXHAUSTED).");
ABSL_FLAG(int64_t, max_probe_bytes_in_flight, int64_t{64} << 20,
          "Bytes AdminService.Probe calls in flight may hold (payload, plus twice the reply: "
          "the message and the copy gRPC sends); more are refused (RESOURCE_EXHAUSTED).");
ABSL_FLAG(int64_t, grpc_memory_bytes, int64_t{8} << 30,
          "Bytes gRPC's connections may hold in all (its resource quota: messages being "
          "received, unary request bodies, replies being sent, and the push payloads the "
          "shard keeps); past it gRPC reads less and cancels streams. Keep it above "
          "--max_buffered_bytes. 0: unbounded.");
ABSL_FLAG(int32_t, grpc_max_threads, 256,
          "Threads gRPC may run for the unary calls (Init, Heartbeat, the admin and control "
          "calls, health); while all are busy gRPC refuses further calls (RESOURCE_EXHAUSTED). "
          "0: unbounded.");
ABSL_FLAG(int32_t, max_streams_per_connection, 1024,
          "Calls one client connection may have open at once (HTTP/2 streams); its further "
          "calls wait. 0: gRPC's default (unbounded).");
ABSL_FLAG(int32_t, max_health_watches, 16,
          "grpc.health.v1 Watch streams served at once, on the main port and on --health_port "
          "each; more are refused (RESOURCE_EXHAUSTED). Health calls need no token and each "
          "Watch holds one of gRPC's threads while open: at most half of --grpc_max_threads.");
ABSL_FLAG(int32_t, grpc_queue_threads, 1,
          "Threads serving pushes, pulls and barriers over gRPC, each polling a completion "
          "queue of its own (1 to 64). Polling threads take turns at the connections: more "
          "threads, more hand-offs.");
ABSL_FLAG(int64_t, max_chunks, int64_t{1} << 20, "Tensor chunks a job may Init on this shard.");
ABSL_FLAG(int64_t, max_param_bytes, int64_t{64} << 30,
          "Parameter bytes a job may Init on this shard, with the views that compressed pulls "
          "keep of them and what their encoders keep between calls.");
ABSL_FLAG(int64_t, max_chunk_bytes, int64_t{32} << 20,
          "Largest chunk Init accepts, in bytes (clients split tensors into chunks of at most "
          "32 MiB).");
ABSL_FLAG(int32_t, apply_threads, 0,
          "Threads applying one pushed chunk of 1 MiB or more, in parts (CRC, check and step; "
          "results bit-identical for any count). 0: min(hardware cores, 8); 1: the receiving "
          "thread alone.");
ABSL_FLAG(bool, ucx, false,
          "Also serve pushes and pulls over UCX (workers: --transport=ucx); UCX_TLS picks the "
          "transports, e.g. tcp or sm,self.");
ABSL_FLAG(bool, tcp, true,
          "Also serve pushes and pulls over plain TCP streams, without HTTP/2, on --tcp_port: "
          "the data path workers pick by default (--transport=auto) when they have no TLS. Like "
          "UCX, not encrypted: workers with TLS keep their data on gRPC unless they name "
          "--transport=tcp (the hello secret still keeps out clients without the token). "
          "--tcp=false: gRPC only.");
ABSL_FLAG(std::string, tcp_congestion, std::string(harrier::transport::kDefaultCongestionControl),
          "TCP congestion control of the --tcp data path's connections: the first of these "
          "names the kernel lets this process set (tcp_available_congestion_control; "
          "unprivileged processes only those in tcp_allowed_congestion_control). Empty: the "
          "kernel's default. Not BBR by default: BBR takes a link that passes short bursts "
          "faster than its rate for a faster one, and the parameter server's short flows from "
          "many workers into one shard then lose many of their bytes.");
ABSL_FLAG(int32_t, tcp_port, 0,
          "Port of the --tcp data path on --host; 0: the kernel picks one (clients learn it "
          "over gRPC).");
ABSL_FLAG(std::string, tcp_advertise, "",
          "host:port workers are told to reach the --tcp data path at, where that is not "
          "--host and --tcp_port: a proxy or a forwarded port in front of the shard. \":port\" "
          "keeps the host workers reach the gRPC port at. Empty: the bound address.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this shard; with --tls_key the gRPC port serves TLS only.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates: with it every client must present a certificate signed by one "
          "of them (mutual TLS).");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the job token (trailing newline stripped; not readable by others): every "
          "call except health checks must carry it, else UNAUTHENTICATED. Session credentials are "
          "keyed from it; without it they guard against mistakes, not a hostile client.");
ABSL_FLAG(std::string, job, "harrier",
          "Job name: a message naming another job is refused (FAILED_PRECONDITION); session "
          "credentials are bound to it. Must match the workers' --job. At most 256 bytes.");
ABSL_FLAG(bool, admin_open, false,
          "Without --auth_token_file, serve admin calls (harrier-ctl status, checkpoint, "
          "shutdown, new-run) to any host that reaches the port. false: only to callers on this "
          "host (loopback: 127.0.0.1, ::1), others are refused PERMISSION_DENIED. With a token, "
          "admin calls need it from any host and this flag changes nothing.");
ABSL_FLAG(int, health_port, -1,
          "Also serve grpc.health.v1 alone on this port, plaintext and without a token, for "
          "probes that cannot do TLS (-1: off, 0: ephemeral).");

ABSL_FLAG(bool, resume, false,
          "Continue the newest run checkpointed in --checkpoint_dir (its job id; workers learn "
          "their clocks from the shards). Without it every start is a fresh run with a new job "
          "id: older runs' checkpoints are kept aside in their own folders, never applied. "
          "Nothing to resume: a warning, then a fresh run.");
ABSL_FLAG(bool, exit_when_done, true,
          "Once every worker has finished (exited, or lost), write a final checkpoint and exit "
          "(0; 1 when a lost worker failed the job), so the shards end with their job. false: "
          "keep serving; the next worker to register starts a new run.");
ABSL_FLAG(int, rejoin_after_ms, 3000,
          "A worker registering for a rank whose session has been silent this long takes it "
          "over (a restarted worker rejoins, learning its clock from the shards); at most "
          "--heartbeat_timeout_ms.");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "harrier-server: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  harrier::ParseFlags(
      argc, argv,
      "One shard of the Harrier parameter server.\n"
      "Usage: harrier-server --shard=I --num_shards=N --num_workers=M [--port=P] [flags]");
  harrier::TuneMallocForLargeBuffers();
  harrier::SkipMutexDeadlockDetection();
  harrier::InitLogging(absl::StrCat("server-", absl::GetFlag(FLAGS_shard)));

  // Signals are taken synchronously by this thread; block them before gRPC
  // starts its threads so none of those receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  harrier::ShardServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.store.shard = absl::GetFlag(FLAGS_shard);
  options.store.num_shards = absl::GetFlag(FLAGS_num_shards);
  options.store.num_workers = absl::GetFlag(FLAGS_num_workers);
  options.optimizer.kind = absl::GetFlag(FLAGS_optimizer);
  options.optimizer.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  options.optimizer.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  options.optimizer.beta1 = static_cast<float>(absl::GetFlag(FLAGS_beta1));
  options.optimizer.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  options.optimizer.epsilon = static_cast<float>(absl::GetFlag(FLAGS_epsilon));
  options.optimizer.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  auto sync = harrier::SyncPolicy::FromFlags(
      absl::GetFlag(FLAGS_sync), absl::GetFlag(FLAGS_staleness), absl::GetFlag(FLAGS_local_steps));
  if (!sync.ok()) return Fail(std::string(sync.status().message()));
  options.store.sync = *sync;
  options.store.staleness_aware_lr = absl::GetFlag(FLAGS_staleness_aware_lr);
  options.store.max_pending_rounds = absl::GetFlag(FLAGS_max_pending_rounds);
  const std::string loss_policy = absl::GetFlag(FLAGS_on_worker_loss);
  if (loss_policy == "fail") {
    options.on_worker_loss = harrier::WorkerLossPolicy::kFail;
  } else if (loss_policy == "continue") {
    options.on_worker_loss = harrier::WorkerLossPolicy::kContinue;
  } else {
    return Fail("--on_worker_loss must be fail or continue, got '" + loss_policy + "'");
  }
  if (absl::GetFlag(FLAGS_heartbeat_timeout_ms) < 100) {
    return Fail("--heartbeat_timeout_ms must be >= 100");
  }
  options.heartbeat_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  options.ucx = absl::GetFlag(FLAGS_ucx);
  options.tcp = absl::GetFlag(FLAGS_tcp);
  options.tcp_congestion_control = absl::GetFlag(FLAGS_tcp_congestion);
  options.tcp_port = absl::GetFlag(FLAGS_tcp_port);
  options.tcp_advertise = absl::GetFlag(FLAGS_tcp_advertise);
  if (!options.tcp_advertise.empty()) {
    if (!options.tcp) {
      return Fail("--tcp_advertise names the --tcp data path's address: drop it, or set --tcp");
    }
    if (auto status = harrier::CheckAdvertisedAddress(options.tcp_advertise); !status.ok()) {
      return Fail(absl::StrCat("--tcp_advertise: ", status.message()));
    }
  }
  if (absl::GetFlag(FLAGS_push_threads) < 1 || absl::GetFlag(FLAGS_pull_threads) < 1 ||
      absl::GetFlag(FLAGS_max_queued_calls) < 1) {
    return Fail("--push_threads, --pull_threads and --max_queued_calls must be >= 1");
  }
  options.service.push_threads = absl::GetFlag(FLAGS_push_threads);
  options.service.pull_threads = absl::GetFlag(FLAGS_pull_threads);
  options.service.max_queued_calls = static_cast<size_t>(absl::GetFlag(FLAGS_max_queued_calls));
  if (absl::GetFlag(FLAGS_max_request_bytes) < 1 || absl::GetFlag(FLAGS_max_chunks) < 1 ||
      absl::GetFlag(FLAGS_max_connection_bytes) < 1 ||
      absl::GetFlag(FLAGS_max_buffered_bytes) < 1 || absl::GetFlag(FLAGS_max_param_bytes) < 1 ||
      absl::GetFlag(FLAGS_max_chunk_bytes) < 4) {
    return Fail(
        "--max_request_bytes, --max_connection_bytes, --max_buffered_bytes, --max_chunks "
        "and --max_param_bytes must be >= 1, "
        "--max_chunk_bytes >= 4");
  }
  options.service.max_request_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_request_bytes));
  options.service.max_connection_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_connection_bytes));
  options.service.max_buffered_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_buffered_bytes));
  if (absl::GetFlag(FLAGS_max_parked_pull_bytes) < 1 ||
      absl::GetFlag(FLAGS_max_probe_bytes_in_flight) < 1 ||
      absl::GetFlag(FLAGS_grpc_memory_bytes) < 0 || absl::GetFlag(FLAGS_grpc_max_threads) < 0 ||
      absl::GetFlag(FLAGS_max_streams_per_connection) < 0 ||
      absl::GetFlag(FLAGS_grpc_queue_threads) < 1 || absl::GetFlag(FLAGS_grpc_queue_threads) > 64) {
    return Fail(
        "--max_parked_pull_bytes and --max_probe_bytes_in_flight must be >= 1, "
        "--grpc_memory_bytes, --grpc_max_threads and --max_streams_per_connection >= 0, "
        "--grpc_queue_threads 1 to 64");
  }
  options.service.max_parked_pull_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_parked_pull_bytes));
  options.service.max_probe_bytes_in_flight =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_probe_bytes_in_flight));
  options.grpc_limits.memory_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_grpc_memory_bytes));
  options.grpc_limits.max_threads = absl::GetFlag(FLAGS_grpc_max_threads);
  options.grpc_limits.max_streams_per_connection =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  options.grpc_limits.queue_threads = absl::GetFlag(FLAGS_grpc_queue_threads);
  options.grpc_limits.max_health_watches = absl::GetFlag(FLAGS_max_health_watches);
  options.store.max_chunks = static_cast<size_t>(absl::GetFlag(FLAGS_max_chunks));
  options.store.max_param_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_param_bytes));
  options.store.max_chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_chunk_bytes));
  if (absl::GetFlag(FLAGS_apply_threads) < 0 || absl::GetFlag(FLAGS_apply_threads) > 256) {
    return Fail("--apply_threads must be in [0, 256] (0: from the core count)");
  }
  options.store.apply_threads = absl::GetFlag(FLAGS_apply_threads);
  if (options.store.apply_threads == 0) {
    options.store.apply_threads =
        std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  }
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (absl::GetFlag(FLAGS_checkpoint_every_s) < 0 || absl::GetFlag(FLAGS_checkpoint_keep) < 1) {
    return Fail("--checkpoint_every_s must be >= 0 and --checkpoint_keep >= 1");
  }
  options.checkpoint_every = std::chrono::seconds(absl::GetFlag(FLAGS_checkpoint_every_s));
  options.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  if (absl::GetFlag(FLAGS_checkpoint_full_every) < 1) {
    return Fail("--checkpoint_full_every must be >= 1");
  }
  options.checkpoint_full_every = absl::GetFlag(FLAGS_checkpoint_full_every);
  options.store.track_sparse_changes =
      options.checkpoint_full_every > 1 && !absl::GetFlag(FLAGS_checkpoint_dir).empty();
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  if (const std::string token_file = absl::GetFlag(FLAGS_auth_token_file); !token_file.empty()) {
    auto token = harrier::ReadJobTokenFile(token_file);
    if (!token.ok()) return Fail(std::string(token.status().message()));
    options.job_token = *token;
  }
  options.health_port = absl::GetFlag(FLAGS_health_port);
  options.admin_open = absl::GetFlag(FLAGS_admin_open);
  options.resume = absl::GetFlag(FLAGS_resume);
  options.exit_when_done = absl::GetFlag(FLAGS_exit_when_done);
  if (absl::GetFlag(FLAGS_rejoin_after_ms) < 0) return Fail("--rejoin_after_ms must be >= 0");
  options.rejoin_after = std::chrono::milliseconds(
      std::min(absl::GetFlag(FLAGS_rejoin_after_ms), absl::GetFlag(FLAGS_heartbeat_timeout_ms)));
  options.job = absl::GetFlag(FLAGS_job);
  if (options.job.empty()) return Fail("--job must not be empty");
  if (options.job.size() > harrier::kMaxJobNameBytes) {
    return Fail(absl::StrCat("--job must be at most ", harrier::kMaxJobNameBytes,
                             " bytes (every request names it)"));
  }
  const std::string servers = absl::GetFlag(FLAGS_servers);
  if (!servers.empty()) options.shard_addresses = absl::StrSplit(servers, ',', absl::SkipEmpty());

  auto server = harrier::ShardServer::Start(options);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  spdlog::info(
      "serving shard={}/{} port={} workers={} sync={} optimizer={} lr={} metrics_port={} tls={} "
      "token={} health_port={}",
      options.store.shard, options.store.num_shards, (*server)->port(), options.store.num_workers,
      options.store.sync.ToString(), options.optimizer.kind, options.optimizer.lr,
      (*server)->metrics_port(),
      options.tls.ca.empty() ? (options.tls.enabled() ? "server" : "off") : "mutual",
      options.job_token.empty() ? "off" : "on", (*server)->health_port());

  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    auto written = harrier::WriteFileAtomically(port_file, absl::StrCat((*server)->port(), "\n"));
    if (!written.ok()) return Fail(std::string(written.message()));
  }

  // Runs until a signal or a shutdown request (--exit_when_done, or
  // AdminService.Shutdown), whichever comes first.
  int exit_code = 0;
  for (;;) {
    const timespec poll = {0, 200 * 1000 * 1000};
    const int signal_number = sigtimedwait(&signals, nullptr, &poll);
    if (signal_number > 0) {
      spdlog::info("signal {} received: shutting down", signal_number);
      break;
    }
    if (auto request = (*server)->shutdown_request(); request.has_value()) {
      spdlog::info("shutting down: {}", request->reason);
      exit_code = request->exit_code;
      break;
    }
  }
  (*server)->Shutdown(std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  (*server)->Wait();
  const auto& counters = (*server)->store().counters();
  spdlog::info("stopped pushes={} pulls={} bytes_in={} bytes_out={} rejected={}",
               counters.pushes.load(), counters.pulls.load(), counters.bytes_in.load(),
               counters.bytes_out.load(), counters.rejected.load());
  return exit_code;
}
