#include "deploy/launch/launch_lib.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"

namespace harrier::launch {
namespace {

std::string ErrorOf(const std::string& hosts) {
  auto parsed = ParseHostList(hosts);
  REQUIRE_FALSE(parsed.ok());
  return std::string(parsed.status().message());
}

TEST_CASE("-H lists hosts and slots in order") {
  auto hosts = ParseHostList("a:2, b.example:1,10.0.0.3:4");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 3);
  CHECK((*hosts)[0].host == "a");
  CHECK((*hosts)[0].slots == 2);
  CHECK((*hosts)[1].host == "b.example");
  CHECK((*hosts)[2].host == "10.0.0.3");
  CHECK((*hosts)[2].slots == 4);
}

TEST_CASE("a bad -H names what is wrong") {
  CHECK(ErrorOf("") == "-H is empty (want host1:slots,host2:slots)");
  CHECK(ErrorOf("host1:0") == "-H host1:0: slots of host1 must be a positive integer, got '0'");
  CHECK(ErrorOf("host1:x") == "-H host1:x: slots of host1 must be a positive integer, got 'x'");
  CHECK(ErrorOf("host1") == "-H host1: 'host1' has no slots (want host:slots, e.g. host1:1)");
  CHECK(ErrorOf("a:1,,b:1") == "-H a:1,,b:1: empty entry");
  CHECK(ErrorOf(":3") == "-H :3: ':3' has no host name");
}

TEST_CASE("hostfile: both forms, comments, errors with line numbers") {
  auto hosts = ParseHostfile("# the job\nnode1 slots=2\n\nnode2:1  # small one\n", "hf");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 2);
  CHECK((*hosts)[0].host == "node1");
  CHECK((*hosts)[0].slots == 2);
  CHECK((*hosts)[1].host == "node2");
  CHECK((*hosts)[1].slots == 1);
  auto bare = ParseHostfile("node1 slots=1\nnode2\n", "hf");
  REQUIRE_FALSE(bare.ok());
  CHECK(bare.status().message() == "hf:2: 'node2' has no slots (want 'host slots=N' or 'host:N')");
  auto zero = ParseHostfile("node1 slots=0\n", "hf");
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.status().message() == "hf:1: slots of node1 must be a positive integer, got '0'");
  auto empty = ParseHostfile("# nothing\n", "hf");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message() == "hostfile hf lists no hosts");
}

TEST_CASE("-H spelled out as --hosts; worker flags and flag values untouched") {
  CHECK(SpellOutShortFlags({"harrier-launch", "-H", "a:1", "--ssh_args", "-Hx", "-Hb:2", "-H=c:3",
                            "--dry_run", "--", "-H", "x:1"}) ==
        std::vector<std::string>{"harrier-launch", "--hosts", "a:1", "--ssh_args", "-Hx",
                                 "--hosts=b:2", "--hosts=c:3", "--dry_run", "--", "-H", "x:1"});
}

TEST_CASE("-np spelled out as --np; a command after -- untouched") {
  CHECK(SpellOutShortFlags({"harrier-launch", "-np", "4", "-np4", "-np=4", "--np=4", "--np", "4",
                            "--", "python3", "-np", "2"}) ==
        std::vector<std::string>{"harrier-launch", "--np", "4", "--np=4", "--np=4", "--np=4",
                                 "--np", "4", "--", "python3", "-np", "2"});
}

TEST_CASE("horovodrun's --timeline-filename spelt as --timeline_filename") {
  CHECK(SpellOutShortFlags({"harrier-launch", "--timeline-filename", "t.json",
                            "--timeline-filename=/x/t_{rank}.json", "--", "python3",
                            "--timeline-filename", "y"}) ==
        std::vector<std::string>{"harrier-launch", "--timeline_filename", "t.json",
                                 "--timeline_filename=/x/t_{rank}.json", "--", "python3",
                                 "--timeline-filename", "y"});
}

TEST_CASE("options: --timeline_filename made absolute") {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_hosts, "localhost:1");
  absl::SetFlag(&FLAGS_timeline_filename, "t_{rank}.json");
  auto relative = OptionsFromFlags({}, "/home/me");
  REQUIRE(relative.ok());
  CHECK(relative->timeline == "/home/me/t_{rank}.json");
  absl::SetFlag(&FLAGS_timeline_filename, "/tmp/t.json");
  auto absolute = OptionsFromFlags({}, "/home/me");
  REQUIRE(absolute.ok());
  CHECK(absolute->timeline == "/tmp/t.json");
}

