// harrier-ctl: the operator's command line for a running job. It asks every
// shard's AdminService (status, checkpoint, shutdown, new-run) or grpc.health.v1
// (health, which the Kubernetes probes run).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/grpc_security.h"
#include "common/json.h"
#include "proto/harrier.grpc.pb.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated host:port of every shard, shard 0 first.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the job token the shards were started with (every command but health "
          "needs it when they have one).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates: talk TLS, the shards' certificates must chain to them.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate chain, for shards that require mutual TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, job, "harrier",
          "The job the shards must serve: a shard serving another is an error.");
ABSL_FLAG(int, timeout_ms, 5000,
          "Deadline of every call; shutdown also waits at most this long for the shards to "
          "stop.");
ABSL_FLAG(bool, json, false, "status: print one JSON object instead of the report.");

namespace harrier {
namespace {

constexpr char kUsage[] =
    "Operator commands for a running Harrier job.\n"
    "Usage: harrier-ctl [--servers=H:P,H:P,...] [--auth_token_file=F] [--tls_ca=F] "
    "[--tls_cert=F] [--tls_key=F] [--job=J] [--timeout_ms=5000] [--json] COMMAND\n"
    "Commands:\n"
    "  status      every shard's view: job, ranks (clock, last heard), keys, bytes, checkpoint\n"
    "  health      grpc.health.v1 on every shard: exit 0 only when all are SERVING\n"
    "  checkpoint  every shard writes a checkpoint now\n"
    "  shutdown    every shard (shard 0 last) writes a final checkpoint and exits\n"
    "  new-run     end the running job and start a new run: shard 0 picks its job id, the\n"
    "              others adopt it; the old run's workers are refused from then on (its\n"
    "              state is checkpointed first where the shards have a --checkpoint_dir)\n"
    "Exit status: 0 done, 1 a shard failed or did not answer, 2 a usage error.";

int Usage(const std::string& why) {
  std::fprintf(stderr, "harrier-ctl: %s\n%s\n", why.c_str(), kUsage);
  return 2;
}

// "UNAUTHENTICATED: missing or wrong job token (--auth_token_file)".
std::string Describe(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

// What the operator can do about a refusal, or "" when the message says it.
std::string Remedy(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return "the shards have a job token: pass the file they were started with as "
           "--auth_token_file";
  }
  if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED &&
      status.error_message().find("--admin_open") != std::string::npos) {
    return "without a job token the shards serve admin calls only on their own host: run "
           "harrier-ctl there with --servers=127.0.0.1:PORT, or start the shards with "
           "--auth_token_file (and pass it here), or with --admin_open=true";
  }
  return "";
}

// Says each distinct remedy of `statuses` once, on stderr.
void PrintRemedies(const std::vector<grpc::Status>& statuses) {
  std::vector<std::string> said;
  for (const grpc::Status& status : statuses) {
    const std::string remedy = Remedy(status);
    if (remedy.empty() || std::find(said.begin(), said.end(), remedy) != said.end()) continue;
    std::fprintf(stderr, "harrier-ctl: what to do: %s\n", remedy.c_str());
    said.push_back(remedy);
  }
}

struct Shard {
  int index = 0;
  std::string address;
  std::string name;  // "shard i (host:port)"
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<proto::AdminService::Stub> admin;
};

class Ctl {
 public:
  Ctl(std::vector<Shard> shards, std::string token, absl::Duration timeout)
      : shards_(std::move(shards)), token_(std::move(token)), timeout_(timeout) {}

  std::vector<Shard>& shards() { return shards_; }
  absl::Duration timeout() const { return timeout_; }

  // Every call: the deadline, and the token (health needs none, and a probe
  // must not depend on the token file being mounted).
  void Prepare(grpc::ClientContext* context, absl::Duration timeout, bool token) const {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (token && !token_.empty()) {
      context->AddMetadata(std::string(kJobTokenMetadataKey), token_);
    }
  }

  // Runs `call` for every shard at once, so a dead shard costs one deadline
  // in all, not one per shard.
  template <typename Result>
  std::vector<Result> ForEach(const std::function<Result(Shard&)>& call) {
    std::vector<std::future<Result>> futures;
    for (Shard& shard : shards_) {
      futures.push_back(std::async(std::launch::async, [&call, &shard] { return call(shard); }));
    }
    std::vector<Result> results;
    for (auto& future : futures) results.push_back(future.get());
    return results;
  }

