// The timeline file: a Chrome trace that parses as JSON at every point
// (closed or not), with tracks, spans and marks where they were put, and
// a size bound that ends recording with an event saying so.
#include "worker/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/json.h"

namespace harrier {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("a timeline is a Chrome trace of its tracks, spans and marks") {
  const std::string path = TempPath("timeline.json");
  auto timeline = Timeline::Open(path, 3, 1 << 20);
  REQUIRE(timeline.ok());
  const int pushes = (*timeline)->Track("push 1");
  const int waits = (*timeline)->Track("waits");
  CHECK(pushes != waits);
  CHECK((*timeline)->Track("push 1") == pushes);  // one track per name
  const absl::Time start = absl::FromUnixMicros(1'700'000'000'000'000);
  (*timeline)->Span(pushes, "w 1/2", "push", start, start + absl::Milliseconds(5),
                    Json{{"bytes", 4096}});
  (*timeline)->Mark(waits, "step", start + absl::Milliseconds(7));
  // Before Close the array has no end, as when a worker dies: the writer
  // puts the events in the file within moments, unasked.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReadFile(path).find("\"w 1/2\"") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  CHECK(ReadFile(path).find("\"w 1/2\"") != std::string::npos);
  CHECK((*timeline)->Flush().ok());
  REQUIRE((*timeline)->Close().ok());

  const Json events = ParseJson(ReadFile(path));
  REQUIRE(events.is_array());
  int spans = 0, marks = 0, names = 0;
  for (const Json& event : events) {
    CHECK(event["pid"] == 3);
    if (event["ph"] == "M" && event["name"] == "process_name") {
      CHECK(event["args"]["name"] == "worker 3");
    } else if (event["ph"] == "M" && event["name"] == "thread_name") {
      ++names;
      CHECK(((event["tid"] == pushes && event["args"]["name"] == "push 1") ||
             (event["tid"] == waits && event["args"]["name"] == "waits")));
    } else if (event["ph"] == "X") {
      ++spans;
      CHECK(event["name"] == "w 1/2");
      CHECK(event["cat"] == "push");
      CHECK(event["tid"] == pushes);
      CHECK(event["ts"] == 1'700'000'000'000'000);
      CHECK(event["dur"] == 5000);
      CHECK(event["args"]["bytes"] == 4096);
    } else if (event["ph"] == "i") {
      ++marks;
      CHECK(event["tid"] == waits);
      CHECK(event["ts"] == 1'700'000'000'007'000);
    }
  }
  CHECK(spans == 1);
  CHECK(marks == 1);
  CHECK(names == 2);
  // Events after Close are dropped; Close twice is harmless.
  (*timeline)->Mark(waits, "late", absl::Now());
  CHECK((*timeline)->Close().ok());
  CHECK(ParseJson(ReadFile(path)).size() == events.size());
}

TEST_CASE("a timeline stops at its size bound with an event that says so") {
  const std::string path = TempPath("bounded.json");
  auto timeline = Timeline::Open(path, 0, 4096);
  REQUIRE(timeline.ok());
  const int track = (*timeline)->Track("pull 1");
  for (int i = 0; i < 1000; ++i) {
    (*timeline)->Span(track, "p", "pull", absl::Now(), absl::Now(), Json{{"i", i}});
  }
  CHECK((*timeline)->full());
  REQUIRE((*timeline)->Close().ok());
  const std::string text = ReadFile(path);
  CHECK(text.size() < 4096 + 512);  // at most one line past the bound
  const Json events = ParseJson(text);
  REQUIRE(events.is_array());
  CHECK(events.back()["name"] == "timeline full: the rest is not recorded");
  CHECK(events.size() > 10);
  CHECK(events.size() < 100);
}

TEST_CASE("lanes: the lowest free track of their kind, made when every one is held") {
  const std::string path = TempPath("lanes.json");
  auto timeline = Timeline::Open(path, 0, 1 << 20);
  REQUIRE(timeline.ok());
  Timeline& t = **timeline;
  const int push1 = t.TakeLane("push");
  const int push2 = t.TakeLane("push");
  const int pull1 = t.TakeLane("pull");
  CHECK(push1 != push2);
  CHECK(pull1 != push1);
  CHECK(pull1 != push2);
  t.ReleaseLane(push1);
  CHECK(t.TakeLane("push") == push1);  // the lowest free one again
  const int push3 = t.TakeLane("push");
  CHECK(push3 != push1);
  CHECK(push3 != push2);
  t.ReleaseLane(push2);
  CHECK(t.TakeLane("push") == push2);
  REQUIRE(t.Close().ok());
  std::map<int, std::string> names;
  for (const Json& event : ParseJson(ReadFile(path))) {
    if (event["name"] == "thread_name") {
      names[event["tid"].get<int>()] = event["args"]["name"].get<std::string>();
    }
  }
  CHECK(names[push1] == "push 1");
  CHECK(names[push2] == "push 2");
  CHECK(names[push3] == "push 3");
  CHECK(names[pull1] == "pull 1");
  CHECK(names.size() == 4);
}

TEST_CASE("threads recording at once lose no event and keep the file whole") {
  const std::string path = TempPath("threads.json");
  auto timeline = Timeline::Open(path, 1, 64 << 20);
  REQUIRE(timeline.ok());
  Timeline& t = **timeline;
  constexpr int kThreads = 4;
  constexpr int kEach = 2000;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&t, k] {
      for (int i = 0; i < kEach; ++i) {
        const int lane = t.TakeLane("call");
        t.Span(lane, "c", "call", absl::Now(), absl::Now(), Json{{"thread", k}, {"i", i}});
        t.ReleaseLane(lane);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  REQUIRE(t.Flush().ok());
  // Flushed: every event is in the file, which parses once its array ends.
  const std::string written = ReadFile(path);
  const Json events = ParseJson(written + "\n]");
  std::set<std::pair<int, int>> seen;
  int lanes = 0;
  for (const Json& event : events) {
    if (event["ph"] == "X") {
      seen.insert({event["args"]["thread"].get<int>(), event["args"]["i"].get<int>()});
    }
    if (event["name"] == "thread_name") ++lanes;
  }
  CHECK(seen.size() == kThreads * kEach);
  CHECK(lanes >= 1);
  CHECK(lanes <= kThreads);  // a lane is held by one thread at a time
  REQUIRE(t.Close().ok());
  CHECK(ParseJson(ReadFile(path)).size() == events.size());
}

TEST_CASE("timeline paths: {rank} is replaced; without it only rank 0 writes") {
  CHECK(TimelinePathFor("/tmp/t_{rank}.json", 2) == "/tmp/t_2.json");
  CHECK(TimelinePathFor("/tmp/t.json", 0) == "/tmp/t.json");
  CHECK(TimelinePathFor("/tmp/t.json", 1).empty());
  CHECK(TimelinePathFor("", 0).empty());
}

TEST_CASE("closing a timeline whose file takes no bytes gives up at its deadline") {
  // A pipe that nobody reads stands for a stalled disk: once its buffer is
  // full the writer blocks in the write.
  const std::string path = TempPath("stalled.fifo");
  ::unlink(path.c_str());
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  auto timeline = Timeline::Open(path, 0, 64 << 20);
  REQUIRE(timeline.ok());
  const int track = (*timeline)->Track("calls");
  constexpr int kSpans = 4000;  // about 600 KB, far past a pipe's buffer
  for (int i = 0; i < kSpans; ++i) {
    (*timeline)->Span(track, "call", "push", absl::Now(), absl::Now(), Json{{"i", i}});
  }
  CHECK((*timeline)->Flush(absl::Milliseconds(100)).code() == absl::StatusCode::kDeadlineExceeded);
  const absl::Time before = absl::Now();
  const absl::Status closed = (*timeline)->Close(absl::Milliseconds(200));
  CHECK(closed.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(closed.message().find(path) != std::string::npos);
  CHECK(absl::Now() - before < absl::Seconds(5));
  CHECK((*timeline)->Close().ok());  // closed already: the writer has the file
  timeline->reset();                 // the writer outlives the timeline
  // Read now: the writer goes on, ends the array and closes the pipe.
  REQUIRE(::fcntl(reader, F_SETFL, 0) == 0);
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(reader, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n >= 0);
    if (n == 0) break;  // the writer closed its end
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(reader);
  ::unlink(path.c_str());
  int spans = 0;
  for (const Json& event : ParseJson(text)) {
    if (event["ph"] == "X") ++spans;
  }
  CHECK(spans == kSpans);
}

TEST_CASE("a second timeline on a file this process is writing is refused") {
  const std::string dir = TempPath("");
  const std::string path = TempPath("shared.json");
  auto first = Timeline::Open(path, 0, 1 << 20);
  REQUIRE(first.ok());
  (*first)->Span((*first)->Track("calls"), "call", "push", absl::Now(), absl::Now());
  REQUIRE((*first)->Flush().ok());
  // However the path is spelt, and before anything truncates the file.
  for (const std::string& spelling : {path, dir + "./shared.json"}) {
    auto second = Timeline::Open(spelling, 1, 1 << 20);
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(second.status().message().find(spelling) != std::string::npos);
  }
  REQUIRE((*first)->Close().ok());
  int spans = 0;
  for (const Json& event : ParseJson(ReadFile(path))) {
    if (event["ph"] == "X") ++spans;
  }
  CHECK(spans == 1);
  // Closed, the file may be taken again.
  auto again = Timeline::Open(path, 1, 1 << 20);
  REQUIRE(again.ok());
  CHECK((*again)->Close().ok());
}

TEST_CASE("a timeline waiting for its pipe's reader holds up no other timeline") {
  const std::string fifo = TempPath("unread.fifo");
  ::unlink(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Opening a pipe for writing blocks until it has a reader.
  absl::Notification opened;
  absl::Status waited;  // Catch's assertions are for the main thread only
  std::thread waiting([&] {
    waited = Timeline::Open(fifo, 0, 1 << 20).status();
    opened.Notify();
  });
  absl::SleepFor(absl::Milliseconds(100));  // the thread is in its open
  CHECK_FALSE(opened.HasBeenNotified());
  const absl::Time before = absl::Now();
  auto other = Timeline::Open(TempPath("beside.json"), 1, 1 << 20);
  REQUIRE(other.ok());
  CHECK(absl::Now() - before < absl::Seconds(5));
  CHECK((*other)->Close().ok());
  // A reader lets the first Open finish; its file is then whole.
  const int reader = ::open(fifo.c_str(), O_RDONLY);
  REQUIRE(reader >= 0);
  REQUIRE(opened.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiting.join();
  CHECK(waited.ok());
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(reader, buffer, sizeof(buffer))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n > 0);
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(reader);
  ::unlink(fifo.c_str());
  CHECK(ParseJson(text).size() == 1);  // the process name, and the array ended
}

TEST_CASE("a timeline that cannot be created says where") {
  auto timeline = Timeline::Open("/nonexistent-dir/t.json", 0, 1 << 20);
  REQUIRE_FALSE(timeline.ok());
  CHECK(timeline.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(timeline.status().message().find("/nonexistent-dir/t.json") != std::string::npos);
}

}  // namespace
}  // namespace harrier
