// Checkpoint files: round trip, atomic replacement, pruning, and refusal of
// damaged or misplaced files. Real files under TEST_TMPDIR.

#include "server/checkpoint.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "server/shard_store.h"

namespace harrier {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test case, so cases do not see each other's files.
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / ("ckpt-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

ShardCheckpoint MakeCheckpoint(int shard, uint64_t version) {
  ShardCheckpoint c;
  c.shard = shard;
  c.num_shards = 4;
  c.num_workers = 3;
  c.sync = "ssp:2";
  c.optimizer = "adam";
  c.version = version;
  c.created_unix_ms = 1700000000123 + static_cast<int64_t>(version);

  SlotCheckpoint a;
  a.key = "layer1/weight";
  a.chunk = 0;
  a.shape = {3, 4};
  for (int i = 0; i < 12; ++i) a.values.push_back(0.25f * i - 1.0f + static_cast<float>(version));
  // Values that a text or lossy encoding would change.
  a.values[1] = -0.0f;
  a.values[2] = std::numeric_limits<float>::denorm_min();
  a.values[3] = std::numeric_limits<float>::infinity();
  a.values[4] = std::numeric_limits<float>::quiet_NaN();
  a.optimizer_first.assign(12, 0.5f);
  a.optimizer_second.assign(12, 1e-7f);
  a.optimizer_steps = 41;
  a.pushed = {7, 8, 9};

  SlotCheckpoint b;
  b.key = "bias";
  b.chunk = 5;
  b.shape = {1000000};  // a chunk of a larger tensor: values need not fill the shape
  b.values = {1.0f, 2.0f};
  b.optimizer_steps = 0;
  b.pushed = {0, 0, 0};

  c.slots = {a, b};
  // Rank 0 live, rank 1 gave its session back, rank 2 only handed out.
  c.sessions = {
      {1700000000500, false, true}, {1700000000400, true, true}, {1700000000600, false, false}};
  c.session_epoch_floor = 1700000000100;
  return c;
}

bool BitwiseEqual(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() &&
         (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

void RequireSame(const ShardCheckpoint& x, const ShardCheckpoint& y) {
  REQUIRE(x.shard == y.shard);
  REQUIRE(x.num_shards == y.num_shards);
  REQUIRE(x.num_workers == y.num_workers);
  REQUIRE(x.sync == y.sync);
  REQUIRE(x.optimizer == y.optimizer);
  REQUIRE(x.version == y.version);
  REQUIRE(x.created_unix_ms == y.created_unix_ms);
  REQUIRE(x.slots.size() == y.slots.size());
  for (size_t i = 0; i < x.slots.size(); ++i) {
    const auto& a = x.slots[i];
    const auto& b = y.slots[i];
    REQUIRE(a.key == b.key);
    REQUIRE(a.chunk == b.chunk);
    REQUIRE(a.shape == b.shape);
    REQUIRE(BitwiseEqual(a.values, b.values));
    REQUIRE(BitwiseEqual(a.optimizer_first, b.optimizer_first));
    REQUIRE(BitwiseEqual(a.optimizer_second, b.optimizer_second));
    REQUIRE(a.optimizer_steps == b.optimizer_steps);
    REQUIRE(a.pushed == b.pushed);
    REQUIRE(a.kind == b.kind);
    REQUIRE(a.own_clock == b.own_clock);
  }
  REQUIRE(x.session_epoch_floor == y.session_epoch_floor);
  REQUIRE(x.sessions.size() == y.sessions.size());
  for (size_t rank = 0; rank < x.sessions.size(); ++rank) {
    REQUIRE(x.sessions[rank].epoch == y.sessions[rank].epoch);
    REQUIRE(x.sessions[rank].released == y.sessions[rank].released);
    REQUIRE(x.sessions[rank].heard == y.sessions[rank].heard);
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Recomputes the trailing CRC, so a test can reach the checks behind it.
std::string Reseal(std::string bytes) {
  bytes.resize(bytes.size() - 4);
  const uint32_t crc = Crc32c(bytes.data(), bytes.size());
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  return bytes;
}

bool AnyContains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& line : lines) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("checkpoint round trip is bitwise exact", "[checkpoint]") {
  const std::string dir = FreshDir("roundtrip");
  const ShardCheckpoint original = MakeCheckpoint(2, 17);
  REQUIRE(WriteCheckpoint(dir, original).ok());
  REQUIRE(fs::exists(dir + "/shard-2/ckpt-00000000000000000017.hck"));
  REQUIRE(CheckpointPath(dir, 2, 17) == dir + "/shard-2/ckpt-00000000000000000017.hck");

  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(dir, 2, &warnings);
  REQUIRE(loaded.ok());
  REQUIRE(warnings.empty());
  RequireSame(original, *loaded);

  // Encoding is deterministic: the same checkpoint gives the same bytes.
  REQUIRE(ReadFile(CheckpointPath(dir, 2, 17)) == EncodeCheckpoint(original));
}

TEST_CASE("empty shard round trips", "[checkpoint]") {
  ShardCheckpoint empty;
  empty.version = 1;
  auto decoded = DecodeCheckpoint(EncodeCheckpoint(empty));
  REQUIRE(decoded.ok());
  RequireSame(empty, *decoded);
}

TEST_CASE("no checkpoint is NotFound", "[checkpoint]") {
  const std::string dir = FreshDir("none");
  auto loaded = LoadLatestCheckpoint(dir, 0, nullptr);
  REQUIRE(absl::IsNotFound(loaded.status()));
  REQUIRE(absl::IsNotFound(LoadLatestCheckpoint(dir + "/missing", 0, nullptr).status()));
}

TEST_CASE("a leftover temporary file is ignored and cleaned up", "[checkpoint]") {
  const std::string dir = FreshDir("temp");
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(0, 1)).ok());
  // A writer that crashed before its rename: a half-written newer version.
  const std::string leftover = CheckpointPath(dir, 0, 2) + ".tmp.99999";
  const std::string full = EncodeCheckpoint(MakeCheckpoint(0, 2));
  WriteRaw(leftover, full.substr(0, full.size() / 2));

  auto versions = ListCheckpointVersions(dir, 0);
  REQUIRE(versions.ok());
  REQUIRE(*versions == std::vector<uint64_t>{1});

  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(dir, 0, &warnings);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->version == 1);
  REQUIRE(warnings.empty());

  // The next successful write removes it.
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(0, 3)).ok());
  REQUIRE_FALSE(fs::exists(leftover));
  for (const auto& entry : fs::directory_iterator(CheckpointShardDir(dir, 0))) {
    REQUIRE(entry.path().filename().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("rewriting a version replaces it", "[checkpoint]") {
  const std::string dir = FreshDir("rewrite");
  ShardCheckpoint c = MakeCheckpoint(1, 5);
  REQUIRE(WriteCheckpoint(dir, c).ok());
  c.slots[0].values[0] = 123.0f;
  REQUIRE(WriteCheckpoint(dir, c).ok());
  auto loaded = LoadLatestCheckpoint(dir, 1, nullptr);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->slots[0].values[0] == 123.0f);
}

TEST_CASE("only the newest K versions are kept", "[checkpoint]") {
  const std::string dir = FreshDir("prune");
  for (uint64_t v = 1; v <= 6; ++v) REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(3, v), 3).ok());
  auto versions = ListCheckpointVersions(dir, 3);
  REQUIRE(versions.ok());
  REQUIRE(*versions == std::vector<uint64_t>{4, 5, 6});

  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(3, 10), 1).ok());
  versions = ListCheckpointVersions(dir, 3);
  REQUIRE(*versions == std::vector<uint64_t>{10});

  // Other shards and foreign files are left alone.
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(1, 1), 1).ok());
  WriteRaw(CheckpointShardDir(dir, 3) + "/README", "operator notes");
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(3, 11), 1).ok());
  REQUIRE(fs::exists(CheckpointShardDir(dir, 3) + "/README"));
  REQUIRE(*ListCheckpointVersions(dir, 1) == std::vector<uint64_t>{1});

  REQUIRE(absl::IsInvalidArgument(WriteCheckpoint(dir, MakeCheckpoint(3, 12), 0)));
}

