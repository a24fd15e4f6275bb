#include "bench/convergence_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/flags.h"
#include "bench/netem/emulated_network.h"
#include "bench/server_cluster.h"
#include "bench/shared_flags.h"
#include "bench/training_run.h"
#include "common/codec/pull_pairing.h"
#include "common/codec/survey_codecs.h"
#include "common/json.h"

ABSL_FLAG(std::string, syncs, "bsp,ssp2,asp,local4",
          "convergence: sync settings (ssp2 = ssp, staleness 2; local4 = local SGD, 4 steps)");
ABSL_FLAG(std::string, pulls, "off,on",
          "convergence: off: dense pulls; on: the grid's pull codec for the codec; paired: "
          "the pull codec paired with the push codec (common/codec/pull_pairing.h)");
ABSL_FLAG(std::string, links, "1,10", "convergence: Gbit/s of every host's link (0: unshaped)");
ABSL_FLAG(int, epochs, 3, "convergence: passes over each worker's quarter of the data");
ABSL_FLAG(int64_t, max_steps, 0, "convergence: 0: no cap; else at most this many steps per worker");
ABSL_FLAG(std::string, targets, "mlp:0.85,cnn:0.88",
          "convergence: MODEL:ACCURACY whose first evaluation at or above it gives "
          "time_to_target_s");
ABSL_FLAG(std::string, out_dir, "", "convergence: where the files go (required)");
ABSL_FLAG(bool, resume, true,
          "convergence: skip runs with an ok line in runs.jsonl (false: run the whole grid)");
ABSL_FLAG(bool, dry_run, false,
          "convergence: print the run ids it would run; start nothing, write nothing");

