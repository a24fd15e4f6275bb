#include "bench/codec/bench_common.h"

#include <cstdio>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/flags.h"
#include "bench/shared_flags.h"
#include "common/json.h"

namespace harrier::bench {

std::optional<int> ParseCodecBenchFlags(
    int argc, char** argv, absl::Span<const char* const> default_codecs,
    const char* usage, CodecBenchOptions* opt) {
  if (std::optional<int> exit_code =
          ParseBenchFlags(argc, argv, usage, {"sizes", "codecs", "min_time"})) {
    return exit_code;
  }
  if (const std::string sizes = absl::GetFlag(FLAGS_sizes); !sizes.empty()) {
    opt->sizes.clear();
    for (absl::string_view s : absl::StrSplit(sizes, ',')) {
      size_t v = 0;
      if (!absl::SimpleAtoi(s, &v) || v == 0) {
        std::fprintf(stderr, "bad size \"%.*s\"\n", static_cast<int>(s.size()), s.data());
        std::fputs(usage, stderr);
        return 2;
      }
      opt->sizes.push_back(v);
    }
  }
  opt->min_time = absl::GetFlag(FLAGS_min_time);
  if (!(opt->min_time >= 0)) {
    std::fprintf(stderr, "bad --min_time\n");
    std::fputs(usage, stderr);
    return 2;
  }
  std::vector<std::string> codecs(default_codecs.begin(), default_codecs.end());
  if (const std::string text = absl::GetFlag(FLAGS_codecs); !text.empty()) {
    codecs = absl::StrSplit(text, ';', absl::SkipEmpty());
  }
  opt->specs.clear();
  for (const std::string& text : codecs) {
    absl::StatusOr<CodecSpec> spec = CodecSpec::Parse(text);
    if (!spec.ok()) {
      std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
      return 2;
    }
    opt->specs.push_back(*spec);
  }
  return std::nullopt;
}

std::vector<float> BenchGradient(size_t d) {
  std::vector<float> g(d);
  std::mt19937_64 gen(d);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : g) v = dist(gen);
  return g;
}

void PrintCodecBenchLine(const CodecBenchResult& r) {
  const double bytes = 4.0 * r.elements;
  const double encode_gbps = bytes / r.encode_s / 1e9;
  const double decode_gbps = bytes / r.decode_s / 1e9;
  const double memcpy_gbps = bytes / r.memcpy_s / 1e9;
  Json line = {
      {"bench", r.bench},
      {"codec", r.spec->ToString()},
      {"elements", r.elements},
      {"encode_gbps", RoundTo(encode_gbps, 4)},
      {"decode_gbps", RoundTo(decode_gbps, 4)},
      {"memcpy_gbps", RoundTo(memcpy_gbps, 4)},
      {"encode_ratio", RoundTo(encode_gbps / memcpy_gbps, 5)},
      {"decode_ratio", RoundTo(decode_gbps / memcpy_gbps, 5)},
  };
  if (r.with_compression_ratio) {
    line["compression_ratio"] = RoundTo(bytes / static_cast<double>(r.wire_bytes), 3);
  }
  // The link rate (Gbit/s) below which compressing this tensor pays: the
  // bytes saved take longer to send than encode + decode take. 0 when the
  // payload is not smaller than the fp32 tensor (compression never pays).
  const double saved = bytes - static_cast<double>(r.wire_bytes);
  const double breakeven_gbps =
      saved > 0 ? saved * 8.0 / (r.encode_s + r.decode_s) / 1e9 : 0.0;
  line["breakeven_gbps"] = RoundTo(breakeven_gbps, 3);
  line["wire_bytes"] = r.wire_bytes;
  std::printf("%s\n", DumpJson(line).c_str());
  std::fflush(stdout);
}

}  // namespace harrier::bench
