#include "bench/checkpoint_bench.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/flags.h"
#include "server/checkpoint.h"
#include "server/sparse_rows.h"

ABSL_FLAG(int64_t, checkpoint_rows, 1000000, "Rows the sparse table holds.");
ABSL_FLAG(int, checkpoint_dim, 64, "Row dimension.");
ABSL_FLAG(std::string, checkpoint_changed, "0.001,0.01,0.1,1",
          "Fractions of the rows changed between two checkpoints, comma-separated.");
ABSL_FLAG(std::string, checkpoint_optimizer, "adagrad",
          "The table's per-row optimizer (its state is saved with each row).");

namespace harrier::bench {
namespace {

constexpr const char* kUsage =
    "usage: harrier-bench checkpoint [--checkpoint_rows=1000000] [--checkpoint_dim=64]\n"
    "                                [--checkpoint_changed=0.001,0.01,0.1,1]\n"
    "                                [--checkpoint_optimizer=adagrad]\n"
    "Bytes written per checkpoint of one sparse table against the rows changed since\n"
    "the previous checkpoint: a complete checkpoint against an incremental one\n"
    "(server --checkpoint_full_every), and the seconds to encode and write each\n"
    "(fsync included) to a temporary folder. One JSON line per fraction changed.\n";

uint64_t Next(uint64_t* state) {
  *state += 0x9e3779b97f4a7c15ull;
  uint64_t x = *state;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The table's slot in a checkpoint, as SparseTable exports it.
ShardCheckpoint AsCheckpoint(const SparseRows::Dump& dump, uint64_t version, uint64_t base) {
  ShardCheckpoint c;
  c.shard = 0;
  c.num_shards = 1;
  c.num_workers = 1;
  c.sync = "asp";
  c.optimizer = "sgd";
  c.version = version;
  c.base_version = base;
  SlotCheckpoint slot;
  slot.key = "emb";
  slot.kind = 2;  // TABLE_SPARSE
  slot.own_clock = true;
  slot.pushed = {0};
  slot.values = dump.values;
  slot.optimizer_first = dump.state;
  slot.row_ids = dump.ids;
  slot.row_steps.assign(dump.steps.begin(), dump.steps.end());
  slot.removed_row_ids = dump.removed;
  c.slots.push_back(std::move(slot));
  return c;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int RunCheckpointBench(int argc, char** argv) {
  if (std::optional<int> exit_code = ParseBenchFlags(
          argc, argv, kUsage,
          {"checkpoint_rows", "checkpoint_dim", "checkpoint_changed", "checkpoint_optimizer"})) {
    return *exit_code;
  }
  const int64_t rows = absl::GetFlag(FLAGS_checkpoint_rows);
  const int dim = absl::GetFlag(FLAGS_checkpoint_dim);
  std::vector<double> fractions;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_checkpoint_changed), ',')) {
    double fraction;
    if (!absl::SimpleAtod(part, &fraction) || fraction < 0 || fraction > 1) {
      std::fprintf(stderr, "checkpoint: --checkpoint_changed: '%s' is not a fraction\n",
                   std::string(part).c_str());
      return 2;
    }
    fractions.push_back(fraction);
  }
  if (rows < 1 || dim < 1) {
    std::fprintf(stderr, "checkpoint: --checkpoint_rows and --checkpoint_dim must be >= 1\n");
    return 2;
  }
  proto::SparseTableConfig proto_config;
  proto_config.set_dim(static_cast<uint32_t>(dim));
  proto_config.set_optimizer(absl::GetFlag(FLAGS_checkpoint_optimizer));
  proto_config.set_lr(0.01f);
  proto_config.set_epsilon(1e-8f);
  proto_config.set_beta1(0.9f);
  proto_config.set_beta2(0.999f);
  proto_config.set_init_scale(0.01f);
  auto config = SparseRowsConfig::FromProto(proto_config);
  if (!config.ok()) {
    std::fprintf(stderr, "checkpoint: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("harrier-checkpoint-bench-", getpid()))
          .string();
  std::vector<float> gradient(static_cast<size_t>(dim), 0.5f);
  uint64_t seed = 1;
  uint64_t version = 1;
  for (double fraction : fractions) {
    SparseRows table("emb", *config);
    table.TrackChanges(true);
    for (int64_t i = 0; i < rows; ++i) {
      table.Apply(static_cast<int64_t>(Next(&seed)), gradient.data(), 1.0f, 0);
    }
    auto start = std::chrono::steady_clock::now();
    ShardCheckpoint full = AsCheckpoint(table.Export(false), version++, 0);
    table.MarkClean();
    const std::string full_bytes = EncodeCheckpoint(full);
    const double full_encode_s = Seconds(start);
    start = std::chrono::steady_clock::now();
    if (auto status = WriteCheckpoint(dir, full, 2); !status.ok()) {
      std::fprintf(stderr, "checkpoint: %s\n", std::string(status.message()).c_str());
      return 1;
    }
    const double full_write_s = Seconds(start);
    // Change a fraction of the held rows (drawn again from the ids held).
    const SparseRows::Dump held = table.Export(false);
    const int64_t changed = static_cast<int64_t>(fraction * static_cast<double>(rows));
    for (int64_t i = 0; i < changed; ++i) {
      const int64_t id = held.ids[Next(&seed) % held.ids.size()];
      table.Apply(id, gradient.data(), 1.0f, 1);
    }
    start = std::chrono::steady_clock::now();
    ShardCheckpoint delta = AsCheckpoint(table.Export(true), version++, full.version);
    const std::string delta_bytes = EncodeCheckpoint(delta);
    const double delta_encode_s = Seconds(start);
    start = std::chrono::steady_clock::now();
    if (auto status = WriteCheckpoint(dir, delta, 2); !status.ok()) {
      std::fprintf(stderr, "checkpoint: %s\n", std::string(status.message()).c_str());
      return 1;
    }
    const double delta_write_s = Seconds(start);
    std::printf(
        "{\"bench\":\"checkpoint\",\"rows\":%lld,\"dim\":%d,\"optimizer\":\"%s\","
        "\"changed_fraction\":%g,\"rows_changed_distinct\":%zu,\"complete_bytes\":%zu,"
        "\"incremental_bytes\":%zu,\"incremental_over_complete\":%.4f,"
        "\"bytes_per_changed_row\":%.1f,\"complete_encode_s\":%.3f,\"complete_write_s\":%.3f,"
        "\"incremental_encode_s\":%.3f,\"incremental_write_s\":%.3f}\n",
        static_cast<long long>(rows), dim, absl::GetFlag(FLAGS_checkpoint_optimizer).c_str(),
        fraction, delta.slots[0].row_ids.size(), full_bytes.size(), delta_bytes.size(),
        static_cast<double>(delta_bytes.size()) / static_cast<double>(full_bytes.size()),
        delta.slots[0].row_ids.empty()
            ? 0.0
            : static_cast<double>(delta_bytes.size()) / delta.slots[0].row_ids.size(),
        full_encode_s, full_write_s, delta_encode_s, delta_write_s);
    std::fflush(stdout);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace harrier::bench
