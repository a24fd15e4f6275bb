#include "server/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"

namespace harrier {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'H', 'R', 'R', 'C', 'K', 'P', 'T', '\n'};
// magic + format version + flags + payload size.
constexpr size_t kHeaderSize = sizeof(kMagic) + 4 + 4 + 8;
constexpr size_t kTrailerSize = 4;  // CRC-32C
constexpr char kFilePrefix[] = "ckpt-";
constexpr char kFileSuffix[] = ".hck";
constexpr char kTempMarker[] = ".tmp.";
constexpr int kVersionDigits = 20;  // enough for any uint64_t

// Flags of a rank's session entry (format 3).
constexpr uint32_t kSessionReleased = 1;
constexpr uint32_t kSessionHeard = 2;
// Flags of a slot's kind entry (format 4).
constexpr uint32_t kSlotOwnClock = 1;
// proto::TABLE_SPARSE: slots of this kind carry rows (format 5).
constexpr uint32_t kSparseTableKind = 2;
// Header flag of an incremental checkpoint (format 5).
constexpr uint32_t kIncrementalFlag = 1;

constexpr bool kLittleEndianHost = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// ---------------------------------------------------------------------------
// Encoding. Scalars are written byte by byte so the format is the same on any
// host; arrays go with one memcpy on little-endian hosts, because they are
// nearly all of a checkpoint's bytes.

class Encoder {
 public:
  explicit Encoder(std::string* out) : out_(out) {}

  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Bytes(absl::string_view s) {
    U64(s.size());
    out_->append(s.data(), s.size());
  }
  void Floats(const std::vector<float>& v) {
    U64(v.size());
    if (kLittleEndianHost) {
      out_->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    } else {
      for (float f : v) {
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof(bits));
        U32(bits);
      }
    }
  }
  template <typename T>
  void Words(const std::vector<T>& v) {
    static_assert(sizeof(T) == 8, "64-bit words only");
    U64(v.size());
    if (kLittleEndianHost) {
      out_->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    } else {
      for (T w : v) U64(static_cast<uint64_t>(w));
    }
  }

 private:
  std::string* out_;
};

uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Bounds-checked reader over the payload. Every length is checked against
// the bytes left before anything is allocated, so a damaged length cannot
// ask for gigabytes. The first failure sticks; `what` names the field.
class Decoder {
 public:
  explicit Decoder(absl::string_view data) : data_(data) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t remaining() const { return data_.size() - pos_; }

