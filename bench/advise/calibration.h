// Reads a convergence grid's runs.jsonl (harrier-bench convergence,
// the grid's file format) into the cost model's Calibration: the ok runs of one model,
// with their sync, codec, pulls, specs and steps to the target.
#ifndef HARRIER_BENCH_ADVISE_CALIBRATION_H_
#define HARRIER_BENCH_ADVISE_CALIBRATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "bench/advise/cost_model.h"

namespace harrier::advise {

// `text`: the file's contents, one flat JSON object a line (blank lines
// skipped). Lines of another model and failed runs are left out.
// INVALID_ARGUMENT naming the line for a line that is not a JSON object or
// lacks a key the model needs (run_id, model, sync, codec,
// steps_to_target, status); NOT_FOUND if no ok line is of `model`.
absl::StatusOr<Calibration> ParseCalibration(const std::string& text, const std::string& model);

// ParseCalibration of a file; NOT_FOUND naming it if it cannot be read.
absl::StatusOr<Calibration> ReadCalibration(const std::string& path, const std::string& model);

}  // namespace harrier::advise

#endif  // HARRIER_BENCH_ADVISE_CALIBRATION_H_
