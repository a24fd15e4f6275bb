// The emulated links shape, through real TCP streams across real
// namespaces, veth pairs and a bridge: a shaped link measures the order of
// magnitude of its set rate (a shaper that does not shape is 8x off at
// 1 Gbit/s), the per-host and shared models carry concurrent streams, and
// teardown leaves nothing behind.
//
// Only what a loaded machine cannot break is asserted here: a stream can
// come out much slower than its link when the CPU is busy (0.62 of
// 1 Gbit/s at a load average of 12-19 on 2 cores), never faster. The rates
// within 10 %, the unshaped-to-shaped ratio and the split of a shared link
// are bench checks, run by hand on a quiet machine:
// `bench/scripts/bench_checks.sh links` (docs/experiments.md, "Bench checks").
//
// Needs root. Where namespaces cannot be made every case prints
// "SKIPPED: <reason>" and passes; CI runs as root, so there they run.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "bench/netem/emulated_network.h"

namespace harrier::bench {
namespace {

constexpr int64_t kBytesAt1Gbit = 25'000'000;  // 0.2 s at 1 Gbit/s
// The band a shaped stream must fall in, as fractions of the set rate. Above
// it the shaper does not shape (unshaped streams measure 7-20 Gbit/s here);
// below it the link is broken, not merely slowed by a busy CPU (5x slower
// than a quiet machine is still inside).
constexpr double kAtLeast = 0.1;
constexpr double kAtMost = 2.0;

bool InBand(double gbps, double rate_gbps) {
  return gbps >= kAtLeast * rate_gbps && gbps <= kAtMost * rate_gbps;
}

// Makes a network, or returns nullptr after printing why it was skipped.
std::unique_ptr<EmulatedNetwork> MakeOrSkip(const EmulatedNetworkOptions& options) {
  auto network = EmulatedNetwork::Create(options);
  if (absl::IsUnavailable(network.status())) {
    std::printf("SKIPPED: %s\n", std::string(network.status().message()).c_str());
    std::fflush(stdout);
    return nullptr;
  }
  REQUIRE(network.ok());
  return *std::move(network);
}

EmulatedNetworkOptions Options(LinkModel model, int hosts, double rate_gbps) {
  EmulatedNetworkOptions options;
  options.prefix = "hlt";
  options.num_hosts = hosts;
  options.rate_gbps = rate_gbps;
  options.model = model;
  return options;
}

// One stream, and up to 2 more while it falls below the band: a stream is
// slowed by a busy CPU, never sped up, so a shaper that does not shape fails
// every attempt.
double Measure(const EmulatedNetwork& network, int from, int to, int64_t bytes) {
  const double rate = network.options().rate_gbps;
  double best = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto one = network.MeasureTcpGbps(from, to, bytes);
    INFO(one.status().ToString());
    REQUIRE(one.ok());
    best = std::max(best, *one);
    if (rate == 0 || best >= kAtLeast * rate) break;
  }
  std::printf("%s %d -> %d, set %g Gbit/s: measured %.3f Gbit/s\n",
              network.options().model == LinkModel::kPerHost ? "per-host" : "shared", from, to,
              rate, best);
  return best;
}

TEST_CASE("per-host links at 1 Gbit/s shape both ways") {
  auto network = MakeOrSkip(Options(LinkModel::kPerHost, 2, 1));
  if (network == nullptr) return;
  const double up = Measure(*network, 0, 1, kBytesAt1Gbit);
  CHECK(InBand(up, 1));
  const double down = Measure(*network, 1, 0, kBytesAt1Gbit);
  CHECK(InBand(down, 1));
}

TEST_CASE("a shared link at 1 Gbit/s shapes") {
  auto network = MakeOrSkip(Options(LinkModel::kSharedLink, 2, 1));
  if (network == nullptr) return;
  CHECK(InBand(Measure(*network, 0, 1, kBytesAt1Gbit), 1));
}

TEST_CASE("an unshaped link carries a stream") {
  // How much faster than a shaped one is a bench check (it depends on the
  // CPU left over); here only that the stream arrives whole.
  auto unshaped = MakeOrSkip(Options(LinkModel::kPerHost, 2, 0));
  if (unshaped == nullptr) return;
  CHECK(Measure(*unshaped, 0, 1, kBytesAt1Gbit) > 0);
}

TEST_CASE("per-host links at 10 Gbit/s shape") {
  // One TCP stream through two veths and a bridge is CPU-bound near
  // 10 Gbit/s on 2 cores (5.4-8.3 loaded, 9.47 idle), so only the order of
  // magnitude holds on a busy machine.
  auto shaped = MakeOrSkip(Options(LinkModel::kPerHost, 2, 10));
  if (shaped == nullptr) return;
  CHECK(InBand(Measure(*shaped, 0, 1, 10 * kBytesAt1Gbit), 10));
}

TEST_CASE("per-host links and a shared link carry concurrent streams") {
  // Two streams at once, 0 -> 1 and 2 -> 3: each arrives whole and none
  // beats twice the link (two streams on a shared link get about half of it
  // each, less on a busy CPU, so there is no lower bound). That per-host links keep 1 Gbit/s each while a
  // shared link splits it is a bench check: the split depends on how the
  // two streams overlap in time, which a busy scheduler decides.
  for (LinkModel model : {LinkModel::kPerHost, LinkModel::kSharedLink}) {
    auto network = MakeOrSkip(Options(model, 4, 1));
    if (network == nullptr) return;
    double other_gbps = 0;
    std::thread other([&] {
      auto gbps = network->MeasureTcpGbps(2, 3, kBytesAt1Gbit);
      other_gbps = gbps.ok() ? *gbps : -1;
    });
    auto gbps = network->MeasureTcpGbps(0, 1, kBytesAt1Gbit);
    other.join();
    INFO(gbps.status().ToString());
    REQUIRE(gbps.ok());
    std::printf("%s concurrent 0 -> 1: %.3f, 2 -> 3: %.3f Gbit/s\n",
                model == LinkModel::kPerHost ? "per-host" : "shared", *gbps, other_gbps);
    CHECK(*gbps > 0);
    CHECK(*gbps <= kAtMost * 1);
    CHECK(other_gbps > 0);
    CHECK(other_gbps <= kAtMost * 1);
  }
}

TEST_CASE("teardown removes every namespace; Create removes stale ones of its prefix") {
  // A namespace named as a dead run of this prefix would have named it.
  pid_t dead = 4000000;
  while (kill(dead, 0) == 0 || errno != ESRCH) ++dead;
  const std::string stale = absl::StrCat("hlt", dead, "-b");
  auto probe = RunCommand({"ip", "netns", "add", stale});
  if (!probe.ok()) {
    std::printf("SKIPPED: cannot create network namespaces: %s\n",
                std::string(probe.status().message()).c_str());
    return;
  }
  std::vector<std::string> made;
  {
    auto network = MakeOrSkip(Options(LinkModel::kPerHost, 3, 1));
    REQUIRE(network != nullptr);
    made = network->namespaces();
    CHECK(made.size() == 4);  // bridge + 3 hosts
    auto listed = ListNamespaces("hlt");
    REQUIRE(listed.ok());
    CHECK(std::find(listed->begin(), listed->end(), stale) == listed->end());
    for (const std::string& name : made) {
      CHECK(std::find(listed->begin(), listed->end(), name) != listed->end());
    }
  }
  auto after = ListNamespaces(absl::StrCat("hlt", getpid(), "-"));
  REQUIRE(after.ok());
  CHECK(after->empty());
}

TEST_CASE("bad options are refused") {
  EmulatedNetworkOptions options;
  options.prefix = "bad-prefix!";
  CHECK(absl::IsInvalidArgument(EmulatedNetwork::Create(options).status()));
  options.prefix = "ok";
  options.num_hosts = 0;
  CHECK(absl::IsInvalidArgument(EmulatedNetwork::Create(options).status()));
}

}  // namespace
}  // namespace harrier::bench
