#include "server/codec_cache.h"

namespace harrier {

absl::StatusOr<std::shared_ptr<const CodecCache::Entry>> CodecCache::Get(
    const std::string& params) {
  {
    absl::MutexLock lock(&mutex_);
    auto it = entries_.find(params);
    if (it != entries_.end()) return it->second;
  }
  auto spec = CodecSpec::Parse(params);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  auto codec = CreateCodec(*spec);
  if (!codec.ok()) return absl::InvalidArgumentError(codec.status().message());
  auto entry = std::make_shared<Entry>();
  entry->spec = *spec;
  entry->decoder = std::move(*codec);
  absl::MutexLock lock(&mutex_);
  if (entries_.size() < max_entries_) entries_.emplace(params, entry);
  return std::shared_ptr<const Entry>(std::move(entry));
}

}  // namespace harrier
