// MetricsRegistry as a scraper sees it: every case registers metrics,
// serves them with MetricsHttpServer on 127.0.0.1 and reads /metrics over
// HTTP.

#include "common/metrics/metrics.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metrics_http_server.h"
#include "tests/metrics/http_client.h"

namespace harrier {
namespace {

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The value on the line that starts with `series` followed by a space, or
// NaN when there is no such line.
double ValueOf(const std::string& text, const std::string& series) {
  const std::string prefix = series + " ";
  for (size_t line = 0; line < text.size();) {
    const size_t end = std::min(text.find('\n', line), text.size());
    if (text.compare(line, prefix.size(), prefix) == 0) {
      return std::strtod(text.substr(line + prefix.size(), end - line - prefix.size()).c_str(),
                         nullptr);
    }
    line = end + 1;
  }
  return std::nan("");
}

// Serves `registry` for one scrape and returns the body of GET /metrics
// (empty when the scrape failed, which the REQUIREs below then report).
std::string Scrape(const MetricsRegistry& registry) {
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(server.ok());
  testing::HttpResult r = testing::Get((*server)->port(), "/metrics");
  REQUIRE(r.ok);
  REQUIRE(r.status == 200);
  return r.body;
}

TEST_CASE("counters and gauges are served with HELP, TYPE and labels", "[metrics]") {
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
  REQUIRE(pushes.value() == 42);
  REQUIRE(lag.value() == 2.25);

  const std::string text = Scrape(registry);
  INFO(text);
  // Families sorted by name, one HELP and TYPE each; a series' labels sorted
  // by name (prometheus-cpp's order; the hand-written registry kept the
  // registration order, which Prometheus does not distinguish).
  const std::string expected =
      "# HELP harrier_clock_lag Clocks between fastest and slowest.\n"
      "# TYPE harrier_clock_lag gauge\n"
      "harrier_clock_lag 2.25\n"
      "# HELP harrier_pushes_total Pushes applied.\n"
      "# TYPE harrier_pushes_total counter\n"
      "harrier_pushes_total{method=\"push\",shard=\"0\"} 42\n"
      "harrier_pushes_total{shard=\"1\"} 7\n";
  REQUIRE(Contains(text, expected));
  REQUIRE(text.find("# TYPE harrier_pushes_total") == text.rfind("# TYPE harrier_pushes_total"));
}

TEST_CASE("histograms are served as cumulative buckets, sum and count", "[metrics]") {
  MetricsRegistry registry;
  Histogram& h =
      registry.AddHistogram("rpc_seconds", "RPC latency.", {0.005, 0.1, 1}, {{"method", "pull"}});
  Histogram& bare = registry.AddHistogram("bare_seconds", "No labels.", {1});
  for (double v : {0.001, 0.005, 0.05, 0.5, 2.0, 3.0}) h.Observe(v);
  bare.Observe(0.5);

  const std::string text = Scrape(registry);
  INFO(text);
  // "le" is inclusive: 0.005 counts in the 0.005 bucket.
  REQUIRE(Contains(text, "# TYPE rpc_seconds histogram\n"));
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"0.005\"} 2\n"));
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"0.1\"} 3\n"));
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"1\"} 4\n"));
  REQUIRE(Contains(text, "rpc_seconds_bucket{method=\"pull\",le=\"+Inf\"} 6\n"));
  REQUIRE(Contains(text, "rpc_seconds_count{method=\"pull\"} 6\n"));
  REQUIRE(ValueOf(text, "rpc_seconds_sum{method=\"pull\"}") == Approx(5.556));
  REQUIRE(Contains(text,
                   "# HELP bare_seconds No labels.\n"
                   "# TYPE bare_seconds histogram\n"
                   "bare_seconds_count 1\n"
                   "bare_seconds_sum 0.5\n"
                   "bare_seconds_bucket{le=\"1\"} 1\n"
                   "bare_seconds_bucket{le=\"+Inf\"} 1\n"));
  // The same numbers through the handle.
  REQUIRE(h.BucketCounts() == std::vector<uint64_t>{2, 1, 1, 2});
  REQUIRE(h.sum() == Approx(5.556));
  REQUIRE(h.bounds() == std::vector<double>{0.005, 0.1, 1});
}

