#include "deploy/launch/launch_lib.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

ABSL_FLAG(std::string, hosts, "",
          "-H for short. Hosts in order, host:slots,... (slots = workers on that host, >= 1). A "
          "host named localhost or 127.0.0.1 runs its processes locally, without ssh (then every "
          "process must be local: workers reach shards by host name).");
ABSL_FLAG(std::string, hostfile, "",
          "Hosts from a file instead of -H: one a line, 'host slots=N' or 'host:N'; '#' starts a "
          "comment.");
ABSL_FLAG(int, np, 0,
          "-np N for short (also -npN, -np=N). Number of workers: ranks fill the hosts' slots in "
          "order up to N, hosts past the N-th slot are not used; more than the slots is an error. "
          "0: every slot. Without -H or --hostfile, -np N runs N workers on localhost.");
ABSL_FLAG(int, num_servers, 0, "Number of shards (0: one per host).");
ABSL_FLAG(int, base_port, 50051,
          "Port of shard 0; shard i listens on base_port+i. 0: a free port for each shard, "
          "chosen by the launcher (every host local).");
ABSL_FLAG(std::string, bin_dir, "",
          "Where harrier-server and harrier-worker are, the same path on every host: DIR, "
          "DIR/server and DIR/worker, or DIR/../../server and DIR/../../worker as in bazel-bin "
          "(default: next to harrier-launch).");
ABSL_FLAG(std::string, server_bin, "", "harrier-server explicitly (overrides --bin_dir).");
ABSL_FLAG(std::string, worker_bin, "", "harrier-worker explicitly (overrides --bin_dir).");
ABSL_FLAG(std::string, ssh, "ssh",
          "ssh client. Remote commands run as PROGRAM [ssh_args] -o BatchMode=yes -o "
          "ConnectTimeout=10 host -- <command>.");
ABSL_FLAG(std::string, ssh_args, "",
          "Extra ssh arguments (e.g. \"-i key -p 2222\"), split like a shell would.");
ABSL_FLAG(std::string, server_args, "",
          "Extra harrier-server flags, e.g. \"--optimizer=nesterov --lr=0.05\", split like a shell "
          "would.");
ABSL_FLAG(int, grace_ms, 10000,
          "On teardown, how long processes get after SIGTERM before SIGKILL; also how long shards "
          "get to exit by themselves after the workers finish.");
ABSL_FLAG(int, start_timeout_ms, 60000,
          "Deadline for the ssh check of each host and for each shard to accept connections.");
ABSL_FLAG(bool, dry_run, false,
          "Print the commands it would run (a command after -- with its HARRIER_* environment) "
          "and exit.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates, as harrier-server's and harrier-worker's --tls_ca: passed to every "
          "shard and harrier-worker, to a command as HARRIER_TLS_CA. The same path on every host; "
          "relative to the launcher's current folder.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain, as harrier-server's and harrier-worker's --tls_cert: passed to "
          "every shard and harrier-worker, to a command as HARRIER_TLS_CERT.");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls_cert: passed to every shard and harrier-worker, to a command "
          "as HARRIER_TLS_KEY.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the job token, as harrier-server's and harrier-worker's "
          "--auth_token_file: passed to every shard and harrier-worker, to a command as "
          "HARRIER_AUTH_TOKEN_FILE.");
ABSL_FLAG(std::string, timeline_filename, "",
          "Every worker records a timeline of its pushes, pulls and waits (a Chrome trace) to "
          "this file: harrier-worker as --timeline, a command as HARRIER_TIMELINE "
          "(harrier.torch). '{rank}' in the path is replaced by the worker's rank; without it "
          "only rank 0 writes one, as horovodrun's --timeline-filename. Also spelt "
          "--timeline-filename. Relative to the launcher's current folder.");

namespace harrier::launch {
namespace {

absl::StatusOr<int> ParseSlots(const std::string& where, const std::string& host,
                               absl::string_view text) {
  int slots = 0;
  if (!absl::SimpleAtoi(text, &slots) || slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": slots of ", host, " must be a positive integer, got '", text, "'"));
  }
  return slots;
}

absl::StatusOr<HostSlots> ParseHostColonSlots(const std::string& where, absl::string_view entry) {
  const size_t colon = entry.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", entry, "' has no slots (want host:slots, e.g. ", entry, ":1)"));
  }
  HostSlots h;
  h.host = std::string(entry.substr(0, colon));
  if (h.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", entry, "' has no host name"));
  }
  absl::StatusOr<int> slots = ParseSlots(where, h.host, entry.substr(colon + 1));
  if (!slots.ok()) return slots.status();
  h.slots = *slots;
  return h;
}

}  // namespace

