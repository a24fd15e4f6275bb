#ifndef HARRIER_SERVER_CHECKPOINT_H_
#define HARRIER_SERVER_CHECKPOINT_H_

// Versioned, atomic, verified checkpoint files for one parameter shard.
//
// Layout on disk: `<dir>/shard-<i>/ckpt-<version, 20 digits>.hck`. Each file
// is written under a temporary name, fsynced, renamed into place and the
// directory fsynced, so a crash leaves either the old set of files or the
// new one, never a half-written checkpoint under a final name. The newest K
// versions are kept; a reader takes the newest one that verifies, so one
// damaged file costs one checkpoint interval, not the run.
//
// File format (all integers little-endian):
//   magic "HRRCKPT\n" (8 bytes) | format version u32 | flags u32 (0) |
//   payload size u64 | payload | CRC-32C u32 of every preceding byte.
// Format versions: 1 (no optimizer kind), 2 (adds the optimizer kind after
// the sync policy's name), 3 (adds the ranks' sessions after the slots),
// 4 (adds each slot's table kind and clock after the sessions), 5 (adds
// the rows of sparse tables after the kinds). This build writes 5 and reads
// all five.
// The payload is a plain length-prefixed encoding of ShardCheckpoint (see
// checkpoint.cc); no protobuf, because the bulk is float arrays that are
// written with one memcpy each and protobuf's 2 GiB message limit would cap
// the shard size.
//
// Thread-safety: the functions are thread-safe for different shards. Two
// writers of the same shard directory must be serialised by the caller (the
// server has one checkpoint thread per shard).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace harrier {

// One (key, chunk) slot of a shard, as ShardStore holds it.
struct SlotCheckpoint {
  std::string key;
  uint32_t chunk = 0;
  std::vector<uint64_t> shape;
  std::vector<float> values;
  std::vector<float> optimizer_first;   // empty, or values.size()
  std::vector<float> optimizer_second;  // empty, or values.size()
  int64_t optimizer_steps = 0;
  std::vector<int64_t> pushed;  // iterations pushed, one entry per worker rank
  // The table's kind (proto::TableKind) and whether its clock is its own
  // (InitRequest.own_clock); format versions before 4: dense, training clock.
  uint32_t kind = 0;
  bool own_clock = false;
  // Sparse tables (format 5): the table's settings (a serialized
  // proto::SparseTableConfig), and per row its id and optimizer step count;
  // `values` holds the rows (row_ids.size() x dim) and optimizer_first
  // their optimizer state.
  std::string sparse_config;
  std::vector<int64_t> row_ids;
  std::vector<uint64_t> row_steps;
  // In an incremental checkpoint (ShardCheckpoint::base_version): the ids
  // evicted since the base; row_ids then holds only the rows written since.
  std::vector<int64_t> removed_row_ids;
};

// What a shard keeps of one rank's session across a restart
// (SessionTable): the highest epoch it had seen, so that a session of an
// older epoch (a stale process of a worker that re-registered) is refused
// after the restart as it was before.
struct RankSessionCheckpoint {
  uint64_t epoch = 0;     // 0: no session seen for the rank
  bool released = false;  // its worker gave the session back
  bool heard = false;     // a call had carried it (else only handed out)
};

// A whole shard at one version. `version` is chosen by the caller and must
// grow from one checkpoint to the next (pruning keeps the highest versions).
struct ShardCheckpoint {
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  std::string sync;  // the sync policy's name, for a restart to compare
  // The shard optimizer's kind (OptimizerOptions::kind: sgd, momentum, ...;
  // "delta" under local SGD) whose state the slots hold. A restore into a
  // shard with another kind is refused (ShardStore::Import). Empty: unknown
  // (format version 1), not checked.
  std::string optimizer;
  uint64_t version = 0;
  int64_t created_unix_ms = 0;
  std::vector<SlotCheckpoint> slots;
  // One entry per worker rank, or none (format versions 1 and 2, which
  // did not keep sessions: the restarted shard then knows no epoch).
  std::vector<RankSessionCheckpoint> sessions;
  // The highest epoch seen before the run's sessions were last forgotten
  // (SessionTable::epoch_floor); 0 in format versions 1 and 2.
  uint64_t session_epoch_floor = 0;
  // 0: the checkpoint is complete. Otherwise it is incremental (format 5):
  // its sparse tables hold only the rows written (and the ids evicted)
  // since checkpoint `base_version`, the previous one, which a restore
  // loads first (and its base, down to a complete one). Dense tensors are
  // always whole.
  uint64_t base_version = 0;
};

