#include "bench/bench_util.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace harrier::bench {

double Percentile(std::vector<double>& samples, double q) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(q * static_cast<double>(samples.size()));
  const size_t index = rank < 1.0 ? 0 : static_cast<size_t>(rank) - 1;
  return samples[std::min(index, samples.size() - 1)];
}

bool StartGate::ArriveAndWait() {
  std::unique_lock<std::mutex> lock(mutex_);
  ++arrived_;
  changed_.notify_all();
  changed_.wait(lock, [this] { return open_ || aborted_; });
  return !aborted_;
}

BenchClock::time_point StartGate::WaitAllThenOpen() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return arrived_ >= parties_ || aborted_; });
  open_ = true;
  const auto start = BenchClock::now();
  changed_.notify_all();
  return start;
}

bool StartGate::ArriveAndWaitUntil(BenchClock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++arrived_;
  changed_.notify_all();
  return changed_.wait_until(lock, deadline, [this] { return open_ || aborted_; }) && !aborted_;
}

absl::StatusOr<BenchClock::time_point> StartGate::WaitAllThenOpenUntil(
    BenchClock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool ready =
      changed_.wait_until(lock, deadline, [this] { return arrived_ >= parties_ || aborted_; });
  if (aborted_) return absl::AbortedError("a party aborted the start gate");
  if (!ready) {
    aborted_ = true;
    changed_.notify_all();
    return absl::DeadlineExceededError(absl::StrCat("start gate: ", arrived_, " of ", parties_,
                                                    " parties arrived before the deadline"));
  }
  open_ = true;
  const auto start = BenchClock::now();
  changed_.notify_all();
  return start;
}

void StartGate::Abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  changed_.notify_all();
}

absl::StatusOr<std::vector<size_t>> ParseByteList(absl::string_view text) {
  std::vector<size_t> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    size_t multiplier = 1;
    if (!item.empty()) {
      switch (absl::ascii_toupper(item.back())) {
        case 'K': multiplier = size_t{1} << 10; break;
        case 'M': multiplier = size_t{1} << 20; break;
        case 'G': multiplier = size_t{1} << 30; break;
        default: break;
      }
      if (multiplier != 1) item.remove_suffix(1);
    }
    uint64_t number = 0;
    if (!absl::SimpleAtoi(item, &number) || number == 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad size '", item, "' in '", text, "'"));
    }
    values.push_back(static_cast<size_t>(number) * multiplier);
  }
  if (values.empty()) return absl::InvalidArgumentError("empty size list");
  return values;
}

absl::StatusOr<std::vector<size_t>> ParseTensorSizes(absl::string_view text) {
  auto sizes = ParseByteList(text);
  if (!sizes.ok()) return sizes.status();
  for (size_t size : *sizes) {
    if (size % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(size, " is not a whole number of float32 values"));
    }
  }
  return sizes;
}

absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text) {
  std::vector<int> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int number = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &number) || number <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad count '", item, "' in '", text, "'"));
    }
    values.push_back(number);
  }
  if (values.empty()) return absl::InvalidArgumentError("empty list");
  return values;
}

std::string FormatBytes(size_t bytes) {
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, "M");
  }
  if (bytes >= (size_t{1} << 10) && bytes % (size_t{1} << 10) == 0) {
    return absl::StrCat(bytes >> 10, "K");
  }
  return absl::StrCat(bytes);
}

absl::StatusOr<std::vector<std::string>> SyncServerFlags(absl::string_view sync) {
  if (sync == "bsp" || sync == "asp")
    return std::vector<std::string>{absl::StrCat("--sync=", sync)};
  // The count is digits only: SimpleAtoi alone would also take "+2" and
  // " 2", names no bench prints back.
  const auto count = [](absl::string_view digits, int64_t* value) {
    return !digits.empty() &&
           std::all_of(digits.begin(), digits.end(),
                       [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) &&
           absl::SimpleAtoi(digits, value) && *value >= 1;
  };
  int64_t every = 0;
  if (absl::ConsumePrefix(&sync, "ssp") && count(sync, &every)) {
    return std::vector<std::string>{"--sync=ssp", absl::StrCat("--staleness=", every)};
  }
  if (absl::ConsumePrefix(&sync, "local") && count(sync, &every)) {
    return std::vector<std::string>{"--sync=local", absl::StrCat("--local_steps=", every)};
  }
  return absl::InvalidArgumentError("want bsp, asp, ssp<N> or local<H> with N, H >= 1");
}

}  // namespace harrier::bench
