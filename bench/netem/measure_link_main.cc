// measure-link: builds an emulated network of two hosts, measures one TCP
// stream from host 0 to host 1 across it, removes it, and prints one JSON
// line. For tuning tbf parameters and checking a machine by hand.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "bench/flags.h"
#include "bench/netem/emulated_network.h"
#include "common/json.h"

ABSL_FLAG(double, rate_gbps, 1, "tbf rate of every link in Gbit/s; 0 = unshaped");
ABSL_FLAG(std::string, model, "per_host",
          "per_host: a namespace per host joined by veth to a bridge; shared: one namespace, its "
          "loopback shaped");
ABSL_FLAG(double, mbytes, 25, "megabytes (10^6) the TCP stream sends");

namespace {

constexpr const char kUsage[] =
    "usage: measure-link [--rate_gbps=1] [--model=per_host|shared] [--mbytes=25]\n"
    "  --rate_gbps  tbf rate of every link in Gbit/s; 0 = unshaped\n"
    "  --model      per_host: a namespace per host joined by veth to a bridge;\n"
    "               shared: one namespace, its loopback shaped\n"
    "  --mbytes     megabytes (10^6) the TCP stream sends\n"
    "Needs root. Prints one JSON line on stdout.\n";

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> exit_code =
          harrier::bench::ParseBenchFlags(argc, argv, kUsage, {"rate_gbps", "model", "mbytes"})) {
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
  auto gbps = (*network)->MeasureTcpGbps(0, 1, static_cast<int64_t>(mbytes * 1e6));
  if (!gbps.ok()) {
    std::fprintf(stderr, "measure-link: %s\n", std::string(gbps.status().message()).c_str());
    return 1;
  }
  const harrier::bench::TbfParams tbf = harrier::bench::TbfParamsFor(options.rate_gbps);
  const harrier::Json line = {
      {"bench", "measure_link"},
      {"model", model},
      {"rate_gbps", options.rate_gbps},
      {"burst_bytes", options.rate_gbps > 0 ? tbf.burst_bytes : 0},
      {"mbytes", mbytes},
      {"measured_gbps", harrier::RoundTo(*gbps, 4)},
  };
  std::printf("%s\n", harrier::DumpJson(line).c_str());
  return 0;
}