  // grpc.health.v1.Health/Check for the whole server, without a generated
  // stub (Debian ships health.proto only in grpc-proto): the request
  // {service: ""} is empty; the reply is {status: N}, bytes 08 N.
  grpc::Status Health(Shard& shard, absl::Duration timeout, std::string* serving) const {
    grpc::GenericStub stub(shard.channel);
    grpc::ClientContext context;
    Prepare(&context, timeout, /*token=*/false);
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer reply;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &reply, [&done](grpc::Status status) { done.set_value(std::move(status)); });
    grpc::Status status = done.get_future().get();
    if (!status.ok()) return status;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (reply.Dump(&slices).ok()) {
      for (const auto& slice : slices) {
        bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
      }
    }
    // 1 SERVING, 2 NOT_SERVING, 0 (or absent) UNKNOWN, 3 SERVICE_UNKNOWN.
    const int code = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
    *serving = code == 1 ? "SERVING" : code == 2 ? "NOT_SERVING" : "UNKNOWN";
    return grpc::Status::OK;
  }

 private:
  std::vector<Shard> shards_;
  const std::string token_;
  const absl::Duration timeout_;
};

std::string SyncName(const proto::SyncConfig& sync) {
  switch (sync.mode()) {
    case proto::SYNC_BSP: return "bsp";
    case proto::SYNC_SSP: return absl::StrCat("ssp(staleness=", sync.staleness(), ")");
    case proto::SYNC_ASP: return "asp";
    case proto::SYNC_LOCAL: return absl::StrCat("local(steps=", sync.local_steps(), ")");
    default: return absl::StrCat("mode ", static_cast<int>(sync.mode()));
  }
}

// How far along a rank is as one shard sees it; the job view takes the
// furthest any shard saw (a rank one shard saw leave has left).
int StateOrder(const std::string& state) {
  static const std::map<std::string, int> order = {
      {"absent", 0}, {"present", 1}, {"left", 2}, {"done", 3}, {"lost", 4}};
  const auto found = order.find(state);
  return found == order.end() ? 0 : found->second;
}

struct StatusReply {
  grpc::Status status;
  proto::StatusResponse response;
};

