#include "common/metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"

namespace harrier {
namespace {

uint64_t ToBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double FromBits(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

void AtomicAddDouble(std::atomic<uint64_t>& bits, double delta) {
  uint64_t old = bits.load(std::memory_order_relaxed);
  while (
      !bits.compare_exchange_weak(old, ToBits(FromBits(old) + delta), std::memory_order_relaxed)) {
  }
}

// Registration errors are bugs in the calling code, found the first time it
// runs; there is no caller that could handle them, and the library has no
// logger of its own, so the message goes straight to stderr.
[[noreturn]] void Fatal(const std::string& message) {
  std::fprintf(stderr, "MetricsRegistry: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

bool IsNameStart(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}

bool IsNameChar(char c, bool colon) { return IsNameStart(c, colon) || (c >= '0' && c <= '9'); }

std::string EscapeHelp(absl::string_view help) {
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

}  // namespace

absl::Status ValidateMetricName(absl::string_view name) {
  bool ok = !name.empty() && IsNameStart(name[0], /*colon=*/true);
  for (char c : name) ok = ok && IsNameChar(c, /*colon=*/true);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name '", name, "' does not match [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelName(absl::string_view name) {
  bool ok = !name.empty() && IsNameStart(name[0], /*colon=*/false);
  for (char c : name) ok = ok && IsNameChar(c, /*colon=*/false);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("label name '", name, "' does not match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') {
    return absl::InvalidArgumentError(
        absl::StrCat("label name '", name, "' starts with the reserved prefix __"));
  }
  return absl::OkStatus();
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Shortest text that parses back to the same double, so counters stay
  // exact up to 2^53 and bucket bounds read as written (0.005, not
  // 0.0050000000000000001).
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

void Gauge::Set(double value) { bits_.store(ToBits(value), std::memory_order_relaxed); }

void Gauge::Add(double delta) { AtomicAddDouble(bits_, delta); }

double Gauge::value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // Buckets are few (tens at most), and lower_bound keeps "le" inclusive:
  // a value equal to a bound belongs to that bound's bucket. NaN lands in
  // +Inf, as Prometheus' own clients do.
  const size_t bucket =
      std::isnan(value)
          ? bounds_.size()
          : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAddDouble(sum_bits_, value);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = counts_[i].load(std::memory_order_relaxed);
  return counts;
}

double Histogram::sum() const { return FromBits(sum_bits_.load(std::memory_order_relaxed)); }

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

struct MetricsRegistry::Series {
  MetricLabels labels;
  std::string rendered_labels;  // `a="x",b="y"`, without braces
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::function<double()> read;
};

struct MetricsRegistry::Family {
  std::string help;
  Type type;
  std::vector<std::unique_ptr<Series>> series;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::AddSeries(const std::string& name, const std::string& help, Type type,
                                std::unique_ptr<Series> series) {
  absl::Status valid = ValidateMetricName(name);
  if (!valid.ok()) Fatal(std::string(valid.message()));
  std::set<std::string> label_names;
  std::string rendered;
  for (const auto& [label, value] : series->labels) {
    valid = ValidateLabelName(label);
    if (!valid.ok()) Fatal(absl::StrCat(name, ": ", valid.message()));
    if (!label_names.insert(label).second) {
      Fatal(absl::StrCat(name, ": label '", label, "' given twice"));
    }
    if (type == Type::kHistogram && label == "le") {
      Fatal(absl::StrCat(name, ": a histogram cannot have the label 'le'"));
    }
    absl::StrAppend(&rendered, rendered.empty() ? "" : ",", label, "=\"", EscapeLabelValue(value),
                    "\"");
  }
  series->rendered_labels = std::move(rendered);
  // Label order does not make a different series.
  MetricLabels sorted = series->labels;
  std::sort(sorted.begin(), sorted.end());

  // The series is complete before it is published, so a concurrent render
  // sees it whole or not at all.
  std::lock_guard<std::mutex> lock(mutex_);
  auto& family = families_[name];
  if (family == nullptr) {
    family = std::make_unique<Family>();
    family->help = help;
    family->type = type;
  } else if (family->type != type || family->help != help) {
    Fatal(absl::StrCat(name, " registered again with another type or help text"));
  }
  for (const auto& existing : family->series) {
    MetricLabels other = existing->labels;
    std::sort(other.begin(), other.end());
    if (other == sorted)
      Fatal(absl::StrCat(name, "{", series->rendered_labels, "} registered twice"));
  }
  family->series.push_back(std::move(series));
}

Counter& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  auto series = std::make_unique<Series>();
  series->labels = labels;
  series->counter = std::make_unique<Counter>();
  Counter& counter = *series->counter;
  AddSeries(name, help, Type::kCounter, std::move(series));
  return counter;
}

Gauge& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  auto series = std::make_unique<Series>();
  series->labels = labels;
  series->gauge = std::make_unique<Gauge>();
  Gauge& gauge = *series->gauge;
  AddSeries(name, help, Type::kGauge, std::move(series));
  return gauge;
}

Histogram& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds, const MetricLabels& labels) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i - 1] < bounds[i]))) {
      Fatal(absl::StrCat(name, ": histogram bounds must be finite and strictly increasing"));
    }
  }
  auto series = std::make_unique<Series>();
  series->labels = labels;
  series->histogram = std::make_unique<Histogram>(std::move(bounds));
  Histogram& histogram = *series->histogram;
  AddSeries(name, help, Type::kHistogram, std::move(series));
  return histogram;
}

