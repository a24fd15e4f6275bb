// A timeline of one worker's communication, written as a Chrome trace: the
// JSON array of events that Perfetto (ui.perfetto.dev) and chrome://tracing
// open, the format of Horovod's HOROVOD_TIMELINE and BytePS's traces.
//
// Each row of the viewer is a track: the comm scheduler puts each push and
// pull call on a lane of its kind (a call occupies its lane from dispatch
// to completion, so calls in flight at once lie on separate lanes) and the
// training loop's waits on a track of their own. Times are microseconds
// since the Unix epoch, so the files of several workers line up when
// their events are put into one array (`jq -s add worker*.json`).
//
// Recording an event only formats it and hands it to the timeline's
// writer thread, which appends it to the file and flushes within moments,
// so a run that dies leaves what it recorded (viewers accept an array
// without its closing bracket) and no caller waits on the file. At most
// `max_bytes` are written; the rest of the run is not recorded and the
// last event says so.

#ifndef HARRIER_WORKER_TIMELINE_H_
#define HARRIER_WORKER_TIMELINE_H_

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/json.h"

namespace harrier {

class Timeline {
 public:
  // Creates (or truncates) `path`; the events are those of process `rank`
  // (the viewer's process row "worker <rank>"). FAILED_PRECONDITION when
  // another timeline of this process is writing that file.
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(const std::string& path, int rank,
                                                        uint64_t max_bytes);
  ~Timeline();  // Close()s, logging a failure
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // The track named `name` (a row in the viewer), created on first use.
  // Returns its id for Span and Mark.
  int Track(absl::string_view name);
  // A lane: the lowest-numbered of the tracks "<prefix> 1", "<prefix> 2",
  // ... that no span in flight holds (made when all are held). Spans of
  // calls that overlap in time go on separate lanes; ReleaseLane gives the
  // track back once its call has ended.
  int TakeLane(absl::string_view prefix);
  void ReleaseLane(int track);
  // An event on `track` from `start` to `end`, with `args` (a JSON object
  // or null) shown when it is selected.
  void Span(int track, absl::string_view name, absl::string_view category, absl::Time start,
            absl::Time end, const Json& args = Json());
  // A moment on `track`.
  void Mark(int track, absl::string_view name, absl::Time at, const Json& args = Json());

  // Waits until every event recorded so far is in the file, at most
  // `timeout`: DEADLINE_EXCEEDED past it.
  absl::Status Flush(absl::Duration timeout = absl::Seconds(10));
  // Writes what is pending, ends the array and closes the file, waiting at
  // most `timeout`; events after it are dropped. Errors writing or closing
  // the file. Past `timeout` (a file on a stalled disk or a pipe nobody
  // reads) it returns DEADLINE_EXCEEDED and the writer thread finishes the
  // file on its own, whenever the file takes the bytes.
  absl::Status Close(absl::Duration timeout = absl::Seconds(10));

  bool full() const;

 private:
  // What the writer thread shares with the timeline. The thread holds its
  // own reference, so a Close that gave up waiting leaves it nothing freed.
  struct State {
    State(std::FILE* file, std::string path, int rank, uint64_t max_bytes)
        : path(std::move(path)), rank(rank), max_bytes(max_bytes), file(file) {}
    const std::string path;
    const int rank;
    const uint64_t max_bytes;
    mutable absl::Mutex mutex;
    // Only the writer thread touches the file.
    std::FILE* const file;
    // The file's identity in the process's set of timeline files.
    dev_t device = 0;
    ino_t inode = 0;
    bool closed ABSL_GUARDED_BY(mutex) = false;
    // The writer has ended the array and closed the file.
    bool finished ABSL_GUARDED_BY(mutex) = false;
    // Formatted events not yet handed to the file; their count since the
    // start (queued) and how many of those the file holds (written).
    std::string pending ABSL_GUARDED_BY(mutex);
    uint64_t queued ABSL_GUARDED_BY(mutex) = 0;
    uint64_t written ABSL_GUARDED_BY(mutex) = 0;
    uint64_t bytes ABSL_GUARDED_BY(mutex) = 0;  // queued, in all
    bool first ABSL_GUARDED_BY(mutex) = true;
    bool full ABSL_GUARDED_BY(mutex) = false;
    bool write_failed ABSL_GUARDED_BY(mutex) = false;
    std::vector<std::string> tracks ABSL_GUARDED_BY(mutex);
    struct Lane {
      std::string prefix;
      int track = 0;
      bool busy = false;
    };
    std::vector<Lane> lanes ABSL_GUARDED_BY(mutex);
  };

  explicit Timeline(std::shared_ptr<State> state);
  static int TrackLocked(State& state, absl::string_view name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex);
  // Formats `event` and queues it for the writer.
  static void Write(State& state, Json event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex);
  // The writer thread: appends what is queued and flushes the file; once
  // closed, ends the array and closes the file.
  static void WriteLoop(std::shared_ptr<State> state);

  const std::shared_ptr<State> state_;
  std::thread writer_;  // last: started once the rest is made
};

// The path a worker of `rank` writes its timeline to: `pattern` with
// "{rank}" replaced by the rank. Without "{rank}" only rank 0 writes one
// (as Horovod's timeline is written once): empty for other ranks.
std::string TimelinePathFor(absl::string_view pattern, int rank);

}  // namespace harrier

#endif  // HARRIER_WORKER_TIMELINE_H_
