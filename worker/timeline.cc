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
    : path_(std::move(path)), rank_(rank), max_bytes_(max_bytes), file_(file) {}

Timeline::~Timeline() {
  if (absl::Status status = Close(); !status.ok()) spdlog::warn("{}", status.ToString());
}

int Timeline::Track(absl::string_view name) {
  absl::MutexLock lock(&mutex_);
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
  if (file_ == nullptr || full_) return;
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
  // Flushed per event (a few microseconds; a step makes a few hundred), so
  // the file holds every event that ended even if the process dies.
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    write_failed_ = true;
  }
  bytes_ += line.size();
}

absl::Status Timeline::Close() {
  absl::MutexLock lock(&mutex_);
  if (file_ == nullptr) return absl::OkStatus();
  const char* end = first_ ? "[]\n" : "\n]\n";
  if (std::fputs(end, file_) < 0) write_failed_ = true;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (write_failed_ || !closed) {
    return absl::DataLossError(absl::StrCat("timeline: writing '", path_, "' failed"));
  }
  return absl::OkStatus();
}

uint64_t Timeline::bytes_written() const {
  absl::MutexLock lock(&mutex_);
  return bytes_;
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
