// JSON for the lines Harrier's tools write and read (harrier-bench,
// harrier-advise, harrier-ctl --json): nlohmann/json, the one JSON library
// (Debian's nlohmann-json3-dev, header-only), with the few conventions they
// share. Objects keep their keys in insertion order (ordered_json), so a
// line reads in the order it is built and scripts that compare key order
// keep working. Nothing here throws.

#ifndef HARRIER_COMMON_JSON_H_
#define HARRIER_COMMON_JSON_H_

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"

namespace harrier {

using Json = nlohmann::ordered_json;

// One line of compact JSON (no spaces, no newline). Text that is not UTF-8
// is replaced (U+FFFD) instead of throwing; NaN and infinities print null.
inline std::string DumpJson(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Parses `text`; a value that is_discarded() when it is not JSON.
inline Json ParseJson(absl::string_view text) {
  return Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

// `value` rounded to `digits` decimals: a fixed-point figure ("%.4f") as a
// JSON number, which prints in its shortest form (0.85, not 0.8500).
inline double RoundTo(double value, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(value * scale) / scale;
}

// `value` rounded to `digits` significant digits ("%.6g") as a JSON number.
inline double RoundToSignificant(double value, int digits) {
  if (!std::isfinite(value) || value == 0) return value;
  const double scale = std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(std::fabs(value)))));
  return std::round(value * scale) / scale;
}

}  // namespace harrier

#endif  // HARRIER_COMMON_JSON_H_
