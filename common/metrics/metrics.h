#ifndef HARRIER_COMMON_METRICS_METRICS_H_
#define HARRIER_COMMON_METRICS_METRICS_H_

// Harrier's metrics registry: a thin layer over prometheus-cpp
// (prometheus::Registry and its Counter, Gauge and Histogram families) that
// adds what prometheus-cpp lacks: series whose value is read from elsewhere
// at scrape time (ShardCounters' atomics, a queue's length), and the checks
// that turn a registration mistake into an abort naming the metric.
//
// Usage: build one MetricsRegistry per server (no global registry, so
// several servers can run in one test process), register every metric at
// start-up, keep the returned references, and update them from any thread.
// Serve it with MetricsHttpServer (metrics_http_server.h).
//
// Registration mistakes (a bad metric or label name, a label given twice, a
// label set registered twice, the same name with another type or help text,
// a histogram label named "le", bounds that are not finite and strictly
// increasing, an empty callback) are programming errors: the Add* methods
// abort with a message naming the metric.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace prometheus {
class Collectable;
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace harrier {

// Label name/value pairs. The exposition lists a series' labels sorted by
// name (prometheus-cpp keeps them in a map); order does not make a series.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Metric handles. Those returned by MetricsRegistry are served with it and
// live as long as it; one built directly (e.g. in a unit test of code that
// takes a Histogram*) works the same but is served nowhere.

// A monotonically increasing count. Thread-safe, lock-free. Stored as a
// double by prometheus-cpp: exact up to 2^53.
class Counter {
 public:
  Counter();
  ~Counter();
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Increment(uint64_t n = 1);
  uint64_t value() const;

 private:
  friend class MetricsRegistry;
  explicit Counter(prometheus::Counter* counter);
  std::unique_ptr<prometheus::Counter> owned_;  // only when built directly
  prometheus::Counter* counter_;                // owned_ or the registry's family's
};

// A value that goes up and down. Thread-safe, lock-free.
class Gauge {
 public:
  Gauge();
  ~Gauge();
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value);
  void Add(double delta);
  double value() const;

 private:
  friend class MetricsRegistry;
  explicit Gauge(prometheus::Gauge* gauge);
  std::unique_ptr<prometheus::Gauge> owned_;  // only when built directly
  prometheus::Gauge* gauge_;                  // owned_ or the registry's family's
};

// Counts of observations in fixed buckets ("le" inclusive: a value equal to
// a bound counts in that bound's bucket; NaN counts in +Inf), with their
// sum. Thread-safe (prometheus-cpp takes a short per-histogram lock, so a
// scrape or a snapshot sees the counts and the sum of the same
// observations).
class Histogram {
 public:
  // `bounds`: the finite upper bounds, strictly increasing; a +Inf bucket
  // is always added. Aborts on bad bounds.
  explicit Histogram(std::vector<double> bounds);
  ~Histogram();
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket counts, not cumulative (bounds().size() + 1 entries, the
  // last for +Inf), and the sum of the observed values.
  std::vector<uint64_t> BucketCounts() const;
  double sum() const;

 private:
  friend class MetricsRegistry;
  Histogram(prometheus::Histogram* histogram, std::vector<double> bounds);
  std::vector<double> bounds_;
  std::unique_ptr<prometheus::Histogram> owned_;  // only when built directly
  prometheus::Histogram* histogram_;              // owned_ or the registry's family's
};

// Bounds start, start*factor, ... (count of them), e.g. latencies.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Owns every metric registered with it. Returned references stay valid for
// the registry's lifetime. Thread-safe: registration and scrapes may happen
// concurrently with each other and with updates.
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
  // `bounds`: the finite upper bounds, strictly increasing; the +Inf bucket
  // is always added.
  Histogram& AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds, const MetricLabels& labels = {});

  // Values read from elsewhere at scrape time. `read` runs on the scraping
  // thread (an HTTP server thread) under the registry's lock: it must be
  // cheap, thread-safe, must not call back into this registry, and whatever
  // it reads must outlive the registry (or the last scrape).
  void AddCallbackGauge(const std::string& name, const std::string& help,
                        std::function<double()> read, const MetricLabels& labels = {});
  void AddCallbackCounter(const std::string& name, const std::string& help,
                          std::function<double()> read, const MetricLabels& labels = {});

  // What MetricsHttpServer registers with its prometheus::Exposer: every
  // family of this registry, sorted by name, series sorted by labels.
  // Expires with the registry.
  std::weak_ptr<prometheus::Collectable> collectable() const;

  // The same families in Prometheus' text format, through prometheus-cpp's
  // serializer (what /metrics serves, uncompressed). For tests and logs.
  std::string RenderText() const;

 private:
  class Collector;
  enum class Type { kCounter, kGauge, kHistogram };

  // Checks `name`, `help`, `labels` against what is registered and records
  // the series; aborts on misuse.
  void CheckAndRecord(const std::string& name, const std::string& help, Type type,
                      const MetricLabels& labels) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  struct FamilyInfo {
    Type type;
    std::string help;
    std::vector<MetricLabels> label_sets;  // each sorted by name
  };

  // Guards the bookkeeping below and the order of registrations; the
  // prometheus::Registry and the collector are thread-safe on their own.
  absl::Mutex mutex_;
  std::map<std::string, FamilyInfo> families_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::unique_ptr<Counter>> counters_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::unique_ptr<Gauge>> gauges_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::unique_ptr<Histogram>> histograms_ ABSL_GUARDED_BY(mutex_);
  // Holds the prometheus::Registry and the callback series; shared so the
  // Exposer can hold it weakly.
  std::shared_ptr<Collector> collector_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_METRICS_METRICS_H_
