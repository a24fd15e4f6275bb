// MetricsRegistry: exposition format and concurrent updates.

#include "common/metrics/metrics.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace harrier {
namespace {

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST_CASE("counters and gauges render with HELP, TYPE and labels", "[metrics]") {
  MetricsRegistry registry;
  Counter& pushes = registry.AddCounter("harrier_pushes_total", "Pushes applied.",
                                        {{"shard", "0"}, {"method", "push"}});
  Counter& other = registry.AddCounter("harrier_pushes_total", "Pushes applied.", {{"shard", "1"}});
  Gauge& lag = registry.AddGauge("harrier_clock_lag", "Clocks between fastest and slowest.");
  pushes.Increment();
  pushes.Increment(41);
  other.Increment(7);
  lag.Set(3.5);
  lag.Add(-1.25);

  const std::string text = registry.RenderText();
  INFO(text);
  const std::string expected =
      "# HELP harrier_clock_lag Clocks between fastest and slowest.\n"
      "# TYPE harrier_clock_lag gauge\n"
      "harrier_clock_lag 2.25\n"
      "# HELP harrier_pushes_total Pushes applied.\n"
      "# TYPE harrier_pushes_total counter\n"
      "harrier_pushes_total{shard=\"0\",method=\"push\"} 42\n"
      "harrier_pushes_total{shard=\"1\"} 7\n";
  REQUIRE(text == expected);
}

TEST_CASE("histograms render cumulative buckets, sum and count", "[metrics]") {
  MetricsRegistry registry;
  Histogram& h =
      registry.AddHistogram("rpc_seconds", "RPC latency.", {0.005, 0.1, 1}, {{"method", "pull"}});
  Histogram& bare = registry.AddHistogram("bare_seconds", "No labels.", {1});
  for (double v : {0.001, 0.005, 0.05, 0.5, 2.0, 3.0}) h.Observe(v);
  bare.Observe(0.5);

  const std::string text = registry.RenderText();
  INFO(text);
  // The sum is a double; compare the lines around it exactly and it approximately.
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"0.005\"} 2\n"));
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"0.1\"} 3\n"));
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"1\"} 4\n"));
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"+Inf\"} 6\n"));
  REQUIRE(Contains(text, "rpc_seconds_sum{method=\"pull\"} "));
  REQUIRE(Contains(text, "rpc_seconds_count{method=\"pull\"} 6\n"));
  REQUIRE(h.sum() == Approx(5.556));
  REQUIRE(Contains(text,
                   "# HELP bare_seconds No labels.\n"
                   "# TYPE bare_seconds histogram\n"
                   "bare_seconds_bucket{le=\"1\"} 1\n"
                   "bare_seconds_bucket{le=\"+Inf\"} 1\n"
                   "bare_seconds_sum 0.5\n"
                   "bare_seconds_count 1\n"));
  REQUIRE(Contains(text, "# TYPE rpc_seconds histogram\n"));

  REQUIRE(h.BucketCounts() == std::vector<uint64_t>{2, 1, 1, 2});
}

TEST_CASE("label values and help text are escaped", "[metrics]") {
  MetricsRegistry registry;
  registry.AddGauge("g", "line one\nback\\slash \"quoted\"", {{"path", "C:\\dir\\\"x\"\nnext"}})
      .Set(1);
  const std::string text = registry.RenderText();
  INFO(text);
  // HELP escapes backslash and newline only; label values also escape quotes.
  REQUIRE(Contains(text, "# HELP g line one\\nback\\\\slash \"quoted\"\n"));
  REQUIRE(Contains(text, "g{path=\"C:\\\\dir\\\\\\\"x\\\"\\nnext\"} 1\n"));
  REQUIRE(EscapeLabelValue("a\"b") == "a\\\"b");
}

TEST_CASE("values are formatted as Prometheus parses them", "[metrics]") {
  REQUIRE(FormatMetricValue(0) == "0");
  REQUIRE(FormatMetricValue(1) == "1");
  REQUIRE(FormatMetricValue(0.1) == "0.1");
  REQUIRE(FormatMetricValue(-2.5) == "-2.5");
  REQUIRE(FormatMetricValue(1e300) == "1e+300");
  REQUIRE(FormatMetricValue(9007199254740992.0) == "9007199254740992");
  REQUIRE(FormatMetricValue(std::numeric_limits<double>::infinity()) == "+Inf");
  REQUIRE(FormatMetricValue(-std::numeric_limits<double>::infinity()) == "-Inf");
  REQUIRE(FormatMetricValue(std::nan("")) == "NaN");
}

