// CodecSpec parsing and printing.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/codec/codec.h"

namespace harrier {
namespace {

struct NameAndId {
  absl::string_view name;
  CodecId id;
};

constexpr NameAndId kCodecNames[] = {
    {"none", CodecId::kNone},         {"fp16", CodecId::kFp16},
    {"bf16", CodecId::kBf16},         {"topk", CodecId::kTopK},
    {"randomk", CodecId::kRandomK},   {"threshold", CodecId::kThreshold},
    {"qsgd", CodecId::kQsgd},         {"terngrad", CodecId::kTernGrad},
    {"sign", CodecId::kSign},         {"efsign", CodecId::kEfSign},
    {"signum", CodecId::kSignum},     {"onebit", CodecId::kOneBit},
    {"powersgd", CodecId::kPowerSgd},
};

// The parameters each codec accepts; anything else is refused.
std::vector<absl::string_view> AllowedParams(CodecId id) {
  switch (id) {
    case CodecId::kTopK:
      return {"ratio"};
    case CodecId::kRandomK:
      return {"ratio", "seed", "scale"};
    case CodecId::kThreshold:
      return {"tau", "sample", "ratio", "momentum"};
    case CodecId::kQsgd:
      return {"levels", "bucket"};
    case CodecId::kTernGrad:
      return {"clip"};
    case CodecId::kSign:
      return {"scale"};
    case CodecId::kPowerSgd:
      return {"rank", "cols"};
    default:
      return {};
  }
}

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("codec spec \"", text, "\": ", why));
}

// Shortest decimal that parses back to exactly the same double.
std::string FormatDouble(double v) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    double back = 0;
    if (absl::SimpleAtod(buf, &back) && back == v) break;
  }
  return buf;
}

absl::Status ParseDouble(absl::string_view text, absl::string_view key,
                         absl::string_view value, double* out) {
  if (!absl::SimpleAtod(value, out) || !std::isfinite(*out)) {
    return Bad(text, absl::StrCat("parameter ", key, "=", value,
                                  " is not a finite number"));
  }
  return absl::OkStatus();
}

absl::Status ParseUint(absl::string_view text, absl::string_view key,
                       absl::string_view value, uint64_t* out) {
  if (value.empty() || value[0] == '-' || value[0] == '+' ||
      !absl::SimpleAtoi(value, out)) {
    return Bad(text, absl::StrCat("parameter ", key, "=", value,
                                  " is not a non-negative integer"));
  }
  return absl::OkStatus();
}

absl::Status ParseBool(absl::string_view text, absl::string_view key,
                       absl::string_view value, bool* out) {
  if (value == "1" || value == "true") {
    *out = true;
  } else if (value == "0" || value == "false") {
    *out = false;
  } else {
    return Bad(text,
               absl::StrCat("parameter ", key, "=", value, " is not 0 or 1"));
  }
  return absl::OkStatus();
}

absl::Status OutOfRange(absl::string_view text, absl::string_view key,
                        absl::string_view value, absl::string_view range) {
  return Bad(text, absl::StrCat("parameter ", key, "=", value,
                                " out of range (", range, ")"));
}

}  // namespace

absl::string_view CodecName(CodecId id) {
  for (const NameAndId& entry : kCodecNames) {
    if (entry.id == id) return entry.name;
  }
  return "unknown";
}

