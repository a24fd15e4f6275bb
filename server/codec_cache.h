#ifndef HARRIER_SERVER_CODEC_CACHE_H_
#define HARRIER_SERVER_CODEC_CACHE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/codec/codec.h"

namespace harrier {

// Codecs a shard decodes with, built once per codec-parameter string rather
// than parsed and constructed for every push. Decode is const and touches no
// mutable state (common/codec/codec.h), so one cached codec serves every
// slot and thread at once. Bounded: past `max_entries` distinct strings (a
// hostile client can send any number) codecs are built per call and not
// kept. Thread-safe.
class CodecCache {
 public:
  explicit CodecCache(size_t max_entries = 64) : max_entries_(max_entries) {}

  struct Entry {
    CodecSpec spec;
    std::shared_ptr<const Codec> decoder;
  };

  // The parsed spec and a decoder for `params`, or INVALID_ARGUMENT for a
  // spec that does not parse or build.
  absl::StatusOr<std::shared_ptr<const Entry>> Get(const std::string& params);

 private:
  const size_t max_entries_;
  absl::Mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Entry>> entries_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_SERVER_CODEC_CACHE_H_
