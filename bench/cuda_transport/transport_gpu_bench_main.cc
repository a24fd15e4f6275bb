// transport_gpu_bench: pushes of a dense tensor that lives in device memory
// to one harrier-server shard over UCX, and pulls of it back, two ways:
//   direct: UCX reads (push) or writes (pull, a landing chooser with a device
//           landing) the device buffer itself (UCS_MEMORY_TYPE_CUDA), only
//           when the UCX in use supports CUDA memory;
//   staged: push: cudaMemcpy device-to-host into a host buffer, then a host
//           push; pull: a host pull, then cudaMemcpy host-to-device;
// each next to the host push or pull of the same bytes measured in the same
// run (ratio_of_host = host seconds / path seconds, 1.0 = as fast as host).
// One JSON line per point on stdout. Needs --config=cuda to build and a GPU
// to run; see bench/cuda_transport/BUILD.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/cuda_transport/ucx_push_target.h"
#include "bench/flags.h"
#include "common/json.h"
#include "cuda/device_memory.h"

ABSL_FLAG(std::string, sizes_mib, "1,16,64", "tensor sizes in MiB");
ABSL_FLAG(int, iterations, 20, "timed pushes per path and size (after one warm-up)");
ABSL_FLAG(std::string, device_memory, "",
          "auto, off (always staged) or on (fail without CUDA UCX); default: "
          "$HARRIER_UCX_DEVICE_MEMORY, else auto");
ABSL_FLAG(size_t, chunk_bytes, size_t{4} << 20, "chunk size of the pushes (the client's default)");

namespace harrier::bench {
namespace {

constexpr const char* kUsage =
    "usage: transport_gpu_bench [flags]\n"
    "Push and pull goodput of a dense fp32 tensor in device memory with one\n"
    "harrier-server shard over UCX (started here, --ucx, on 127.0.0.1): direct\n"
    "from/into device memory (if this UCX supports CUDA memory) and staged through\n"
    "a host buffer, each with a host push/pull of the same bytes as the reference.\n"
    "JSON lines on stdout:\n"
    "  {bench, op: push|pull, path: direct|staged, bytes, seconds (per op), gbps (GB/s),\n"
    "   host_seconds, host_gbps, ratio_of_host, ucx_cuda, device_memory, ucx_tls}\n"
    "UCX_TLS etc. configure UCX here and in the shard; HARRIER_UCX_DEVICE_MEMORY\n"
    "is the default of --device_memory.\n"
    "  --sizes_mib=1,16,64    tensor sizes in MiB\n"
    "  --iterations=20        timed pushes per path and size (after one warm-up)\n"
    "  --device_memory=auto   auto, off (always staged) or on (fail without CUDA UCX)\n"
    "  --chunk_bytes=4194304  chunk size of the pushes (the client's default)\n"
    "  --help\n";

struct Options {
  std::vector<int> sizes_mib = {1, 16, 64};
  int iterations = 20;
  std::string device_memory;
  size_t chunk_bytes = size_t{4} << 20;
};

// Returns a message for a usage error, "" on success.
std::string ParseArgs(Options* options) {
  options->sizes_mib.clear();
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes_mib), ',', absl::SkipWhitespace())) {
    int mib = 0;
    if (!absl::SimpleAtoi(part, &mib) || mib <= 0 || mib > 4096) {
      return absl::StrCat("--sizes_mib: '", part, "' is not a size in MiB (1..4096)");
    }
    options->sizes_mib.push_back(mib);
  }
  if (options->sizes_mib.empty()) return "--sizes_mib: empty list";
  options->iterations = absl::GetFlag(FLAGS_iterations);
  if (options->iterations <= 0) {
    return absl::StrCat("--iterations: '", options->iterations, "' is not a positive count");
  }
  options->device_memory = absl::GetFlag(FLAGS_device_memory);
  if (options->device_memory.empty()) {
    const char* env = std::getenv(kUcxDeviceMemoryEnv);
    options->device_memory = env == nullptr ? "auto" : env;
  }
  options->chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (auto mode = ParseUcxDeviceMemory(options->device_memory); !mode.ok()) {
    return std::string(mode.status().message());
  }
  return "";
}

// ServerProcess finds harrier-server under $TEST_SRCDIR: outside `bazel
// test`, point it at this binary's runfiles (bazel-bin and bazel run).
void UseOwnRunfiles(const char* argv0) {
  if (std::getenv("TEST_SRCDIR") != nullptr) return;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string binary = n > 0 ? std::string(self, n) : std::string(argv0);
  setenv("TEST_SRCDIR", (binary + ".runfiles").c_str(), 1);
  setenv("TEST_WORKSPACE", "harrier", 1);
}