int Status(Ctl& ctl, bool json) {
  std::vector<StatusReply> replies = ctl.ForEach<StatusReply>([&ctl](Shard& shard) {
    StatusReply reply;
    grpc::ClientContext context;
    ctl.Prepare(&context, ctl.timeout(), true);
    reply.status = shard.admin->GetStatus(&context, proto::StatusRequest(), &reply.response);
    return reply;
  });
  int exit_code = 0;
  std::vector<std::string> errors(replies.size());
  const std::string job = absl::GetFlag(FLAGS_job);
  {
    std::vector<grpc::Status> statuses;
    for (const StatusReply& reply : replies) statuses.push_back(reply.status);
    PrintRemedies(statuses);
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    const Shard& shard = ctl.shards()[i];
    if (!replies[i].status.ok()) {
      errors[i] = Describe(replies[i].status);
    } else if (replies[i].response.job() != job) {
      errors[i] = absl::StrCat("serves job '", replies[i].response.job(), "', not --job='", job, "'");
    } else if (static_cast<int>(replies[i].response.shard()) != shard.index) {
      errors[i] = absl::StrCat("is shard ", replies[i].response.shard(),
                               ": list --servers in shard order");
    } else {
      continue;
    }
    std::fprintf(stderr, "harrier-ctl: %s: %s\n", shard.name.c_str(), errors[i].c_str());
    exit_code = 1;
  }

  // The job as the answering shards see it together.
  const proto::StatusResponse* first = nullptr;
  std::string job_state;
  std::string failure;
  uint64_t job_id = 0;
  int answered = 0, done = 0, waiting = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!errors[i].empty()) continue;
    const proto::StatusResponse& r = replies[i].response;
    if (first == nullptr) first = &r;
    ++answered;
    job_id = std::max(job_id, r.job_id());
    if (r.job_state() == "failed" && failure.empty()) {
      failure = absl::StrCat("shard ", r.shard(), ": ", r.failure());
    }
    if (r.job_state() == "done") ++done;
    if (r.job_state() == "waiting") ++waiting;
  }
  if (answered == 0) {
    job_state = "unknown";
  } else if (!failure.empty()) {
    job_state = "failed";
  } else if (done == answered) {
    job_state = "done";
  } else if (waiting == answered) {
    job_state = "waiting";
  } else {
    job_state = "running";
  }
  struct Rank {
    std::string state = "absent";
    int64_t next_clock = -1;
    int64_t last_heard_ms_ago = -1;
    uint64_t epoch = 0;
  };
  std::map<uint32_t, Rank> ranks;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!errors[i].empty()) continue;
    for (const proto::RankStatus& r : replies[i].response.ranks()) {
      Rank& rank = ranks[r.rank()];
      if (StateOrder(r.state()) > StateOrder(rank.state)) rank.state = r.state();
      // Minimums over the shards that know: -1 says "none" (no chunk held,
      // never heard).
      if (r.next_clock() >= 0 && (rank.next_clock < 0 || r.next_clock() < rank.next_clock)) {
        rank.next_clock = r.next_clock();
      }
      if (r.last_heard_ms_ago() >= 0 &&
          (rank.last_heard_ms_ago < 0 || r.last_heard_ms_ago() < rank.last_heard_ms_ago)) {
        rank.last_heard_ms_ago = r.last_heard_ms_ago();
      }
      rank.epoch = std::max(rank.epoch, r.epoch());
    }
  }

  if (json) {
    Json out = {
        {"job", job},
        {"job_id", job_id},
        {"job_state", job_state},
        {"failure", failure},
        {"sync", first != nullptr ? SyncName(first->sync()) : ""},
        {"num_workers", first ? first->num_workers() : 0},
    };
    Json& ranks_json = out["ranks"] = Json::array();
    for (const auto& [index, rank] : ranks) {
      ranks_json.push_back({
          {"rank", index},
          {"state", rank.state},
          {"next_clock", rank.next_clock},
          {"last_heard_ms_ago", rank.last_heard_ms_ago},
          {"epoch", rank.epoch},
      });
    }
    Json& shards_json = out["shards"] = Json::array();
    for (size_t i = 0; i < replies.size(); ++i) {
      const Shard& shard = ctl.shards()[i];
      Json entry = {{"shard", shard.index}, {"address", shard.address}};
      if (!errors[i].empty()) {
        entry["reachable"] = false;
        entry["error"] = errors[i];
        shards_json.push_back(std::move(entry));
        continue;
      }
      const proto::StatusResponse& r = replies[i].response;
      entry["reachable"] = true;
      entry["job_id"] = r.job_id();
      entry["job_state"] = r.job_state();
      entry["keys"] = r.keys();
      entry["chunks"] = r.chunks();
      entry["param_bytes"] = r.param_bytes();
      entry["bytes_in"] = r.bytes_in();
      entry["bytes_out"] = r.bytes_out();
      entry["checkpoint_age_seconds"] = RoundTo(r.checkpoint_age_seconds(), 3);
      entry["checkpoint_version"] = r.checkpoint_version();
      entry["uptime_seconds"] = RoundTo(r.uptime_seconds(), 3);
      shards_json.push_back(std::move(entry));
    }
    std::printf("%s\n", DumpJson(out).c_str());
    return exit_code;
  }

  std::printf("job %s  job_id %llu  state %s  sync %s  workers %u\n", job.c_str(),
              static_cast<unsigned long long>(job_id), job_state.c_str(),
              first != nullptr ? SyncName(first->sync()).c_str() : "?",
              first != nullptr ? first->num_workers() : 0);
  if (!failure.empty()) std::printf("failure: %s\n", failure.c_str());
  std::printf("%-6s %-8s %12s %16s %14s\n", "RANK", "STATE", "NEXT_CLOCK", "LAST_HEARD_MS", "EPOCH");
  for (const auto& [index, rank] : ranks) {
    std::printf("%-6u %-8s %12lld %16s %14llu\n", index, rank.state.c_str(),
                static_cast<long long>(rank.next_clock),
                rank.last_heard_ms_ago < 0 ? "never"
                                           : std::to_string(rank.last_heard_ms_ago).c_str(),
                static_cast<unsigned long long>(rank.epoch));
  }
  std::printf("%-6s %-22s %6s %7s %12s %14s %14s %12s %8s\n", "SHARD", "ADDRESS", "KEYS", "CHUNKS",
              "PARAM_BYTES", "BYTES_IN", "BYTES_OUT", "CKPT_AGE_S", "CKPT_VER");
  for (size_t i = 0; i < replies.size(); ++i) {
    const Shard& shard = ctl.shards()[i];
    if (!errors[i].empty()) {
      std::printf("%-6d %-22s unreachable (%s)\n", shard.index, shard.address.c_str(),
                  errors[i].c_str());
      continue;
    }
    const proto::StatusResponse& r = replies[i].response;
    std::printf("%-6d %-22s %6llu %7llu %12llu %14llu %14llu %12s %8llu\n", shard.index,
                shard.address.c_str(), static_cast<unsigned long long>(r.keys()),
                static_cast<unsigned long long>(r.chunks()),
                static_cast<unsigned long long>(r.param_bytes()),
                static_cast<unsigned long long>(r.bytes_in()),
                static_cast<unsigned long long>(r.bytes_out()),
                r.checkpoint_age_seconds() < 0
                    ? "none"
                    : absl::StrFormat("%.1f", r.checkpoint_age_seconds()).c_str(),
                static_cast<unsigned long long>(r.checkpoint_version()));
  }
  return exit_code;
}

