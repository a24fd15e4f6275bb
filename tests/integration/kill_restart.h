#ifndef HARRIER_TESTS_INTEGRATION_KILL_RESTART_H_
#define HARRIER_TESTS_INTEGRATION_KILL_RESTART_H_

#include <string>
#include <vector>

namespace harrier::testing {

// What happened in one kill-and-restart run.
struct KillRestartResult {
  std::vector<std::string> worker_errors;  // empty strings: the worker finished
  int iterations = 0;                      // each worker's target
  int killed_at = 0;                       // rank 0's iteration at the SIGKILL
  int completed = 0;                       // rank 0's iterations done
  int rounds_applied = -1;                 // read back after training (-1: read failed)
  bool final_value_exact = false;          // the parameter is exactly -rounds_applied
  std::string timeline;                    // when the kill, the restart and the end happened
  std::string data_paths_at_end;           // rank 0's Client::data_paths() after training
};

// One shard with checkpoints every second on a fixed port, two BSP workers
// (threads, each its own Client over `transport`) pushing a gradient of 1
// for `iterations` rounds; the shard is SIGKILLed at iteration
// `kill_at` and restarted with the same flags (`extra_server_flags` added,
// e.g. --ucx; `restart_flags` added after them at the restart only).
// Workers retry while it is down.
KillRestartResult RunKillAndRestart(const std::string& transport,
                                    const std::vector<std::string>& extra_server_flags,
                                    int iterations = 60, int kill_at = 30,
                                    const std::vector<std::string>& restart_flags = {});

}  // namespace harrier::testing

#endif  // HARRIER_TESTS_INTEGRATION_KILL_RESTART_H_