TEST_CASE("metrics built without a registry work alike", "[metrics]") {
  // For unit tests of code that takes a Histogram* (or a Counter, a Gauge).
  Histogram h(ExponentialBuckets(1e-5, 4, 10));
  for (double v : {1e-5, 2e-5, 1.0, 100.0, std::nan("")}) h.Observe(v);
  const std::vector<uint64_t> counts = h.BucketCounts();
  REQUIRE(counts.size() == 11);
  REQUIRE(counts[0] == 1);   // le=1e-05, inclusive
  REQUIRE(counts[1] == 1);   // le=4e-05
  REQUIRE(counts[9] == 1);   // le=2.62144
  REQUIRE(counts[10] == 2);  // +Inf: 100 and NaN
  Counter c;
  c.Increment(3);
  c.Increment();
  REQUIRE(c.value() == 4);
  Gauge g;
  g.Set(2);
  g.Add(-0.5);
  REQUIRE(g.value() == 1.5);
}

TEST_CASE("the server's latency buckets keep their bounds", "[metrics]") {
  // The bounds of harrier_server_push_seconds and _pull_seconds.
  const std::vector<double> bounds = ExponentialBuckets(1e-5, 4, 10);
  MetricsRegistry registry;
  Histogram& h =
      registry.AddHistogram("push_seconds", "Push call latency.", bounds, {{"shard", "0"}});
  for (double bound : bounds) h.Observe(bound);  // one on each bound
  const std::string text = Scrape(registry);
  INFO(text);
  // prometheus-cpp writes a bound with 16 significant digits, so two of the
  // ten labels read longer than the hand-written exposition's shortest form
  // ("0.0006400000000000001" for 0.00064, "0.6553600000000001" for 0.65536);
  // every label still parses back to its bound, which is what
  // histogram_quantile uses.
  const std::vector<std::string> labels = {
      "1e-05",   "4e-05",   "0.00016", "0.0006400000000000001", "0.00256",
      "0.01024", "0.04096", "0.16384", "0.6553600000000001",    "2.62144"};
  for (size_t i = 0; i < bounds.size(); ++i) {
    INFO("bucket " << i);
    REQUIRE(std::strtod(labels[i].c_str(), nullptr) == Approx(bounds[i]).epsilon(1e-15));
    REQUIRE(Contains(text, "push_seconds_bucket{shard=\"0\",le=\"" + labels[i] + "\"} " +
                               std::to_string(i + 1) + "\n"));
  }
  REQUIRE(Contains(text, "push_seconds_bucket{shard=\"0\",le=\"+Inf\"} 10\n"));
  REQUIRE(Contains(text, "push_seconds_count{shard=\"0\"} 10\n"));
}

TEST_CASE("label values and help text are escaped", "[metrics]") {
  MetricsRegistry registry;
  registry.AddGauge("g", "line one\nback\\slash \"quoted\"", {{"path", "C:\\dir\\\"x\"\nnext"}})
      .Set(1);
  const std::string text = Scrape(registry);
  INFO(text);
  // HELP escapes backslash and newline only; label values also escape quotes.
  REQUIRE(Contains(text, "# HELP g line one\\nback\\\\slash \"quoted\"\n"));
  REQUIRE(Contains(text, "g{path=\"C:\\\\dir\\\\\\\"x\\\"\\nnext\"} 1\n"));
}