  uint32_t U32(absl::string_view what) {
    if (!Need(4, what)) return 0;
    const uint32_t v = LoadU32(data_.data() + pos_);
    pos_ += 4;
    return v;
  }
  uint64_t U64(absl::string_view what) {
    if (!Need(8, what)) return 0;
    const uint64_t v = LoadU64(data_.data() + pos_);
    pos_ += 8;
    return v;
  }
  int64_t I64(absl::string_view what) { return static_cast<int64_t>(U64(what)); }
  int Int(absl::string_view what) {
    const uint32_t v = U32(what);
    if (v > static_cast<uint32_t>(INT_MAX)) Fail(absl::StrCat(what, " out of range: ", v));
    return ok() ? static_cast<int>(v) : 0;
  }
  std::string Bytes(absl::string_view what) {
    const uint64_t n = Count(1, what);
    if (!ok()) return {};
    std::string s(data_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::vector<float> Floats(absl::string_view what) {
    const uint64_t n = Count(sizeof(float), what);
    std::vector<float> v;
    if (!ok()) return v;
    v.resize(n);
    // n == 0 (an empty optimizer state) leaves v.data() null, and memcpy
    // from or to null is undefined even for 0 bytes (UBSan, fuzzing).
    if (kLittleEndianHost && n > 0) {
      std::memcpy(v.data(), data_.data() + pos_, n * sizeof(float));
      pos_ += n * sizeof(float);
    } else {
      for (auto& f : v) {
        const uint32_t bits = LoadU32(data_.data() + pos_);
        std::memcpy(&f, &bits, sizeof(bits));
        pos_ += 4;
      }
    }
    return v;
  }
  template <typename T>
  std::vector<T> Words(absl::string_view what) {
    static_assert(sizeof(T) == 8, "64-bit words only");
    const uint64_t n = Count(sizeof(T), what);
    std::vector<T> v;
    if (!ok()) return v;
    v.resize(n);
    if (kLittleEndianHost && n > 0) {  // v.data() is null when n == 0, as in Floats
      std::memcpy(v.data(), data_.data() + pos_, n * sizeof(T));
      pos_ += n * sizeof(T);
    } else {
      for (auto& w : v) {
        w = static_cast<T>(LoadU64(data_.data() + pos_));
        pos_ += 8;
      }
    }
    return v;
  }

  void Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }

 private:
  bool Need(uint64_t n, absl::string_view what) {
    if (!ok()) return false;
    if (n > remaining()) {
      Fail(absl::StrCat("payload ends inside ", what, " at offset ", pos_, " (", n,
                        " bytes needed, ", remaining(), " left)"));
      return false;
    }
    return true;
  }
  // Reads an element count and checks that many elements fit in what is left.
  uint64_t Count(uint64_t element_size, absl::string_view what) {
    const uint64_t n = U64(what);
    if (!ok()) return 0;
    if (n > remaining() / element_size) {
      Fail(absl::StrCat(what, " claims ", n, " elements of ", element_size, " bytes but only ",
                        remaining(), " payload bytes are left"));
      return 0;
    }
    return n;
  }

  absl::string_view data_;
  size_t pos_ = 0;
  std::string error_;
};

std::string EncodePayload(const ShardCheckpoint& c) {
  size_t estimate = 64 + c.sync.size() + c.optimizer.size() + 12 * c.sessions.size();
  for (const auto& s : c.slots) {
    estimate += 64 + s.key.size() + 8 * (s.shape.size() + s.pushed.size()) +
                4 * (s.values.size() + s.optimizer_first.size() + s.optimizer_second.size());
  }
  std::string out;
  out.reserve(estimate);
  Encoder e(&out);
  e.U32(static_cast<uint32_t>(c.shard));
  e.U32(static_cast<uint32_t>(c.num_shards));
  e.U32(static_cast<uint32_t>(c.num_workers));
  e.Bytes(c.sync);
  e.Bytes(c.optimizer);  // format 2
  e.U64(c.version);
  e.I64(c.created_unix_ms);
  e.U64(c.slots.size());
  for (const auto& s : c.slots) {
    e.Bytes(s.key);
    e.U32(s.chunk);
    e.Words(s.shape);
    e.Floats(s.values);
    e.Floats(s.optimizer_first);
    e.Floats(s.optimizer_second);
    e.I64(s.optimizer_steps);
    e.Words(s.pushed);
  }
  // Format 3: the ranks' sessions.
  e.U64(c.session_epoch_floor);
  e.U64(c.sessions.size());
  for (const auto& session : c.sessions) {
    e.U64(session.epoch);
    e.U32((session.released ? kSessionReleased : 0u) | (session.heard ? kSessionHeard : 0u));
  }
  // Format 4: each slot's table kind and clock, in slot order.
  for (const auto& s : c.slots) {
    e.U32(s.kind);
    e.U32(s.own_clock ? kSlotOwnClock : 0u);
  }
  // Format 5: the sparse tables' settings and row ids, in slot order.
  for (const auto& s : c.slots) {
    if (s.kind != kSparseTableKind) continue;
    e.Bytes(s.sparse_config);
    e.Words(s.row_ids);
    e.Words(s.row_steps);
    e.Words(s.removed_row_ids);
  }
  e.U64(c.base_version);
  return out;
}

absl::StatusOr<ShardCheckpoint> DecodePayload(absl::string_view payload, uint32_t format) {
  Decoder d(payload);
  ShardCheckpoint c;
  c.shard = d.Int("shard");
  c.num_shards = d.Int("num_shards");
  c.num_workers = d.Int("num_workers");
  c.sync = d.Bytes("sync");
  if (format >= 2) c.optimizer = d.Bytes("optimizer");
  c.version = d.U64("version");
  c.created_unix_ms = d.I64("created_unix_ms");
  const uint64_t num_slots = d.U64("slot count");
  // Each slot takes at least 60 bytes, which bounds the reservation.
  if (d.ok() && num_slots > d.remaining() / 60) {
    d.Fail(absl::StrCat("slot count ", num_slots, " does not fit in ", d.remaining(),
                        " payload bytes"));
  }
  if (d.ok()) c.slots.reserve(num_slots);
  for (uint64_t i = 0; d.ok() && i < num_slots; ++i) {
    SlotCheckpoint s;
    const std::string where = absl::StrCat("slot ", i, " ");
    s.key = d.Bytes(where + "key");
    s.chunk = d.U32(where + "chunk");
    s.shape = d.Words<uint64_t>(where + "shape");
    s.values = d.Floats(where + "values");
    s.optimizer_first = d.Floats(where + "optimizer_first");
    s.optimizer_second = d.Floats(where + "optimizer_second");
    s.optimizer_steps = d.I64(where + "optimizer_steps");
    s.pushed = d.Words<int64_t>(where + "pushed");
    c.slots.push_back(std::move(s));
  }
  if (format >= 3) {
    c.session_epoch_floor = d.U64("session epoch floor");
    const uint64_t num_sessions = d.U64("session count");
    // Each entry is an epoch and its flags: 12 bytes.
    if (d.ok() && num_sessions > d.remaining() / 12) {
      d.Fail(absl::StrCat("session count ", num_sessions, " does not fit in ", d.remaining(),
                          " payload bytes"));
    }
    if (d.ok()) c.sessions.reserve(num_sessions);
    for (uint64_t rank = 0; d.ok() && rank < num_sessions; ++rank) {
      const std::string where = absl::StrCat("rank ", rank, " session ");
      RankSessionCheckpoint session;
      session.epoch = d.U64(where + "epoch");
      const uint32_t flags = d.U32(where + "flags");
      if (d.ok() && (flags & ~(kSessionReleased | kSessionHeard)) != 0) {
        d.Fail(absl::StrFormat("%sflags 0x%08x: unknown bits", where, flags));
      }
      session.released = (flags & kSessionReleased) != 0;
      session.heard = (flags & kSessionHeard) != 0;
      c.sessions.push_back(session);
    }
  }
  if (format >= 4) {
    for (size_t i = 0; d.ok() && i < c.slots.size(); ++i) {
      const std::string where = absl::StrCat("slot ", i, " ");
      c.slots[i].kind = d.U32(where + "table kind");
      const uint32_t flags = d.U32(where + "flags");
      if (d.ok() && (flags & ~kSlotOwnClock) != 0) {
        d.Fail(absl::StrFormat("%sflags 0x%08x: unknown bits", where, flags));
      }
      c.slots[i].own_clock = (flags & kSlotOwnClock) != 0;
    }
  }
  if (format >= 5) {
    for (size_t i = 0; d.ok() && i < c.slots.size(); ++i) {
      SlotCheckpoint& s = c.slots[i];
      if (s.kind != kSparseTableKind) continue;
      const std::string where = absl::StrCat("slot ", i, " ");
      s.sparse_config = d.Bytes(where + "sparse settings");
      s.row_ids = d.Words<int64_t>(where + "row ids");
      s.row_steps = d.Words<uint64_t>(where + "row steps");
      s.removed_row_ids = d.Words<int64_t>(where + "removed row ids");
      if (d.ok() && s.row_steps.size() != s.row_ids.size()) {
        d.Fail(absl::StrCat(where, s.row_ids.size(), " row ids but ", s.row_steps.size(),
                            " row step counts"));
      }
    }
    c.base_version = d.U64("base version");
  }
  if (d.ok() && d.remaining() != 0) {
    d.Fail(absl::StrCat(d.remaining(), format >= 5   ? " unexpected bytes after the sparse rows"
                                       : format >= 4 ? " unexpected bytes after the slots' kinds"
                                       : format >= 3 ? " unexpected bytes after the sessions"
                                                     : " unexpected bytes after the last slot"));
  }
  if (!d.ok()) return absl::DataLossError(d.error());
  return c;
}

// ---------------------------------------------------------------------------
// Files.

std::string ErrnoText() { return std::strerror(errno); }

std::string FileName(uint64_t version) {
  return absl::StrFormat("%s%0*u%s", kFilePrefix, kVersionDigits, version, kFileSuffix);
}

// The version in a final checkpoint name; false for anything else
// (temporary files, foreign files).
bool ParseFileName(absl::string_view name, uint64_t* version) {
  const size_t prefix = sizeof(kFilePrefix) - 1;
  const size_t suffix = sizeof(kFileSuffix) - 1;
  if (name.size() != prefix + kVersionDigits + suffix) return false;
  if (name.substr(0, prefix) != kFilePrefix) return false;
  if (name.substr(name.size() - suffix) != kFileSuffix) return false;
  const absl::string_view digits = name.substr(prefix, kVersionDigits);
  if (!std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return false;
  }
  return absl::SimpleAtoi(digits, version);
}

bool IsTempFileName(absl::string_view name) {
  return name.substr(0, sizeof(kFilePrefix) - 1) == kFilePrefix &&
         name.find(kTempMarker) != absl::string_view::npos;
}

absl::Status WriteAll(int fd, const std::string& path, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ErrnoText()));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// A rename is only durable once the directory entry is on disk too.
absl::Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot open directory ", path, ": ", ErrnoText()));
  const int rc = ::fsync(fd);
  const std::string error = rc == 0 ? "" : ErrnoText();
  ::close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("cannot fsync directory ", path, ": ", error));
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& dir, const std::string& final_path,
                              const std::string& bytes) {
  const std::string tmp = absl::StrCat(final_path, kTempMarker, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ErrnoText()));
  absl::Status status = WriteAll(fd, tmp, bytes);
  if (status.ok() && ::fsync(fd) != 0) {
    status = absl::InternalError(absl::StrCat("cannot fsync ", tmp, ": ", ErrnoText()));
  }
  // close() can report a deferred write error (NFS, quota), so it counts.
  if (::close(fd) != 0 && status.ok()) {
    status = absl::InternalError(absl::StrCat("cannot close ", tmp, ": ", ErrnoText()));
  }
  if (status.ok() && std::rename(tmp.c_str(), final_path.c_str()) != 0) {
    status = absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", final_path, ": ", ErrnoText()));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return SyncDirectory(dir);
}