namespace harrier::bench {
namespace {

constexpr const char* kUsage =
    "usage: harrier-bench convergence --out_dir=DIR [flags]\n"
    "The survey's grid: for every model x sync x codec x pulls x link, a fresh job of\n"
    "--shards harrier-server shards and --workers harrier-worker processes, each in a\n"
    "network namespace of its own behind its own tc-tbf link (//bench/netem,\n"
    "per-host model), trains for --epochs (or --max_steps) with rank 0 evaluating the\n"
    "test set every --eval_every steps. As each run ends it appends to DIR/runs.jsonl,\n"
    "DIR/runs.csv and DIR/curves.csv (README.md, \"convergence\") and prints the JSON\n"
    "line on stdout; progress goes to stderr. A run already \"ok\" in runs.jsonl is\n"
    "skipped, so a killed grid resumes where it stopped. Needs root (ip netns, tc).\n"
    "  --models=mlp,cnn         harrier-worker --workload of each run\n"
    "  --syncs=bsp,ssp2,asp,local4\n"
    "                           bsp; ssp2 = ssp, staleness 2; asp; local4 = local SGD,\n"
    "                           4 local steps between pushes\n"
    "  --codecs=none,fp16,topk,randomk,dgc,qsgd4,qsgd8,terngrad,signsgd,efsign,signum,\n"
    "           onebit,powersgd2\n"
    "                           push codecs, each with its server settings and its\n"
    "                           compressed-pull codec (README.md has the table)\n"
    "  --pulls=off,on           off: dense pulls; on: the codec's pull codec in the\n"
    "                           grid's table; paired: the pull codec paired with the\n"
    "                           push codec (--pull_codec=paired)\n"
    "  --links=1,10             Gbit/s of every host's link (0: unshaped)\n"
    "  --workers=4 --shards=2   processes, one namespace each\n"
    "  --epochs=3               passes over each worker's quarter of the data\n"
    "  --max_steps=0            0: no cap; else at most this many steps per worker\n"
    "  --eval_every=20          steps between rank 0's evaluations\n"
    "  --targets=mlp:0.85,cnn:0.88\n"
    "                           test accuracy whose first evaluation at or above it\n"
    "                           gives time_to_target_s (runs do not stop there)\n"
    "  --train_examples=0       train on the first N examples only (0: all 60000)\n"
    "  --out_dir=DIR            where the files go (required; created if missing)\n"
    "  --resume=true            skip runs with an ok line in DIR/runs.jsonl (false:\n"
    "                           empty the three files and run the whole grid)\n"
    "  --run_timeout_s=900      deadline of one run (a run past it is failed)\n"
    "  --dry_run                print the run ids it would run on stdout (and those\n"
    "                           it would skip on stderr); start nothing, write nothing\n"
    "  --server_flags='F ...'   extra flags for every shard, after the codec's (a later\n"
    "                           flag wins): for tuning, e.g. '--lr=0.1'\n"
    "  --worker_flags='F ...'   extra flags for every harrier-worker, likewise\n"
    "  --server_binary=PATH     harrier-server (default: from runfiles)\n"
    "  --worker_binary=PATH     harrier-worker (default: from runfiles)\n"
    "  --help\n";

constexpr int kBatchSize = 64;

// A --syncs entry: the shards' consistency flags.
struct SyncSetting {
  std::string name;
  std::vector<std::string> server_flags;
};

// The consistency models the grid (and the advisor reading it) knows.
const std::vector<SyncSetting>& SyncSettings() {
  static const auto* settings = [] {
    auto* table = new std::vector<SyncSetting>;
    for (const char* name : {"bsp", "ssp2", "asp", "local4"}) {
      table->push_back({name, *SyncServerFlags(name)});
    }
    return table;
  }();
  return *settings;
}

// A --codecs entry is a row of the survey table (common/codec/
// survey_codecs.h): what the advisor times and recommends is what this
// grid trains.

template <typename T>
const T* FindByName(const std::vector<T>& table, absl::string_view name) {
  for (const T& entry : table) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

template <typename T>
std::string Names(const std::vector<T>& table) {
  std::vector<std::string> names;
  for (const T& entry : table) names.push_back(entry.name);
  return absl::StrJoin(names, ", ");
}

struct Options {
  std::vector<std::string> models = {"mlp", "cnn"};
  std::vector<const SyncSetting*> syncs;
  std::vector<const SurveyCodec*> codecs;
  std::vector<std::string> pulls = {"off", "on"};
  std::vector<double> links = {1, 10};
  int epochs = 3;
  int64_t max_steps = 0;
  std::map<std::string, double> targets = {{"mlp", 0.85}, {"cnn", 0.88}};
  std::string out_dir;
  bool resume = true;
  bool dry_run = false;
  std::vector<std::string> server_flags;
  std::vector<std::string> worker_flags;
  JobFlags job;
};

std::vector<std::string> SplitList(absl::string_view value) {
  return absl::StrSplit(value, ',', absl::SkipWhitespace());
}

// Returns a message for a usage error, "" on success.
std::string ParseArgs(Options* options) {
  options->models = SplitList(FlagOr(FLAGS_models, "mlp,cnn"));
  for (const std::string& model : options->models) {
    if (model != "mlp" && model != "cnn") {
      return absl::StrCat("--models: unknown model '", model, "' (mlp, cnn)");
    }
  }
  if (options->models.empty()) return "--models: empty list";
  for (const std::string& sync : SplitList(absl::GetFlag(FLAGS_syncs))) {
    const SyncSetting* setting = FindByName(SyncSettings(), sync);
    if (setting == nullptr) {
      return absl::StrCat("--syncs: unknown sync '", sync, "' (", Names(SyncSettings()), ")");
    }
    options->syncs.push_back(setting);
  }
  if (options->syncs.empty()) return "--syncs: empty list";
  const std::string codecs = absl::GetFlag(FLAGS_codecs);
  if (codecs.empty()) {
    for (const SurveyCodec& codec : SurveyCodecs()) options->codecs.push_back(&codec);
  }
  for (const std::string& codec : SplitList(codecs)) {
    const SurveyCodec* setting = FindSurveyCodec(codec);
    if (setting == nullptr) {
      return absl::StrCat("--codecs: unknown codec '", codec, "' (", Names(SurveyCodecs()), ")");
    }
    options->codecs.push_back(setting);
  }
  if (options->codecs.empty()) return "--codecs: empty list";
  options->pulls.clear();
  for (const std::string& pull : SplitList(absl::GetFlag(FLAGS_pulls))) {
    if (pull != "off" && pull != "on" && pull != "paired") {
      return absl::StrCat("--pulls: '", pull, "' is not off, on or paired");
    }
    options->pulls.push_back(pull);
  }
  if (options->pulls.empty()) return "--pulls: empty list";
  options->links.clear();
  for (const std::string& link : SplitList(absl::GetFlag(FLAGS_links))) {
    double gbps = 0;
    if (!absl::SimpleAtod(link, &gbps) || !(gbps >= 0) || !std::isfinite(gbps)) {
      return absl::StrCat("--links: bad rate '", link, "' (Gbit/s >= 0; 0: unshaped)");
    }
    options->links.push_back(gbps);
  }
  if (options->links.empty()) return "--links: empty list";
  options->targets.clear();
  for (const std::string& entry : SplitList(absl::GetFlag(FLAGS_targets))) {
    const std::vector<std::string> parts = absl::StrSplit(entry, ':');
    double target = 0;
    if (parts.size() != 2 || !absl::SimpleAtod(parts[1], &target) ||
        !(target > 0 && target <= 1)) {
      return absl::StrCat("--targets: bad entry '", entry,
                          "' (MODEL:ACCURACY, accuracy in (0, 1])");
    }
    options->targets[parts[0]] = target;
  }
  if (const std::string error = ReadJobFlags(&options->job); !error.empty()) return error;
  options->epochs = absl::GetFlag(FLAGS_epochs);
  if (options->epochs < 1) return "bad --epochs (a positive integer)";
  options->max_steps = absl::GetFlag(FLAGS_max_steps);
  if (options->max_steps < 0) {
    return absl::StrCat("bad --max_steps='", options->max_steps, "' (0: no cap, else a positive cap)");
  }
  options->resume = absl::GetFlag(FLAGS_resume);
  options->dry_run = absl::GetFlag(FLAGS_dry_run);
  options->out_dir = absl::GetFlag(FLAGS_out_dir);
  for (auto [name, flag, out] :
       {std::make_tuple("server_flags", &FLAGS_server_flags, &options->server_flags),
        std::make_tuple("worker_flags", &FLAGS_worker_flags, &options->worker_flags)}) {
    std::vector<std::string> flags =
        absl::StrSplit(absl::GetFlag(*flag), ' ', absl::SkipWhitespace());
    for (const std::string& extra : flags) {
      if (!absl::StartsWith(extra, "--")) {
        return absl::StrCat("--", name, ": '", extra, "' is not a --flag");
      }
    }
    *out = std::move(flags);
  }
  if (options->out_dir.empty()) return "--out_dir=DIR is required";
  for (const std::string& model : options->models) {
    if (options->targets.count(model) == 0) {
      return absl::StrCat("--targets: no target for model '", model, "'");
    }
  }
  return "";
}

// ---- The files ----

// One field of a run's record: its text as JSON writes it (strings
// unescaped here, quoted on output).
struct Field {
  std::string key;
  std::string text;
  bool is_string = false;
};
using Record = std::vector<Field>;

const std::vector<std::string>& RunKeys() {
  static const auto* keys = new std::vector<std::string>{"bench",
                                                         "run_id",
                                                         "model",
                                                         "sync",
                                                         "codec",
                                                         "codec_spec",
                                                         "pull_codec",
                                                         "link_gbps",
                                                         "link_measured_gbps",
                                                         "workers",
                                                         "shards",
                                                         "batch_size",
                                                         "target_accuracy",
                                                         "time_to_target_s",
                                                         "steps_to_target",
                                                         "final_accuracy",
                                                         "best_accuracy",
                                                         "final_loss",
                                                         "steps",
                                                         "wall_s",
                                                         "step_s",
                                                         "bytes_up_per_step",
                                                         "bytes_down_per_step",
                                                         "worker_cpu_ms_per_step",
                                                         "shard_cpu_ms_per_step",
                                                         "status",
                                                         "error"};
  return *keys;
}

constexpr const char* kCurvesHeader =
    "run_id,model,sync,codec,pulls,link_gbps,step,wall_s,loss,accuracy,bytes_up,bytes_down";

std::string ToJson(const Record& record) {
  Json json = Json::object();
  for (const Field& field : record) {
    int64_t integer = 0;
    double number = 0;
    if (field.is_string) {
      json[field.key] = field.text;
    } else if (absl::SimpleAtoi(field.text, &integer)) {
      json[field.key] = integer;
    } else if (absl::SimpleAtod(field.text, &number)) {
      json[field.key] = number;
    } else {
      json[field.key] = nullptr;  // not a number: never written by MakeRecord
    }
  }
  return DumpJson(json);
}

std::string CsvField(absl::string_view text) {
  if (text.find_first_of(",\"\n\r") == absl::string_view::npos) return std::string(text);
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

std::string ToCsv(const Record& record) {
  std::vector<std::string> parts;
  for (const Field& field : record) parts.push_back(CsvField(field.text));
  return absl::StrJoin(parts, ",");
}

// A flat JSON object as ToJson writes it, keys in order; nullopt when the
// line is not one (e.g. cut short by a kill).
std::optional<Record> ParseFlatJson(absl::string_view line) {
  const Json json = ParseJson(line);
  if (!json.is_object()) return std::nullopt;
  Record record;
  for (const auto& [key, value] : json.items()) {
    if (value.is_string()) {
      record.push_back({key, value.get<std::string>(), true});
    } else if (value.is_number()) {
      record.push_back({key, DumpJson(value), false});
    } else {
      return std::nullopt;
    }
  }
  return record;
}

const std::string* FieldText(const Record& record, absl::string_view key) {
  for (const Field& field : record) {
    if (field.key == key) return &field.text;
  }
  return nullptr;
}

bool HasRunKeys(const Record& record) {
  if (record.size() != RunKeys().size()) return false;
  for (size_t i = 0; i < record.size(); ++i) {
    if (record[i].key != RunKeys()[i]) return false;
  }
  return true;
}

std::vector<std::string> FileLines(const std::string& path) {
  std::vector<std::string> lines;
  const std::string text = ReadFile(path);
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) break;  // a line cut short by a kill is dropped
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// Writes `lines` to path through a temporary file and a rename, so a kill
// leaves either the old file or the new one.
absl::Status RewriteFile(const std::string& path, const std::vector<std::string>& lines) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const std::string& line : lines) out << line << '\n';
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status AppendLines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::app);
  for (const std::string& line : lines) out << line << '\n';
  out.flush();
  if (!out) return absl::InternalError(absl::StrCat("cannot append to ", path));
  return absl::OkStatus();
}

// The first CSV field of a curves row (run ids have no comma or quote).
std::string FirstCsvField(const std::string& line) { return line.substr(0, line.find(',')); }

// Brings the three files to a consistent state: runs.jsonl keeps the first
// ok line of each run id (failed lines, lines cut short and duplicates
// go), runs.csv is written again from it, curves.csv keeps only rows of
// those run ids. With resume false all three start empty. Returns the ok
// run ids.
absl::StatusOr<std::set<std::string>> PrepareFiles(const std::string& dir, bool resume,
                                                   int* dropped) {
  std::set<std::string> ok;
  std::vector<std::string> jsonl;
  std::vector<std::string> csv = {absl::StrJoin(RunKeys(), ",")};
  std::vector<std::string> curves = {kCurvesHeader};
  *dropped = 0;
  if (resume) {
    for (const std::string& line : FileLines(dir + "/runs.jsonl")) {
      const std::optional<Record> record = ParseFlatJson(line);
      const std::string* run_id = record ? FieldText(*record, "run_id") : nullptr;
      const std::string* status = record ? FieldText(*record, "status") : nullptr;
      if (record && HasRunKeys(*record) && run_id && status && *status == "ok" &&
          ok.insert(*run_id).second) {
        jsonl.push_back(line);
        csv.push_back(ToCsv(*record));
      } else {
        ++*dropped;
      }
    }
    for (const std::string& line : FileLines(dir + "/curves.csv")) {
      if (line == kCurvesHeader) continue;
      if (ok.count(FirstCsvField(line)) > 0) curves.push_back(line);
    }
  }
  for (const auto& [name, lines] :
       {std::pair<const char*, const std::vector<std::string>*>{"runs.jsonl", &jsonl},
        {"runs.csv", &csv},
        {"curves.csv", &curves}}) {
    if (auto status = RewriteFile(absl::StrCat(dir, "/", name), *lines); !status.ok()) {
      return status;
    }
  }
  return ok;
}

// ---- One run ----

std::string LinkText(double gbps) { return absl::StrFormat("%g", gbps); }

struct RunSpec {
  std::string model;
  const SyncSetting* sync;
  const SurveyCodec* codec;
  std::string pulls;  // off, on or paired
  double link_gbps;