TEST_CASE("a corrupt newest file falls back to the previous version", "[checkpoint]") {
  const std::string dir = FreshDir("corrupt");
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(0, 1)).ok());
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(0, 2)).ok());
  const std::string newest = CheckpointPath(dir, 0, 2);
  const std::string good = ReadFile(newest);

  struct Damage {
    const char* name;
    std::string bytes;
    const char* expected;  // part of the warning
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  std::string flipped_header = good;
  flipped_header[9] ^= 0x01;  // inside the format version field
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  const std::vector<Damage> cases = {
      {"bit flip in the payload", flipped, "CRC-32C mismatch"},
      {"bit flip in the header", flipped_header, "CRC-32C mismatch"},
      {"truncated", good.substr(0, good.size() - 100), "truncated"},
      {"truncated to a few bytes", good.substr(0, 10), "truncated"},
      {"empty", "", "truncated"},
      {"bad magic", bad_magic, "bad magic"},
      {"trailing garbage", good + "xyz", "unexpected bytes"},
  };
  for (const auto& damage : cases) {
    SECTION(damage.name) {
      WriteRaw(newest, damage.bytes);
      std::vector<std::string> warnings;
      auto loaded = LoadLatestCheckpoint(dir, 0, &warnings);
      REQUIRE(loaded.ok());
      REQUIRE(loaded->version == 1);
      RequireSame(*loaded, MakeCheckpoint(0, 1));
      REQUIRE(warnings.size() == 1);
      INFO(warnings[0]);
      REQUIRE(AnyContains(warnings, newest));
      REQUIRE(AnyContains(warnings, damage.expected));
    }
  }
}

