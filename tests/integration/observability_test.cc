// What a real harrier-server tells its operator: one key=value log line per
// registration, rejoin, leave, lost worker, checkpoint and restore, and the
// metrics that count them (harrier_server_active_workers, the push latency
// of PushPull, harrier_server_checkpoint_age_seconds after a restore).
// Each wait has a deadline.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier {
namespace {

constexpr size_t kElements = 1024;

// Polls `condition` every 20 ms for at most `timeout`; its last answer.
bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string ReadAll(const std::string& path) {
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// The first (or last) log line of `path` containing `fragment` ("" if none).
std::string LogLine(const std::string& path, const std::string& fragment, bool last = false) {
  std::istringstream log(ReadAll(path));
  std::string line, found;
  while (std::getline(log, line)) {
    if (line.find(fragment) == std::string::npos) continue;
    if (!last) return line;
    found = line;
  }
  return found;
}

bool Logged(const std::string& path, const std::string& fragment) {
  return !LogLine(path, fragment).empty();
}

// The value of `key=` in a key=value line (-1: absent).
double Field(const std::string& line, const std::string& key) {
  const size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return -1;
  return std::stod(line.substr(at + key.size() + 2));
}

ClientOptions Options(const std::string& address, int rank) {
  ClientOptions options;
  options.servers = {address};
  options.rank = rank;
  options.worker_name = absl::StrCat("observer-", rank);
  options.rpc_timeout = absl::Seconds(10);
  options.heartbeat_interval = absl::Milliseconds(200);
  return options;
}

std::unique_ptr<Client> Connect(const std::string& address, int rank) {
  auto client = Client::Create(Options(address, rank));
  REQUIRE(client.ok());
  REQUIRE((*client)->RegisterTensor("w", {static_cast<int64_t>(kElements)}).ok());
  return std::move(*client);
}

struct Shard {
  std::unique_ptr<testing::ServerProcess> server;
  int metrics_port = 0;
  std::string log;
};

Shard StartShard(const std::string& log_name, std::vector<std::string> extra) {
  Shard shard;
  shard.metrics_port = testing::FreePort();
  shard.log = absl::StrCat(testing::TempDir(), "/", log_name);
  std::filesystem::remove(shard.log);
  std::vector<std::string> flags = {
      "--shard=0",  "--num_shards=1", "--num_workers=2",
      "--sync=asp", "--lr=1",         absl::StrCat("--metrics_port=", shard.metrics_port)};
  flags.insert(flags.end(), extra.begin(), extra.end());
  auto server = testing::ServerProcess::Start(flags, shard.log);
  REQUIRE(server.ok());
  shard.server = std::move(*server);
  REQUIRE(WaitFor(
      [&] { return testing::MetricValue(shard.metrics_port, "harrier_server_active_workers") >= 0; }));
  return shard;
}

void Stop(Shard& shard) {
  shard.server->process().Signal(SIGTERM);
  REQUIRE(shard.server->process().WaitForExit(20000) == 0);
}

TEST_CASE("observability: registrations, a PushPull, a leave and checkpoints, then a restore") {
  const std::string dir = absl::StrCat(testing::TempDir(), "/observability-checkpoints");
  std::filesystem::remove_all(dir);
  Shard shard = StartShard(
      "observability-first.log",
      {"--checkpoint_dir=" + dir, "--checkpoint_every_s=1", "--heartbeat_timeout_ms=60000"});
  const int metrics = shard.metrics_port;
  // Configured for two workers, none registered yet.
  REQUIRE(testing::MetricValue(metrics, "harrier_server_active_workers") == 0);

  std::unique_ptr<Client> first = Connect(shard.server->address(), 0);
  std::unique_ptr<Client> second = Connect(shard.server->address(), 1);
  REQUIRE(testing::MetricValue(metrics, "harrier_server_active_workers") == 2);
  for (int rank = 0; rank < 2; ++rank) {
    Client& client = rank == 0 ? *first : *second;
    const std::string line = LogLine(
        shard.log, absl::StrCat("event=register shard=0 rank=", rank,
                                " epoch=", client.session_epoch(), " worker=observer-", rank));
    INFO(ReadAll(shard.log));
    REQUIRE_FALSE(line.empty());
  }

  // A PushPull is a push as far as the push metrics go.
  REQUIRE(testing::MetricValue(metrics, "harrier_server_push_seconds_count") == 0);
  const std::vector<float> gradient(kElements, 2.0f);
  std::vector<float> w(kElements);
  REQUIRE(first->PushPull("w", gradient, absl::MakeSpan(w)).ok());
  REQUIRE(w[0] == -1.0f);  // ASP, lr 1, scaled 1/2
  REQUIRE(testing::MetricValue(metrics, "harrier_server_pushes_total") == 1);
  REQUIRE(testing::MetricValue(metrics, "harrier_server_push_seconds_count") == 1);
  REQUIRE(testing::MetricValue(metrics, "harrier_server_push_seconds_sum") > 0);
  REQUIRE(testing::MetricValue(metrics, "harrier_server_pull_seconds_count") == 1);

  second->Clock();
  second->Clock();
  REQUIRE(second->Leave().ok());
  REQUIRE(testing::MetricValue(metrics, "harrier_server_active_workers") == 1);
  {
    INFO(ReadAll(shard.log));
    REQUIRE(Logged(shard.log, "event=leave shard=0 rank=1 clock=2 present=1"));
  }

  // --checkpoint_every_s=1: a checkpoint of the tensor within a few
  // seconds, logged (an earlier one may have found the shard empty).
  const std::string kCheckpoint = "event=checkpoint shard=0 version=";
  REQUIRE(WaitFor([&] { return Field(LogLine(shard.log, kCheckpoint, true), "chunks") == 1; }));
  const std::string checkpoint = LogLine(shard.log, kCheckpoint, true);
  INFO(checkpoint);
  REQUIRE(Field(checkpoint, "version") >= 1);
  REQUIRE(Field(checkpoint, "bytes") > kElements * sizeof(float));
  REQUIRE(Field(checkpoint, "seconds") >= 0);
  const double age = testing::MetricValue(metrics, "harrier_server_checkpoint_age_seconds");
  REQUIRE(age >= 0);
  REQUIRE(age < 5);

  first.reset();
  second.reset();
  Stop(shard);
  // The final checkpoint, at shutdown, is the newest one.
  const std::string last = LogLine(shard.log, kCheckpoint, true);
  REQUIRE(Field(last, "chunks") == 1);
  const int version = static_cast<int>(Field(last, "version"));
  REQUIRE(version > static_cast<int>(Field(checkpoint, "version")));

  // Restarted on the same directory after 1.5 s: the shard serves state that
  // old, and says so.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  Shard restarted = StartShard("observability-restarted.log",
                               {"--checkpoint_dir=" + dir, "--resume", "--heartbeat_timeout_ms=60000"});
  const std::string restore =
      LogLine(restarted.log, absl::StrCat("event=restore shard=0 version=", version, " chunks=1 "));
  {
    INFO(ReadAll(restarted.log));
    REQUIRE_FALSE(restore.empty());
  }
  REQUIRE(Field(restore, "age_seconds") >= 1.5);
  const double restored_age =
      testing::MetricValue(restarted.metrics_port, "harrier_server_checkpoint_age_seconds");
  REQUIRE(restored_age >= 1.5);
  REQUIRE(restored_age < 60);
  REQUIRE(testing::MetricValue(restarted.metrics_port, "harrier_server_active_workers") == 0);
  Stop(restarted);
}

TEST_CASE("observability: a silent worker is logged lost, and its re-registration a rejoin") {
  Shard shard = StartShard("observability-loss.log",
                           {"--heartbeat_timeout_ms=600", "--on_worker_loss=continue"});
  const int metrics = shard.metrics_port;
  uint64_t first_epoch = 0;
  {
    std::unique_ptr<Client> client = Connect(shard.server->address(), 1);
    first_epoch = client->session_epoch();
    REQUIRE(client->Heartbeat().ok());
    REQUIRE(testing::MetricValue(metrics, "harrier_server_active_workers") == 1);
  }  // gone without Leave: the shard only stops hearing from it
  REQUIRE(WaitFor([&] { return Logged(shard.log, "event=worker_lost shard=0 rank=1 "); }));
  const std::string lost = LogLine(shard.log, "event=worker_lost shard=0 rank=1 ");
  INFO(lost);
  REQUIRE(Field(lost, "last_heartbeat_ms") > 600);
  REQUIRE(lost.find(" timeout_ms=600 policy=continue present=0") != std::string::npos);
  REQUIRE(testing::MetricValue(metrics, "harrier_server_active_workers") == 0);

  // The same rank registers again: a rejoin under a new epoch.
  auto again = Client::Create(Options(shard.server->address(), 1));
  REQUIRE(again.ok());
  const uint64_t epoch = (*again)->session_epoch();
  REQUIRE(epoch > first_epoch);
  {
    INFO(ReadAll(shard.log));
    REQUIRE(Logged(shard.log, absl::StrCat("event=rejoin shard=0 rank=1 epoch=", epoch,
                                           " previous_epoch=", first_epoch, " worker=observer-1")));
  }
  again->reset();
  Stop(shard);
}

}  // namespace
}  // namespace harrier
