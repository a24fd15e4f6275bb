#include "bench/advise/calibration.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json.h"

namespace harrier::advise {
namespace {

std::string StringOr(const Json& object, const char* key, const std::string& otherwise) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

double NumberOr(const Json& object, const char* key, double otherwise) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() ? it->get<double>() : otherwise;
}

}  // namespace

absl::StatusOr<Calibration> ParseCalibration(const std::string& text, const std::string& model) {
  Calibration calibration;
  calibration.model = model;
  int line_number = 0;
  int other_models = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const Json object = ParseJson(line);
    if (!object.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration line ", line_number, " is not a JSON object"));
    }
    for (const char* key : {"run_id", "model", "sync", "codec", "steps_to_target", "status"}) {
      if (!object.contains(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat("calibration line ", line_number, " has no \"", key, "\""));
      }
    }
    if (StringOr(object, "status", "") != "ok") continue;
    if (StringOr(object, "model", "") != model) {
      ++other_models;
      continue;
    }
    CalibrationRun run;
    run.sync = StringOr(object, "sync", "");
    run.codec = StringOr(object, "codec", "");
    run.codec_spec = StringOr(object, "codec_spec", "");
    run.pull_codec = StringOr(object, "pull_codec", "none");
    // runs.jsonl has no pulls key: the run id says it (<...>-pullon-<link>g).
    const std::string run_id = StringOr(object, "run_id", "");
    if (absl::StrContains(run_id, "-pullon-")) {
      run.pulls = "on";
    } else if (absl::StrContains(run_id, "-pullpaired-")) {
      run.pulls = "paired";
    } else if (absl::StrContains(run_id, "-pulloff-")) {
      run.pulls = "off";
    } else {
      run.pulls = run.pull_codec == "none" || run.pull_codec.empty() ? "off" : "on";
    }
    run.link_gbps = NumberOr(object, "link_gbps", -1);
    run.steps_to_target = NumberOr(object, "steps_to_target", -1);
    run.step_s = NumberOr(object, "step_s", -1);
    run.time_to_target_s = NumberOr(object, "time_to_target_s", -1);
    calibration.runs.push_back(std::move(run));
  }
  if (calibration.runs.empty()) {
    return absl::NotFoundError(absl::StrCat("the calibration has no ok run of model '", model, "'",
                                            other_models > 0 ? " (only other models')" : ""));
  }
  return calibration;
}

absl::StatusOr<Calibration> ReadCalibration(const std::string& path, const std::string& model) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --calibration=", path));
  std::stringstream text;
  text << in.rdbuf();
  auto calibration = ParseCalibration(text.str(), model);
  if (!calibration.ok()) {
    return absl::Status(calibration.status().code(),
                        absl::StrCat(path, ": ", calibration.status().message()));
  }
  return calibration;
}

}  // namespace harrier::advise
