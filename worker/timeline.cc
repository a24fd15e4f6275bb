#include "worker/timeline.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "spdlog/spdlog.h"

namespace harrier {
namespace {

int64_t Micros(absl::Time at) { return absl::ToUnixMicros(at); }

}  // namespace

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank,
                                                         uint64_t max_bytes) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline: cannot create '", path, "': ", std::strerror(errno)));
  }
  auto timeline = std::unique_ptr<Timeline>(new Timeline(file, path, rank, max_bytes));
  {
    absl::MutexLock lock(&timeline->mutex_);
    timeline->Write(Json{{"name", "process_name"},
                         {"ph", "M"},
                         {"pid", rank},
                         {"args", Json{{"name", absl::StrCat("worker ", rank)}}}});
  }
  return timeline;
}

Timeline::Timeline(std::FILE* file, std::string path, int rank, uint64_t max_bytes)
    : path_(std::move(path)), rank_(rank), max_bytes_(max_bytes), file_(file), writer_([this] {
        WriteLoop();
      }) {}

Timeline::~Timeline() {
  if (absl::Status status = Close(); !status.ok()) spdlog::warn("{}", status.ToString());
}

void Timeline::WriteLoop() {
  auto work = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return closed_ || !pending_.empty(); };
  mutex_.Lock();
  while (true) {
    mutex_.Await(absl::Condition(&work));
    if (pending_.empty()) break;  // closed, and everything is written
    std::string lines;
    lines.swap(pending_);
    const uint64_t queued = queued_;
    // The file is the writer's alone, so callers go on recording
    // meanwhile. Flushed per batch: the file holds every event that ended
    // even if the process dies.
    mutex_.Unlock();
    const bool failed = std::fwrite(lines.data(), 1, lines.size(), file_) != lines.size() ||
                        std::fflush(file_) != 0;
    mutex_.Lock();
    if (failed) write_failed_ = true;
    written_ = queued;
  }
  mutex_.Unlock();
}

int Timeline::Track(absl::string_view name) {
  absl::MutexLock lock(&mutex_);
  return TrackLocked(name);
}

int Timeline::TrackLocked(absl::string_view name) {
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == name) return static_cast<int>(i) + 1;
  }
  tracks_.emplace_back(name);
  const int track = static_cast<int>(tracks_.size());
  Write(Json{{"name", "thread_name"},
             {"ph", "M"},
             {"pid", rank_},
             {"tid", track},
             {"args", Json{{"name", std::string(name)}}}});
  // Rows in the order their tracks were made.
  Write(Json{{"name", "thread_sort_index"},
             {"ph", "M"},
             {"pid", rank_},
             {"tid", track},
             {"args", Json{{"sort_index", track}}}});
  return track;
}

int Timeline::TakeLane(absl::string_view prefix) {
  absl::MutexLock lock(&mutex_);
  int number = 0;
  for (Lane& lane : lanes_) {
    if (lane.prefix != prefix) continue;
    ++number;
    if (!lane.busy) {
      lane.busy = true;
      return lane.track;
    }
  }
  // Made under the same lock, so two callers never share a new lane.
  const int track = TrackLocked(absl::StrCat(prefix, " ", number + 1));
  lanes_.push_back({std::string(prefix), track, true});
  return track;
}

void Timeline::ReleaseLane(int track) {
  absl::MutexLock lock(&mutex_);
  for (Lane& lane : lanes_) {
    if (lane.track == track) lane.busy = false;
  }
}

void Timeline::Span(int track, absl::string_view name, absl::string_view category,
                    absl::Time start, absl::Time end, const Json& args) {
  Json event{{"name", std::string(name)},
             {"cat", std::string(category)},
             {"ph", "X"},
             {"pid", rank_},
             {"tid", track},
             {"ts", Micros(start)},
             {"dur", std::max<int64_t>(0, Micros(end) - Micros(start))}};
  if (!args.is_null()) event["args"] = args;
  absl::MutexLock lock(&mutex_);
  Write(std::move(event));
}

void Timeline::Mark(int track, absl::string_view name, absl::Time at, const Json& args) {
  Json event{{"name", std::string(name)}, {"ph", "i"}, {"s", "t"},
             {"pid", rank_},              {"tid", track}, {"ts", Micros(at)}};
  if (!args.is_null()) event["args"] = args;
  absl::MutexLock lock(&mutex_);
  Write(std::move(event));
}

void Timeline::Write(Json event) {
  if (closed_ || full_) return;
  std::string line = absl::StrCat(first_ ? "[\n" : ",\n", DumpJson(event));
  if (bytes_ + line.size() > max_bytes_) {
    // The last event says where recording stopped; it may take the file
    // a line past the limit.
    full_ = true;
    line = absl::StrCat(first_ ? "[\n" : ",\n",
                        DumpJson(Json{{"name", "timeline full: the rest is not recorded"},
                                      {"ph", "i"},
                                      {"s", "g"},
                                      {"pid", rank_},
                                      {"ts", Micros(absl::Now())},
                                      {"args", Json{{"max_bytes", max_bytes_}}}}));
  }
  first_ = false;
  bytes_ += line.size();
  pending_ += line;
  ++queued_;
}

absl::Status Timeline::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mutex_);
  const uint64_t target = queued_;
  auto written = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return written_ >= target || closed_;
  };
  if (!mutex_.AwaitWithTimeout(absl::Condition(&written), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("timeline: '", path_, "' not written within ", absl::FormatDuration(timeout)));
  }
  return write_failed_ ? absl::DataLossError(absl::StrCat("timeline: writing '", path_, "' failed"))
                       : absl::OkStatus();
}

absl::Status Timeline::Close() {
  bool first = false;
  {
    absl::MutexLock lock(&mutex_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
    first = first_;
  }
  // The writer writes what is pending, then ends; the file is ours after.
  writer_.join();
  absl::MutexLock lock(&mutex_);
  const char* end = first ? "[]\n" : "\n]\n";
  if (std::fputs(end, file_) < 0) write_failed_ = true;
  const bool file_closed = std::fclose(file_) == 0;
  if (write_failed_ || !file_closed) {
    return absl::DataLossError(absl::StrCat("timeline: writing '", path_, "' failed"));
  }
  return absl::OkStatus();
}

bool Timeline::full() const {
  absl::MutexLock lock(&mutex_);
  return full_;
}

std::string TimelinePathFor(absl::string_view pattern, int rank) {
  if (pattern.empty()) return "";
  if (absl::StrContains(pattern, "{rank}")) {
    return absl::StrReplaceAll(pattern, {{"{rank}", std::to_string(rank)}});
  }
  return rank == 0 ? std::string(pattern) : "";
}

}  // namespace harrier