  std::string run_id() const {
    return absl::StrCat(model, "-", sync->name, "-", codec->name, "-pull", pulls, "-",
                        LinkText(link_gbps), "g");
  }
  std::string pull_codec() const {
    if (pulls == "on") return codec->pull_spec;
    if (pulls == "paired") {
      auto pair = ResolvePullCodec(codec->push_spec, kPairedPullCodec);
      return pair.ok() ? *pair : "none";  // the grid's push specs all parse
    }
    return "none";
  }
};

// Numbers as the files carry them: unknown (or not finite) is -1; else
// rounded to `decimals` and written as JSON writes that number, so that
// runs.csv rows rebuilt from runs.jsonl on a resume are the rows written.
std::string Number(double value, int decimals) {
  if (!std::isfinite(value) || value == -1) return "-1";
  if (decimals == 0) return absl::StrCat(std::llround(value));
  return DumpJson(RoundTo(value, decimals));
}

struct Measured {
  std::vector<EvalPoint> evals;
  std::vector<TrafficPoint> traffic;
  double wall_s = -1;
  std::vector<double> worker_cpu_s;  // per rank, -1 unknown
  std::vector<double> shard_cpu_s;   // per shard, -1 unknown
};

// CPU milliseconds a step: the mean over the workers other than rank 0
// (which also evaluates the test set; rank 0 when it is alone), and the sum
// over the shards. -1 when a figure is unknown.
std::pair<double, double> CpuMsPerStep(const Measured& measured, double steps) {
  if (!(steps > 0)) return {-1, -1};
  double workers = 0;
  int counted = 0;
  for (size_t rank = measured.worker_cpu_s.size() > 1 ? 1 : 0;
       rank < measured.worker_cpu_s.size(); ++rank) {
    if (measured.worker_cpu_s[rank] < 0) return {-1, -1};
    workers += measured.worker_cpu_s[rank];
    ++counted;
  }
  double shards = 0;
  for (const double cpu : measured.shard_cpu_s) {
    if (cpu < 0) return {-1, -1};
    shards += cpu;
  }
  return {counted > 0 ? workers / counted / steps * 1e3 : -1,
          measured.shard_cpu_s.empty() ? -1 : shards / steps * 1e3};
}

Record MakeRecord(const Options& options, const RunSpec& run, double measured_gbps,
                  const Measured& measured, const std::string& error) {
  const double target = options.targets.at(run.model);
  double time_to_target = -1, steps_to_target = -1;
  double final_accuracy = -1, best_accuracy = -1, final_loss = -1, steps = -1, step_s = -1;
  for (const EvalPoint& point : measured.evals) {
    if (point.accuracy >= target) {
      time_to_target = point.wall_s;
      steps_to_target = static_cast<double>(point.step);
      break;
    }
  }
  for (const EvalPoint& point : measured.evals) {
    best_accuracy = std::max(best_accuracy, point.accuracy);
  }
  if (!measured.evals.empty()) {
    const EvalPoint& last = measured.evals.back();
    final_accuracy = last.accuracy;
    final_loss = last.loss;
    steps = static_cast<double>(last.step);
    if (last.step > 0) step_s = last.wall_s / static_cast<double>(last.step);
  }
  double up = -1, down = -1;
  if (!measured.traffic.empty() && measured.traffic.back().step > 0) {
    up = measured.traffic.back().bytes_pushed / static_cast<double>(measured.traffic.back().step);
    down = measured.traffic.back().bytes_pulled / static_cast<double>(measured.traffic.back().step);
  }
  const auto [worker_cpu_ms, shard_cpu_ms] = CpuMsPerStep(measured, steps);
  auto str = [](const char* key, std::string text) { return Field{key, std::move(text), true}; };
  auto num = [](const char* key, std::string text) { return Field{key, std::move(text), false}; };
  return Record{
      str("bench", "convergence"),
      str("run_id", run.run_id()),
      str("model", run.model),
      str("sync", run.sync->name),
      str("codec", run.codec->name),
      str("codec_spec", run.codec->push_spec),
      str("pull_codec", run.pull_codec()),
      num("link_gbps", LinkText(run.link_gbps)),
      num("link_measured_gbps", Number(measured_gbps, 4)),
      num("workers", absl::StrCat(options.job.workers)),
      num("shards", absl::StrCat(options.job.shards)),
      num("batch_size", absl::StrCat(kBatchSize)),
      num("target_accuracy", Number(target, 4)),
      num("time_to_target_s", Number(time_to_target, 3)),
      num("steps_to_target", Number(steps_to_target, 0)),
      num("final_accuracy", Number(final_accuracy, 4)),
      num("best_accuracy", Number(best_accuracy, 4)),
      num("final_loss", Number(final_loss, 4)),
      num("steps", Number(steps, 0)),
      num("wall_s", Number(measured.wall_s, 3)),
      num("step_s", Number(step_s, 6)),
      num("bytes_up_per_step", Number(up, 0)),
      num("bytes_down_per_step", Number(down, 0)),
      num("worker_cpu_ms_per_step", Number(worker_cpu_ms, 3)),
      num("shard_cpu_ms_per_step", Number(shard_cpu_ms, 3)),
      str("status", error.empty() ? "ok" : "failed"),
      str("error", error),
  };
}

// One curves.csv row per eval point, with rank 0's cumulative bytes at the
// latest metrics line at or before its step.
std::vector<std::string> CurveRows(const RunSpec& run, const Measured& measured) {
  std::vector<std::string> rows;
  size_t t = 0;
  const TrafficPoint* latest = nullptr;
  for (const EvalPoint& point : measured.evals) {
    while (t < measured.traffic.size() && measured.traffic[t].step <= point.step) {
      latest = &measured.traffic[t++];
    }
    rows.push_back(absl::StrCat(
        run.run_id(), ",", run.model, ",", run.sync->name, ",", run.codec->name, ",",
        run.pulls, ",", LinkText(run.link_gbps), ",", point.step, ",",
        Number(point.wall_s, 3), ",", Number(point.loss, 4), ",", Number(point.accuracy, 4), ",",
        latest != nullptr ? Number(latest->bytes_pushed, 0) : "-1", ",",
        latest != nullptr ? Number(latest->bytes_pulled, 0) : "-1"));
  }
  return rows;
}

// One line: what a failure says in the files.
std::string OneLine(absl::string_view text) {
  std::string line = absl::StrReplaceAll(absl::StripAsciiWhitespace(text), {{"\n", " | "}});
  if (line.size() > 600) line = line.substr(0, 600) + "...";
  return line;
}

// Removes a run's log folder. A process of the run that is still exiting
// (a shell in the emulated network flushing its redirect) may write into
// it while it goes: tried again for up to 5 s until it is gone.
void RemoveLogs(const std::string& logs) {
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  std::error_code error_code;
  while (true) {
    std::filesystem::remove_all(logs, error_code);
    if (!std::filesystem::exists(logs, error_code) || absl::Now() > give_up) return;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<Measured> RunOne(const Options& options, const TrainingRunner& runner,
                                const RunSpec& run, const std::string& tag) {
  TrainingJob job;
  job.shards = options.job.shards;
  job.workers = options.job.workers;
  job.server_flags = run.sync->server_flags;
  job.server_flags.insert(job.server_flags.end(), run.codec->server_flags.begin(),
                          run.codec->server_flags.end());
  job.server_flags.insert(job.server_flags.end(), options.server_flags.begin(),
                          options.server_flags.end());
  job.worker_flags = {absl::StrCat("--workload=", run.model),
                      absl::StrCat("--epochs=", options.epochs),
                      absl::StrCat("--batch_size=", kBatchSize),
                      absl::StrCat("--codec=", run.codec->push_spec),
                      absl::StrCat("--pull_codec=", run.pull_codec()),
                      absl::StrCat("--eval_every=", options.job.eval_every),
                      absl::StrCat("--target_accuracy=", options.targets.at(run.model)),
                      "--log_every=100",
                      "--rpc_timeout_s=120"};
  if (options.max_steps > 0) {
    job.worker_flags.push_back(absl::StrCat("--max_steps=", options.max_steps));
  }
  if (options.job.train_examples > 0) {
    job.worker_flags.push_back(absl::StrCat("--train_examples=", options.job.train_examples));
  }
  job.worker_flags.insert(job.worker_flags.end(), run.codec->worker_flags.begin(),
                          run.codec->worker_flags.end());
  job.worker_flags.insert(job.worker_flags.end(), options.worker_flags.begin(),
                          options.worker_flags.end());
  job.stop_at_target = false;
  job.timeout_s = options.job.run_timeout_s;
  auto outcome = runner.Run(job, tag);
  if (!outcome.ok()) return outcome.status();
  Measured measured;
  measured.evals = std::move(outcome->evals);
  measured.traffic = ReadTraffic(outcome->metrics_path);
  measured.wall_s = outcome->wall_s;
  measured.worker_cpu_s = outcome->worker_cpu_s;
  measured.shard_cpu_s = outcome->shard_cpu_s;
  if (measured.evals.empty()) {
    return absl::InternalError(
        absl::StrCat("rank 0 printed no eval line: ", Tail(outcome->rank0_stdout, 300)));
  }
  return measured;
}

}  // namespace

int RunConvergenceBench(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_code = ParseSubcommandFlags(
          argc, argv, kUsage,
          {"models", "syncs", "codecs", "pulls", "links", "workers", "shards", "epochs",
           "max_steps", "eval_every", "targets", "train_examples", "out_dir", "resume",
           "run_timeout_s", "dry_run", "server_flags", "worker_flags", "server_binary",
           "worker_binary"},
          ParseArgs, &options)) {
    return *exit_code;
  }

  // The grid, link outermost: one emulated network per link.
  std::vector<RunSpec> grid;
  for (const double link : options.links) {
    for (const std::string& model : options.models) {
      for (const SyncSetting* sync : options.syncs) {
        for (const SurveyCodec* codec : options.codecs) {
          for (const std::string& pulls : options.pulls) {
            grid.push_back({model, sync, codec, pulls, link});
          }
        }
      }
    }
  }
  std::set<std::string> seen;
  for (const RunSpec& run : grid) {
    if (!seen.insert(run.run_id()).second) {
      std::fprintf(stderr, "harrier-bench convergence: run %s is in the grid twice\n",
                   run.run_id().c_str());
      return 2;
    }
  }

  const std::string& dir = options.out_dir;
  std::set<std::string> done;
  if (options.dry_run) {
    // What PrepareFiles would keep, without writing anything.
    if (options.resume) {
      for (const std::string& line : FileLines(dir + "/runs.jsonl")) {
        const std::optional<Record> record = ParseFlatJson(line);
        const std::string* status = record ? FieldText(*record, "status") : nullptr;
        if (record && HasRunKeys(*record) && status && *status == "ok") {
          done.insert(*FieldText(*record, "run_id"));
        }
      }
    }
    int to_run = 0;
    for (const RunSpec& run : grid) {
      if (done.count(run.run_id()) > 0) {
        std::fprintf(stderr, "convergence: would skip %s (ok in runs.jsonl)\n",
                     run.run_id().c_str());
      } else {
        std::printf("%s\n", run.run_id().c_str());
        ++to_run;
      }
    }
    std::fprintf(stderr, "convergence: dry run, %d of %zu runs to do\n", to_run, grid.size());
    return 0;
  }

  std::error_code error_code;
  std::filesystem::create_directories(dir, error_code);
  if (error_code) {
    std::fprintf(stderr, "harrier-bench convergence: cannot create --out_dir=%s: %s\n", dir.c_str(),
                 error_code.message().c_str());
    return 1;
  }
  int dropped = 0;
  auto prepared = PrepareFiles(dir, options.resume, &dropped);
  if (!prepared.ok()) {
    std::fprintf(stderr, "harrier-bench convergence: %s\n",
                 std::string(prepared.status().message()).c_str());
    return 1;
  }
  done = std::move(*prepared);
  // A start killed after a run's ok line and before it removed the run's
  // logs leaves them behind: they go now, as they would have then.
  size_t already = 0;
  for (const RunSpec& run : grid) {
    if (done.count(run.run_id()) == 0) continue;
    ++already;
    RemoveLogs(absl::StrCat(dir, "/logs/", run.run_id()));
  }
  std::fprintf(stderr,
               "convergence: %zu runs in the grid, %zu already ok in %s/runs.jsonl (%d failed or "
               "incomplete lines dropped)\n",
               grid.size(), already, dir.c_str(), dropped);

  auto server_binary = PrepareServerBench("convergence", options.job.server_binary);
  if (!server_binary.ok()) return 1;
  auto worker_binary = FindWorkerBinary(options.job.worker_binary);
  if (!worker_binary.ok()) {
    std::fprintf(stderr, "harrier-bench convergence: %s\n",
                 std::string(worker_binary.status().message()).c_str());
    return 1;
  }

  int failures = 0;
  int index = 0;
  for (const double link : options.links) {
    std::vector<const RunSpec*> todo;
    for (const RunSpec& run : grid) {
      if (run.link_gbps != link) continue;
      ++index;
      if (done.count(run.run_id()) > 0) {
        std::fprintf(stderr, "convergence: [%d/%zu] %s: ok in runs.jsonl, skipped\n", index,
                     grid.size(), run.run_id().c_str());
        continue;
      }
      todo.push_back(&run);
    }
    if (todo.empty()) continue;

    EmulatedNetworkOptions network_options;
    network_options.prefix = "hconv";
    network_options.num_hosts = options.job.shards + options.job.workers;
    network_options.rate_gbps = link;
    network_options.model = LinkModel::kPerHost;
    auto network = EmulatedNetwork::Create(network_options);
    if (!network.ok()) {
      std::fprintf(stderr, "harrier-bench convergence: cannot build the emulated network: %s\n",
                   std::string(network.status().message()).c_str());
      return 1;
    }
    auto measured_gbps = MeasureWorkerLinkGbps(**network, options.job.shards, link);
    if (!measured_gbps.ok()) {
      std::fprintf(stderr, "harrier-bench convergence: measuring the %s Gbit/s link failed: %s\n",
                   LinkText(link).c_str(), std::string(measured_gbps.status().message()).c_str());
      return 1;
    }
    std::fprintf(stderr,
                 "convergence: %d hosts, links of %s Gbit/s, one TCP stream measured %.3f "
                 "Gbit/s\n",
                 network_options.num_hosts, LinkText(link).c_str(), *measured_gbps);
    TrainingRunner runner(**network, *server_binary, *worker_binary);

    for (const RunSpec* run : todo) {
      const std::string run_id = run->run_id();
      const std::string logs = absl::StrCat(dir, "/logs/", run_id);
      std::filesystem::remove_all(logs, error_code);
      std::filesystem::create_directories(logs, error_code);
      std::fprintf(stderr, "convergence: %s: push %s, pull %s, logs in %s\n", run_id.c_str(),
                   run->codec->push_spec.c_str(), run->pull_codec().c_str(), logs.c_str());
      auto measured = RunOne(options, runner, *run, logs + "/run");
      std::string error;
      if (!measured.ok()) {
        error = OneLine(measured.status().message());
        ++failures;
      }
      const Record record =
          MakeRecord(options, *run, *measured_gbps, measured.ok() ? *measured : Measured{}, error);
      // curves first, runs.jsonl last: a kill in between leaves rows that the
      // next start drops, since the run has no ok line yet.
      absl::Status written = absl::OkStatus();
      if (measured.ok()) written = AppendLines(dir + "/curves.csv", CurveRows(*run, *measured));
      if (written.ok()) written = AppendLines(dir + "/runs.csv", {ToCsv(record)});
      if (written.ok()) written = AppendLines(dir + "/runs.jsonl", {ToJson(record)});
      if (!written.ok()) {
        std::fprintf(stderr, "harrier-bench convergence: %s\n",
                     std::string(written.message()).c_str());
        return 1;
      }
      std::printf("%s\n", ToJson(record).c_str());
      std::fflush(stdout);
      if (measured.ok()) {
        const Record& r = record;
        std::fprintf(stderr,
                     "convergence: %s ok: final %s best %s loss %s, target %s at %s s / %s "
                     "steps, %s steps in %s s, up %s B/step down %s B/step, CPU ms/step "
                     "worker %s shards %s\n",
                     run_id.c_str(), FieldText(r, "final_accuracy")->c_str(),
                     FieldText(r, "best_accuracy")->c_str(), FieldText(r, "final_loss")->c_str(),
                     FieldText(r, "target_accuracy")->c_str(),
                     FieldText(r, "time_to_target_s")->c_str(),
                     FieldText(r, "steps_to_target")->c_str(), FieldText(r, "steps")->c_str(),
                     FieldText(r, "wall_s")->c_str(), FieldText(r, "bytes_up_per_step")->c_str(),
                     FieldText(r, "bytes_down_per_step")->c_str(),
                     FieldText(r, "worker_cpu_ms_per_step")->c_str(),
                     FieldText(r, "shard_cpu_ms_per_step")->c_str());
        // The logs of a failed run stay for diagnosis; an ok run's are in
        // the files.
        RemoveLogs(logs);
      } else {
        std::fprintf(stderr, "convergence: %s FAILED: %s (logs in %s)\n", run_id.c_str(),
                     error.c_str(), logs.c_str());
      }
    }
  }
  std::filesystem::remove(dir + "/logs", error_code);  // only if empty
  std::fprintf(stderr, "convergence: done, %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace harrier::bench