int Health(Ctl& ctl) {
  struct Reply {
    grpc::Status status;
    std::string serving;
  };
  std::vector<Reply> replies = ctl.ForEach<Reply>([&ctl](Shard& shard) {
    Reply reply;
    reply.status = ctl.Health(shard, ctl.timeout(), &reply.serving);
    return reply;
  });
  int exit_code = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    const std::string& address = ctl.shards()[i].address;
    if (!replies[i].status.ok()) {
      std::printf("%s UNREACHABLE (%s)\n", address.c_str(), Describe(replies[i].status).c_str());
      exit_code = 1;
    } else {
      std::printf("%s %s\n", address.c_str(), replies[i].serving.c_str());
      if (replies[i].serving != "SERVING") exit_code = 1;
    }
  }
  std::fflush(stdout);
  return exit_code;
}

int Checkpoint(Ctl& ctl) {
  struct Reply {
    grpc::Status status;
    proto::CheckpointResponse response;
  };
  std::vector<Reply> replies = ctl.ForEach<Reply>([&ctl](Shard& shard) {
    Reply reply;
    grpc::ClientContext context;
    ctl.Prepare(&context, ctl.timeout(), true);
    reply.status = shard.admin->Checkpoint(&context, proto::CheckpointRequest(), &reply.response);
    return reply;
  });
  int exit_code = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    const Shard& shard = ctl.shards()[i];
    if (!replies[i].status.ok()) {
      std::fprintf(stderr, "harrier-ctl: %s: checkpoint failed: %s\n", shard.name.c_str(),
                   Describe(replies[i].status).c_str());
      exit_code = 1;
      continue;
    }
    std::printf("shard=%d version=%llu path=%s\n", shard.index,
                static_cast<unsigned long long>(replies[i].response.version()),
                replies[i].response.path().c_str());
  }
  std::vector<grpc::Status> statuses;
  for (const Reply& reply : replies) statuses.push_back(reply.status);
  PrintRemedies(statuses);
  return exit_code;
}

int NewRun(Ctl& ctl) {
  // Shard 0 (the control plane) starts the run and says its job id; the
  // others adopt that one.
  auto ask = [&ctl](Shard& shard, uint64_t job_id, proto::NewRunResponse* response) {
    grpc::ClientContext context;
    ctl.Prepare(&context, ctl.timeout(), true);
    proto::NewRunRequest request;
    request.set_job_id(job_id);
    request.set_reason("harrier-ctl new-run");
    return shard.admin->NewRun(&context, request, response);
  };
  Shard& control = ctl.shards().front();
  proto::NewRunResponse started;
  const grpc::Status status = ask(control, 0, &started);
  if (!status.ok()) {
    std::fprintf(stderr, "harrier-ctl: %s: new run refused: %s\n", control.name.c_str(),
                 Describe(status).c_str());
    PrintRemedies({status});
    return 1;
  }
  std::printf("%s: job id %llu ended, job id %llu started\n", control.name.c_str(),
              static_cast<unsigned long long>(started.previous_job_id()),
              static_cast<unsigned long long>(started.job_id()));
  struct Reply {
    grpc::Status status;
    proto::NewRunResponse response;
  };
  std::vector<Reply> replies = ctl.ForEach<Reply>([&](Shard& shard) {
    Reply reply;
    if (shard.index == 0) return reply;
    reply.status = ask(shard, started.job_id(), &reply.response);
    return reply;
  });
  int exit_code = 0;
  std::vector<grpc::Status> statuses;
  for (size_t i = 1; i < replies.size(); ++i) {
    const Shard& shard = ctl.shards()[i];
    statuses.push_back(replies[i].status);
    if (!replies[i].status.ok()) {
      std::fprintf(stderr, "harrier-ctl: %s: new run refused: %s\n", shard.name.c_str(),
                   Describe(replies[i].status).c_str());
      exit_code = 1;
      continue;
    }
    std::printf("%s: job id %llu ended, job id %llu adopted\n", shard.name.c_str(),
                static_cast<unsigned long long>(replies[i].response.previous_job_id()),
                static_cast<unsigned long long>(replies[i].response.job_id()));
  }
  PrintRemedies(statuses);
  std::fflush(stdout);
  return exit_code;
}

