#ifndef HARRIER_COMMON_METRICS_METRICS_H_
#define HARRIER_COMMON_METRICS_METRICS_H_

// A small metrics registry rendered in Prometheus' text exposition format
// (version 0.0.4), with no dependency beyond Abseil.
//
// Usage: build one MetricsRegistry per server (no global registry, so
// several servers can run in one test process), register every metric at
// start-up, keep the returned references, and update them from any thread.
// Updates are single atomic operations; rendering takes the registry's lock
// only to walk the list of metrics.
//
// Registration mistakes (a bad name, a label set registered twice, the same
// name with another type or help text, unsorted histogram bounds) are
// programming errors: the Add* methods abort with a message naming the
// metric. Validate*Name are exposed for callers that build names at run time.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace harrier {

// Label name/value pairs, rendered in the order given.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// OK for `[a-zA-Z_:][a-zA-Z0-9_:]*`, INVALID_ARGUMENT otherwise.
absl::Status ValidateMetricName(absl::string_view name);
// OK for `[a-zA-Z_][a-zA-Z0-9_]*` not starting with "__" (reserved).
absl::Status ValidateLabelName(absl::string_view name);
// Escapes `\`, `"` and newline as the format requires inside label values.
std::string EscapeLabelValue(absl::string_view value);
// A sample value as Prometheus parses it: shortest round-trip decimal,
// "+Inf", "-Inf" or "NaN".
std::string FormatMetricValue(double value);

// A monotonically increasing count. Thread-safe, lock-free.
class Counter {
 public:
  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down. Thread-safe, lock-free (Add is a CAS loop).
class Gauge {
 public:
  void Set(double value);
  void Add(double delta);
  double value() const;

 private:
  std::atomic<uint64_t> bits_{0};  // the double's bits; 0 bits == 0.0
};

// Counts of observations in fixed buckets, with their sum. Thread-safe,
// lock-free. Bucket counts are stored per bucket (not cumulative), so
// Observe touches one bucket; rendering accumulates them.
class Histogram {
 public:
  // `bounds`: the finite upper bounds, strictly increasing; a +Inf bucket
  // is always added.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket counts (bounds().size() + 1 entries, the last for +Inf), and
  // the sum of observed values. A snapshot taken during Observe calls may
  // include an observation in the counts but not yet in the sum.
  std::vector<uint64_t> BucketCounts() const;
  double sum() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> sum_bits_{0};
};

// Bounds start, start*factor, ... (count of them), e.g. latencies.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Owns every metric registered with it. Returned references and pointers
// stay valid for the registry's lifetime. Thread-safe: registration and
// rendering may happen concurrently with each other and with updates.
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Several label sets may share one name (one family); they must agree on
  // type and help text.
  Counter& AddCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge& AddGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram& AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds, const MetricLabels& labels = {});

  // Values read from elsewhere at render time (e.g. ShardCounters' atomics,
  // a queue's length). `read` runs on the rendering thread, under the
  // registry's lock: it must be cheap, thread-safe, must not call back into
  // this registry, and whatever it reads must outlive the registry (or the
  // last render).
  void AddCallbackGauge(const std::string& name, const std::string& help,
                        std::function<double()> read, const MetricLabels& labels = {});
  void AddCallbackCounter(const std::string& name, const std::string& help,
                          std::function<double()> read, const MetricLabels& labels = {});

  // The whole registry in text format 0.0.4: families sorted by name, each
  // with its HELP and TYPE lines, series in registration order.
  std::string RenderText() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series;
  struct Family;

  // Validates `series` (its labels set, its metric object made), then
  // publishes it in its family, creating the family; aborts on misuse.
  void AddSeries(const std::string& name, const std::string& help, Type type,
                 std::unique_ptr<Series> series);

  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_METRICS_METRICS_H_