TEST_CASE("metric and label names are validated", "[metrics]") {
  for (const char* good : {"a", "_a", "a:b", "harrier_bytes_in_total", "A9_:"}) {
    INFO(good);
    REQUIRE(ValidateMetricName(good).ok());
  }
  for (const char* bad : {"", "9a", "a-b", "a b", "é", "a{b}"}) {
    INFO(bad);
    REQUIRE(absl::IsInvalidArgument(ValidateMetricName(bad)));
  }
  REQUIRE(ValidateLabelName("shard").ok());
  REQUIRE(ValidateLabelName("_x").ok());
  REQUIRE_FALSE(ValidateLabelName("a:b").ok());
  REQUIRE_FALSE(ValidateLabelName("__name__").ok());
  REQUIRE_FALSE(ValidateLabelName("1x").ok());
  REQUIRE_FALSE(ValidateLabelName("").ok());
}

TEST_CASE("callback metrics are read at render time", "[metrics]") {
  MetricsRegistry registry;
  std::atomic<uint64_t> bytes{0};
  double queue = 0;
  registry.AddCallbackCounter("bytes_in_total", "Bytes received.",
                              [&] { return static_cast<double>(bytes.load()); }, {{"shard", "2"}});
  registry.AddCallbackGauge("queue_length", "Queued pushes.", [&] { return queue; });
  bytes = 1024;
  queue = 3;
  std::string text = registry.RenderText();
  REQUIRE(Contains(text, "# TYPE bytes_in_total counter\nbytes_in_total{shard=\"2\"} 1024\n"));
  REQUIRE(Contains(text, "# TYPE queue_length gauge\nqueue_length 3\n"));
  queue = 0.5;
  REQUIRE(Contains(registry.RenderText(), "queue_length 0.5\n"));
}

TEST_CASE("exponential buckets", "[metrics]") {
  REQUIRE(ExponentialBuckets(0.001, 10, 4) == std::vector<double>{0.001, 0.01, 0.1, 1.0});
  REQUIRE(ExponentialBuckets(1, 2, 0).empty());
}

TEST_CASE("concurrent updates and renders lose nothing", "[metrics]") {
  MetricsRegistry registry;
  Counter& counter = registry.AddCounter("ops_total", "Operations.");
  Gauge& gauge = registry.AddGauge("level", "Level.");
  Histogram& histogram = registry.AddHistogram("size", "Sizes.", {1, 10, 100});
  constexpr int kThreads = 4;
  constexpr int kIterations = 50000;

  std::atomic<bool> done{false};
  // Renders race with the updates: each must see _count equal to the +Inf
  // bucket. Catch2's assertions are not thread-safe, so the thread only
  // records what it saw.
  std::atomic<int> renders{0};
  std::atomic<int> mismatches{0};
  std::thread renderer([&] {
    do {
      const std::string text = registry.RenderText();
      const std::string inf_prefix = "size_bucket{le=\"+Inf\"} ";
      const std::string count_prefix = "size_count ";
      const size_t inf = text.find(inf_prefix);
      const size_t count = text.find(count_prefix);
      if (inf == std::string::npos || count == std::string::npos) {
        ++mismatches;
        continue;
      }
      const size_t a_start = inf + inf_prefix.size();
      const size_t b_start = count + count_prefix.size();
      if (text.substr(a_start, text.find('\n', a_start) - a_start) !=
          text.substr(b_start, text.find('\n', b_start) - b_start)) {
        ++mismatches;
      }
      ++renders;
    } while (!done.load());
  });
  // Registration concurrent with rendering is allowed too.
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      registry.AddCounter("per_thread_total", "Per thread.", {{"thread", std::to_string(t)}})
          .Increment(t);
      for (int i = 0; i < kIterations; ++i) {
        counter.Increment();
        gauge.Add(1.0);
        histogram.Observe(static_cast<double>(i % 200));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  renderer.join();
  REQUIRE(mismatches.load() == 0);
  REQUIRE(renders.load() > 0);

  REQUIRE(counter.value() == uint64_t{kThreads} * kIterations);
  REQUIRE(gauge.value() == static_cast<double>(kThreads) * kIterations);
  const std::vector<uint64_t> counts = histogram.BucketCounts();
  // Per thread: i % 200 in {0,1} -> le=1, 2..10 -> le=10, 11..100 -> le=100, rest +Inf.
  const uint64_t per_cycle = kIterations / 200;
  REQUIRE(counts == std::vector<uint64_t>{kThreads * per_cycle * 2, kThreads * per_cycle * 9,
                                          kThreads * per_cycle * 90, kThreads * per_cycle * 99});
  // Sum of 0..199 per cycle, exact in a double.
  REQUIRE(histogram.sum() == static_cast<double>(kThreads * per_cycle * 19900));
  const std::string text = registry.RenderText();
  REQUIRE(Contains(text, "ops_total 200000\n"));
  REQUIRE(Contains(text, "per_thread_total{thread=\"3\"} 3\n"));
}

}  // namespace
}  // namespace harrier