// Whether the file's header carries the incremental flag (false for a file
// that cannot be read: pruning then keeps nothing for it).
bool IsIncrementalFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return false;
  char header[kHeaderSize];
  const bool read = std::fread(header, 1, kHeaderSize, file) == kHeaderSize;
  std::fclose(file);
  return read && (LoadU32(header + 12) & kIncrementalFlag) != 0;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open: ", ErrnoText()));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string error = ErrnoText();
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat: ", error));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string error = ErrnoText();
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot read: ", error));
    }
    if (n == 0) break;  // shrank while reading; the size check will say so
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  ::close(fd);
  return bytes;
}

}  // namespace

std::string CheckpointJobDir(const std::string& dir, uint64_t job_id) {
  return absl::StrCat(dir, "/job-", job_id);
}

std::vector<uint64_t> ListCheckpointJobs(const std::string& dir) {
  std::vector<uint64_t> jobs;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    uint64_t id = 0;
    if (absl::StartsWith(name, "job-") && absl::SimpleAtoi(name.substr(4), &id) && id > 0 &&
        entry.is_directory(ec)) {
      jobs.push_back(id);
    }
  }
  std::sort(jobs.begin(), jobs.end());
  return jobs;
}

std::string NewestCheckpointJobDir(const std::string& dir) {
  const std::vector<uint64_t> jobs = ListCheckpointJobs(dir);
  return jobs.empty() ? std::string() : CheckpointJobDir(dir, jobs.back());
}