absl::StatusOr<CodecSpec> CodecSpec::Parse(absl::string_view text) {
  absl::string_view name = text;
  absl::string_view params;
  size_t colon = text.find(':');
  if (colon != absl::string_view::npos) {
    name = text.substr(0, colon);
    params = text.substr(colon + 1);
    if (params.empty()) return Bad(text, "empty parameter list after ':'");
  }
  CodecSpec spec;
  bool found = false;
  for (const NameAndId& entry : kCodecNames) {
    if (entry.name == name) {
      spec.id = entry.id;
      found = true;
    }
  }
  if (!found) {
    std::vector<absl::string_view> known;
    for (const NameAndId& entry : kCodecNames) known.push_back(entry.name);
    return Bad(text, absl::StrCat("unknown codec \"", name,
                                  "\" (known: ", absl::StrJoin(known, ", "), ")"));
  }
  // Codec-specific defaults that differ from the struct's.
  if (spec.id == CodecId::kRandomK) spec.scaled = true;

  std::vector<absl::string_view> allowed = AllowedParams(spec.id);
  std::vector<std::string> seen;
  bool saw_tau = false, saw_sample_or_ratio = false, saw_momentum = false;
  if (!params.empty()) {
    for (absl::string_view item : absl::StrSplit(params, ',')) {
      size_t eq = item.find('=');
      if (eq == absl::string_view::npos || eq == 0) {
        return Bad(text, absl::StrCat("parameter \"", item,
                                      "\" is not key=value"));
      }
      absl::string_view key = item.substr(0, eq);
      absl::string_view value = item.substr(eq + 1);
      bool ok = false;
      for (absl::string_view a : allowed) ok = ok || a == key;
      if (!ok) {
        return Bad(text, absl::StrCat("unknown parameter \"", key,
                                      "\" for codec ", name));
      }
      for (const std::string& s : seen) {
        if (s == key) {
          return Bad(text, absl::StrCat("parameter \"", key, "\" repeated"));
        }
      }
      seen.emplace_back(key);

      if (key == "ratio") {
        absl::Status st = ParseDouble(text, key, value, &spec.ratio);
        if (!st.ok()) return st;
        if (!(spec.ratio > 0.0 && spec.ratio <= 1.0)) {
          return OutOfRange(text, key, value, "0 < ratio <= 1");
        }
        saw_sample_or_ratio = true;
      } else if (key == "sample") {
        absl::Status st = ParseDouble(text, key, value, &spec.sample);
        if (!st.ok()) return st;
        if (!(spec.sample > 0.0 && spec.sample <= 1.0)) {
          return OutOfRange(text, key, value, "0 < sample <= 1");
        }
        saw_sample_or_ratio = true;
      } else if (key == "tau") {
        absl::Status st = ParseDouble(text, key, value, &spec.tau);
        if (!st.ok()) return st;
        if (!(spec.tau >= 0.0)) return OutOfRange(text, key, value, "tau >= 0");
        spec.fixed_tau = true;
        saw_tau = true;
      } else if (key == "momentum") {
        absl::Status st = ParseDouble(text, key, value, &spec.momentum);
        if (!st.ok()) return st;
        if (!(spec.momentum >= 0.0 && spec.momentum < 1.0)) {
          return OutOfRange(text, key, value, "0 <= momentum < 1");
        }
        saw_momentum = true;
      } else if (key == "clip") {
        absl::Status st = ParseDouble(text, key, value, &spec.clip);
        if (!st.ok()) return st;
        if (!(spec.clip >= 0.0)) {
          return OutOfRange(text, key, value, "clip >= 0, 0 = off");
        }
      } else if (key == "seed") {
        absl::Status st = ParseUint(text, key, value, &spec.seed);
        if (!st.ok()) return st;
      } else if (key == "cols") {
        absl::Status st = ParseUint(text, key, value, &spec.cols);
        if (!st.ok()) return st;
      } else if (key == "scale") {
        absl::Status st = ParseBool(text, key, value, &spec.scaled);
        if (!st.ok()) return st;
      } else if (key == "levels" || key == "bucket" || key == "rank") {
        uint64_t v = 0;
        absl::Status st = ParseUint(text, key, value, &v);
        if (!st.ok()) return st;
        if (key == "levels") {
          if (v < 1 || v > 65535) {
            return OutOfRange(text, key, value, "1 <= levels <= 65535");
          }
          spec.levels = static_cast<uint32_t>(v);
        } else if (key == "bucket") {
          if (v < 1 || v > (1u << 30)) {
            return OutOfRange(text, key, value, "1 <= bucket <= 2^30");
          }
          spec.bucket = static_cast<uint32_t>(v);
        } else {
          if (v < 1 || v > 64) {
            return OutOfRange(text, key, value, "1 <= rank <= 64");
          }
          spec.rank = static_cast<uint32_t>(v);
        }
      }
    }
  }
  if (saw_tau && saw_sample_or_ratio) {
    return Bad(text, "threshold takes either tau or sample/ratio, not both");
  }
  if (saw_tau && saw_momentum) {
    return Bad(text,
               "momentum correction is DGC's: it takes the sampled form "
               "(sample/ratio), not a fixed tau");
  }
  return spec;
}

std::string CodecSpec::ToString() const {
  std::string out(CodecName(id));
  std::vector<std::string> parts;
  switch (id) {
    case CodecId::kTopK:
      parts.push_back("ratio=" + FormatDouble(ratio));
      break;
    case CodecId::kRandomK:
      parts.push_back("ratio=" + FormatDouble(ratio));
      parts.push_back(absl::StrCat("seed=", seed));
      parts.push_back(absl::StrCat("scale=", scaled ? 1 : 0));
      break;
    case CodecId::kThreshold:
      if (fixed_tau) {
        parts.push_back("tau=" + FormatDouble(tau));
      } else {
        parts.push_back("sample=" + FormatDouble(sample));
        parts.push_back("ratio=" + FormatDouble(ratio));
        if (momentum != 0.0) parts.push_back("momentum=" + FormatDouble(momentum));
      }
      break;
    case CodecId::kQsgd:
      parts.push_back(absl::StrCat("levels=", levels));
      parts.push_back(absl::StrCat("bucket=", bucket));
      break;
    case CodecId::kTernGrad:
      parts.push_back("clip=" + FormatDouble(clip));
      break;
    case CodecId::kSign:
      parts.push_back(absl::StrCat("scale=", scaled ? 1 : 0));
      break;
    case CodecId::kPowerSgd:
      parts.push_back(absl::StrCat("rank=", rank));
      parts.push_back(absl::StrCat("cols=", cols));
      break;
    default:
      break;
  }
  if (!parts.empty()) absl::StrAppend(&out, ":", absl::StrJoin(parts, ","));
  return out;
}

bool CodecSpec::operator==(const CodecSpec& o) const {
  // Compare only what the codec uses, so that equal spec strings give equal
  // specs whatever the unused fields hold.
  if (id != o.id) return false;
  switch (id) {
    case CodecId::kTopK:
      return ratio == o.ratio;
    case CodecId::kRandomK:
      return ratio == o.ratio && seed == o.seed && scaled == o.scaled;
    case CodecId::kThreshold:
      if (fixed_tau != o.fixed_tau) return false;
      return fixed_tau ? tau == o.tau
                       : (sample == o.sample && ratio == o.ratio &&
                          momentum == o.momentum);
    case CodecId::kQsgd:
      return levels == o.levels && bucket == o.bucket;
    case CodecId::kTernGrad:
      return clip == o.clip;
    case CodecId::kSign:
      return scaled == o.scaled;
    case CodecId::kPowerSgd:
      return rank == o.rank && cols == o.cols;
    default:
      return true;
  }
}

}  // namespace harrier