void MetricsRegistry::AddCallbackGauge(const std::string& name, const std::string& help,
                                       std::function<double()> read, const MetricLabels& labels) {
  if (!read) Fatal(absl::StrCat(name, ": empty callback"));
  auto series = std::make_unique<Series>();
  series->labels = labels;
  series->read = std::move(read);
  AddSeries(name, help, Type::kGauge, std::move(series));
}

void MetricsRegistry::AddCallbackCounter(const std::string& name, const std::string& help,
                                         std::function<double()> read, const MetricLabels& labels) {
  if (!read) Fatal(absl::StrCat(name, ": empty callback"));
  auto series = std::make_unique<Series>();
  series->labels = labels;
  series->read = std::move(read);
  AddSeries(name, help, Type::kCounter, std::move(series));
}

std::string MetricsRegistry::RenderText() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, family] : families_) {
    const char* type = family->type == Type::kCounter ? "counter"
                       : family->type == Type::kGauge ? "gauge"
                                                      : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(family->help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", type, "\n");
    for (const auto& series : family->series) {
      const std::string& labels = series->rendered_labels;
      const std::string braced = labels.empty() ? "" : absl::StrCat("{", labels, "}");
      if (series->histogram != nullptr) {
        const Histogram& h = *series->histogram;
        const std::vector<uint64_t> counts = h.BucketCounts();
        const std::string prefix = labels.empty() ? "{" : absl::StrCat("{", labels, ",");
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le =
              i < h.bounds().size() ? FormatMetricValue(h.bounds()[i]) : std::string("+Inf");
          absl::StrAppend(&out, name, "_bucket", prefix, "le=\"", le, "\"} ", cumulative, "\n");
        }
        absl::StrAppend(&out, name, "_sum", braced, " ", FormatMetricValue(h.sum()), "\n");
        // _count is the +Inf bucket by definition; using the same snapshot
        // keeps the two equal even while observations arrive.
        absl::StrAppend(&out, name, "_count", braced, " ", cumulative, "\n");
      } else if (series->counter != nullptr) {
        absl::StrAppend(&out, name, braced, " ", series->counter->value(), "\n");
      } else if (series->gauge != nullptr) {
        absl::StrAppend(&out, name, braced, " ", FormatMetricValue(series->gauge->value()), "\n");
      } else {
        absl::StrAppend(&out, name, braced, " ", FormatMetricValue(series->read()), "\n");
      }
    }
  }
  return out;
}

}  // namespace harrier
