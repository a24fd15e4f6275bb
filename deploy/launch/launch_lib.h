#ifndef HARRIER_DEPLOY_LAUNCH_LAUNCH_LIB_H_
#define HARRIER_DEPLOY_LAUNCH_LAUNCH_LIB_H_

// The parts of harrier-launch that are pure functions: its flags and what
// they mean, host list parsing, shell quoting, and the plan of which process
// runs where.

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

// harrier-launch's flags (absl flags, parsed by harrier::ParseFlags, so each
// can also come from a --flagfile or HARRIER_<NAME>). -H is --hosts; see
// SpellOutShortHosts.
ABSL_DECLARE_FLAG(std::string, hosts);
ABSL_DECLARE_FLAG(std::string, hostfile);
ABSL_DECLARE_FLAG(int, num_servers);
ABSL_DECLARE_FLAG(int, base_port);
ABSL_DECLARE_FLAG(std::string, bin_dir);
ABSL_DECLARE_FLAG(std::string, server_bin);
ABSL_DECLARE_FLAG(std::string, worker_bin);
ABSL_DECLARE_FLAG(std::string, ssh);
ABSL_DECLARE_FLAG(std::string, ssh_args);
ABSL_DECLARE_FLAG(std::string, server_args);
ABSL_DECLARE_FLAG(int, grace_ms);
ABSL_DECLARE_FLAG(int, start_timeout_ms);
ABSL_DECLARE_FLAG(bool, dry_run);

namespace harrier::launch {

struct HostSlots {
  std::string host;
  int slots = 0;
};

struct Options {
  std::vector<HostSlots> hosts;
  int num_servers = 0;  // 0: one per host
  int base_port = 50051;
  std::string bin_dir;  // empty: next to harrier-launch
  std::string server_bin, worker_bin;
  std::string ssh = "ssh";
  std::vector<std::string> ssh_args;
  std::vector<std::string> server_args;
  std::vector<std::string> worker_args;
  int grace_ms = 10000;
  int start_timeout_ms = 60000;
  bool dry_run = false;
};

// "host1:2,host2:1". One-line errors for an empty list, a missing or
// non-positive slot count, an empty host name.
absl::StatusOr<std::vector<HostSlots>> ParseHostList(const std::string& list);

// Hostfile text: lines "host slots=N" or "host:N"; '#' starts a comment.
absl::StatusOr<std::vector<HostSlots>> ParseHostfile(const std::string& text,
                                                     const std::string& path);

// The command line with -H's forms ("-H LIST", "-HLIST", "-H=LIST") spelled
// as --hosts, for absl, which has no short flags. Arguments after "--", and
// the value of a flag given as "--name VALUE", stay as they are.
std::vector<std::string> SpellOutShortHosts(const std::vector<std::string>& args);

// The options the launcher's flags (already parsed) describe, with
// `worker_args` (what followed "--"). One-line errors for values out of
// range, no hosts or both -H and --hostfile, an unreadable hostfile, and
// flags the launcher sets itself given in the worker or server flags.
absl::StatusOr<Options> OptionsFromFlags(const std::vector<std::string>& worker_args);

// Splits like sh would for words, '...' and "..." quotes and backslashes;
// no expansions.
absl::StatusOr<std::vector<std::string>> ShellSplit(const std::string& text);

// One argument quoted for sh ('...' unless it only has safe characters).
std::string ShellQuote(const std::string& arg);
std::string ShellJoin(const std::vector<std::string>& args);

// localhost and 127.0.0.1 run without ssh.
bool IsLocalHost(const std::string& host);

// Fills server_bin and worker_bin from bin_dir, or from self_dir (the
// directory of harrier-launch) and, as in bazel-bin, self_dir/../../server.
absl::Status ResolveBinaries(Options& options, const std::string& self_dir);

struct PlannedProcess {
  int index = 0;  // shard index or worker rank
  size_t host = 0;  // index into Options::hosts
  int port = 0;  // shards only
  std::vector<std::string> command;  // the harrier-* command line
};

struct JobPlan {
  std::vector<PlannedProcess> shards;
  std::vector<PlannedProcess> workers;
};

// Shards round-robin over the hosts on base_port+i; workers one per slot,
// ranks in host order.
JobPlan MakePlan(const Options& options);

}  // namespace harrier::launch

#endif  // HARRIER_DEPLOY_LAUNCH_LAUNCH_LIB_H_
