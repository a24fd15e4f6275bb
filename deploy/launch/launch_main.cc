// harrier-launch: starts a job's shards and workers on many hosts over ssh,
// streams their output with a per-process prefix and tears everything down
// when one fails or the launcher is interrupted. See deploy/launch/README.md.
//
// One thread, one poll() loop: every child's stdout and stderr pipe plus a
// self-pipe the signal handlers write to. Nothing here blocks without a
// deadline, so a hung host or process cannot hang the launcher.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/flags.h"
#include "deploy/launch/launch_lib.h"

namespace harrier::launch {
namespace {

constexpr char kUsage[] = R"(harrier-launch: run a Harrier job on many hosts over ssh.

Usage:
  harrier-launch (-H host1:slots,host2:slots | --hostfile=FILE | -np N) [options] -- [harrier-worker flags...]
  harrier-launch (-H ... | --hostfile=FILE | -np N) [options] -- COMMAND [ARGS...]

Examples:
  harrier-launch -H node1:2,node2:2 --server_args="--lr=0.05" -- --epochs=5
  harrier-launch -np 4 -H a:2,b:2 -- python3 train.py
  harrier-launch -np 2 -- python3 train.py --epochs 3      (everything on this host)

Hosts:
  -H host:slots,...     (or --hosts=) Hosts in order; slots = workers on that host (>= 1).
  --hostfile=FILE       One host per line, "host slots=N" or "host:N"; '#' starts a comment.
                        A host named localhost or 127.0.0.1 runs its processes locally, without
                        ssh (then every process must be local: workers reach shards by host name).
  -np N                 (also -npN, -np=N, --np=N) N workers: ranks fill the slots in host order
                        up to N (hosts past the N-th slot are not used; more than the slots is an
                        error). Without -H or --hostfile: localhost:N.

Processes:
  Workers: one per slot, ranks 0.. in host order. After "--", harrier-worker's flags (or
    nothing): each runs harrier-worker
    --servers=<every shard's host:port> --num_workers=<workers> --rank=R [TLS flags]
    followed by those flags. A COMMAND instead (the first word after "--" is no flag) runs once
    per slot in place of harrier-worker, with the job in its environment:
      HARRIER_SERVERS      every shard's host:port, comma-separated, shard 0 first
      HARRIER_NUM_SHARDS   HARRIER_NUM_WORKERS (all workers)   HARRIER_RANK (0..N-1)
      HARRIER_LOCAL_RANK   (index on its host)   HARRIER_LOCAL_SIZE (workers on its host)
      HARRIER_TLS_CA, HARRIER_TLS_CERT, HARRIER_TLS_KEY, HARRIER_AUTH_TOKEN_FILE (when given)
      HARRIER_TIMELINE     --timeline_filename, when given
      OMP_NUM_THREADS      the launcher's own; unset, 1 on a host running several workers
    Locally it runs in the launcher's current folder, found on PATH; over ssh it runs in the
    same folder on the remote host (hosts sharing a file system), else in the ssh login folder.
  Shards: --num_servers of them (default: one per host used), shard i on host i mod (number
    of hosts), port base_port+i (--base_port=0: free ports, every host local), started with
    --shard=i --num_shards=N --num_workers=<workers> --port=P --host=0.0.0.0 [TLS flags] <--server_args>.
  Every shard is started first; the workers start once each shard accepts a TCP connection
  (deadline --start_timeout_ms).
  TLS and the job token: --tls_ca, --tls_cert, --tls_key, --auth_token_file (paths that exist on
  every host) go to every shard and harrier-worker as the same flags, to a COMMAND as the
  variables above.
  Timeline: --timeline_filename=PATH (also horovodrun's --timeline-filename) has every worker
  record a Chrome trace of its pushes, pulls and waits: harrier-worker as --timeline=PATH, a
  COMMAND as HARRIER_TIMELINE (harrier.torch). '{rank}' in PATH: one file per worker;
  without it rank 0's alone.

Output: each line of each process's stdout (to stdout) and stderr (to stderr), prefixed
"[shard-0@host] " or "[worker-3@host] "; the launcher's own lines start with "[launch] ".

Failure: when any process exits non-zero, or on SIGINT/SIGTERM, the launcher prints
  [launch] worker-3@host exited with status 1: tearing down
(or "signal 2 received: tearing down"), sends SIGTERM to every remaining process (and its
children, as a process group) on its host (remote ones through a small sh wrapper that also
kills the process when its ssh session closes): the workers first, the shards once the workers
are gone or half of --grace_ms has passed; at --grace_ms it SIGKILLs what is left. A second
signal skips the grace time.
Exit status: 0 when every worker exited 0 (then the shards get --grace_ms to exit by
themselves, then SIGTERM), otherwise 1; 2 for bad arguments (1 for an unknown flag or a
value of the wrong type, which absl reports). A shard that exits 0 before
the last worker is a failure only if a worker still runs --grace_ms later.
)";

// The sh wrapper a remote command runs under. Without a pty, closing the ssh
// session does not signal the remote process, so the wrapper keeps the
// process's pid and acts on what the launcher writes to ssh's stdin: "TERM"
// or "KILL" lines, or end of file (the launcher or its ssh died), which
// means SIGTERM, then SIGKILL after the grace time. Where setsid(1) exists
// the process leads a process group of its own and the signals go to the
// group, so that a command's children (a training script's data loaders)
// end with it. $1 is that grace time in seconds, $2 the folder to run in
// (empty: stay in the login folder); the rest is the command. The watcher's
// output goes to /dev/null so that only the process itself holds the
// session's stdout and stderr open.
constexpr char kRemoteWrapper[] =
    "g=$1; d=$2; shift 2; "
    "if [ -n \"$d\" ] && ! cd \"$d\" 2>/dev/null; then "
    "echo \"harrier-launch: no folder $d on this host: running in $(pwd)\" >&2; fi; "
    "exec 3<&0; "
    "if command -v setsid >/dev/null 2>&1; then setsid \"$@\" </dev/null 3<&- & c=$!; t=-$c; "
    "else \"$@\" </dev/null 3<&- & c=$!; t=$c; fi; "
    "{ while read -r m; do "
    "if [ \"$m\" = KILL ]; then kill -KILL $t; else kill -TERM $t; fi; done; "
    "kill -TERM $t; sleep $g; kill -KILL $t; } <&3 >/dev/null 2>&1 & w=$!; "
    "exec 3<&-; wait $c; r=$?; kill $w 2>/dev/null; exit $r";

int signal_pipe[2] = {-1, -1};

void OnSignal(int signo) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  (void)!write(signal_pipe[1], &byte, 1);
  errno = saved;
}

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