std::string CheckpointShardDir(const std::string& dir, int shard) {
  return absl::StrCat(dir, "/shard-", shard);
}

std::string CheckpointPath(const std::string& dir, int shard, uint64_t version) {
  return absl::StrCat(CheckpointShardDir(dir, shard), "/", FileName(version));
}

std::string EncodeCheckpoint(const ShardCheckpoint& checkpoint) {
  const std::string payload = EncodePayload(checkpoint);
  std::string out;
  out.reserve(kHeaderSize + payload.size() + kTrailerSize);
  out.append(kMagic, sizeof(kMagic));
  Encoder e(&out);
  e.U32(kCheckpointFormatVersion);
  // Flags: kIncrementalFlag, so that pruning can tell without decoding.
  e.U32(checkpoint.base_version != 0 ? kIncrementalFlag : 0u);
  e.U64(payload.size());
  out.append(payload);
  e.U32(Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<ShardCheckpoint> DecodeCheckpoint(absl::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(bytes.size() < sizeof(kMagic)
                                   ? absl::StrCat("truncated: ", bytes.size(), " bytes, no header")
                                   : std::string("bad magic: not a Harrier checkpoint"));
  }
  if (bytes.size() < kHeaderSize + kTrailerSize) {
    return absl::DataLossError(absl::StrCat("truncated: ", bytes.size(), " bytes, less than the ",
                                            kHeaderSize + kTrailerSize,
                                            "-byte header and checksum"));
  }
  // The header layout is fixed across format versions, so size and CRC are
  // checked first: a flipped bit in the version field reads as damage, not
  // as a file from another release.
  const uint32_t format = LoadU32(bytes.data() + 8);
  const uint32_t flags = LoadU32(bytes.data() + 12);
  const uint64_t payload_size = LoadU64(bytes.data() + 16);
  const uint64_t available = bytes.size() - kHeaderSize - kTrailerSize;
  if (payload_size > available) {
    return absl::DataLossError(absl::StrCat(
        "truncated: header says ", payload_size, " payload bytes, file has ", bytes.size(),
        " bytes (", kHeaderSize + payload_size + kTrailerSize, " expected)"));
  }
  if (payload_size < available) {
    return absl::DataLossError(
        absl::StrCat(available - payload_size, " unexpected bytes after the checksum"));
  }
  const size_t covered = kHeaderSize + payload_size;
  const uint32_t stored = LoadU32(bytes.data() + covered);
  const uint32_t computed = Crc32c(bytes.data(), covered);
  if (stored != computed) {
    return absl::DataLossError(
        absl::StrFormat("CRC-32C mismatch: stored 0x%08x, computed 0x%08x", stored, computed));
  }
  if (format < kOldestCheckpointFormatVersion || format > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("format version ", format, "; this build reads versions ",
                     kOldestCheckpointFormatVersion, " to ", kCheckpointFormatVersion));
  }
  if ((flags & ~kIncrementalFlag) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat("unknown flags 0x%08x", flags));
  }
  absl::StatusOr<ShardCheckpoint> checkpoint =
      DecodePayload(bytes.substr(kHeaderSize, payload_size), format);
  if (!checkpoint.ok()) return checkpoint.status();
  if (((flags & kIncrementalFlag) != 0) != (checkpoint->base_version != 0)) {
    return absl::DataLossError("the incremental flag disagrees with the base version");
  }
  // The CRC matched, so an inconsistency here was written that way: still
  // refused, since restoring it would corrupt the shard.
  absl::Status consistent = CheckCheckpointConsistency(*checkpoint);
  if (!consistent.ok()) {
    return absl::DataLossError(absl::StrCat("inconsistent contents: ", consistent.message()));
  }
  return checkpoint;
}

