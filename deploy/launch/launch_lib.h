#ifndef HARRIER_DEPLOY_LAUNCH_LAUNCH_LIB_H_
#define HARRIER_DEPLOY_LAUNCH_LAUNCH_LIB_H_

// The parts of harrier-launch that are pure functions: its flags and what
// they mean, host list parsing, shell quoting, and the plan of which process
// runs where, with what command line and environment.

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

// harrier-launch's flags (absl flags, parsed by harrier::ParseFlags, so each
// can also come from a --flagfile or HARRIER_<NAME>). -H is --hosts and -np
// is --np; see SpellOutShortFlags.
ABSL_DECLARE_FLAG(std::string, hosts);
ABSL_DECLARE_FLAG(std::string, hostfile);
ABSL_DECLARE_FLAG(int, np);
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
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(std::string, timeline_filename);

namespace harrier::launch {

struct HostSlots {
  std::string host;
  int slots = 0;
};

struct Options {
  // The hosts that run workers, each with the number it runs (-np already
  // applied: hosts past the N-th slot are left out).
  std::vector<HostSlots> hosts;
  int num_servers = 0;           // 0: one per host
  int base_port = 50051;         // 0: shard_ports, chosen by the launcher
  std::vector<int> shard_ports;  // when not empty, shard i's port (else base_port + i)
  std::string bin_dir;           // empty: next to harrier-launch
  std::string server_bin, worker_bin;
  std::string ssh = "ssh";
  std::vector<std::string> ssh_args;
  std::vector<std::string> server_args;
  // What followed "--": harrier-worker's flags (worker_args), or a command
  // run once per worker slot instead of harrier-worker (command, when its
  // first word does not start with '-'). At most one of them is non-empty.
  std::vector<std::string> worker_args;
  std::vector<std::string> command;
  // TLS and the job token, absolute paths (empty: not given). Passed to the
  // shards and harrier-worker as the flags of the same names, to a command
  // as HARRIER_TLS_CA, HARRIER_TLS_CERT, HARRIER_TLS_KEY and
  // HARRIER_AUTH_TOKEN_FILE.
  std::string tls_ca, tls_cert, tls_key, auth_token_file;
  // --timeline_filename, absolute (empty: none): harrier-worker's
  // --timeline, a command's HARRIER_TIMELINE.
  std::string timeline;
  // The launcher's current folder: a remote command runs there.
  std::string workdir;
  // The launcher's OMP_NUM_THREADS (empty: unset). A command gets it as it
  // is; unset, a command sharing its host with other workers gets 1, as
  // torchrun does, so that N processes do not each start a compute thread
  // per core (OpenBLAS, which Debian's PyTorch uses, also takes its thread
  // count from it).
  std::string omp_num_threads;
  int grace_ms = 10000;
  int start_timeout_ms = 60000;
  bool dry_run = false;

  bool RunsCommand() const { return !command.empty(); }
};

// "host1:2,host2:1". One-line errors for an empty list, a missing or
// non-positive slot count, an empty host name.
absl::StatusOr<std::vector<HostSlots>> ParseHostList(const std::string& list);

// Hostfile text: lines "host slots=N" or "host:N"; '#' starts a comment.
absl::StatusOr<std::vector<HostSlots>> ParseHostfile(const std::string& text,
                                                     const std::string& path);

// The command line with -H's forms ("-H LIST", "-HLIST", "-H=LIST") spelled
// as --hosts and -np's ("-np N", "-npN", "-np=N") as --np, for absl, which
// has no short flags. Arguments after "--", and the value of a flag given as
// "--name VALUE", stay as they are.
std::vector<std::string> SpellOutShortFlags(const std::vector<std::string>& args);

// The first `np` slots of `hosts` in order (np 0: all of them); hosts left
// without a slot are dropped. `where` names the host list in the error for
// an np larger than the slots.
absl::StatusOr<std::vector<HostSlots>> TakeSlots(const std::vector<HostSlots>& hosts, int np,
                                                 const std::string& where);

// The options the launcher's flags (already parsed) describe, with
// `after_dashes` (what followed "--": harrier-worker flags or a command) and
// `cwd` (the launcher's current folder, which relative TLS and token paths
// are taken from). -np N without -H or --hostfile is localhost:N. One-line
// errors for values out of range, no hosts or both -H and --hostfile, an
// unreadable hostfile, -np beyond the slots, TLS or token files that cannot
// be read when every host is local, and flags the launcher sets itself
// given in the worker or server flags.
absl::StatusOr<Options> OptionsFromFlags(const std::vector<std::string>& after_dashes,
                                         const std::string& cwd);

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
// When the options run a command, harrier-worker is not needed and
// worker_bin stays as it is.
absl::Status ResolveBinaries(Options& options, const std::string& self_dir);

using EnvVars = std::vector<std::pair<std::string, std::string>>;

struct PlannedProcess {
  int index = 0;                     // shard index or worker rank
  size_t host = 0;                   // index into Options::hosts
  int port = 0;                      // shards only
  std::vector<std::string> command;  // the harrier-* command line, or the user's command
  // Set in the process's environment on top of the launcher's (locally) or
  // the ssh session's (remotely): the job, for a user's command.
  EnvVars env;
  // Where a remote process runs (empty: where ssh starts it, the home
  // folder). Local processes run in the launcher's current folder.
  std::string workdir;
};

struct JobPlan {
  std::vector<PlannedProcess> shards;
  std::vector<PlannedProcess> workers;
  // Hosts whose commands got OMP_NUM_THREADS=1 because several workers
  // share them and the launcher's environment did not say (in host order).
  std::vector<std::string> one_thread_hosts;
};

// Shards round-robin over the hosts on base_port+i (or shard_ports[i]);
// workers one per slot, ranks in host order: harrier-worker with --servers,
// --num_workers, --rank (and the TLS flags), or the user's command with the
// job in HARRIER_SERVERS, HARRIER_NUM_SHARDS, HARRIER_NUM_WORKERS,
// HARRIER_RANK, HARRIER_LOCAL_RANK, HARRIER_LOCAL_SIZE (and the TLS
// variables), and OMP_NUM_THREADS (Options::omp_num_threads).
JobPlan MakePlan(const Options& options);

// "NAME=value ... command args", shell-quoted: what a process runs, as
// --dry_run prints it.
std::string CommandWithEnv(const PlannedProcess& process);

}  // namespace harrier::launch

#endif  // HARRIER_DEPLOY_LAUNCH_LAUNCH_LIB_H_