TEST_CASE("values are written as Prometheus parses them", "[metrics]") {
  MetricsRegistry registry;
  const std::vector<std::pair<double, std::string>> cases = {
      {0, "0"},
      {1, "1"},
      {0.1, "0.1"},
      {-2.5, "-2.5"},
      {1e300, "1e+300"},
      {9007199254740992.0, "9007199254740992"},
      {std::numeric_limits<double>::infinity(), "+Inf"},
      {-std::numeric_limits<double>::infinity(), "-Inf"},
      // Prometheus reads NaN case-insensitively; prometheus-cpp writes "Nan".
      {std::nan(""), "Nan"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    registry.AddGauge("v", "Values.", {{"i", std::to_string(i)}}).Set(cases[i].first);
  }
  registry.AddCounter("c_total", "A large count.").Increment(uint64_t{1} << 53);
  const std::string text = Scrape(registry);
  INFO(text);
  for (size_t i = 0; i < cases.size(); ++i) {
    REQUIRE(Contains(text, "v{i=\"" + std::to_string(i) + "\"} " + cases[i].second + "\n"));
  }
  REQUIRE(Contains(text, "c_total 9007199254740992\n"));
}

TEST_CASE("callback metrics are read at scrape time", "[metrics]") {
  MetricsRegistry registry;
  std::atomic<uint64_t> bytes{0};
  std::atomic<double> queue{0};
  registry.AddCallbackCounter("bytes_in_total", "Bytes received.",
                              [&] { return static_cast<double>(bytes.load()); }, {{"shard", "2"}});
  registry.AddCallbackGauge("queue_length", "Queued pushes.", [&] { return queue.load(); });
  bytes = 1024;
  queue = 3;
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(server.ok());
  std::string text = testing::Get((*server)->port(), "/metrics").body;
  INFO(text);
  REQUIRE(Contains(text,
                   "# HELP bytes_in_total Bytes received.\n"
                   "# TYPE bytes_in_total counter\nbytes_in_total{shard=\"2\"} 1024\n"));
  REQUIRE(Contains(text, "# TYPE queue_length gauge\nqueue_length 3\n"));
  queue = 0.5;
  bytes = 2048;
  text = testing::Get((*server)->port(), "/metrics").body;
  REQUIRE(Contains(text, "queue_length 0.5\n"));
  REQUIRE(Contains(text, "bytes_in_total{shard=\"2\"} 2048\n"));
}

TEST_CASE("stored and callback series of one name form one family", "[metrics]") {
  MetricsRegistry registry;
  registry.AddCounter("ops_total", "Operations.", {{"kind", "stored"}}).Increment(2);
  registry.AddCallbackCounter("ops_total", "Operations.", [] { return 5.0; },
                              {{"kind", "callback"}});
  const std::string text = Scrape(registry);
  INFO(text);
  REQUIRE(Contains(text,
                   "# HELP ops_total Operations.\n"
                   "# TYPE ops_total counter\n"
                   "ops_total{kind=\"callback\"} 5\n"
                   "ops_total{kind=\"stored\"} 2\n"));
}

// Runs `f` in a child process; true when it aborted with a message on
// stderr that contains `message`.
bool AbortsWith(const std::function<void()>& f, const std::string& message) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child dies of the abort itself: no Catch2 handler reports it, and
    // nothing it might print mixes into the test's output.
    ::signal(SIGABRT, SIG_DFL);
    ::dup2(::open("/dev/null", O_WRONLY), STDOUT_FILENO);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    f();
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string err;
  char buffer[512];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0) err.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO("child stderr: " << err);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && Contains(err, message);
}

TEST_CASE("registration mistakes abort naming the metric", "[metrics]") {
  // No server runs in this case: the children fork a single-threaded process.
  REQUIRE(AbortsWith([] { MetricsRegistry().AddCounter("9a", "x"); }, "'9a'"));
  REQUIRE(AbortsWith([] { MetricsRegistry().AddCounter("a-b", "x"); }, "'a-b'"));
  REQUIRE(AbortsWith(
      [] {
        MetricsRegistry().AddGauge("g", "x", {{"__name__", "v"}});
      },
      "g: label name '__name__'"));
  REQUIRE(AbortsWith([] { MetricsRegistry().AddGauge("g", "x", {{"1x", "v"}}); }, "'1x'"));
  REQUIRE(AbortsWith(
      [] {
        MetricsRegistry().AddGauge("g", "x", {{"a", "1"}, {"a", "2"}});
      },
      "given twice"));
  REQUIRE(AbortsWith(
      [] {
        MetricsRegistry r;
        r.AddCounter("c_total", "x", {{"a", "1"}, {"b", "2"}});
        r.AddCounter("c_total", "x", {{"b", "2"}, {"a", "1"}});  // same series, other order
      },
      "registered twice"));
  REQUIRE(AbortsWith(
      [] {
        MetricsRegistry r;
        r.AddCounter("m", "x");
        r.AddGauge("m", "x", {{"a", "1"}});
      },
      "m registered again with another type"));
  REQUIRE(AbortsWith(
      [] {
        MetricsRegistry r;
        r.AddCounter("m", "x");
        r.AddCallbackCounter("m", "other help", [] { return 1.0; }, {{"a", "1"}});
      },
      "another type or help"));
  REQUIRE(AbortsWith(
      [] {
        MetricsRegistry().AddHistogram("h", "x", {1}, {{"le", "1"}});
      },
      "h: a histogram cannot have the label 'le'"));
  REQUIRE(AbortsWith([] { MetricsRegistry().AddHistogram("h", "x", {1, 1}); }, "h: histogram"));
  REQUIRE(AbortsWith([] { MetricsRegistry().AddHistogram("h", "x", {2, 1}); }, "h: histogram"));
  REQUIRE(AbortsWith([] { MetricsRegistry().AddCallbackGauge("q", "x", nullptr); },
                     "q: empty callback"));
  // And a correct registration does not abort.
  REQUIRE_FALSE(AbortsWith(
      [] {
        MetricsRegistry().AddCounter("a:b_total", "x", {{"_x", ""}});
      },
      ""));
}