absl::StatusOr<ShardCheckpoint> ApplyIncremental(const ShardCheckpoint& base,
                                                 const ShardCheckpoint& delta) {
  if (delta.base_version != base.version || delta.shard != base.shard ||
      delta.num_workers != base.num_workers) {
    return absl::FailedPreconditionError(
        absl::StrCat("incremental checkpoint ", delta.version, " builds on version ",
                     delta.base_version, ", not on version ", base.version));
  }
  ShardCheckpoint out = delta;
  for (SlotCheckpoint& slot : out.slots) {
    if (slot.kind != kSparseTableKind) continue;
    const SlotCheckpoint* before = nullptr;
    for (const SlotCheckpoint& candidate : base.slots) {
      if (candidate.key == slot.key && candidate.chunk == slot.chunk) before = &candidate;
    }
    // Merged onto a complete base the result is complete; onto an
    // incremental one it is still a change set, whose evictions must reach
    // the complete checkpoint further down.
    const bool complete = base.base_version == 0;
    if (before == nullptr) {
      if (complete) slot.removed_row_ids.clear();
      continue;  // the table was created after the base: all its rows are here
    }
    const size_t rows = before->row_ids.size();
    const size_t width = rows == 0 ? 0 : before->values.size() / rows;
    const size_t state = rows == 0 ? 0 : before->optimizer_first.size() / rows;
    if (!slot.row_ids.empty() &&
        (slot.values.size() / slot.row_ids.size() != width && rows > 0)) {
      return absl::FailedPreconditionError(absl::StrCat("sparse table '", slot.key,
                                                        "': rows of another width than its base's"));
    }
    absl::flat_hash_map<int64_t, bool> replaced;
    for (int64_t id : slot.row_ids) replaced[id] = true;
    for (int64_t id : slot.removed_row_ids) replaced.emplace(id, true);
    SlotCheckpoint merged = slot;
    merged.removed_row_ids.clear();
    if (!complete) {
      absl::flat_hash_map<int64_t, bool> written;
      for (int64_t id : slot.row_ids) written[id] = true;
      const std::vector<int64_t>* lists[] = {&slot.removed_row_ids, &before->removed_row_ids};
      for (const std::vector<int64_t>* list : lists) {
        for (int64_t id : *list) {
          if (written.emplace(id, true).second) merged.removed_row_ids.push_back(id);
        }
      }
    }
    for (size_t i = 0; i < rows; ++i) {
      if (replaced.contains(before->row_ids[i])) continue;
      merged.row_ids.push_back(before->row_ids[i]);
      merged.row_steps.push_back(before->row_steps[i]);
      merged.values.insert(merged.values.end(), before->values.begin() + i * width,
                           before->values.begin() + (i + 1) * width);
      merged.optimizer_first.insert(merged.optimizer_first.end(),
                                    before->optimizer_first.begin() + i * state,
                                    before->optimizer_first.begin() + (i + 1) * state);
    }
    slot = std::move(merged);
  }
  return out;
}