TEST_CASE("a file of another format version is refused", "[checkpoint]") {
  // A well-formed file whose header names the next format version (CRC
  // recomputed).
  std::string bytes = EncodeCheckpoint(MakeCheckpoint(0, 1));
  bytes[8] = static_cast<char>(kCheckpointFormatVersion + 1);
  auto decoded = DecodeCheckpoint(Reseal(bytes));
  REQUIRE(absl::IsFailedPrecondition(decoded.status()));
  REQUIRE(std::string(decoded.status().message())
              .find(absl::StrCat("format version ", kCheckpointFormatVersion + 1)) !=
          std::string::npos);
}

TEST_CASE("all checkpoints corrupt is an error naming each file", "[checkpoint]") {
  const std::string dir = FreshDir("allcorrupt");
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(0, 1)).ok());
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(0, 2)).ok());
  for (uint64_t v : {1, 2}) {
    const std::string path = CheckpointPath(dir, 0, v);
    std::string bytes = ReadFile(path);
    bytes[bytes.size() - 1] ^= 0xff;
    WriteRaw(path, bytes);
  }
  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(dir, 0, &warnings);
  REQUIRE(absl::IsDataLoss(loaded.status()));
  REQUIRE(warnings.size() == 2);
  const std::string message(loaded.status().message());
  REQUIRE(message.find(CheckpointPath(dir, 0, 1)) != std::string::npos);
  REQUIRE(message.find(CheckpointPath(dir, 0, 2)) != std::string::npos);
}

TEST_CASE("a checkpoint of another shard is refused", "[checkpoint]") {
  const std::string dir = FreshDir("mismatch");
  REQUIRE(WriteCheckpoint(dir, MakeCheckpoint(1, 1)).ok());
  // Someone copies shard 0's newer file into shard 1's directory.
  fs::create_directories(CheckpointShardDir(dir, 1));
  WriteRaw(CheckpointPath(dir, 1, 2), EncodeCheckpoint(MakeCheckpoint(0, 2)));

  std::vector<std::string> warnings;
  auto loaded = LoadLatestCheckpoint(dir, 1, &warnings);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->shard == 1);
  REQUIRE(loaded->version == 1);
  REQUIRE(AnyContains(warnings, "holds shard 0, expected shard 1"));

  // With nothing else to fall back on, the load fails.
  fs::remove(CheckpointPath(dir, 1, 1));
  warnings.clear();
  loaded = LoadLatestCheckpoint(dir, 1, &warnings);
  REQUIRE_FALSE(loaded.ok());
  REQUIRE(AnyContains(warnings, "holds shard 0"));

  // A file whose contents disagree with its name's version is refused too.
  const std::string dir2 = FreshDir("misnamed");
  fs::create_directories(CheckpointShardDir(dir2, 0));
  WriteRaw(CheckpointPath(dir2, 0, 9), EncodeCheckpoint(MakeCheckpoint(0, 3)));
  warnings.clear();
  REQUIRE_FALSE(LoadLatestCheckpoint(dir2, 0, &warnings).ok());
  REQUIRE(AnyContains(warnings, "named version 9"));
}