// One host, one shard on port 7000, one worker given --max_steps=3.
Options OneWorkerOneShard() {
  Options o;
  o.hosts = {{"h1", 1}};
  o.num_servers = 1;
  o.base_port = 7000;
  o.server_bin = "/b/harrier-server";
  o.worker_bin = "/b/harrier-worker";
  o.worker_args = {"--max_steps=3"};
  return o;
}

TEST_CASE("plan: the timeline to harrier-worker as --timeline, to a command as HARRIER_TIMELINE") {
  Options o = OneWorkerOneShard();
  o.timeline = "/t/t_{rank}.json";
  const JobPlan plan = MakePlan(o);
  CHECK(plan.workers[0].command ==
        std::vector<std::string>{"/b/harrier-worker", "--servers=h1:7000", "--num_workers=1",
                                 "--rank=0", "--timeline=/t/t_{rank}.json", "--max_steps=3"});
  for (const std::string& flag : plan.shards[0].command)
    CHECK(flag.find("timeline") == std::string::npos);
  o.command = {"python3", "train.py"};
  const JobPlan command = MakePlan(o);
  CHECK(command.workers[0].env.back() ==
        std::make_pair(std::string("HARRIER_TIMELINE"), std::string("/t/t_{rank}.json")));
}

TEST_CASE("-np takes the first N slots in host order") {
  const std::vector<HostSlots> hosts = {{"a", 2}, {"b", 2}, {"c", 1}};
  auto three = TakeSlots(hosts, 3, "-H a:2,b:2,c:1");
  REQUIRE(three.ok());
  REQUIRE(three->size() == 2);
  CHECK((*three)[0].host == "a");
  CHECK((*three)[0].slots == 2);
  CHECK((*three)[1].host == "b");
  CHECK((*three)[1].slots == 1);
  auto all = TakeSlots(hosts, 0, "x");
  REQUIRE(all.ok());
  CHECK(all->size() == 3);
  auto exact = TakeSlots(hosts, 5, "x");
  REQUIRE(exact.ok());
  CHECK(exact->size() == 3);
  auto too_many = TakeSlots(hosts, 6, "-H a:2,b:2,c:1");
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.status().message() == "-np 6: more workers than the 5 slots of -H a:2,b:2,c:1");
}

TEST_CASE("options: -np alone is localhost:N, with -H it cuts the hosts") {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_np, 3);
  auto local = OptionsFromFlags({}, "/w");
  REQUIRE(local.ok());
  REQUIRE(local->hosts.size() == 1);
  CHECK(local->hosts[0].host == "localhost");
  CHECK(local->hosts[0].slots == 3);
  CHECK(local->num_servers == 1);
  absl::SetFlag(&FLAGS_hosts, "a:2,b:2,c:2");
  auto cut = OptionsFromFlags({}, "/w");
  REQUIRE(cut.ok());
  REQUIRE(cut->hosts.size() == 2);
  CHECK(cut->hosts[1].slots == 1);
  CHECK(cut->num_servers == 2);  // one per host used
  absl::SetFlag(&FLAGS_np, 7);
  auto over = OptionsFromFlags({}, "/w");
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().message() == "-np 7: more workers than the 6 slots of -H a:2,b:2,c:2");
  absl::SetFlag(&FLAGS_np, -1);
  auto negative = OptionsFromFlags({}, "/w");
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().message() == "--np=-1: want a number of workers >= 1 (0: every slot)");
}

TEST_CASE("options: a command after --, or harrier-worker flags") {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_hosts, "a:1");
  auto command = OptionsFromFlags({"python3", "train.py", "--rank=1"}, "/w");
  REQUIRE(command.ok());
  CHECK(command->RunsCommand());
  CHECK(command->command == std::vector<std::string>{"python3", "train.py", "--rank=1"});
  CHECK(command->worker_args.empty());
  CHECK(command->workdir == "/w");
  auto flags = OptionsFromFlags({"--epochs=2", "train.py"}, "/w");
  REQUIRE(flags.ok());
  CHECK_FALSE(flags->RunsCommand());
  CHECK(flags->worker_args == std::vector<std::string>{"--epochs=2", "train.py"});
  auto empty = OptionsFromFlags({"", "x"}, "/w");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message() == "the command after -- starts with an empty word");
}

