#include "worker/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "spdlog/spdlog.h"

namespace harrier {
namespace {

int64_t Micros(absl::Time at) { return absl::ToUnixMicros(at); }

// The files timelines of this process are writing, by device and inode,
// so a second timeline on the same file (however its path is spelt) is
// refused before it truncates the first's.
struct OpenFiles {
  absl::Mutex mutex;
  std::set<std::pair<dev_t, ino_t>> files ABSL_GUARDED_BY(mutex);
};

OpenFiles& TimelineFiles() {
  static auto* files = new OpenFiles;
  return *files;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank,
                                                         uint64_t max_bytes) {
  // Opened without truncating and without the registry's lock: opening a
  // pipe blocks until it has a reader, and that must stall only this Open.
  // The file is truncated once it is known to be nobody else's.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline: cannot create '", path, "': ", std::strerror(errno)));
  }
  struct stat opened;
  if (::fstat(fd, &opened) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat("timeline: cannot stat '", path, "': ", std::strerror(error)));
  }
  OpenFiles& open_files = TimelineFiles();
  {
    absl::MutexLock files_lock(&open_files.mutex);
    if (!open_files.files.insert({opened.st_dev, opened.st_ino}).second) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "timeline: '", path, "' is being written by another timeline of this process"));
    }
  }
  auto give_back = [&](absl::string_view what) {
    const int error = errno;
    ::close(fd);
    absl::MutexLock files_lock(&open_files.mutex);
    open_files.files.erase({opened.st_dev, opened.st_ino});
    return absl::InternalError(
        absl::StrCat("timeline: cannot ", what, " '", path, "': ", std::strerror(error)));
  };
  if (S_ISREG(opened.st_mode) && ::ftruncate(fd, 0) != 0) return give_back("truncate");
  std::FILE* file = ::fdopen(fd, "w");
  if (file == nullptr) return give_back("open");
  auto state = std::make_shared<State>(file, path, rank, max_bytes);
  state->device = opened.st_dev;
  state->inode = opened.st_ino;
  {
    absl::MutexLock lock(&state->mutex);
    Write(*state, Json{{"name", "process_name"},
                       {"ph", "M"},
                       {"pid", rank},
                       {"args", Json{{"name", absl::StrCat("worker ", rank)}}}});
  }
  return std::unique_ptr<Timeline>(new Timeline(std::move(state)));
}

Timeline::Timeline(std::shared_ptr<State> state)
    : state_(std::move(state)), writer_([state = state_] { WriteLoop(state); }) {}

Timeline::~Timeline() {
  if (absl::Status status = Close(); !status.ok()) spdlog::warn("{}", status.ToString());
}

void Timeline::WriteLoop(std::shared_ptr<State> state) {
  State& s = *state;
  auto work = [&s]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex) { return s.closed || !s.pending.empty(); };
  s.mutex.Lock();
  while (true) {
    s.mutex.Await(absl::Condition(&work));
    if (s.pending.empty()) break;  // closed, and everything is written
    std::string lines;
    lines.swap(s.pending);
    const uint64_t queued = s.queued;
    // The file is the writer's alone, so callers go on recording
    // meanwhile. Flushed per batch: the file holds every event that ended
    // even if the process dies.
    s.mutex.Unlock();
    const bool failed = std::fwrite(lines.data(), 1, lines.size(), s.file) != lines.size() ||
                        std::fflush(s.file) != 0;
    s.mutex.Lock();
    if (failed) s.write_failed = true;
    s.written = queued;
  }
  const char* end = s.first ? "[]\n" : "\n]\n";
  s.mutex.Unlock();
  bool failed = std::fputs(end, s.file) < 0;
  failed = std::fclose(s.file) != 0 || failed;
  {
    OpenFiles& open_files = TimelineFiles();
    absl::MutexLock files_lock(&open_files.mutex);
    open_files.files.erase({s.device, s.inode});
  }
  s.mutex.Lock();
  if (failed) s.write_failed = true;
  s.finished = true;
  s.mutex.Unlock();
}

int Timeline::Track(absl::string_view name) {
  absl::MutexLock lock(&state_->mutex);
  return TrackLocked(*state_, name);
}

int Timeline::TrackLocked(State& s, absl::string_view name) {
  for (size_t i = 0; i < s.tracks.size(); ++i) {
    if (s.tracks[i] == name) return static_cast<int>(i) + 1;
  }
  s.tracks.emplace_back(name);
  const int track = static_cast<int>(s.tracks.size());
  Write(s, Json{{"name", "thread_name"},
                {"ph", "M"},
                {"pid", s.rank},
                {"tid", track},
                {"args", Json{{"name", std::string(name)}}}});
  // Rows in the order their tracks were made.
  Write(s, Json{{"name", "thread_sort_index"},
                {"ph", "M"},
                {"pid", s.rank},
                {"tid", track},
                {"args", Json{{"sort_index", track}}}});
  return track;
}