TEST_CASE("inconsistent checkpoints are neither written nor loaded", "[checkpoint]") {
  const std::string dir = FreshDir("inconsistent");
  struct Breakage {
    const char* name;
    void (*apply)(ShardCheckpoint&);
    const char* expected;
  };
  const std::vector<Breakage> cases = {
      {"pushed size", [](ShardCheckpoint& c) { c.slots[0].pushed.pop_back(); }, "pushed clocks"},
      {"first moment size", [](ShardCheckpoint& c) { c.slots[0].optimizer_first.pop_back(); },
       "optimizer_first"},
      {"second moment size", [](ShardCheckpoint& c) { c.slots[0].optimizer_second.push_back(1); },
       "optimizer_second"},
      {"duplicate slot", [](ShardCheckpoint& c) { c.slots.push_back(c.slots[0]); }, "twice"},
      {"shard out of range", [](ShardCheckpoint& c) { c.shard = c.num_shards; }, "num_shards"},
      {"no workers", [](ShardCheckpoint& c) { c.num_workers = 0; }, "num_workers"},
  };
  for (const auto& breakage : cases) {
    SECTION(breakage.name) {
      ShardCheckpoint c = MakeCheckpoint(0, 1);
      breakage.apply(c);
      absl::Status written = WriteCheckpoint(dir, c);
      REQUIRE(absl::IsInvalidArgument(written));
      REQUIRE(std::string(written.message()).find(breakage.expected) != std::string::npos);
      // Encoded anyway (bypassing the writer), the reader refuses it as data loss.
      auto decoded = DecodeCheckpoint(EncodeCheckpoint(c));
      REQUIRE(absl::IsDataLoss(decoded.status()));
      REQUIRE(std::string(decoded.status().message()).find(breakage.expected) != std::string::npos);
    }
  }
}

TEST_CASE("damaged lengths do not allocate or crash", "[checkpoint]") {
  // Every single-byte change of a small file is detected (CRC) and never
  // crashes the decoder, whichever field it lands in.
  const std::string good = EncodeCheckpoint(MakeCheckpoint(0, 1));
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x80;
    REQUIRE_FALSE(DecodeCheckpoint(bad).ok());
  }
  // With the CRC recomputed, damage reaches the payload decoder, whose
  // bounds checks must refuse (or accept) it without reading out of range
  // or allocating what a damaged length claims.
  for (size_t i = 24; i + 4 < good.size(); ++i) {
    for (unsigned char bit : {0x01, 0x80}) {
      std::string bad = good;
      bad[i] ^= static_cast<char>(bit);
      auto decoded = DecodeCheckpoint(Reseal(bad));
      if (!decoded.ok()) {
        REQUIRE(
            (absl::IsDataLoss(decoded.status()) || absl::IsFailedPrecondition(decoded.status())));
      }
    }
  }
  // A length field set to a huge value is refused, not allocated.
  std::string huge = good;
  for (int i = 0; i < 8; ++i) huge[24 + 12 + i] = static_cast<char>(0xff);  // sync's length
  auto decoded = DecodeCheckpoint(Reseal(huge));
  REQUIRE(absl::IsDataLoss(decoded.status()));
  // Every truncation is refused.
  for (size_t n = 0; n < good.size(); n += 7) {
    REQUIRE_FALSE(DecodeCheckpoint(good.substr(0, n)).ok());
  }
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

// Removes `n` payload bytes at `at` from an encoded file, fixing the
// header's payload size; the CRC is left for Reseal.
void ErasePayload(std::string* bytes, size_t at, size_t n) {
  bytes->erase(at, n);
  uint64_t payload_size = 0;
  for (int i = 0; i < 8; ++i) {
    payload_size |= static_cast<uint64_t>(static_cast<unsigned char>((*bytes)[16 + i])) << (8 * i);
  }
  payload_size -= n;
  for (int i = 0; i < 8; ++i)
    (*bytes)[16 + i] = static_cast<char>((payload_size >> (8 * i)) & 0xff);
}