absl::StatusOr<std::vector<HostSlots>> ParseHostList(const std::string& list) {
  if (absl::StripAsciiWhitespace(list).empty()) {
    return absl::InvalidArgumentError("-H is empty (want host1:slots,host2:slots)");
  }
  std::vector<HostSlots> hosts;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("-H ", list, ": empty entry"));
    }
    absl::StatusOr<HostSlots> h = ParseHostColonSlots(absl::StrCat("-H ", list), entry);
    if (!h.ok()) return h.status();
    hosts.push_back(*h);
  }
  return hosts;
}

absl::StatusOr<std::vector<HostSlots>> ParseHostfile(const std::string& text,
                                                     const std::string& path) {
  std::vector<HostSlots> hosts;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() == 1) {
      absl::StatusOr<HostSlots> h = ParseHostColonSlots(where, words[0]);
      if (!h.ok()) {
        if (!absl::StrContains(words[0], ':')) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": '", words[0], "' has no slots (want 'host slots=N' or 'host:N')"));
        }
        return h.status();
      }
      hosts.push_back(*h);
    } else if (words.size() == 2 && absl::StartsWith(words[1], "slots=")) {
      absl::StatusOr<int> slots = ParseSlots(where, std::string(words[0]), words[1].substr(6));
      if (!slots.ok()) return slots.status();
      hosts.push_back({std::string(words[0]), *slots});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": cannot read '", line, "' (want 'host slots=N' or 'host:N')"));
    }
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("hostfile ", path, " lists no hosts"));
  }
  return hosts;
}

std::vector<std::string> SpellOutShortFlags(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      out.insert(out.end(), args.begin() + i, args.end());
      break;
    }
    // -H LIST, -HLIST, -H=LIST; -np N, -npN, -np=N.
    bool short_form = false;
    for (const auto& [dash, name] :
         {std::make_pair("-np", "--np"), std::make_pair("-H", "--hosts")}) {
      if (a == dash) {
        out.push_back(name);
        if (i + 1 < args.size()) out.push_back(args[++i]);
      } else if (absl::StartsWith(a, dash)) {
        out.push_back(absl::StrCat(
            name, "=", absl::StripPrefix(absl::string_view(a).substr(strlen(dash)), "=")));
      } else {
        continue;
      }
      short_form = true;
      break;
    }
    if (short_form) continue;
    // horovodrun's spelling of the one flag with a dash in its name.
    if (a == "--timeline-filename" || absl::StartsWith(a, "--timeline-filename=")) {
      out.push_back(absl::StrCat("--timeline_filename", a.substr(strlen("--timeline-filename"))));
      if (a == "--timeline-filename" && i + 1 < args.size()) out.push_back(args[++i]);
      continue;
    }
    out.push_back(a);
    absl::string_view name = a;
    if (a.find('=') != std::string::npos || !absl::ConsumePrefix(&name, "-")) continue;
    absl::ConsumePrefix(&name, "-");
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && !flag->IsOfType<bool>() && i + 1 < args.size()) out.push_back(args[++i]);
  }
  return out;
}

absl::StatusOr<std::vector<HostSlots>> TakeSlots(const std::vector<HostSlots>& hosts, int np,
                                                 const std::string& where) {
  if (np == 0) return hosts;
  int total = 0;
  for (const auto& h : hosts) total += h.slots;
  if (np > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("-np ", np, ": more workers than the ", total, " slots of ", where));
  }
  std::vector<HostSlots> taken;
  for (const auto& h : hosts) {
    if (np == 0) break;
    taken.push_back({h.host, std::min(h.slots, np)});
    np -= taken.back().slots;
  }
  return taken;
}