absl::Status CheckCheckpointConsistency(const ShardCheckpoint& c) {
  if (c.num_shards < 1 || c.shard < 0 || c.shard >= c.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", c.shard, " is not in [0, num_shards=", c.num_shards, ")"));
  }
  if (c.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers ", c.num_workers, " < 1"));
  }
  if (!c.sessions.empty() && c.sessions.size() != static_cast<size_t>(c.num_workers)) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", c.shard, ": ", c.sessions.size(),
                                                   " rank sessions for ", c.num_workers,
                                                   " workers"));
  }
  std::set<std::pair<absl::string_view, uint32_t>> seen;
  for (const auto& s : c.slots) {
    const std::string name = absl::StrCat("shard ", c.shard, " key '", s.key, "' chunk ", s.chunk);
    if (!seen.emplace(s.key, s.chunk).second) {
      return absl::InvalidArgumentError(absl::StrCat(name, " appears twice"));
    }
    if (s.kind == kSparseTableKind) {
      // Rows: values and state are whole rows, one set per id.
      const size_t rows = s.row_ids.size();
      if (s.row_steps.size() != rows || (rows == 0 && !s.values.empty()) ||
          (rows > 0 && (s.values.size() % rows != 0 || s.optimizer_first.size() % rows != 0)) ||
          !s.optimizer_second.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": ", rows, " rows with ", s.values.size(), " values and ",
            s.optimizer_first.size(), " optimizer floats"));
      }
    } else if (!s.optimizer_first.empty() && s.optimizer_first.size() != s.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": optimizer_first has ",
                                                     s.optimizer_first.size(), " values, expected ",
                                                     s.values.size()));
    }
    if (!s.optimizer_second.empty() && s.optimizer_second.size() != s.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": optimizer_second has ",
                                                     s.optimizer_second.size(),
                                                     " values, expected ", s.values.size()));
    }
    if (s.optimizer_steps < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": negative optimizer_steps ", s.optimizer_steps));
    }
    if (s.pushed.size() != static_cast<size_t>(c.num_workers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", s.pushed.size(), " pushed clocks for ", c.num_workers, " workers"));
    }
    for (size_t rank = 0; rank < s.pushed.size(); ++rank) {
      if (s.pushed[rank] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": negative pushed clock ", s.pushed[rank], " for rank ", rank));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> ListCheckpointVersions(const std::string& dir, int shard) {
  const std::string shard_dir = CheckpointShardDir(dir, shard);
  std::vector<uint64_t> versions;
  std::error_code ec;
  if (!fs::exists(shard_dir, ec)) return versions;
  fs::directory_iterator it(shard_dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    uint64_t version;
    if (ParseFileName(it->path().filename().string(), &version)) versions.push_back(version);
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", shard_dir, ": ", ec.message()));
  std::sort(versions.begin(), versions.end());
  return versions;
}

absl::Status WriteCheckpoint(const std::string& dir, const ShardCheckpoint& checkpoint, int keep) {
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("keep must be >= 1, got ", keep));
  absl::Status consistent = CheckCheckpointConsistency(checkpoint);
  if (!consistent.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("refusing to write checkpoint: ", consistent.message()));
  }
  const std::string shard_dir = CheckpointShardDir(dir, checkpoint.shard);
  std::error_code ec;
  const bool created = fs::create_directories(shard_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", shard_dir, ": ", ec.message()));
  if (created) {
    // The new shard directory's own entry must be durable for the file in it to be.
    absl::Status synced = SyncDirectory(dir);
    if (!synced.ok()) return synced;
  }
  const std::string path = CheckpointPath(dir, checkpoint.shard, checkpoint.version);
  absl::Status written = WriteFileDurably(shard_dir, path, EncodeCheckpoint(checkpoint));
  if (!written.ok()) return written;

  // Pruning is best effort: a version that cannot be deleted now is deleted
  // by a later write, and keeping an extra file is harmless.
  std::vector<uint64_t> older;
  std::vector<std::string> temps;
  for (fs::directory_iterator it(shard_dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    uint64_t version;
    if (ParseFileName(name, &version)) {
      if (version != checkpoint.version) older.push_back(version);
    } else if (IsTempFileName(name)) {
      // Writers of one shard are serialised, so any temporary file now is
      // the leftover of a writer that crashed.
      temps.push_back(it->path().string());
    }
  }
  std::sort(older.rbegin(), older.rend());
  // The written version is always kept and counts towards `keep` when it is
  // the newest; older ones fill the remaining places, highest first.
  size_t places = static_cast<size_t>(keep) - 1;
  if (!older.empty() && older.front() > checkpoint.version) places = static_cast<size_t>(keep);
  places = std::min(places, older.size());
  // An incremental checkpoint needs every version below it down to a
  // complete one: those are kept too.
  bool needs_base = places == 0 ? checkpoint.base_version != 0
                                : IsIncrementalFile(CheckpointPath(dir, checkpoint.shard,
                                                                   older[places - 1]));
  while (needs_base && places < older.size()) {
    ++places;
    needs_base = IsIncrementalFile(CheckpointPath(dir, checkpoint.shard, older[places - 1]));
  }
  for (size_t i = places; i < older.size(); ++i) {
    ::unlink(CheckpointPath(dir, checkpoint.shard, older[i]).c_str());
  }
  for (const auto& temp : temps) ::unlink(temp.c_str());
  return absl::OkStatus();
}

absl::Status PrepareCheckpointDir(const std::string& dir) {
  const std::string flag = absl::StrCat("--checkpoint_dir=", dir);
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (fs::exists(status) && !fs::is_directory(status)) {
    return absl::FailedPreconditionError(absl::StrCat(flag, " is not a directory"));
  }
  if (!fs::exists(status)) {
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, " does not exist and cannot be created: ", ec.message()));
    }
  }
  // access(W_OK) answers for the real user id and ignores read-only mounts;
  // a file actually created is the one test that matches what a write needs.
  const std::string probe = absl::StrCat(dir, "/.harrier-probe-", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, " is not writable: ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

absl::StatusOr<ShardCheckpoint> LoadLatestCheckpoint(const std::string& dir, int shard,
                                                     std::vector<std::string>* warnings) {
  absl::StatusOr<std::vector<uint64_t>> versions = ListCheckpointVersions(dir, shard);
  if (!versions.ok()) return versions.status();
  if (versions->empty()) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint for shard ", shard, " in ", CheckpointShardDir(dir, shard)));
  }
  std::vector<std::string> faults;
  for (auto it = versions->rbegin(); it != versions->rend(); ++it) {
    const std::string path = CheckpointPath(dir, shard, *it);
    absl::StatusOr<ShardCheckpoint> checkpoint;
    absl::StatusOr<std::string> bytes = ReadWholeFile(path);
    if (!bytes.ok()) {
      checkpoint = bytes.status();
    } else {
      checkpoint = DecodeCheckpoint(*bytes);
    }
    // A verified file in the wrong place (copied by hand, renamed) is as
    // wrong to restore as a damaged one.
    if (checkpoint.ok() && checkpoint->shard != shard) {
      checkpoint = absl::FailedPreconditionError(
          absl::StrCat("holds shard ", checkpoint->shard, ", expected shard ", shard));
    } else if (checkpoint.ok() && checkpoint->version != *it) {
      checkpoint = absl::FailedPreconditionError(
          absl::StrCat("holds version ", checkpoint->version, " but is named version ", *it));
    }
    // An incremental checkpoint is loaded on top of its base, and that on
    // its own, down to a complete one.
    while (checkpoint.ok() && checkpoint->base_version != 0) {
      const uint64_t base_version = checkpoint->base_version;
      absl::StatusOr<std::string> base_bytes =
          ReadWholeFile(CheckpointPath(dir, shard, base_version));
      absl::StatusOr<ShardCheckpoint> base =
          base_bytes.ok() ? DecodeCheckpoint(*base_bytes) : base_bytes.status();
      if (base.ok() && (base->shard != shard || base->version != base_version)) {
        base = absl::FailedPreconditionError(
            absl::StrCat("holds shard ", base->shard, " version ", base->version));
      }
      if (!base.ok()) {
        checkpoint = absl::DataLossError(absl::StrCat("its base, version ", base_version, ": ",
                                                      base.status().message()));
        break;
      }
      // The base may itself be incremental: the loop goes on from the
      // merged result's base.
      auto merged = ApplyIncremental(*base, *checkpoint);
      if (!merged.ok()) {
        checkpoint = merged.status();
        break;
      }
      merged->base_version = base->base_version;
      checkpoint = std::move(merged);
    }
    if (checkpoint.ok()) return checkpoint;
    std::string fault = absl::StrCat(path, ": ", checkpoint.status().message());
    if (warnings != nullptr) {
      warnings->push_back(absl::StrCat("refusing checkpoint ", fault,
                                       std::next(it) != versions->rend()
                                           ? "; trying the previous version"
                                           : "; no older version left"));
    }
    faults.push_back(std::move(fault));
  }
  return absl::DataLossError(absl::StrCat("no valid checkpoint for shard ", shard, " among ",
                                          faults.size(), " files: ", absl::StrJoin(faults, "; ")));
}

}  // namespace harrier