// A format-3 file of `c` (no table kinds: every slot dense, on the
// training clock).
// A format-4 file of `c` (dense slots only), as an older release wrote.
std::string FormatFourFile(const ShardCheckpoint& c) {
  std::string bytes = EncodeCheckpoint(c);
  // Format 5 ends the payload with the base version (8 bytes), before the
  // CRC (and with each sparse slot's rows before that: none here).
  ErasePayload(&bytes, bytes.size() - 4 - 8, 8);
  bytes[8] = 4;
  return Reseal(bytes);
}

std::string FormatThreeFile(const ShardCheckpoint& c) {
  std::string bytes = FormatFourFile(c);
  // Format 4 ends the payload with 8 bytes per slot, before the 4-byte CRC.
  ErasePayload(&bytes, bytes.size() - 4 - 8 * c.slots.size(), 8 * c.slots.size());
  bytes[8] = 3;
  return Reseal(bytes);
}

// A format-2 file of `c` (no sessions), as an older release wrote.
std::string FormatTwoFile(ShardCheckpoint c) {
  c.sessions.clear();
  c.session_epoch_floor = 0;
  std::string bytes = FormatThreeFile(c);
  // Format 3 ends the payload with the sessions: the epoch floor and the
  // entry count (8 bytes each, here no entries), before the 4-byte CRC.
  ErasePayload(&bytes, bytes.size() - 4 - 16, 16);
  bytes[8] = 2;
  return Reseal(bytes);
}

// A format-1 file of `c` (no optimizer kind, no sessions).
std::string FormatOneFile(ShardCheckpoint c) {
  c.optimizer.clear();
  std::string bytes = FormatTwoFile(c);
  // Payload: shard, num_shards, num_workers (4 bytes each), sync (8-byte
  // length + bytes), then format 2's optimizer (8-byte length, here 0).
  const size_t header = 24, optimizer_at = header + 12 + 8 + c.sync.size();
  ErasePayload(&bytes, optimizer_at, 8);
  bytes[8] = 1;
  return Reseal(bytes);
}

TEST_CASE("a checkpoint records each table's kind and clock; format 3 files load as dense",
          "[checkpoint]") {
  ShardCheckpoint c = MakeCheckpoint(0, 1);
  REQUIRE(c.slots.size() >= 2);
  c.slots[0].kind = 1;  // TABLE_AVERAGE
  c.slots[0].own_clock = true;
  c.slots[1].own_clock = true;
  auto decoded = DecodeCheckpoint(EncodeCheckpoint(c));
  INFO(decoded.status().ToString());
  REQUIRE(decoded.ok());
  REQUIRE(decoded->slots[0].kind == 1);
  REQUIRE(decoded->slots[0].own_clock);
  REQUIRE(decoded->slots[1].kind == 0);
  REQUIRE(decoded->slots[1].own_clock);
  for (size_t i = 2; i < decoded->slots.size(); ++i) REQUIRE_FALSE(decoded->slots[i].own_clock);
  RequireSame(c, *decoded);
  auto old = DecodeCheckpoint(FormatThreeFile(c));
  INFO(old.status().ToString());
  REQUIRE(old.ok());
  for (const SlotCheckpoint& slot : old->slots) {
    REQUIRE(slot.kind == 0);
    REQUIRE_FALSE(slot.own_clock);
  }
}