// The format version this build writes, and the oldest it still reads.
inline constexpr uint32_t kCheckpointFormatVersion = 5;
inline constexpr uint32_t kOldestCheckpointFormatVersion = 1;
inline constexpr int kDefaultCheckpointsKept = 3;

// `<dir>/job-<job_id>`: the checkpoints of one run (server/README.md, "Job
// lifecycle"); a shard passes it as `dir` to the functions below.
std::string CheckpointJobDir(const std::string& dir, uint64_t job_id);
// The job ids with a `job-<id>` folder in `dir`, ascending (empty when
// `dir` does not exist).
std::vector<uint64_t> ListCheckpointJobs(const std::string& dir);
// The folder of the newest run in `dir` (CheckpointJobDir of the highest
// job id), or "" when there is none.
std::string NewestCheckpointJobDir(const std::string& dir);

// `<dir>/shard-<shard>`.
std::string CheckpointShardDir(const std::string& dir, int shard);
// `<dir>/shard-<shard>/ckpt-<version zero-padded to 20 digits>.hck`.
std::string CheckpointPath(const std::string& dir, int shard, uint64_t version);

// The serialised file contents, header and CRC included.
std::string EncodeCheckpoint(const ShardCheckpoint& checkpoint);

// Parses and verifies file contents: magic, format version, size, CRC, then
// the payload's structure and internal consistency (CheckCheckpointConsistency).
// DATA_LOSS for damage, FAILED_PRECONDITION for an unsupported format version.
absl::StatusOr<ShardCheckpoint> DecodeCheckpoint(absl::string_view bytes);

// Sizes and ranges that must hold for any checkpoint: shard in
// [0, num_shards), num_workers >= 1, optimizer vectors empty or as long as
// values, one `pushed` entry per worker, no duplicate (key, chunk), no
// session entries or one per worker.
// INVALID_ARGUMENT naming the slot otherwise.
absl::Status CheckCheckpointConsistency(const ShardCheckpoint& checkpoint);

// Writes the checkpoint atomically (see the file comment) and then deletes
// all but the `keep` highest versions of this shard; the file just written is
// never deleted. Leftover temporary files from a crashed writer are removed.
// Rewriting an existing version replaces it. INVALID_ARGUMENT for an
// inconsistent checkpoint or keep < 1; INTERNAL for an I/O error, naming the
// path. A failure to delete an old version is not an error (the next write
// tries again).
// Incremental checkpoints: the newest `keep` are kept, and below them every
// version down to the complete one they build on.
absl::Status WriteCheckpoint(const std::string& dir, const ShardCheckpoint& checkpoint,
                             int keep = kDefaultCheckpointsKept);

// `delta` (incremental, base_version == base.version) applied to `base`: a
// complete checkpoint at delta's version. FAILED_PRECONDITION when they do
// not fit together.
absl::StatusOr<ShardCheckpoint> ApplyIncremental(const ShardCheckpoint& base,
                                                 const ShardCheckpoint& delta);

// Versions present for the shard (final names only; temporary files are
// ignored), ascending. Empty when the directory does not exist.
absl::StatusOr<std::vector<uint64_t>> ListCheckpointVersions(const std::string& dir, int shard);

// Checks at start-up that `dir` can take checkpoints: creates it (and its
// parents) when missing, then creates and removes a probe file in it.
// FAILED_PRECONDITION with one line naming --checkpoint_dir when it exists
// and is not a directory, cannot be created, or is not writable.
absl::Status PrepareCheckpointDir(const std::string& dir);

// Loads the newest checkpoint of `shard` that verifies. Each newer file that
// does not (truncated, CRC mismatch, bad magic or format version, internal
// inconsistency, a version or shard other than its name says) is skipped and
// one line naming the file and the fault is appended to `warnings` (may be
// null). NOT_FOUND when the shard has no checkpoint files; DATA_LOSS when
// files exist but none verifies (the message lists each file's fault).
absl::StatusOr<ShardCheckpoint> LoadLatestCheckpoint(const std::string& dir, int shard,
                                                     std::vector<std::string>* warnings);

}  // namespace harrier

#endif  // HARRIER_SERVER_CHECKPOINT_H_