TEST_CASE("options: TLS and token paths made absolute, checked when every host is local") {
  absl::FlagSaver restore;
  char tmpl[] = "/tmp/launch_lib_test.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/ca.pem") << "x\n";
  absl::SetFlag(&FLAGS_hosts, "localhost:1");
  absl::SetFlag(&FLAGS_tls_ca, "ca.pem");
  auto local = OptionsFromFlags({}, dir);
  REQUIRE(local.ok());
  CHECK(local->tls_ca == dir + "/ca.pem");
  CHECK(local->tls_cert.empty());
  absl::SetFlag(&FLAGS_auth_token_file, "/nonexistent/token");
  auto missing = OptionsFromFlags({}, dir);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() ==
        "cannot read --auth_token_file=/nonexistent/token: No such file or directory");
  absl::SetFlag(&FLAGS_auth_token_file, dir);
  auto folder = OptionsFromFlags({}, dir);
  REQUIRE_FALSE(folder.ok());
  CHECK(folder.status().message() == "cannot read --auth_token_file=" + dir + ": not a file");
  // Remote hosts have their own files: not checked here.
  absl::SetFlag(&FLAGS_hosts, "node1:1");
  absl::SetFlag(&FLAGS_auth_token_file, "/nonexistent/token");
  auto remote = OptionsFromFlags({}, dir);
  REQUIRE(remote.ok());
  CHECK(remote->auth_token_file == "/nonexistent/token");
  REQUIRE(system(("rm -rf " + dir).c_str()) == 0);
}

TEST_CASE("options from the flags: worker flags after --, owned flags refused") {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_hosts, "a:1,b:2");
  absl::SetFlag(&FLAGS_num_servers, 3);
  absl::SetFlag(&FLAGS_base_port, 6000);
  absl::SetFlag(&FLAGS_grace_ms, 500);
  absl::SetFlag(&FLAGS_ssh_args, "-i 'my key' -p 2222");
  absl::SetFlag(&FLAGS_server_args, "--lr=0.05");
  absl::SetFlag(&FLAGS_dry_run, true);
  auto o = OptionsFromFlags({"--max_steps=5", "--batch_size=32"}, "/w");
  REQUIRE(o.ok());
  CHECK(o->hosts.size() == 2);
  CHECK(o->num_servers == 3);
  CHECK(o->base_port == 6000);
  CHECK(o->grace_ms == 500);
  CHECK(o->dry_run);
  CHECK(o->ssh_args == std::vector<std::string>{"-i", "my key", "-p", "2222"});
  CHECK(o->server_args == std::vector<std::string>{"--lr=0.05"});
  CHECK(o->worker_args == std::vector<std::string>{"--max_steps=5", "--batch_size=32"});
  absl::SetFlag(&FLAGS_server_args, "--port=7");
  auto port = OptionsFromFlags({}, "/w");
  REQUIRE_FALSE(port.ok());
  CHECK(port.status().message() == "--port is set by harrier-launch; drop it from --server_args");
  absl::SetFlag(&FLAGS_server_args, "");
  absl::SetFlag(&FLAGS_base_port, -1);
  auto bad_port = OptionsFromFlags({}, "/w");
  REQUIRE_FALSE(bad_port.ok());
  CHECK(bad_port.status().message() ==
        "--base_port=-1: want a port in [1, 65535] (0: free ports, every host local)");
  absl::SetFlag(&FLAGS_base_port, 0);
  auto free_remote = OptionsFromFlags({}, "/w");
  REQUIRE_FALSE(free_remote.ok());
  CHECK(free_remote.status().message() ==
        "--base_port=0 (free ports) needs every host local: the launcher can only find free "
        "ports on this one; give a port");
  absl::SetFlag(&FLAGS_hosts, "localhost:2");
  auto free_local = OptionsFromFlags({}, "/w");
  REQUIRE(free_local.ok());
  CHECK(free_local->base_port == 0);
}

TEST_CASE("options from the flags: defaults, hosts required, -H or --hostfile") {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_hosts, "a:1,b:1");
  auto defaults = OptionsFromFlags({}, "/w");
  REQUIRE(defaults.ok());
  CHECK(defaults->num_servers == 2);
  CHECK(defaults->base_port == 50051);
  CHECK(defaults->grace_ms == 10000);
  CHECK(defaults->ssh == "ssh");
  CHECK_FALSE(defaults->dry_run);
  auto rank = OptionsFromFlags({"--rank=2"}, "/w");
  REQUIRE_FALSE(rank.ok());
  CHECK(rank.status().message() ==
        "--rank is set by harrier-launch; drop it from the worker flags");
  absl::SetFlag(&FLAGS_hostfile, "x");
  auto both = OptionsFromFlags({}, "/w");
  REQUIRE_FALSE(both.ok());
  CHECK(both.status().message() == "give -H or --hostfile, not both");
  absl::SetFlag(&FLAGS_hosts, "");
  absl::SetFlag(&FLAGS_hostfile, "");
  auto none = OptionsFromFlags({"--max_steps=1"}, "/w");
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        "no hosts: give -H host1:slots,... or --hostfile=FILE, or -np N for N workers on this host "
        "(see --help)");
}