TEST_CASE("a checkpoint records the ranks' sessions; format 2 files load without them",
          "[checkpoint]") {
  auto decoded = DecodeCheckpoint(EncodeCheckpoint(MakeCheckpoint(0, 1)));
  INFO(decoded.status().ToString());
  REQUIRE(decoded.ok());
  REQUIRE(decoded->sessions.size() == 3);
  REQUIRE(decoded->sessions[1].released);
  RequireSame(*decoded, MakeCheckpoint(0, 1));
  auto old = DecodeCheckpoint(FormatTwoFile(MakeCheckpoint(0, 1)));
  INFO(old.status().ToString());
  REQUIRE(old.ok());
  REQUIRE(old->sessions.empty());
  REQUIRE(old->session_epoch_floor == 0);
  ShardCheckpoint expected = MakeCheckpoint(0, 1);
  expected.sessions.clear();
  expected.session_epoch_floor = 0;
  RequireSame(expected, *old);
  // Sessions for another number of workers are neither written nor read.
  ShardCheckpoint wrong = MakeCheckpoint(0, 1);
  wrong.sessions.pop_back();
  REQUIRE(absl::IsInvalidArgument(CheckCheckpointConsistency(wrong)));
  auto refused = DecodeCheckpoint(EncodeCheckpoint(wrong));
  REQUIRE(absl::IsDataLoss(refused.status()));
  REQUIRE(std::string(refused.status().message()).find("2 rank sessions for 3 workers") !=
          std::string::npos);
}

TEST_CASE("a checkpoint records its optimizer kind; format 1 files stay readable",
          "[checkpoint]") {
  auto decoded = DecodeCheckpoint(EncodeCheckpoint(MakeCheckpoint(0, 1)));
  REQUIRE(decoded.ok());
  REQUIRE(decoded->optimizer == "adam");
  auto old = DecodeCheckpoint(FormatOneFile(MakeCheckpoint(0, 1)));
  INFO(old.status().ToString());
  REQUIRE(old.ok());
  REQUIRE(old->optimizer.empty());
  ShardCheckpoint expected = MakeCheckpoint(0, 1);
  expected.optimizer.clear();
  expected.sessions.clear();
  expected.session_epoch_floor = 0;
  RequireSame(expected, *old);
}

std::unique_ptr<ShardStore> StoreWith(const std::string& kind) {
  ShardStoreOptions options;
  options.num_workers = 1;
  options.sync = *SyncPolicy::FromFlags("asp", 1, 1);
  OptimizerOptions optimizer;
  optimizer.kind = kind;
  return std::make_unique<ShardStore>(options, *CreateOptimizer(optimizer));
}

proto::InitRequest OneValue() {
  const float zero = 0.0f;
  proto::InitRequest init;
  init.set_key("w");
  init.add_shape(1);
  init.set_num_elements(1);
  init.set_dtype(proto::DTYPE_FLOAT32);
  init.set_initial_values(std::string(reinterpret_cast<const char*>(&zero), sizeof(zero)));
  init.set_checksum(Crc32c(init.initial_values().data(), sizeof(zero)));
  return init;
}

TEST_CASE("import refuses optimizer state of another kind, naming both", "[checkpoint]") {
  auto adam = StoreWith("adam");
  REQUIRE(adam->Init(OneValue()).ok());
  const ShardCheckpoint checkpoint = adam->Export();
  REQUIRE(checkpoint.optimizer == "adam");
  // Through the file format, as a restart reads it.
  auto decoded = DecodeCheckpoint(EncodeCheckpoint(checkpoint));
  REQUIRE(decoded.ok());
  const absl::Status refused = StoreWith("momentum")->Import(*decoded);
  INFO(refused.ToString());
  REQUIRE(absl::IsFailedPrecondition(refused));
  REQUIRE(refused.message().find("'adam'") != absl::string_view::npos);
  REQUIRE(refused.message().find("'momentum'") != absl::string_view::npos);
  REQUIRE(StoreWith("adam")->Import(*decoded).ok());
  // A format-1 checkpoint does not say its kind: taken as it is.
  auto old = DecodeCheckpoint(FormatOneFile(checkpoint));
  REQUIRE(old.ok());
  REQUIRE(StoreWith("momentum")->Import(*old).ok());
}

}  // namespace
}  // namespace harrier

