// measure-link: builds an emulated network of two hosts, measures one TCP
// stream from host 0 to host 1 across it, removes it, and prints one JSON
// line. For tuning tbf parameters and checking a machine by hand (and the
// link checks of bench/scripts/bench_checks.sh): --attempts keeps the best
// of several streams, --reverse measures host 1 to host 0, --pairs=N runs N
// streams at once between disjoint pairs of 2N hosts.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/flags.h"
#include "bench/netem/emulated_network.h"
#include "common/json.h"

ABSL_FLAG(double, rate_gbps, 1, "tbf rate of every link in Gbit/s; 0 = unshaped");
ABSL_FLAG(std::string, model, "per_host",
          "per_host: a namespace per host joined by veth to a bridge; shared: one namespace, its "
          "loopback shaped");
ABSL_FLAG(double, mbytes, 25, "megabytes (10^6) the TCP stream sends");
ABSL_FLAG(int, attempts, 1,
          "streams measured one after another; the best is reported (a busy CPU only ever "
          "slows a stream)");
ABSL_FLAG(bool, reverse, false, "measure host 1 -> host 0 instead of host 0 -> host 1");
ABSL_FLAG(int, pairs, 1,
          "streams at once, host 2i -> host 2i+1 for i < pairs, over 2 x pairs hosts; an "
          "attempt's figure is its slowest stream's");

namespace {

constexpr const char kUsage[] =
    "usage: measure-link [--rate_gbps=1] [--model=per_host|shared] [--mbytes=25]\n"
    "                    [--attempts=1] [--reverse] [--pairs=1]\n"
    "  --rate_gbps  tbf rate of every link in Gbit/s; 0 = unshaped\n"
    "  --model      per_host: a namespace per host joined by veth to a bridge;\n"
    "               shared: one namespace, its loopback shaped\n"
    "  --mbytes     megabytes (10^6) the TCP stream sends\n"
    "  --attempts   streams one after another; the best is reported\n"
    "  --reverse    host 1 -> host 0 instead of host 0 -> host 1\n"
    "  --pairs      streams at once, host 2i -> 2i+1, over 2 x pairs hosts;\n"
    "               pairs_gbps lists each stream of the attempt whose slowest\n"
    "               stream was fastest\n"
    "Needs root. Prints one JSON line on stdout.\n";

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> exit_code =
          harrier::bench::ParseBenchFlags(argc, argv, kUsage,
                                          {"rate_gbps", "model", "mbytes", "attempts", "reverse",
                                           "pairs"})) {
    return *exit_code;
  }
  harrier::bench::EmulatedNetworkOptions options;
  options.prefix = "hml";
  options.rate_gbps = absl::GetFlag(FLAGS_rate_gbps);
  const std::string model = absl::GetFlag(FLAGS_model);
  const double mbytes = absl::GetFlag(FLAGS_mbytes);
  if (!(mbytes >= 2)) {
    std::fprintf(stderr, "measure-link: bad --mbytes=%g (at least 2)\n", mbytes);
    return 2;
  }
  const int attempts = absl::GetFlag(FLAGS_attempts);
  const int pairs = absl::GetFlag(FLAGS_pairs);
  const bool reverse = absl::GetFlag(FLAGS_reverse);
  if (attempts < 1 || attempts > 100 || pairs < 1 || pairs > 8) {
    std::fprintf(stderr, "measure-link: --attempts must be in [1, 100] and --pairs in [1, 8]\n");
    return 2;
  }
  options.num_hosts = 2 * pairs;
  if (model == "shared") {
    options.model = harrier::bench::LinkModel::kSharedLink;
  } else if (model != "per_host") {
    std::fprintf(stderr, "measure-link: --model must be per_host or shared, not %s\n",
                 model.c_str());
    return 2;
  }
  auto network = harrier::bench::EmulatedNetwork::Create(options);
  if (!network.ok()) {
    std::fprintf(stderr, "measure-link: %s\n", std::string(network.status().message()).c_str());
    return 1;
  }
  const int64_t bytes = static_cast<int64_t>(mbytes * 1e6);
  // Each attempt runs every pair at once; the attempt whose slowest stream
  // was fastest is kept.
  std::vector<double> best;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    std::vector<absl::StatusOr<double>> rates(pairs, 0.0);
    std::vector<std::thread> streams;
    for (int i = 0; i < pairs; ++i) {
      const int from = reverse ? 2 * i + 1 : 2 * i;
      const int to = reverse ? 2 * i : 2 * i + 1;
      streams.emplace_back(
          [&, i, from, to] { rates[i] = (*network)->MeasureTcpGbps(from, to, bytes); });
    }
    for (std::thread& stream : streams) stream.join();
    std::vector<double> these;
    for (const absl::StatusOr<double>& rate : rates) {
      if (!rate.ok()) {
        std::fprintf(stderr, "measure-link: %s\n", std::string(rate.status().message()).c_str());
        return 1;
      }
      these.push_back(*rate);
    }
    if (best.empty() || *std::min_element(these.begin(), these.end()) >
                            *std::min_element(best.begin(), best.end())) {
      best = these;
    }
  }
  harrier::Json pairs_gbps = harrier::Json::array();
  for (double rate : best) pairs_gbps.push_back(harrier::RoundTo(rate, 4));
  const harrier::bench::TbfParams tbf = harrier::bench::TbfParamsFor(options.rate_gbps);
  const harrier::Json line = {
      {"bench", "measure_link"},
      {"model", model},
      {"rate_gbps", options.rate_gbps},
      {"burst_bytes", options.rate_gbps > 0 ? tbf.burst_bytes : 0},
      {"mbytes", mbytes},
      {"measured_gbps", harrier::RoundTo(best[0], 4)},
      {"attempts", attempts},
      {"reverse", reverse},
      {"pairs", pairs},
      {"pairs_gbps", pairs_gbps},
  };
  std::printf("%s\n", harrier::DumpJson(line).c_str());
  return 0;
}
