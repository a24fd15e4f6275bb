// measure-link: builds an emulated network of two hosts, measures one TCP
// stream from host 0 to host 1 across it, removes it, and prints one JSON
// line. For tuning tbf parameters and checking a machine by hand.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "bench/netem/emulated_network.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: measure-link [--rate_gbps=1] [--model=per_host|shared] [--mbytes=25]\n"
               "  --rate_gbps  tbf rate of every link in Gbit/s; 0 = unshaped\n"
               "  --model      per_host: a namespace per host joined by veth to a bridge;\n"
               "               shared: one namespace, its loopback shaped\n"
               "  --mbytes     megabytes (10^6) the TCP stream sends\n"
               "Needs root. Prints one JSON line on stdout.\n");
}

}  // namespace

int main(int argc, char** argv) {
  harrier::bench::EmulatedNetworkOptions options;
  options.prefix = "hml";
  std::string model = "per_host";
  double mbytes = 25;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return arg.compare(0, n, name) == 0 ? arg.c_str() + n : nullptr;
    };
    if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    } else if (const char* v = value("--rate_gbps=")) {
      if (!absl::SimpleAtod(v, &options.rate_gbps)) {
        std::fprintf(stderr, "measure-link: bad --rate_gbps=%s\n", v);
        return 2;
      }
    } else if (const char* v = value("--model=")) {
      model = v;
    } else if (const char* v = value("--mbytes=")) {
      if (!absl::SimpleAtod(v, &mbytes) || mbytes < 2) {
        std::fprintf(stderr, "measure-link: bad --mbytes=%s (at least 2)\n", v);
        return 2;
      }
    } else {
      std::fprintf(stderr, "measure-link: unknown flag %s\n", arg.c_str());
      Usage(stderr);
      return 2;
    }
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
  std::printf(
      "{\"bench\":\"measure_link\",\"model\":\"%s\",\"rate_gbps\":%g,\"burst_bytes\":%lld,"
      "\"mbytes\":%g,\"measured_gbps\":%.4f}\n",
      model.c_str(), options.rate_gbps,
      static_cast<long long>(options.rate_gbps > 0 ? tbf.burst_bytes : 0), mbytes, *gbps);
  return 0;
}
