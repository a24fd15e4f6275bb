#include "tests/integration/kill_restart.h"

#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "testing/server_process.h"
#include "worker/client.h"

namespace harrier::testing {
namespace {

constexpr size_t kElements = 16;

ClientOptions Options(const std::string& address, int rank, const std::string& transport) {
  ClientOptions options;
  options.servers = {address};
  options.rank = rank;
  options.transport = transport;
  options.rpc_timeout = absl::Seconds(20);
  options.retry_timeout = absl::Seconds(20);
  return options;
}

}  // namespace

KillRestartResult RunKillAndRestart(const std::string& transport,
                                    const std::vector<std::string>& extra_server_flags,
                                    int iterations, int kill_at,
                                    const std::vector<std::string>& restart_flags) {
  KillRestartResult result;
  result.iterations = iterations;
  result.worker_errors.assign(2, "");
  static std::atomic<int> run{0};
  const std::string dir = absl::StrCat(TempDir(), "/checkpoints-", transport, "-", run++);
  std::vector<std::string> flags = {
      "--shard=0", "--num_shards=1", "--num_workers=2", "--lr=1", "--sync=bsp",
      absl::StrCat("--port=", FreePort()), "--checkpoint_dir=" + dir, "--resume", "--checkpoint_every_s=1"};
  flags.insert(flags.end(), extra_server_flags.begin(), extra_server_flags.end());
  auto server = ServerProcess::Start(flags);
  if (!server.ok()) {
    result.worker_errors = {server.status().ToString(), ""};
    return result;
  }
  const std::string address = (*server)->address();

  const auto start = std::chrono::steady_clock::now();
  const auto seconds_since_start = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::atomic<int> progress{0};
  std::vector<std::thread> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      absl::Status status;
      auto client = Client::Create(Options(address, rank, transport));
      if (!client.ok()) status = client.status();
      if (status.ok()) status = (*client)->RegisterTensor("w", {kElements});
      std::vector<float> w(kElements), g(kElements, 1.0f);
      for (int t = 0; t < iterations && status.ok(); ++t) {
        status = (*client)->PushPull("w", g, absl::MakeSpan(w));
        (*client)->Clock();
        if (rank == 0 && status.ok()) progress = t + 1;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!status.ok()) {
        result.worker_errors[rank] = absl::StrCat(status.ToString(), " (at ",
                                                  seconds_since_start(), " s)");
      }
      if (rank == 0 && client.ok()) {
        result.data_paths_at_end = absl::StrJoin((*client)->data_paths(), ",");
      }
    });
  }
  // Let a checkpoint or two be written, then kill the shard hard (bounded:
  // 30 iterations take about 2 s; a stuck worker must not hang the test).
  while (progress < kill_at && result.worker_errors[0].empty() && seconds_since_start() < 60) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  result.killed_at = progress;
  (*server)->process().Signal(SIGKILL);
  (*server)->process().WaitForExit(5000);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double killed_s = seconds_since_start();
  flags.insert(flags.end(), restart_flags.begin(), restart_flags.end());
  auto restarted = ServerProcess::Start(flags);
  const double restarted_s = seconds_since_start();
  for (auto& worker : workers) worker.join();
  result.completed = progress;
  result.timeline = absl::StrCat("killed at ", killed_s, " s, restarted by ", restarted_s,
                                 " s (", restarted.ok() ? "ok" : restarted.status().ToString(),
                                 "), workers done at ", seconds_since_start(), " s");
  if (!restarted.ok()) return result;

  // Every applied round subtracts exactly 1 from the parameter.
  auto reader = Client::Create(Options(address, 0, transport));
  if (!reader.ok() || !(*reader)->RegisterTensor("w", {kElements}).ok()) return result;
  std::vector<float> w(kElements);
  for (int t = 0; t < iterations; ++t) (*reader)->Clock();
  if (!(*reader)->Pull("w", absl::MakeSpan(w)).ok()) return result;
  result.rounds_applied = static_cast<int>(-w[0]);
  result.final_value_exact = w[0] == -static_cast<float>(result.rounds_applied);
  return result;
}

}  // namespace harrier::testing