namespace harrier {
namespace {

// A sparse table's slot: `ids` rows of 2 floats and 1 state float each.
SlotCheckpoint SparseSlot(const std::vector<int64_t>& ids, float base) {
  SlotCheckpoint s;
  s.key = "emb";
  s.chunk = 1;
  s.kind = 2;  // TABLE_SPARSE
  s.own_clock = true;
  s.sparse_config = "settings";
  s.pushed = {4, 5, 6};
  for (int64_t id : ids) {
    s.row_ids.push_back(id);
    s.row_steps.push_back(static_cast<uint64_t>(id) + 1);
    s.values.push_back(base + id);
    s.values.push_back(base - id);
    s.optimizer_first.push_back(base * id);
  }
  return s;
}

std::map<int64_t, float> RowsOf(const SlotCheckpoint& s) {
  std::map<int64_t, float> rows;
  for (size_t i = 0; i < s.row_ids.size(); ++i) rows[s.row_ids[i]] = s.values[2 * i];
  return rows;
}

TEST_CASE("sparse tables: rows round-trip, incremental checkpoints chain", "[checkpoint]") {
  ShardCheckpoint full = MakeCheckpoint(1, 1);
  full.slots.push_back(SparseSlot({1, 2, 3, -7}, 10.0f));
  auto decoded = DecodeCheckpoint(EncodeCheckpoint(full));
  INFO(decoded.status().ToString());
  REQUIRE(decoded.ok());
  const SlotCheckpoint& rows = decoded->slots.back();
  CHECK(rows.row_ids == std::vector<int64_t>{1, 2, 3, -7});
  CHECK(rows.row_steps == std::vector<uint64_t>{2, 3, 4, static_cast<uint64_t>(-6)});
  CHECK(rows.sparse_config == "settings");
  CHECK(rows.values == full.slots.back().values);
  CHECK(decoded->base_version == 0);

  // Version 2 changes row 2 and adds row 9; version 3 evicts row 1.
  ShardCheckpoint delta2 = MakeCheckpoint(1, 2);
  delta2.base_version = 1;
  delta2.slots.push_back(SparseSlot({2, 9}, 20.0f));
  ShardCheckpoint delta3 = MakeCheckpoint(1, 3);
  delta3.base_version = 2;
  SlotCheckpoint evicted = SparseSlot({}, 0.0f);
  evicted.removed_row_ids = {1};
  delta3.slots.push_back(evicted);

  const std::string dir = FreshDir("incremental");
  REQUIRE(WriteCheckpoint(dir, full, 1).ok());
  REQUIRE(WriteCheckpoint(dir, delta2, 1).ok());
  REQUIRE(WriteCheckpoint(dir, delta3, 1).ok());
  // keep = 1, but version 3 needs 2 and 2 needs 1.
  auto versions = ListCheckpointVersions(dir, 1);
  REQUIRE(versions.ok());
  CHECK(*versions == std::vector<uint64_t>{1, 2, 3});
  auto loaded = LoadLatestCheckpoint(dir, 1, nullptr);
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(loaded->version == 3);
  CHECK(loaded->base_version == 0);
  const SlotCheckpoint& merged = loaded->slots.back();
  CHECK(RowsOf(merged) == std::map<int64_t, float>{{2, 22.0f}, {3, 13.0f}, {-7, 3.0f}, {9, 29.0f}});
  CHECK(merged.pushed == std::vector<int64_t>{4, 5, 6});
  // The incremental file is smaller than the complete one.
  CHECK(EncodeCheckpoint(delta3).size() < EncodeCheckpoint(full).size());

  // A complete checkpoint lets the chain go.
  ShardCheckpoint full4 = MakeCheckpoint(1, 4);
  full4.slots.push_back(SparseSlot({5}, 1.0f));
  REQUIRE(WriteCheckpoint(dir, full4, 1).ok());
  versions = ListCheckpointVersions(dir, 1);
  REQUIRE(versions.ok());
  CHECK(*versions == std::vector<uint64_t>{4});

  SECTION("a damaged base: the newest usable chain is restored") {
    ShardCheckpoint delta5 = MakeCheckpoint(1, 5);
    delta5.base_version = 4;
    delta5.slots.push_back(SparseSlot({6}, 1.0f));
    REQUIRE(WriteCheckpoint(dir, delta5, 2).ok());
    std::string bytes = ReadFile(CheckpointPath(dir, 1, 4));
    bytes[bytes.size() / 2] ^= 0x40;
    WriteRaw(CheckpointPath(dir, 1, 4), bytes);
    std::vector<std::string> warnings;
    auto restored = LoadLatestCheckpoint(dir, 1, &warnings);
    CHECK_FALSE(restored.ok());  // 5 needs 4, and 4 is damaged: nothing older is left
    CHECK(warnings.size() == 2);
  }
}

}  // namespace
}  // namespace harrier