void LaunchLine(const std::string& text) {
  const std::string line = absl::StrCat("[launch] ", text, "\n");
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

// One child of the launcher: a local harrier-* process or the ssh client
// that runs one remotely.
struct Proc {
  std::string name;  // "worker-3@host"
  std::string host;
  bool is_shard = false;
  bool remote = false;
  std::vector<std::string> argv;  // what is exec'd here
  EnvVars env;                    // set in a local child's environment
  std::string shown;              // its command line as --dry_run prints it
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1, in_fd = -1;  // in_fd: ssh's stdin (remote only)
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;  // raw waitpid status
  bool signalled_by_us = false;
};

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "ended";
}
bool Succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

absl::Status Spawn(Proc& p) {
  int out[2], err[2], in[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  std::vector<char*> args;
  for (auto& a : p.argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Its own process group: a Ctrl-C at the terminal reaches only the
    // launcher, which then tears down in order.
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // The launcher is single-threaded, so setenv after fork is safe.
    for (const auto& [name, value] : p.env) setenv(name.c_str(), value.c_str(), 1);
    if (p.remote) {
      dup2(in[0], STDIN_FILENO);
    } else {
      const int devnull = open("/dev/null", O_RDONLY);
      dup2(devnull, STDIN_FILENO);
    }
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execvp(args[0], args.data());
    const std::string msg = absl::StrCat("cannot run ", p.argv[0], ": ", strerror(errno), "\n");
    (void)!write(STDERR_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  // Also here, so that a signal to the group right after fork finds it.
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  close(in[0]);
  p.pid = pid;
  p.out_fd = out[0];
  p.err_fd = err[0];
  SetNonBlocking(p.out_fd);
  SetNonBlocking(p.err_fd);
  if (p.remote) {
    p.in_fd = in[1];
  } else {
    close(in[1]);
  }
  return absl::OkStatus();
}

// Writes every complete line in `buf` to `fd` with the prefix, one write()
// per line so lines from different processes never mix.
void EmitLines(std::string& buf, const std::string& prefix, int fd, bool flush_partial) {
  size_t start = 0;
  for (;;) {
    const size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    const std::string line = absl::StrCat(prefix, buf.substr(start, nl - start + 1));
    (void)!write(fd, line.data(), line.size());
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flush_partial && !buf.empty()) {
    const std::string line = absl::StrCat(prefix, buf, "\n");
    (void)!write(fd, line.data(), line.size());
    buf.clear();
  }
}

// Reads what is available on *fd; closes it at end of file.
void Drain(int* fd, std::string& buf, const std::string& prefix, int out) {
  if (*fd < 0) return;
  char chunk[65536];
  for (;;) {
    const ssize_t n = read(*fd, chunk, sizeof(chunk));
    if (n > 0) {
      buf.append(chunk, n);
      EmitLines(buf, prefix, out, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    EmitLines(buf, prefix, out, true);
    close(*fd);
    *fd = -1;
    return;
  }
}

// One TCP connect attempt with a deadline: true once something listens.
bool CanConnect(const std::string& host, int port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool ok = false;
  for (addrinfo* ai = res; ai != nullptr && !ok; ai = ai->ai_next) {
    const int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd pfd{s, POLLOUT, 0};
      if (poll(&pfd, 1, timeout_ms) == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
        ok = err == 0;
      }
    }
    close(s);
  }
  freeaddrinfo(res);
  return ok;
}

class Launcher {
 public:
  explicit Launcher(const Options& options) : opt_(options) {}

  std::vector<std::string> SshArgv(const std::string& host) const {
    std::vector<std::string> argv = {opt_.ssh};
    for (const auto& a : opt_.ssh_args) argv.push_back(a);
    // Options the user gave come first: for -o, ssh keeps the first value.
    for (const char* a : {"-o", "BatchMode=yes", "-o", "ConnectTimeout=10"}) argv.push_back(a);
    argv.push_back(host);
    argv.push_back("--");
    return argv;
  }

  // The process as a child of the launcher: itself (locally, its variables
  // set by Spawn) or the ssh client running it under kRemoteWrapper, its
  // variables set by env(1).
  Proc MakeProc(const std::string& name, const std::string& host,
                const PlannedProcess& planned) const {
    Proc p;
    p.name = absl::StrCat(name, "@", host);
    p.host = host;
    p.remote = !IsLocalHost(host);
    if (!p.remote) {
      p.argv = planned.command;
      p.env = planned.env;
      p.shown = CommandWithEnv(planned);
      return p;
    }
    p.argv = SshArgv(host);
    std::vector<std::string> remote = {"sh",
                                       "-c",
                                       kRemoteWrapper,
                                       "harrier-launch-wrapper",
                                       absl::StrCat(opt_.grace_ms / 1000.0),
                                       planned.workdir};
    if (!planned.env.empty()) {
      remote.push_back("env");
      for (const auto& [var, value] : planned.env) remote.push_back(absl::StrCat(var, "=", value));
    }
    for (const auto& a : planned.command) remote.push_back(a);
    p.argv.push_back(ShellJoin(remote));
    p.shown = ShellJoin(p.argv);
    return p;
  }

  void Plan() {
    const JobPlan plan = MakePlan(opt_);
    if (!plan.one_thread_hosts.empty()) {
      fprintf(stderr,
              "harrier-launch: OMP_NUM_THREADS=1 for each worker on %s, which runs several of "
              "them (export OMP_NUM_THREADS to choose another count)\n",
              absl::StrJoin(plan.one_thread_hosts, ", ").c_str());
    }
    for (const auto& s : plan.shards) {
      Proc p = MakeProc(absl::StrCat("shard-", s.index), opt_.hosts[s.host].host, s);
      p.is_shard = true;
      shard_ports_.push_back(s.port);
      procs_.push_back(std::move(p));
    }
    for (const auto& w : plan.workers) {
      procs_.push_back(MakeProc(absl::StrCat("worker-", w.index), opt_.hosts[w.host].host, w));
    }
  }

  void DryRun() const {
    for (const auto& p : procs_) {
      const std::string line = absl::StrCat("[", p.name, "] ", p.shown, "\n");
      (void)!write(STDOUT_FILENO, line.data(), line.size());
    }
  }

  // Before anything starts: every host answers over ssh and has the
  // binaries (harrier-server, and harrier-worker or a command given by its
  // path), so a typo in a host name fails in one line, not mid-start. A
  // command found on PATH (python3) is not checked.
  absl::Status CheckHosts() {
    std::vector<std::string> bins = {opt_.server_bin};
    std::string hint = "(see --bin_dir, --server_bin, --worker_bin)";
    std::string workdir;  // where a relative command path is looked up
    if (!opt_.RunsCommand()) {
      bins.push_back(opt_.worker_bin);
    } else {
      hint = "(see --bin_dir, --server_bin and the command after --)";
      if (opt_.command[0].find('/') != std::string::npos) bins.push_back(opt_.command[0]);
      workdir = opt_.workdir;
    }
    std::set<std::string> seen;
    for (const auto& h : opt_.hosts) {
      if (!seen.insert(h.host).second) continue;
      for (const std::string& bin : bins) {
        if (IsLocalHost(h.host) && access(bin.c_str(), X_OK) != 0) {
          return absl::NotFoundError(absl::StrCat(h.host, ": no executable ", bin, " ", hint));
        }
      }
      if (IsLocalHost(h.host)) continue;
      std::vector<std::string> check = {"sh", "-c",
                                        "[ -z \"$1\" ] || cd \"$1\" 2>/dev/null; shift; "
                                        "for b; do [ -x \"$b\" ] || { echo \"no executable $b\"; "
                                        "exit 3; }; done",
                                        "check", workdir};
      check.insert(check.end(), bins.begin(), bins.end());
      std::vector<std::string> argv = SshArgv(h.host);
      argv.push_back(ShellJoin(check));
      Proc p;
      p.argv = argv;
      p.remote = false;
      absl::Status st = Spawn(p);
      if (!st.ok()) return st;
      std::string out, err;
      const auto start = Clock::now();
      int status = 0;
      bool done = false;
      while (!done) {
        if (MsSince(start) > opt_.start_timeout_ms) {
          kill(p.pid, SIGKILL);
          waitpid(p.pid, &status, 0);
          return absl::DeadlineExceededError(
              absl::StrCat("cannot reach host ", h.host, " over ssh: no answer in ",
                           opt_.start_timeout_ms, " ms (--start_timeout_ms)"));
        }
        pollfd fds[2] = {{p.out_fd, POLLIN, 0}, {p.err_fd, POLLIN, 0}};
        poll(fds, 2, 100);
        ReadAll(&p.out_fd, out);
        ReadAll(&p.err_fd, err);
        if (p.out_fd < 0 && p.err_fd < 0) {
          waitpid(p.pid, &status, 0);
          done = true;
        }
      }
      if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
        return absl::NotFoundError(absl::StrCat(h.host, ": ", LastLine(out), " ", hint));
      }
      if (!Succeeded(status)) {
        const std::string why = LastLine(err).empty() ? DescribeStatus(status) : LastLine(err);
        return absl::UnavailableError(
            absl::StrCat("cannot reach host ", h.host, " over ssh: ", why));
      }
    }
    return absl::OkStatus();
  }

  int Run() {
    if (absl::Status st = CheckHosts(); !st.ok()) {
      LaunchLine(std::string(st.message()));
      return 1;
    }
    const size_t num_shards = shard_ports_.size();
    LaunchLine(absl::StrCat("starting ", num_shards, " shards and ", procs_.size() - num_shards,
                            " workers on ", opt_.hosts.size(), " hosts"));
    for (size_t i = 0; i < num_shards; ++i) {
      if (!StartProc(procs_[i])) return Finish();
    }
    // Shards first; the workers only once every shard accepts connections.
    std::vector<bool> ready(num_shards, false);
    size_t num_ready = 0;
    const auto start = Clock::now();
    while (num_ready < num_shards && !tearing_down_) {
      for (size_t i = 0; i < num_shards && !tearing_down_; ++i) {
        if (ready[i]) continue;
        const std::string& host = procs_[i].host;
        if (CanConnect(IsLocalHost(host) ? "127.0.0.1" : host, shard_ports_[i], 200)) {
          ready[i] = true;
          ++num_ready;
          LaunchLine(absl::StrCat(procs_[i].name, " is up on port ", shard_ports_[i]));
        }
      }
      if (num_ready == num_shards) break;
      if (MsSince(start) > opt_.start_timeout_ms) {
        for (size_t i = 0; i < num_shards; ++i) {
          if (!ready[i]) {
            Fail(absl::StrCat(procs_[i].name, " does not accept connections on port ",
                              shard_ports_[i], " after ", opt_.start_timeout_ms,
                              " ms (--start_timeout_ms): tearing down"));
            break;
          }
        }
        break;
      }
      PollOnce(100);
    }
    if (!tearing_down_) {
      for (size_t i = num_shards; i < procs_.size(); ++i) {
        if (!StartProc(procs_[i])) break;
      }
    }
    // Until every worker is done (or a failure).
    while (!tearing_down_ && !AllWorkersExited()) {
      PollOnce(early_shard_exit_ ? 100 : 1000);
      CheckEarlyShardExit();
    }
    if (!tearing_down_) {
      LaunchLine(absl::StrCat("all ", procs_.size() - num_shards,
                              " workers finished; waiting for the shards to exit"));
      const auto done_at = Clock::now();
      while (!tearing_down_ && !AllExited() && MsSince(done_at) < opt_.grace_ms) PollOnce(100);
      if (!tearing_down_ && !AllExited()) {
        // Servers without --exit_when_done (or an older harrier-server) stay.
        LaunchLine(absl::StrCat("shards still running after ", opt_.grace_ms,
                                " ms (--grace_ms): stopping them"));
        stopping_shards_ = true;
        TerminateAll();
      }
    }
    return Finish();
  }

 private:
  static void ReadAll(int* fd, std::string& into) {
    if (*fd < 0) return;
    char chunk[4096];
    for (;;) {
      const ssize_t n = read(*fd, chunk, sizeof(chunk));
      if (n > 0) {
        into.append(chunk, n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      close(*fd);
      *fd = -1;
      return;
    }
  }

  static std::string LastLine(const std::string& text) {
    std::vector<std::string> lines =
        absl::StrSplit(text, absl::ByAnyChar("\r\n"), absl::SkipWhitespace());
    return lines.empty() ? "" : std::string(absl::StripAsciiWhitespace(lines.back()));
  }

  bool StartProc(Proc& p) {
    absl::Status st = Spawn(p);
    if (!st.ok()) {
      Fail(absl::StrCat("cannot start ", p.name, ": ", st.message(), ": tearing down"));
      return false;
    }
    by_pid_[p.pid] = &p;
    return true;
  }

  bool AllWorkersExited() const {
    for (const auto& p : procs_) {
      if (!p.is_shard && (p.pid < 0 || !p.exited)) return false;
    }
    return true;
  }
  bool AllExited() const {
    for (const auto& p : procs_) {
      if (p.pid >= 0 && !p.exited) return false;
    }
    return true;
  }

  void CheckEarlyShardExit() {
    if (!early_shard_exit_ || tearing_down_ || AllWorkersExited()) return;
    if (MsSince(early_shard_exit_->at) < opt_.grace_ms) return;
    Fail(
        absl::StrCat(early_shard_exit_->name, " exited before the workers finished: tearing down"));
  }

  void Fail(const std::string& message) {
    if (tearing_down_) return;
    tearing_down_ = true;
    failed_ = true;
    LaunchLine(message);
    TerminateAll();
  }

  // SIGTERM to each process that still runs, on its own host: the workers
  // first, the shards once no worker is left (or half the grace time has
  // passed). A worker stopped by SIGTERM finishes its step and leaves the
  // job, which needs its shards; stopped together, the workers would wait on
  // dead shards until SIGKILL.
  void TerminateAll() {
    term_sent_at_ = Clock::now();
    shards_term_pending_ = true;
    for (auto& p : procs_) {
      if (!p.is_shard) Terminate(p);
    }
    MaybeTerminateShards();
  }

  void MaybeTerminateShards() {
    if (!shards_term_pending_) return;
    bool workers_left = false;
    for (const auto& p : procs_) {
      if (!p.is_shard && p.pid >= 0 && !p.exited) workers_left = true;
    }
    if (workers_left && MsSince(term_sent_at_) < opt_.grace_ms / 2) return;
    shards_term_pending_ = false;
    for (auto& p : procs_) {
      if (p.is_shard) Terminate(p);
    }
  }

  static void Terminate(Proc& p) {
    if (p.pid < 0 || p.exited) return;
    p.signalled_by_us = true;
    if (p.remote) {
      SendRemote(p, "TERM\n");
    } else {
      SignalLocal(p, SIGTERM);
    }
  }

  // A local child leads its own process group (Spawn): the signal reaches
  // its children too (a command's helper processes).
  static void SignalLocal(const Proc& p, int signo) {
    if (kill(-p.pid, signo) != 0) kill(p.pid, signo);
  }

  void KillAll() {
    for (auto& p : procs_) {
      if (p.pid < 0 || p.exited) continue;
      p.signalled_by_us = true;
      if (p.remote) {
        SendRemote(p, "KILL\n");
        if (p.in_fd >= 0) close(p.in_fd);
        p.in_fd = -1;
      } else {
        SignalLocal(p, SIGKILL);
      }
    }
    kill_sent_at_ = Clock::now();
  }

  static void SendRemote(Proc& p, const char* line) {
    if (p.in_fd >= 0) (void)!write(p.in_fd, line, strlen(line));
  }

  // Waits up to timeout_ms for output, exits and signals, and handles them.
  void PollOnce(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Proc*, bool>> owners;  // (proc, is stdout)
    fds.push_back({signal_pipe[0], POLLIN, 0});
    owners.push_back({nullptr, false});
    for (auto& p : procs_) {
      if (p.out_fd >= 0) {
        fds.push_back({p.out_fd, POLLIN, 0});
        owners.push_back({&p, true});
      }
      if (p.err_fd >= 0) {
        fds.push_back({p.err_fd, POLLIN, 0});
        owners.push_back({&p, false});
      }
    }
    const int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n > 0) {
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Proc* p = owners[i].first;
        const std::string prefix = absl::StrCat("[", p->name, "] ");
        if (owners[i].second) {
          Drain(&p->out_fd, p->out_buf, prefix, STDOUT_FILENO);
        } else {
          Drain(&p->err_fd, p->err_buf, prefix, STDERR_FILENO);
        }
      }
    }
    unsigned char sigs[64];
    ssize_t got;
    while ((got = read(signal_pipe[0], sigs, sizeof(sigs))) > 0) {
      for (ssize_t i = 0; i < got; ++i) {
        if (sigs[i] == SIGCHLD) continue;
        if (!tearing_down_) {
          tearing_down_ = true;
          failed_ = true;
          LaunchLine(absl::StrCat("signal ", static_cast<int>(sigs[i]), " received: tearing down"));
          TerminateAll();
        } else if (!kill_sent_at_) {
          LaunchLine(absl::StrCat("signal ", static_cast<int>(sigs[i]),
                                  " received again: killing everything now"));
          KillAll();
        }
      }
    }
    Reap();
  }

  void Reap() {
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      auto it = by_pid_.find(pid);
      if (it == by_pid_.end()) continue;
      Proc& p = *it->second;
      p.exited = true;
      p.status = status;
      // Its last lines before the verdict on it.
      const std::string prefix = absl::StrCat("[", p.name, "] ");
      Drain(&p.out_fd, p.out_buf, prefix, STDOUT_FILENO);
      Drain(&p.err_fd, p.err_buf, prefix, STDERR_FILENO);
      if (p.in_fd >= 0) close(p.in_fd);
      p.in_fd = -1;
      if (p.signalled_by_us) continue;
      if (!Succeeded(status)) {
        std::string what = DescribeStatus(status);
        if (p.remote && WIFEXITED(status) && WEXITSTATUS(status) == 255) {
          what += " (ssh failed: see its last lines above)";
        }
        Fail(absl::StrCat(p.name, " ", what, ": tearing down"));
      } else if (p.is_shard && !AllWorkersExited() && !tearing_down_ && !early_shard_exit_) {
        // A shard exits 0 once every rank has released its slot, which can
        // be seen here before the last worker's ssh session has closed. The
        // workers get --grace_ms to follow; after that the shard left while
        // workers still needed it, which fails the job (CheckEarlyShardExit).
        early_shard_exit_ = EarlyShardExit{p.name, Clock::now()};
      }
    }
  }

  // Teardown (if started) runs to its end under deadlines; then the verdict.
  int Finish() {
    if (tearing_down_ || stopping_shards_) {
      while (!AllExited()) {
        if (!kill_sent_at_ && MsSince(term_sent_at_) >= opt_.grace_ms) {
          std::vector<std::string> left;
          for (const auto& p : procs_) {
            if (p.pid >= 0 && !p.exited) left.push_back(p.name);
          }
          LaunchLine(absl::StrCat("still running after ", opt_.grace_ms, " ms (--grace_ms): ",
                                  absl::StrJoin(left, ", "), "; sending SIGKILL"));
          KillAll();
        }
        // The remote wrapper got KILL; if its ssh still has not exited, end
        // the ssh client itself.
        if (kill_sent_at_ && MsSince(*kill_sent_at_) > 3000) {
          for (auto& p : procs_) {
            if (p.pid >= 0 && !p.exited) SignalLocal(p, SIGKILL);
          }
        }
        PollOnce(100);
        MaybeTerminateShards();
      }
    }
    // Output after exit (pipes held by nobody else) is already drained.
    for (auto& p : procs_) {
      const std::string prefix = absl::StrCat("[", p.name, "] ");
      EmitLines(p.out_buf, prefix, STDOUT_FILENO, true);
      EmitLines(p.err_buf, prefix, STDERR_FILENO, true);
    }
    if (failed_) {
      LaunchLine("job failed");
      return 1;
    }
    LaunchLine("job finished: every worker exited 0");
    return 0;
  }

  const Options& opt_;
  std::vector<Proc> procs_;  // shards first, then workers; never resized after Plan()
  std::vector<int> shard_ports_;
  std::map<pid_t, Proc*> by_pid_;
  bool tearing_down_ = false;
  struct EarlyShardExit {
    std::string name;
    Clock::time_point at;
  };
  std::optional<EarlyShardExit> early_shard_exit_;  // first shard that exited 0 before the workers
  bool stopping_shards_ = false;
  bool shards_term_pending_ = false;
  bool failed_ = false;
  Clock::time_point term_sent_at_;
  std::optional<Clock::time_point> kill_sent_at_;
};

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The lowest port the kernel hands to outgoing connections and bind(0).
int EphemeralLow() {
  FILE* range = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  int low = 0, high = 0;
  const bool read = range != nullptr && fscanf(range, "%d %d", &low, &high) == 2;
  if (range != nullptr) fclose(range);
  return read && low > 12000 ? low : 32768;
}

bool CanListen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);  // the shards listen on 0.0.0.0
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

// `n` distinct ports free on this host now, at random below the ephemeral
// range: a port from bind(0) is soon handed to some outgoing connection,
// which would take it before its shard listens. One could still be taken
// before its shard listens; the shard then fails to start, which fails the
// job in one line.
absl::StatusOr<std::vector<int>> PickFreePorts(int n) {
  std::mt19937_64 random(std::random_device{}());
  const int low = 10000, high = EphemeralLow();
  std::vector<int> ports;
  for (int attempt = 0; attempt < 10000 && static_cast<int>(ports.size()) < n; ++attempt) {
    const int port = low + static_cast<int>(random() % static_cast<uint64_t>(high - low));
    if (std::find(ports.begin(), ports.end(), port) == ports.end() && CanListen(port)) {
      ports.push_back(port);
    }
  }
  if (static_cast<int>(ports.size()) < n) {
    return absl::UnavailableError(absl::StrCat("--base_port=0: no ", n, " free ports in [", low,
                                               ", ", high, ")"));
  }
  return ports;
}

std::string CurrentDir() {
  char buf[4096];
  return getcwd(buf, sizeof(buf)) != nullptr ? std::string(buf) : std::string();
}

int Main(int argc, char** argv) {
  std::vector<std::string> args = SpellOutShortFlags(std::vector<std::string>(argv, argv + argc));
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  const std::vector<std::string> positional =
      harrier::ParseFlags(static_cast<int>(args.size()), pointers.data(), kUsage);
  // The worker flags or the command are what follows "--"; any other
  // positional argument is a mistake (a worker flag before "--", or a stray
  // word).
  const auto dashes = std::find(args.begin() + 1, args.end(), "--");
  const std::vector<std::string> after_dashes(dashes == args.end() ? dashes : dashes + 1,
                                              args.end());
  if (positional.size() > after_dashes.size() + 1) {
    fprintf(stderr,
            "harrier-launch: unexpected argument '%s' (worker flags go after --; see --help)\n",
            positional[1].c_str());
    return 2;
  }
  absl::StatusOr<Options> parsed = OptionsFromFlags(after_dashes, CurrentDir());
  if (!parsed.ok()) {
    fprintf(stderr, "harrier-launch: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  Options& opt = *parsed;
  if (absl::Status st = ResolveBinaries(opt, SelfDir()); !st.ok()) {
    fprintf(stderr, "harrier-launch: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (opt.base_port == 0) {
    absl::StatusOr<std::vector<int>> ports = PickFreePorts(opt.num_servers);
    if (!ports.ok()) {
      fprintf(stderr, "harrier-launch: %s\n", std::string(ports.status().message()).c_str());
      return 1;
    }
    opt.shard_ports = *ports;
  }
  Launcher launcher(opt);
  launcher.Plan();
  if (opt.dry_run) {
    launcher.DryRun();
    return 0;
  }
  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    perror("harrier-launch: pipe");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int s : {SIGINT, SIGTERM, SIGCHLD}) sigaction(s, &sa, nullptr);
  return launcher.Run();
}

}  // namespace
}  // namespace harrier::launch

int main(int argc, char** argv) { return harrier::launch::Main(argc, argv); }