TEST_CASE("shell quoting survives a real sh") {
  const std::vector<std::string> args = {"plain", "with space", "it's", "$HOME",
                                         "a\"b",  "",           "x\\y", "--flag=a b;c"};
  auto split = ShellSplit(ShellJoin(args));
  REQUIRE(split.ok());
  CHECK(*split == args);
  // The same string through /bin/sh, as the remote login shell reads it.
  const std::string command = "printf '%s\\n' " + ShellJoin(args);
  FILE* sh = popen(("sh -c " + ShellQuote(command)).c_str(), "r");
  REQUIRE(sh != nullptr);
  std::string out;
  char buf[256];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), sh)) > 0) out.append(buf, n);
  REQUIRE(pclose(sh) == 0);
  std::string expected;
  for (const auto& a : args) expected += a + "\n";
  CHECK(out == expected);
  CHECK(ShellQuote("10.0.0.1:50051,b:2") == "10.0.0.1:50051,b:2");
  REQUIRE_FALSE(ShellSplit("'open").ok());
}

TEST_CASE("plan: shards round-robin on base_port+i, workers ranked in host order") {
  Options o;
  o.hosts = {{"h1", 2}, {"h2", 1}};
  o.num_servers = 3;
  o.base_port = 7000;
  o.server_bin = "/b/harrier-server";
  o.worker_bin = "/b/harrier-worker";
  o.server_args = {"--lr=0.1"};
  o.worker_args = {"--max_steps=3"};
  const JobPlan plan = MakePlan(o);
  REQUIRE(plan.shards.size() == 3);
  CHECK(plan.shards[0].host == 0);
  CHECK(plan.shards[1].host == 1);
  CHECK(plan.shards[2].host == 0);
  CHECK(plan.shards[2].command ==
        std::vector<std::string>{"/b/harrier-server", "--shard=2", "--num_shards=3",
                                 "--num_workers=3", "--port=7002", "--host=0.0.0.0", "--lr=0.1"});
  REQUIRE(plan.workers.size() == 3);
  CHECK(plan.workers[1].host == 0);
  CHECK(plan.workers[2].host == 1);
  CHECK(plan.workers[2].command ==
        std::vector<std::string>{"/b/harrier-worker", "--servers=h1:7000,h2:7001,h1:7002",
                                 "--num_workers=3", "--rank=2", "--max_steps=3"});
}

TEST_CASE("plan: TLS flags to shards and harrier-worker") {
  Options o = OneWorkerOneShard();
  o.tls_ca = "/s/ca.pem";
  o.auth_token_file = "/s/token";
  const JobPlan plan = MakePlan(o);
  CHECK(plan.shards[0].command ==
        std::vector<std::string>{"/b/harrier-server", "--shard=0", "--num_shards=1",
                                 "--num_workers=1", "--port=7000", "--host=0.0.0.0",
                                 "--tls_ca=/s/ca.pem", "--auth_token_file=/s/token"});
  CHECK(plan.workers[0].command ==
        std::vector<std::string>{"/b/harrier-worker", "--servers=h1:7000", "--num_workers=1",
                                 "--rank=0", "--tls_ca=/s/ca.pem", "--auth_token_file=/s/token",
                                 "--max_steps=3"});
  CHECK(plan.workers[0].env.empty());
  // Ports the launcher chose (--base_port=0).
  o.hosts = {{"localhost", 1}};
  o.num_servers = 2;
  o.shard_ports = {41234, 40007};
  const JobPlan chosen = MakePlan(o);
  CHECK(chosen.shards[1].port == 40007);
  CHECK(chosen.shards[1].command[4] == "--port=40007");
  CHECK(chosen.workers[0].command[1] == "--servers=127.0.0.1:41234,127.0.0.1:40007");
}