int Timeline::TakeLane(absl::string_view prefix) {
  State& s = *state_;
  absl::MutexLock lock(&s.mutex);
  int number = 0;
  for (State::Lane& lane : s.lanes) {
    if (lane.prefix != prefix) continue;
    ++number;
    if (!lane.busy) {
      lane.busy = true;
      return lane.track;
    }
  }
  // Made under the same lock, so two callers never share a new lane.
  const int track = TrackLocked(s, absl::StrCat(prefix, " ", number + 1));
  s.lanes.push_back({std::string(prefix), track, true});
  return track;
}

void Timeline::ReleaseLane(int track) {
  State& s = *state_;
  absl::MutexLock lock(&s.mutex);
  for (State::Lane& lane : s.lanes) {
    if (lane.track == track) lane.busy = false;
  }
}

void Timeline::Span(int track, absl::string_view name, absl::string_view category,
                    absl::Time start, absl::Time end, const Json& args) {
  State& s = *state_;
  Json event{{"name", std::string(name)},
             {"cat", std::string(category)},
             {"ph", "X"},
             {"pid", s.rank},
             {"tid", track},
             {"ts", Micros(start)},
             {"dur", std::max<int64_t>(0, Micros(end) - Micros(start))}};
  if (!args.is_null()) event["args"] = args;
  absl::MutexLock lock(&s.mutex);
  Write(s, std::move(event));
}

void Timeline::Mark(int track, absl::string_view name, absl::Time at, const Json& args) {
  State& s = *state_;
  Json event{{"name", std::string(name)}, {"ph", "i"}, {"s", "t"}, {"pid", s.rank}, {"tid", track},
             {"ts", Micros(at)}};
  if (!args.is_null()) event["args"] = args;
  absl::MutexLock lock(&s.mutex);
  Write(s, std::move(event));
}

void Timeline::Write(State& s, Json event) {
  if (s.closed || s.full) return;
  std::string line = absl::StrCat(s.first ? "[\n" : ",\n", DumpJson(event));
  if (s.bytes + line.size() > s.max_bytes) {
    // The last event says where recording stopped; it may take the file
    // a line past the limit.
    s.full = true;
    line = absl::StrCat(s.first ? "[\n" : ",\n",
                        DumpJson(Json{{"name", "timeline full: the rest is not recorded"},
                                      {"ph", "i"},
                                      {"s", "g"},
                                      {"pid", s.rank},
                                      {"ts", Micros(absl::Now())},
                                      {"args", Json{{"max_bytes", s.max_bytes}}}}));
  }
  s.first = false;
  s.bytes += line.size();
  s.pending += line;
  ++s.queued;
}

absl::Status Timeline::Flush(absl::Duration timeout) {
  State& s = *state_;
  absl::MutexLock lock(&s.mutex);
  const uint64_t target = s.queued;
  auto written = [&s, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex) {
    return s.written >= target || s.finished;
  };
  if (!s.mutex.AwaitWithTimeout(absl::Condition(&written), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("timeline: '", s.path, "' not written within ",
                                                    absl::FormatDuration(timeout)));
  }
  return s.write_failed
             ? absl::DataLossError(absl::StrCat("timeline: writing '", s.path, "' failed"))
             : absl::OkStatus();
}

absl::Status Timeline::Close(absl::Duration timeout) {
  State& s = *state_;
  bool finished = false;
  {
    absl::MutexLock lock(&s.mutex);
    if (s.closed) return absl::OkStatus();  // the first Close has the writer
    // The writer writes what is pending, ends the array, closes the file
    // and ends.
    s.closed = true;
    auto is_finished = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex) { return s.finished; };
    finished = s.mutex.AwaitWithTimeout(absl::Condition(&is_finished), timeout);
  }
  if (!finished) {
    // It holds its own reference to the state and finishes on its own.
    writer_.detach();
    return absl::DeadlineExceededError(
        absl::StrCat("timeline: '", s.path, "' not written and closed within ",
                     absl::FormatDuration(timeout), "; its writer finishes it in the background"));
  }
  writer_.join();
  absl::MutexLock lock(&s.mutex);
  if (s.write_failed) {
    return absl::DataLossError(absl::StrCat("timeline: writing '", s.path, "' failed"));
  }
  return absl::OkStatus();
}

bool Timeline::full() const {
  absl::MutexLock lock(&state_->mutex);
  return state_->full;
}

std::string TimelinePathFor(absl::string_view pattern, int rank) {
  if (pattern.empty()) return "";
  if (absl::StrContains(pattern, "{rank}")) {
    return absl::StrReplaceAll(pattern, {{"{rank}", std::to_string(rank)}});
  }
  return rank == 0 ? std::string(pattern) : "";
}

}  // namespace harrier