namespace {

// One line if `path` is no regular file this process can open for reading.
absl::Status CheckReadable(const char* flag, const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --", flag, "=", path, ": ", strerror(errno)));
  }
  struct stat st {};
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  close(fd);
  if (!regular) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read --", flag, "=", path, ": not a file"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Options> OptionsFromFlags(const std::vector<std::string>& after_dashes,
                                         const std::string& cwd) {
  Options o;
  o.workdir = cwd;
  if (const char* threads = std::getenv("OMP_NUM_THREADS"); threads != nullptr)
    o.omp_num_threads = threads;
  // A command is any first word that is not a flag: "python3", "./train.sh".
  if (!after_dashes.empty() && !absl::StartsWith(after_dashes[0], "-")) {
    if (after_dashes[0].empty()) {
      return absl::InvalidArgumentError("the command after -- starts with an empty word");
    }
    o.command = after_dashes;
  } else {
    o.worker_args = after_dashes;
  }
  auto bad = [](const char* name, const auto& value, const std::string& want) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": want ", want));
  };
  o.num_servers = absl::GetFlag(FLAGS_num_servers);
  if (o.num_servers < 0) return bad("num_servers", o.num_servers, "a positive integer");
  o.base_port = absl::GetFlag(FLAGS_base_port);
  if (o.base_port < 0 || o.base_port > 65535) {
    return bad("base_port", o.base_port, "a port in [1, 65535] (0: free ports, every host local)");
  }
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  o.server_bin = absl::GetFlag(FLAGS_server_bin);
  o.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  o.ssh = absl::GetFlag(FLAGS_ssh);
  if (o.ssh.empty()) return bad("ssh", "", "an ssh program");
  for (auto [name, value, words] :
       {std::make_tuple("ssh_args", absl::GetFlag(FLAGS_ssh_args), &o.ssh_args),
        std::make_tuple("server_args", absl::GetFlag(FLAGS_server_args), &o.server_args)}) {
    absl::StatusOr<std::vector<std::string>> split = ShellSplit(value);
    if (!split.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", split.status().message()));
    }
    *words = *split;
  }
  o.grace_ms = absl::GetFlag(FLAGS_grace_ms);
  if (o.grace_ms < 0) return bad("grace_ms", o.grace_ms, "milliseconds >= 0");
  o.start_timeout_ms = absl::GetFlag(FLAGS_start_timeout_ms);
  if (o.start_timeout_ms < 1) {
    return bad("start_timeout_ms", o.start_timeout_ms, "milliseconds >= 1");
  }
  o.dry_run = absl::GetFlag(FLAGS_dry_run);
  const int np = absl::GetFlag(FLAGS_np);
  if (np < 0) return bad("np", np, "a number of workers >= 1 (0: every slot)");

  const std::string hosts_flag = absl::GetFlag(FLAGS_hosts);
  const std::string hostfile = absl::GetFlag(FLAGS_hostfile);
  if (!hosts_flag.empty() && !hostfile.empty()) {
    return absl::InvalidArgumentError("give -H or --hostfile, not both");
  }
  std::string where;  // the host list, for -np's error
  if (!hosts_flag.empty()) {
    absl::StatusOr<std::vector<HostSlots>> hosts = ParseHostList(hosts_flag);
    if (!hosts.ok()) return hosts.status();
    o.hosts = *hosts;
    where = absl::StrCat("-H ", hosts_flag);
  } else if (!hostfile.empty()) {
    std::ifstream in(hostfile);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --hostfile=", hostfile));
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<std::vector<HostSlots>> hosts = ParseHostfile(text.str(), hostfile);
    if (!hosts.ok()) return hosts.status();
    o.hosts = *hosts;
    where = absl::StrCat("--hostfile=", hostfile);
  } else if (np > 0) {
    // As horovodrun -np 4: everything on this machine.
    o.hosts = {{"localhost", np}};
    where = "localhost";
  } else {
    return absl::InvalidArgumentError(
        "no hosts: give -H host1:slots,... or --hostfile=FILE, or -np N for N workers on this "
        "host (see --help)");
  }
  absl::StatusOr<std::vector<HostSlots>> taken = TakeSlots(o.hosts, np, where);
  if (!taken.ok()) return taken.status();
  o.hosts = *taken;

  bool all_local = true;
  for (const auto& h : o.hosts) all_local = all_local && IsLocalHost(h.host);
  if (o.base_port == 0 && !all_local) {
    return absl::InvalidArgumentError(
        "--base_port=0 (free ports) needs every host local: the launcher can only find free "
        "ports on this one; give a port");
  }
  // TLS and the token: absolute paths, so that they mean the same to every
  // process wherever it runs. Remote hosts must have the same paths, which
  // only they can check; when every host is this one, check here.
  for (auto [name, value, path] :
       {std::make_tuple("tls_ca", absl::GetFlag(FLAGS_tls_ca), &o.tls_ca),
        std::make_tuple("tls_cert", absl::GetFlag(FLAGS_tls_cert), &o.tls_cert),
        std::make_tuple("tls_key", absl::GetFlag(FLAGS_tls_key), &o.tls_key),
        std::make_tuple("auth_token_file", absl::GetFlag(FLAGS_auth_token_file),
                        &o.auth_token_file)}) {
    if (value.empty()) continue;
    *path = absl::StartsWith(value, "/") || cwd.empty() ? value : absl::StrCat(cwd, "/", value);
    if (all_local) {
      if (absl::Status st = CheckReadable(name, *path); !st.ok()) return st;
    }
  }
  if (const std::string timeline = absl::GetFlag(FLAGS_timeline_filename); !timeline.empty()) {
    o.timeline = absl::StartsWith(timeline, "/") || cwd.empty() ? timeline
                                                                : absl::StrCat(cwd, "/", timeline);
  }
  // The launcher owns the job's shape; a second value would silently win or lose.
  for (const std::string& a : o.worker_args) {
    for (const char* owned : {"--servers", "--num_workers", "--rank"}) {
      if (a == owned || absl::StartsWith(a, absl::StrCat(owned, "="))) {
        return absl::InvalidArgumentError(
            absl::StrCat(owned, " is set by harrier-launch; drop it from the worker flags"));
      }
    }
  }
  for (const std::string& a : o.server_args) {
    for (const char* owned : {"--shard", "--num_shards", "--num_workers", "--port", "--host"}) {
      if (a == owned || absl::StartsWith(a, absl::StrCat(owned, "="))) {
        return absl::InvalidArgumentError(
            absl::StrCat(owned, " is set by harrier-launch; drop it from --server_args"));
      }
    }
  }
  if (o.num_servers == 0) o.num_servers = static_cast<int>(o.hosts.size());
  if (o.base_port > 0 && o.base_port + o.num_servers - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--base_port=", o.base_port, " + ",
                                                   o.num_servers, " shards runs past port 65535"));
  }
  return o;
}