// Seconds per call of `push`, averaged over `iterations` calls.
template <typename Push>
absl::StatusOr<double> Time(int iterations, Push push) {
  const absl::Time start = absl::Now();
  for (int i = 0; i < iterations; ++i) {
    if (absl::Status status = push(); !status.ok()) return status;
  }
  return absl::ToDoubleSeconds(absl::Now() - start) / iterations;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "transport_gpu_bench: %s\n", std::string(status.message()).c_str());
  return 1;
}

int Run(const Options& options) {
  auto mode = ParseUcxDeviceMemory(options.device_memory);
  auto target = UcxPushTarget::Start(*mode, options.chunk_bytes);
  if (!target.ok()) return Fail(target.status());
  const bool direct = (*target)->sends_from_device_memory();
  const bool direct_pulls = (*target)->receives_into_device_memory();
  const char* tls = std::getenv("UCX_TLS");
  const Json common = {
      {"ucx_cuda", direct},
      {"device_memory", options.device_memory},
      {"ucx_tls", tls == nullptr ? "" : tls},
  };
  if (!direct) {
    std::fprintf(stderr,
                 "transport_gpu_bench: this UCX does not send from device memory (no CUDA "
                 "support, or --device_memory=off): staged paths only\n");
  }
  for (int mib : options.sizes_mib) {
    const size_t bytes = static_cast<size_t>(mib) << 20;
    const size_t n = bytes / sizeof(float);
    std::vector<float> values(n), staging(n), pulled(n);
    for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 97) * 0.25f;
    auto device = cuda::DeviceArray::Create(n);
    if (!device.ok()) return Fail(device.status());
    if (absl::Status s = device->CopyFromHost(values.data(), n); !s.ok()) return Fail(s);
    const std::string key = absl::StrCat("t", mib, "m");
    if (absl::Status s = (*target)->AddTensor(key, values); !s.ok()) return Fail(s);

    auto host_push = [&] { return (*target)->Push(key, values.data(), MemoryKind::kHost); };
    auto staged_push = [&]() -> absl::Status {
      if (absl::Status s = device->CopyToHost(staging.data(), n); !s.ok()) return s;
      return (*target)->Push(key, staging.data(), MemoryKind::kHost);
    };
    auto direct_push = [&] { return (*target)->Push(key, device->data(), MemoryKind::kDevice); };

    auto host_pull = [&] {
      return (*target)->Pull(key, pulled.data(), MemoryKind::kHost).status();
    };
    auto staged_pull = [&]() -> absl::Status {
      if (absl::Status s = (*target)->Pull(key, staging.data(), MemoryKind::kHost).status();
          !s.ok()) {
        return s;
      }
      return device->CopyFromHost(staging.data(), n);
    };
    auto direct_pull = [&] {
      return (*target)->Pull(key, device->data(), MemoryKind::kDevice).status();
    };

    struct Path {
      const char* name;
      std::function<absl::Status()> run;
    };
    struct Op {
      const char* name;
      std::function<absl::Status()> host;
      std::vector<Path> paths;
    };
    std::vector<Op> ops = {{"push", host_push, {{"staged", staged_push}}},
                           {"pull", host_pull, {{"staged", staged_pull}}}};
    if (direct) ops[0].paths.push_back({"direct", direct_push});
    if (direct_pulls) ops[1].paths.push_back({"direct", direct_pull});
    for (const Op& op : ops) {
      if (absl::Status s = op.host(); !s.ok()) return Fail(s);  // warm-up: connection, pages
      auto host = Time(options.iterations, op.host);
      if (!host.ok()) return Fail(host.status());
      for (const Path& path : op.paths) {
        if (absl::Status s = path.run(); !s.ok()) return Fail(s);  // warm-up
        auto seconds = Time(options.iterations, path.run);
        if (!seconds.ok()) return Fail(seconds.status());
        Json line = {
            {"bench", "transport_gpu"},
            {"op", op.name},
            {"path", path.name},
            {"bytes", bytes},
            {"seconds", RoundToSignificant(*seconds, 6)},
            {"gbps", RoundToSignificant(bytes / *seconds / 1e9, 4)},
            {"host_seconds", RoundToSignificant(*host, 6)},
            {"host_gbps", RoundToSignificant(bytes / *host / 1e9, 4)},
            {"ratio_of_host", RoundToSignificant(*host / *seconds, 4)},
            {"iterations", options.iterations},
        };
        line.update(common);
        std::printf("%s\n", DumpJson(line).c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace harrier::bench

int main(int argc, char** argv) {
  harrier::bench::Options options;
  if (std::optional<int> exit_code = harrier::bench::ParseSubcommandFlags(
          argc, argv, harrier::bench::kUsage,
          {"sizes_mib", "iterations", "device_memory", "chunk_bytes"}, harrier::bench::ParseArgs,
          &options)) {
    return *exit_code;
  }
  harrier::bench::UseOwnRunfiles(argv[0]);
  return harrier::bench::Run(options);
}
