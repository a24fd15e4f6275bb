#include "server/memory_account.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace harrier {

absl::Status NamedBudget::Reserve(uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  if (bytes > limit_bytes_ || held_ > limit_bytes_ - bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the shard's ", name_, " would hold more than ", limit_bytes_, " bytes (",
                     flag_, "); retry later or raise the bound"));
  }
  held_ += bytes;
  return absl::OkStatus();
}

void NamedBudget::Release(uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  held_ -= std::min(bytes, held_);
}

uint64_t NamedBudget::held_bytes() const {
  absl::MutexLock lock(&mutex_);
  return held_;
}

MemoryAccount::MemoryAccount(const MemoryAccountOptions& options)
    : options_(options),
      payloads_(options.max_connection_bytes, options.max_buffered_bytes),
      parked_pulls_("parked pulls", "--max_parked_pull_bytes", options.max_parked_pull_bytes),
      probes_("probes in flight", "--max_probe_bytes_in_flight",
              options.max_probe_bytes_in_flight) {}

std::vector<MemoryAccount::Figure> MemoryAccount::Figures() const {
  std::vector<Figure> figures;
  figures.push_back(
      {"push payloads", "--max_buffered_bytes", payloads_.buffered(), options_.max_buffered_bytes});
  for (const NamedBudget* budget : {&parked_pulls_, &probes_}) {
    figures.push_back(
        {budget->name(), budget->flag(), budget->held_bytes(), budget->limit_bytes()});
  }
  return figures;
}

}  // namespace harrier
