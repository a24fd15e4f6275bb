#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "prometheus/check_names.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace harrier {
namespace {

// Registration errors are bugs in the calling code, found the first time it
// runs; there is no caller that could handle them, and the library has no
// logger of its own, so the message goes straight to stderr.
[[noreturn]] void Fatal(const std::string& message) {
  std::fprintf(stderr, "MetricsRegistry: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

// prometheus-cpp 1.0 writes HELP text as given; the format wants backslash
// and newline escaped there.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void CheckBounds(const std::string& name, const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i - 1] < bounds[i]))) {
      Fatal(absl::StrCat(name, ": histogram bounds must be finite and strictly increasing"));
    }
  }
}

prometheus::Labels ToPrometheusLabels(const MetricLabels& labels) {
  return prometheus::Labels(labels.begin(), labels.end());
}

std::string LabelsText(const MetricLabels& labels) {
  return absl::StrJoin(labels, ",", [](std::string* out, const auto& label) {
    absl::StrAppend(out, label.first, "=\"", label.second, "\"");
  });
}

// The series `labels` of family `name`, building the family on first use.
// prometheus-cpp throws std::invalid_argument on what CheckAndRecord has
// already refused; should a check be missed, the exception still ends here
// as the same kind of abort instead of crossing into the caller.
template <typename Metric, typename... Args>
Metric& AddSeries(prometheus::detail::Builder<Metric> builder, prometheus::Registry& registry,
                  const std::string& name, const std::string& help, const MetricLabels& labels,
                  const Args&... args) {
  try {
    return builder.Name(name)
        .Help(EscapeHelp(help))
        .Register(registry)
        .Add(ToPrometheusLabels(labels), args...);
  } catch (const std::exception& e) {
    Fatal(absl::StrCat(name, ": ", e.what()));
  }
}

}  // namespace

Counter::Counter() : owned_(std::make_unique<prometheus::Counter>()), counter_(owned_.get()) {}
Counter::Counter(prometheus::Counter* counter) : counter_(counter) {}
Counter::~Counter() = default;

void Counter::Increment(uint64_t n) { counter_->Increment(static_cast<double>(n)); }

uint64_t Counter::value() const { return static_cast<uint64_t>(counter_->Value()); }

Gauge::Gauge() : owned_(std::make_unique<prometheus::Gauge>()), gauge_(owned_.get()) {}
Gauge::Gauge(prometheus::Gauge* gauge) : gauge_(gauge) {}
Gauge::~Gauge() = default;

void Gauge::Set(double value) { gauge_->Set(value); }

void Gauge::Add(double delta) { gauge_->Increment(delta); }

double Gauge::value() const { return gauge_->Value(); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  CheckBounds("Histogram", bounds_);
  owned_ = std::make_unique<prometheus::Histogram>(bounds_);
  histogram_ = owned_.get();
}

Histogram::Histogram(prometheus::Histogram* histogram, std::vector<double> bounds)
    : bounds_(std::move(bounds)), histogram_(histogram) {}

Histogram::~Histogram() = default;

void Histogram::Observe(double value) {
  if (std::isnan(value)) {
    // prometheus-cpp's bucket search would put NaN in the first bucket;
    // Prometheus' own clients (and Harrier before them) count it in +Inf.
    std::vector<double> increments(bounds_.size() + 1, 0.0);
    increments.back() = 1;
    histogram_->ObserveMultiple(increments, value);
    return;
  }
  histogram_->Observe(value);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  // prometheus-cpp's snapshot is cumulative, with the +Inf bucket last.
  const prometheus::ClientMetric snapshot = histogram_->Collect();
  std::vector<uint64_t> counts;
  uint64_t below = 0;
  for (const auto& bucket : snapshot.histogram.bucket) {
    counts.push_back(bucket.cumulative_count - below);
    below = bucket.cumulative_count;
  }
  return counts;
}

double Histogram::sum() const { return histogram_->Collect().histogram.sample_sum; }

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

// The Collectable the Exposer scrapes: the prometheus::Registry's families
// plus the callback series, read at scrape time.
class MetricsRegistry::Collector final : public prometheus::Collectable {
 public:
  prometheus::Registry& registry() { return registry_; }

