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
  CHECK(SpellOutShortHosts({"harrier-launch", "-H", "a:1", "--ssh_args", "-Hx", "-Hb:2", "-H=c:3",
                            "--dry_run", "--", "-H", "x:1"}) ==
        std::vector<std::string>{"harrier-launch", "--hosts", "a:1", "--ssh_args", "-Hx",
                                 "--hosts=b:2", "--hosts=c:3", "--dry_run", "--", "-H", "x:1"});
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
  auto o = OptionsFromFlags({"--max_steps=5", "--batch_size=32"});
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
  auto port = OptionsFromFlags({});
  REQUIRE_FALSE(port.ok());
  CHECK(port.status().message() == "--port is set by harrier-launch; drop it from --server_args");
  absl::SetFlag(&FLAGS_server_args, "");
  absl::SetFlag(&FLAGS_base_port, 0);
  auto bad_port = OptionsFromFlags({});
  REQUIRE_FALSE(bad_port.ok());
  CHECK(bad_port.status().message() == "--base_port=0: want a port in [1, 65535]");
}

TEST_CASE("options from the flags: defaults, hosts required, -H or --hostfile") {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_hosts, "a:1,b:1");
  auto defaults = OptionsFromFlags({});
  REQUIRE(defaults.ok());
  CHECK(defaults->num_servers == 2);
  CHECK(defaults->base_port == 50051);
  CHECK(defaults->grace_ms == 10000);
  CHECK(defaults->ssh == "ssh");
  CHECK_FALSE(defaults->dry_run);
  auto rank = OptionsFromFlags({"--rank=2"});
  REQUIRE_FALSE(rank.ok());
  CHECK(rank.status().message() == "--rank is set by harrier-launch; drop it from the worker flags");
  absl::SetFlag(&FLAGS_hostfile, "x");
  auto both = OptionsFromFlags({});
  REQUIRE_FALSE(both.ok());
  CHECK(both.status().message() == "give -H or --hostfile, not both");
  absl::SetFlag(&FLAGS_hosts, "");
  absl::SetFlag(&FLAGS_hostfile, "");
  auto none = OptionsFromFlags({"--max_steps=1"});
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        "no hosts: give -H host1:slots,... or --hostfile=FILE (see --help)");
}

TEST_CASE("shell quoting survives a real sh") {
  const std::vector<std::string> args = {"plain", "with space", "it's", "$HOME", "a\"b", "", "x\\y",
                                         "--flag=a b;c"};
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
  REQUIRE(system(("rm -rf " + dir).c_str()) == 0);
}

}  // namespace
}  // namespace harrier::launch