TEST_CASE("exponential buckets", "[metrics]") {
  REQUIRE(ExponentialBuckets(0.001, 10, 4) == std::vector<double>{0.001, 0.01, 0.1, 1.0});
  REQUIRE(ExponentialBuckets(1, 2, 0).empty());
}

TEST_CASE("concurrent updates and scrapes lose nothing", "[metrics]") {
  MetricsRegistry registry;
  Counter& counter = registry.AddCounter("ops_total", "Operations.");
  Gauge& gauge = registry.AddGauge("level", "Level.");
  Histogram& histogram = registry.AddHistogram("size", "Sizes.", {1, 10, 100});
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  constexpr int kThreads = 4;
  constexpr int kIterations = 50000;

  std::atomic<bool> done{false};
  // Scrapes race with the updates: each must see _count equal to the +Inf
  // bucket. Catch2's assertions are not thread-safe, so the thread only
  // records what it saw.
  std::atomic<int> scrapes{0};
  std::atomic<int> mismatches{0};
  std::thread scraper([&] {
    do {
      const std::string text = testing::Get(port, "/metrics").body;
      const double inf = ValueOf(text, "size_bucket{le=\"+Inf\"}");
      const double count = ValueOf(text, "size_count");
      if (std::isnan(inf) || inf != count) ++mismatches;
      ++scrapes;
    } while (!done.load());
  });
  // Registration concurrent with scrapes is allowed too.
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
  scraper.join();
  REQUIRE(mismatches.load() == 0);
  REQUIRE(scrapes.load() > 0);

  REQUIRE(counter.value() == uint64_t{kThreads} * kIterations);
  REQUIRE(gauge.value() == static_cast<double>(kThreads) * kIterations);
  const int per_cycle = kIterations / 200;
  // Per thread: i % 200 in {0,1} -> le=1, 2..10 -> le=10, 11..100 -> le=100, rest +Inf.
  REQUIRE(histogram.BucketCounts() ==
          std::vector<uint64_t>{kThreads * per_cycle * 2, kThreads * per_cycle * 9,
                                kThreads * per_cycle * 90, kThreads * per_cycle * 99});
  // Sum of 0..199 per cycle, exact in a double.
  REQUIRE(histogram.sum() == static_cast<double>(kThreads * per_cycle * 19900));
  const std::string text = testing::Get(port, "/metrics").body;
  INFO(text);
  REQUIRE(Contains(text, "ops_total 200000\n"));
  REQUIRE(Contains(text, "level 200000\n"));
  REQUIRE(Contains(text, "per_thread_total{thread=\"3\"} 3\n"));
  // The same on /metrics, cumulative.
  REQUIRE(ValueOf(text, "size_bucket{le=\"1\"}") == kThreads * per_cycle * 2);
  REQUIRE(ValueOf(text, "size_bucket{le=\"10\"}") == kThreads * per_cycle * 11);
  REQUIRE(ValueOf(text, "size_bucket{le=\"100\"}") == kThreads * per_cycle * 101);
  REQUIRE(ValueOf(text, "size_bucket{le=\"+Inf\"}") == kThreads * kIterations);
  REQUIRE(ValueOf(text, "size_sum") == static_cast<double>(kThreads * per_cycle * 19900));
}

}  // namespace
}  // namespace harrier