absl::StatusOr<std::vector<std::string>> ShellSplit(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else if (c == '\'') {
      const size_t end = text.find('\'', i + 1);
      if (end == std::string::npos) return absl::InvalidArgumentError("unterminated ' quote");
      word += text.substr(i + 1, end - i - 1);
      i = end;
      in_word = true;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() &&
            (text[j + 1] == '"' || text[j + 1] == '\\' || text[j + 1] == '$' ||
             text[j + 1] == '`')) {
          ++j;
        }
        word += text[j];
      }
      if (j >= text.size()) return absl::InvalidArgumentError("unterminated \" quote");
      i = j;
      in_word = true;
    } else if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
      in_word = true;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

std::string ShellQuote(const std::string& arg) {
  bool safe = !arg.empty();
  for (const char c : arg) {
    if (!absl::ascii_isalnum(c) && std::string("-_=./:,@%+").find(c) == std::string::npos) {
      safe = false;
      break;
    }
  }
  if (safe) return arg;
  std::string quoted = "'";
  for (const char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string ShellJoin(const std::vector<std::string>& args) {
  std::vector<std::string> quoted;
  for (const auto& a : args) quoted.push_back(ShellQuote(a));
  return absl::StrJoin(quoted, " ");
}

bool IsLocalHost(const std::string& host) { return host == "localhost" || host == "127.0.0.1"; }

absl::Status ResolveBinaries(Options& o, const std::string& self_dir) {
  const bool explicit_dir = !o.bin_dir.empty();
  const std::string dir = explicit_dir ? o.bin_dir : self_dir;
  auto find = [&](const std::string& name, const std::string& package,
                  std::string* out) -> absl::Status {
    if (!out->empty()) return absl::OkStatus();
    const std::vector<std::string> candidates = {absl::StrCat(dir, "/", name),
                                                 absl::StrCat(dir, "/", package, "/", name),
                                                 absl::StrCat(dir, "/../../", package, "/", name)};
    for (const auto& c : candidates) {
      if (access(c.c_str(), X_OK) == 0) {
        char resolved[4096];
        *out = realpath(c.c_str(), resolved) != nullptr ? std::string(resolved) : c;
        return absl::OkStatus();
      }
    }
    // Remote-only hosts may have binaries this machine lacks: with an
    // explicit --bin_dir trust it (the ssh check looks on each host).
    if (explicit_dir) {
      *out = candidates[0];
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat("no ", name, " in ", dir, " (nor ", dir, "/", package,
                                            ", ", dir, "/../../", package,
                                            "): give --bin_dir or --", package, "_bin"));
  };
  if (absl::Status st = find("harrier-server", "server", &o.server_bin); !st.ok()) return st;
  if (o.RunsCommand()) return absl::OkStatus();
  return find("harrier-worker", "worker", &o.worker_bin);
}

namespace {

// The TLS and token flags the options give, for harrier-server and
// harrier-worker.
std::vector<std::string> SecurityFlags(const Options& o) {
  std::vector<std::string> flags;
  for (const auto& [name, value] :
       {std::make_pair("tls_ca", &o.tls_ca), std::make_pair("tls_cert", &o.tls_cert),
        std::make_pair("tls_key", &o.tls_key),
        std::make_pair("auth_token_file", &o.auth_token_file)}) {
    if (!value->empty()) flags.push_back(absl::StrCat("--", name, "=", *value));
  }
  return flags;
}

}  // namespace

JobPlan MakePlan(const Options& o) {
  JobPlan plan;
  int total = 0;
  // Local ranks count per host name: a host listed twice is one host.
  std::map<std::string, int> per_host;
  for (const auto& h : o.hosts) {
    total += h.slots;
    per_host[h.host] += h.slots;
  }
  const std::vector<std::string> security = SecurityFlags(o);
  std::vector<std::string> addresses;
  for (int i = 0; i < o.num_servers; ++i) {
    PlannedProcess s;
    s.index = i;
    s.host = i % o.hosts.size();
    s.port = o.shard_ports.empty() ? o.base_port + i : o.shard_ports[i];
    const std::string& host = o.hosts[s.host].host;
    addresses.push_back(absl::StrCat(IsLocalHost(host) ? "127.0.0.1" : host, ":", s.port));
    s.command = {o.server_bin,
                 absl::StrCat("--shard=", i),
                 absl::StrCat("--num_shards=", o.num_servers),
                 absl::StrCat("--num_workers=", total),
                 absl::StrCat("--port=", s.port),
                 "--host=0.0.0.0"};
    s.command.insert(s.command.end(), security.begin(), security.end());
    for (const auto& a : o.server_args) s.command.push_back(a);
    plan.shards.push_back(s);
  }
  const std::string servers = absl::StrJoin(addresses, ",");
  std::map<std::string, int> next_local_rank;
  int rank = 0;
  for (size_t h = 0; h < o.hosts.size(); ++h) {
    const std::string& host = o.hosts[h].host;
    for (int slot = 0; slot < o.hosts[h].slots; ++slot, ++rank) {
      PlannedProcess w;
      w.index = rank;
      w.host = h;
      const int local_rank = next_local_rank[host]++;
      if (o.RunsCommand()) {
        w.command = o.command;
        w.workdir = o.workdir;
        w.env = {{"HARRIER_SERVERS", servers},
                 {"HARRIER_NUM_SHARDS", absl::StrCat(o.num_servers)},
                 {"HARRIER_NUM_WORKERS", absl::StrCat(total)},
                 {"HARRIER_RANK", absl::StrCat(rank)},
                 {"HARRIER_LOCAL_RANK", absl::StrCat(local_rank)},
                 {"HARRIER_LOCAL_SIZE", absl::StrCat(per_host[host])}};
        for (const auto& [name, value] :
             {std::make_pair("HARRIER_TLS_CA", &o.tls_ca),
              std::make_pair("HARRIER_TLS_CERT", &o.tls_cert),
              std::make_pair("HARRIER_TLS_KEY", &o.tls_key),
              std::make_pair("HARRIER_AUTH_TOKEN_FILE", &o.auth_token_file),
              std::make_pair("HARRIER_TIMELINE", &o.timeline)}) {
          if (!value->empty()) w.env.emplace_back(name, *value);
        }
        if (!o.omp_num_threads.empty()) {
          w.env.emplace_back("OMP_NUM_THREADS", o.omp_num_threads);
        } else if (per_host[host] > 1) {
          w.env.emplace_back("OMP_NUM_THREADS", "1");
          if (local_rank == 0) plan.one_thread_hosts.push_back(host);
        }
      } else {
        w.command = {o.worker_bin, absl::StrCat("--servers=", servers),
                     absl::StrCat("--num_workers=", total), absl::StrCat("--rank=", rank)};
        w.command.insert(w.command.end(), security.begin(), security.end());
        if (!o.timeline.empty()) w.command.push_back(absl::StrCat("--timeline=", o.timeline));
        for (const auto& a : o.worker_args) w.command.push_back(a);
      }
      plan.workers.push_back(w);
    }
  }
  return plan;
}

std::string CommandWithEnv(const PlannedProcess& p) {
  // NAME='a value', not 'NAME=a value', which sh would not take for an
  // assignment.
  std::vector<std::string> words;
  for (const auto& [name, value] : p.env)
    words.push_back(absl::StrCat(name, "=", ShellQuote(value)));
  words.push_back(ShellJoin(p.command));
  return absl::StrJoin(words, " ");
}

}  // namespace harrier::launch