  void AddCallback(const std::string& name, const std::string& escaped_help,
                   prometheus::MetricType type, const MetricLabels& labels,
                   std::function<double()> read) {
    absl::MutexLock lock(&mutex_);
    CallbackFamily& family = callbacks_[name];
    family.help = escaped_help;
    family.type = type;
    CallbackSeries series;
    for (const auto& [label, value] : ToPrometheusLabels(labels)) {
      series.labels.push_back({label, value});
    }
    series.read = std::move(read);
    family.series.push_back(std::move(series));
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families = registry_.Collect();
    {
      absl::MutexLock lock(&mutex_);
      for (const auto& [name, callback] : callbacks_) {
        // A name may have stored and callback series alike (same type and
        // help, checked at registration): they form one family.
        auto same_name = std::find_if(families.begin(), families.end(),
                                      [&name = name](const auto& f) { return f.name == name; });
        if (same_name == families.end()) {
          prometheus::MetricFamily created;
          created.name = name;
          created.help = callback.help;
          created.type = callback.type;
          same_name = families.insert(families.end(), std::move(created));
        }
        prometheus::MetricFamily& family = *same_name;
        for (const CallbackSeries& series : callback.series) {
          prometheus::ClientMetric metric;
          metric.label = series.labels;
          if (callback.type == prometheus::MetricType::Counter) {
            metric.counter.value = series.read();
          } else {
            metric.gauge.value = series.read();
          }
          family.metric.push_back(std::move(metric));
        }
      }
    }
    // Families by name and series by labels, so a scrape reads the same
    // from one run to the next (prometheus-cpp keeps series in a hash map).
    std::sort(families.begin(), families.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    for (auto& family : families) {
      std::sort(family.metric.begin(), family.metric.end(),
                [](const auto& a, const auto& b) { return a.label < b.label; });
    }
    return families;
  }

 private:
  struct CallbackSeries {
    std::vector<prometheus::ClientMetric::Label> labels;  // sorted by name
    std::function<double()> read;
  };
  struct CallbackFamily {
    std::string help;
    prometheus::MetricType type;
    std::vector<CallbackSeries> series;
  };

  prometheus::Registry registry_;  // thread-safe on its own
  mutable absl::Mutex mutex_;
  std::map<std::string, CallbackFamily> callbacks_ ABSL_GUARDED_BY(mutex_);
};

MetricsRegistry::MetricsRegistry() : collector_(std::make_shared<Collector>()) {}
MetricsRegistry::~MetricsRegistry() = default;

std::weak_ptr<prometheus::Collectable> MetricsRegistry::collectable() const { return collector_; }

std::string MetricsRegistry::RenderText() const {
  return prometheus::TextSerializer().Serialize(collector_->Collect());
}

void MetricsRegistry::CheckAndRecord(const std::string& name, const std::string& help, Type type,
                                     const MetricLabels& labels) {
  if (!prometheus::CheckMetricName(name)) {
    Fatal(absl::StrCat("metric name '", name, "' does not match [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  std::set<std::string> label_names;
  for (const auto& [label, value] : labels) {
    if (!prometheus::CheckLabelName(label)) {
      Fatal(absl::StrCat(name, ": label name '", label,
                         "' does not match [a-zA-Z_][a-zA-Z0-9_]* or starts with __"));
    }
    if (!label_names.insert(label).second) {
      Fatal(absl::StrCat(name, ": label '", label, "' given twice"));
    }
    if (type == Type::kHistogram && label == "le") {
      Fatal(absl::StrCat(name, ": a histogram cannot have the label 'le'"));
    }
  }
  auto [it, created] = families_.try_emplace(name, FamilyInfo{type, help, {}});
  FamilyInfo& family = it->second;
  if (!created && (family.type != type || family.help != help)) {
    Fatal(absl::StrCat(name, " registered again with another type or help text"));
  }
  MetricLabels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  if (std::find(family.label_sets.begin(), family.label_sets.end(), sorted) !=
      family.label_sets.end()) {
    Fatal(absl::StrCat(name, "{", LabelsText(labels), "} registered twice"));
  }
  family.label_sets.push_back(std::move(sorted));
}

Counter& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mutex_);
  CheckAndRecord(name, help, Type::kCounter, labels);
  counters_.push_back(std::unique_ptr<Counter>(new Counter(
      &AddSeries(prometheus::BuildCounter(), collector_->registry(), name, help, labels))));
  return *counters_.back();
}

Gauge& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mutex_);
  CheckAndRecord(name, help, Type::kGauge, labels);
  gauges_.push_back(std::unique_ptr<Gauge>(
      new Gauge(&AddSeries(prometheus::BuildGauge(), collector_->registry(), name, help, labels))));
  return *gauges_.back();
}

Histogram& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds, const MetricLabels& labels) {
  CheckBounds(name, bounds);
  absl::MutexLock lock(&mutex_);
  CheckAndRecord(name, help, Type::kHistogram, labels);
  prometheus::Histogram& series =
      AddSeries(prometheus::BuildHistogram(), collector_->registry(), name, help, labels, bounds);
  histograms_.push_back(std::unique_ptr<Histogram>(new Histogram(&series, std::move(bounds))));
  return *histograms_.back();
}

void MetricsRegistry::AddCallbackGauge(const std::string& name, const std::string& help,
                                       std::function<double()> read, const MetricLabels& labels) {
  if (!read) Fatal(absl::StrCat(name, ": empty callback"));
  absl::MutexLock lock(&mutex_);
  CheckAndRecord(name, help, Type::kGauge, labels);
  collector_->AddCallback(name, EscapeHelp(help), prometheus::MetricType::Gauge, labels,
                          std::move(read));
}

void MetricsRegistry::AddCallbackCounter(const std::string& name, const std::string& help,
                                         std::function<double()> read, const MetricLabels& labels) {
  if (!read) Fatal(absl::StrCat(name, ": empty callback"));
  absl::MutexLock lock(&mutex_);
  CheckAndRecord(name, help, Type::kCounter, labels);
  collector_->AddCallback(name, EscapeHelp(help), prometheus::MetricType::Counter, labels,
                          std::move(read));
}

}  // namespace harrier