int Shutdown(Ctl& ctl) {
  int exit_code = 0;
  std::vector<bool> asked(ctl.shards().size(), false);
  // Shard 0 last: it serves the control plane, which the others' workers
  // still reach while their shards go.
  for (int i = static_cast<int>(ctl.shards().size()) - 1; i >= 0; --i) {
    Shard& shard = ctl.shards()[i];
    grpc::ClientContext context;
    ctl.Prepare(&context, ctl.timeout(), true);
    proto::ShutdownRequest request;
    request.set_reason("harrier-ctl shutdown");
    proto::ShutdownResponse response;
    const grpc::Status status = shard.admin->Shutdown(&context, request, &response);
    if (!status.ok()) {
      std::fprintf(stderr, "harrier-ctl: %s: shutdown refused: %s\n", shard.name.c_str(),
                   Describe(status).c_str());
      PrintRemedies({status});
      exit_code = 1;
      continue;
    }
    asked[i] = true;
    std::printf("%s: shutdown requested\n", shard.name.c_str());
  }
  std::fflush(stdout);
  // The shard answers before it stops (its final checkpoint, the grace its
  // in-flight calls get): stopped means it no longer answers at all.
  const absl::Time deadline = absl::Now() + ctl.timeout();
  for (size_t i = 0; i < ctl.shards().size(); ++i) {
    if (!asked[i]) continue;
    Shard& shard = ctl.shards()[i];
    bool stopped = false;
    while (!stopped) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      std::string serving;
      const grpc::Status status = ctl.Health(shard, std::min(left, absl::Milliseconds(500)), &serving);
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        stopped = true;
      } else {
        absl::SleepFor(std::min(deadline - absl::Now(), absl::Milliseconds(100)));
      }
    }
    if (stopped) {
      std::printf("%s: stopped\n", shard.name.c_str());
    } else {
      std::fprintf(stderr, "harrier-ctl: %s: still answering %s after the shutdown request\n",
                   shard.name.c_str(), absl::FormatDuration(ctl.timeout()).c_str());
      exit_code = 1;
    }
  }
  return exit_code;
}

}  // namespace
}  // namespace harrier

int main(int argc, char** argv) {
  const std::vector<std::string> args = harrier::ParseFlags(argc, argv, harrier::kUsage);
  if (args.size() < 2) return harrier::Usage("no command");
  if (args.size() > 2) return harrier::Usage(absl::StrCat("one command, got ", args.size() - 1));
  const std::string command = args[1];
  if (command != "status" && command != "health" && command != "checkpoint" &&
      command != "shutdown" && command != "new-run") {
    return harrier::Usage(absl::StrCat("unknown command '", command, "'"));
  }
  const int timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms < 1) return harrier::Usage("--timeout_ms must be >= 1");
  const std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  if (addresses.empty()) return harrier::Usage("--servers (or HARRIER_SERVERS) is empty");

  harrier::TlsFiles tls;
  tls.ca = absl::GetFlag(FLAGS_tls_ca);
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  auto credentials = harrier::MakeChannelCredentials(tls);
  if (!credentials.ok()) {
    std::fprintf(stderr, "harrier-ctl: %s\n", std::string(credentials.status().message()).c_str());
    return 2;
  }
  std::string token;
  // health sends no token, so a probe works without the token file.
  if (const std::string file = absl::GetFlag(FLAGS_auth_token_file);
      !file.empty() && command != "health") {
    auto read = harrier::ReadJobTokenFile(file);
    if (!read.ok()) {
      std::fprintf(stderr, "harrier-ctl: %s\n", std::string(read.status().message()).c_str());
      return 2;
    }
    token = *read;
  }
  std::vector<harrier::Shard> shards;
  for (size_t i = 0; i < addresses.size(); ++i) {
    harrier::Shard shard;
    shard.index = static_cast<int>(i);
    shard.address = addresses[i];
    shard.name = absl::StrCat("shard ", i, " (", addresses[i], ")");
    // A channel of its own per shard and no retries: a dead shard fails its
    // call at once (connection refused) rather than at the deadline.
    grpc::ChannelArguments channel_args;
    channel_args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    shard.channel = grpc::CreateCustomChannel(addresses[i], *credentials, channel_args);
    shard.admin = harrier::proto::AdminService::NewStub(shard.channel);
    shards.push_back(std::move(shard));
  }
  harrier::Ctl ctl(std::move(shards), std::move(token), absl::Milliseconds(timeout_ms));
  if (command == "status") return harrier::Status(ctl, absl::GetFlag(FLAGS_json));
  if (command == "health") return harrier::Health(ctl);
  if (command == "checkpoint") return harrier::Checkpoint(ctl);
  if (command == "new-run") return harrier::NewRun(ctl);
  return harrier::Shutdown(ctl);
}
