// Emulated network links for benchmarks and tests: Linux network namespaces
// shaped with tc's token bucket (tbf). This kernel has tbf and htb but no
// netem, so links are rate-limited only; no latency is added (see README.md).
//
// Two models:
//  - kSharedLink: one namespace whose loopback is shaped. Every host is
//    127.0.0.1 in that namespace, so all traffic of all hosts shares one
//    link of `rate_gbps` (one direction of lo carries everything).
//  - kPerHost: one namespace per host, each joined by a veth pair to a
//    bridge namespace holding a Linux bridge. Both ends of each veth are
//    shaped: the host end's egress is the host's upload, the bridge end's
//    egress its download, so every host has its own full-duplex NIC of
//    `rate_gbps`. Hosts are 10.199.0.(i+1)/24, addresses that exist only
//    inside the namespaces.
//
// Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip` and `tc`;
// Create returns UNAVAILABLE with a one-line reason otherwise, so callers can
// print "SKIPPED: <reason>" or fail loudly.
//
// Namespaces are named <prefix><pid>-<role>, so parallel runs with one
// prefix never collide; Create first removes namespaces of the same prefix
// whose pid is no longer alive (left by a run that was killed), and the
// destructor removes everything the object made. Not thread-safe, except
// MeasureTcpGbps, which only reads the object.

#ifndef HARRIER_BENCH_NETEM_EMULATED_NETWORK_H_
#define HARRIER_BENCH_NETEM_EMULATED_NETWORK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace harrier::bench {

enum class LinkModel { kSharedLink, kPerHost };

struct EmulatedNetworkOptions {
  // Start of every namespace name; letters and digits, at most 8 characters.
  std::string prefix = "hnet";
  int num_hosts = 2;
  // Rate of each link in Gbit/s (10^9 bit/s); 0 leaves the links unshaped.
  double rate_gbps = 0;
  LinkModel model = LinkModel::kPerHost;
};

// The tbf parameters used for a rate; exposed so the docs and netem.sh can
// quote them. Larger rates need larger bursts: the token bucket is refilled
// per timer tick, and a burst below rate x ~2 ms starves TCP (measured here,
// README.md).
struct TbfParams {
  int64_t rate_bits_per_s;
  int64_t burst_bytes;
  int latency_ms;
};
TbfParams TbfParamsFor(double rate_gbps);

class EmulatedNetwork {
 public:
  static absl::StatusOr<std::unique_ptr<EmulatedNetwork>> Create(
      const EmulatedNetworkOptions& options);
  ~EmulatedNetwork();
  EmulatedNetwork(const EmulatedNetwork&) = delete;
  EmulatedNetwork& operator=(const EmulatedNetwork&) = delete;

  const EmulatedNetworkOptions& options() const { return options_; }
  int num_hosts() const { return options_.num_hosts; }
  // IPv4 address of host i inside its namespace (and reachable from every
  // other host's namespace); "127.0.0.1" in the shared-link model.
  std::string host_address(int host) const;
  // Name of the namespace host i runs in (`ip netns` name).
  std::string host_namespace(int host) const;
  // /var/run/netns/<name>: open it and setns(fd, CLONE_NEWNET) in a forked
  // child before exec to run a process in host i (what the overlap bench
  // does: the child keeps PR_SET_PDEATHSIG that way).
  std::string host_namespace_path(int host) const;
  // argv prefix that runs a command inside host i:
  // {"ip", "netns", "exec", <name>}. `ip netns exec` execs the command in
  // place, so a PR_SET_PDEATHSIG set before it survives.
  std::vector<std::string> ExecPrefix(int host) const;
  // Every namespace this object made, bridge included.
  std::vector<std::string> namespaces() const { return namespaces_; }

  // Rate in Gbit/s that one TCP stream of `bytes` reaches from host `from`
  // to host `to`: a listener and a sender on two threads of this process,
  // each moved into its host's namespace with setns, so the stream crosses
  // the emulated links (and the bridge) as the benchmark's traffic does.
  // Timed from just before connect to the receiver's last byte: every byte
  // must cross the link within that span, so a receiver that is descheduled
  // and then drains a full socket buffer at once cannot inflate the rate
  // (timing from its first read did, seen under load). The handshake (one
  // round trip, tens of microseconds) and the tbf burst are under 2 % of a
  // 0.2 s stream. `from` == `to` is allowed (the host's
  // own loopback, unshaped in the per-host model).
  absl::StatusOr<double> MeasureTcpGbps(int from, int to, int64_t bytes,
                                        absl::Duration timeout = absl::Seconds(30)) const;
  // The best of `attempts` MeasureTcpGbps runs. A shaped link never beats
  // its rate, while a loaded CPU (softirqs and threads descheduled) only
  // ever makes a stream slower, so the best run is the estimate of what the
  // link carries; on a quiet machine all runs agree.
  absl::StatusOr<double> BestTcpGbps(int from, int to, int64_t bytes, int attempts,
                                     absl::Duration timeout = absl::Seconds(30)) const;

  // One raw TCP stream as MeasureTcpGbps runs it, with the CPU its two
  // threads spent (user + system, the kernel's send and receive paths
  // included as far as they run in those threads' system calls).
  struct TcpStream {
    double gbps = 0;
    int64_t bytes = 0;
    double cpu_seconds = 0;  // sender + receiver
    // CPU per GB that an endpoint sends or receives: cpu / (2 * bytes), the
    // same measure the benches give their processes (sent + received).
    double cpu_s_per_gb() const { return bytes > 0 ? cpu_seconds / (2e-9 * bytes) : 0; }
  };
  absl::StatusOr<TcpStream> MeasureTcpStream(int from, int to, int64_t bytes,
                                             absl::Duration timeout = absl::Seconds(30)) const;
  // `attempts` streams: the best rate, and the least CPU per GB (load only
  // ever adds to it, as it only ever slows a stream).
  absl::StatusOr<TcpStream> BestTcpStream(int from, int to, int64_t bytes, int attempts,
                                          absl::Duration timeout = absl::Seconds(30)) const;

 private:
  explicit EmulatedNetwork(const EmulatedNetworkOptions& options) : options_(options) {}
  absl::Status Build();
  absl::Status BuildShared();
  absl::Status BuildPerHost();
  absl::Status AddNamespace(const std::string& name);
  void RemoveAll();

  EmulatedNetworkOptions options_;
  std::string base_;  // <prefix><pid>
  std::vector<std::string> namespaces_;
};

// Runs argv (argv[0] found on PATH) with stdin from /dev/null, waiting at
// most `timeout`; returns its stdout. On failure the status names the
// command and quotes its stderr. Used for `ip` and `tc`.
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv,
                                       absl::Duration timeout = absl::Seconds(10));

// Names in `ip netns list` that start with `prefix`.
absl::StatusOr<std::vector<std::string>> ListNamespaces(const std::string& prefix);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_NETEM_EMULATED_NETWORK_H_