TEST_CASE("plan: a command gets the job in its environment") {
  Options o;
  o.hosts = {{"h1", 2}, {"h2", 1}, {"h1", 1}};
  o.num_servers = 2;
  o.base_port = 7000;
  o.server_bin = "/b/harrier-server";
  o.command = {"python3", "train.py", "--lr", "0.1"};
  o.workdir = "/home/me/job";
  o.tls_cert = "/s/tls.crt";
  const JobPlan plan = MakePlan(o);
  REQUIRE(plan.workers.size() == 4);
  CHECK(plan.workers[3].command == o.command);
  CHECK(plan.workers[3].workdir == "/home/me/job");
  CHECK(plan.workers[1].env == EnvVars{{"HARRIER_SERVERS", "h1:7000,h2:7001"},
                                       {"HARRIER_NUM_SHARDS", "2"},
                                       {"HARRIER_NUM_WORKERS", "4"},
                                       {"HARRIER_RANK", "1"},
                                       {"HARRIER_LOCAL_RANK", "1"},
                                       {"HARRIER_LOCAL_SIZE", "3"},
                                       {"HARRIER_TLS_CERT", "/s/tls.crt"},
                                       {"OMP_NUM_THREADS", "1"}});
  // h1 listed twice is one host: rank 3 is its third worker.
  CHECK(plan.workers[3].env[3] == std::make_pair(std::string("HARRIER_RANK"), std::string("3")));
  CHECK(plan.workers[3].env[4] ==
        std::make_pair(std::string("HARRIER_LOCAL_RANK"), std::string("2")));
  CHECK(plan.workers[2].env[4] ==
        std::make_pair(std::string("HARRIER_LOCAL_RANK"), std::string("0")));
  CHECK(plan.workers[2].env[5] ==
        std::make_pair(std::string("HARRIER_LOCAL_SIZE"), std::string("1")));
  CHECK(plan.shards[1].command.back() == "--tls_cert=/s/tls.crt");
  PlannedProcess p;
  p.env = {{"HARRIER_RANK", "0"}, {"HARRIER_TLS_CA", "/my certs/ca.pem"}};
  p.command = {"sh", "-c", "echo $HARRIER_RANK"};
  CHECK(CommandWithEnv(p) ==
        "HARRIER_RANK=0 HARRIER_TLS_CA='/my certs/ca.pem' sh -c 'echo $HARRIER_RANK'");
}

TEST_CASE("plan: OMP_NUM_THREADS=1 where workers share a host, the launcher's own otherwise") {
  Options o;
  o.hosts = {{"h1", 2}, {"h2", 1}};
  o.num_servers = 1;
  o.server_bin = "/b/harrier-server";
  o.command = {"python3", "train.py"};
  auto threads = [](const PlannedProcess& w) {
    for (const auto& [name, value] : w.env)
      if (name == "OMP_NUM_THREADS") return value;
    return std::string("unset");
  };
  JobPlan plan = MakePlan(o);
  REQUIRE(plan.workers.size() == 3);
  CHECK(threads(plan.workers[0]) == "1");
  CHECK(threads(plan.workers[1]) == "1");
  CHECK(threads(plan.workers[2]) == "unset");  // alone on h2: its cores are its own
  CHECK(plan.one_thread_hosts == std::vector<std::string>{"h1"});
  o.omp_num_threads = "4";  // exported by the user: passed on as it is, also over ssh
  plan = MakePlan(o);
  CHECK(threads(plan.workers[0]) == "4");
  CHECK(threads(plan.workers[2]) == "4");
  CHECK(plan.one_thread_hosts.empty());
  o.omp_num_threads.clear();
  o.command.clear();  // harrier-worker: flags, no environment of the job
  plan = MakePlan(o);
  CHECK(plan.workers[0].env.empty());
  CHECK(plan.one_thread_hosts.empty());
}

TEST_CASE("binaries: next to the launcher, or as in bazel-bin") {
  char tmpl[] = "/tmp/launch_lib_test.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  for (const char* d : {"/server", "/worker", "/deploy", "/deploy/launch"}) {
    REQUIRE(mkdir((dir + d).c_str(), 0755) == 0);
  }
  for (const char* f : {"/server/harrier-server", "/worker/harrier-worker"}) {
    std::ofstream(dir + f) << "#!/bin/sh\n";
    REQUIRE(chmod((dir + f).c_str(), 0755) == 0);
  }
  Options o;
  REQUIRE(ResolveBinaries(o, dir + "/deploy/launch").ok());
  CHECK(o.server_bin == dir + "/server/harrier-server");
  CHECK(o.worker_bin == dir + "/worker/harrier-worker");
  Options missing;
  auto st = ResolveBinaries(missing, "/nonexistent/a/b");
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("no harrier-server in") == 0);
  // A command needs no harrier-worker.
  REQUIRE(system(("rm " + dir + "/worker/harrier-worker").c_str()) == 0);
  Options command;
  command.command = {"python3"};
  REQUIRE(ResolveBinaries(command, dir + "/deploy/launch").ok());
  CHECK(command.server_bin == dir + "/server/harrier-server");
  CHECK(command.worker_bin.empty());
  REQUIRE(system(("rm -rf " + dir).c_str()) == 0);
}

}  // namespace
}  // namespace harrier::launch
