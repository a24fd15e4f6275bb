#ifndef HARRIER_SERVER_PULL_VIEWS_H_
#define HARRIER_SERVER_PULL_VIEWS_H_

// Compressed pulls of one dense chunk (server/README.md, "Compressed pull
// views"): per rank, the parameters as the rank has rebuilt them from its
// replies so far, and the encoder of that stream (PowerSGD warm-starts). A
// reply sends C(parameters - view) and the view advances by what the rank
// decodes, so what the codec drops stays in the next difference.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/codec/codec.h"
#include "proto/harrier.pb.h"
#include "server/codec_cache.h"

namespace harrier {

struct ShardCounters;

// What every chunk's views share: the shard's codec cache and counters,
// and the last view version handed out.
struct PullViewEnvironment {
  CodecCache* codecs = nullptr;
  ShardCounters* counters = nullptr;
  std::atomic<uint64_t>* last_version = nullptr;
  int num_workers = 1;
};

// Not thread-safe: the chunk's lock guards it.
class PullViews {
 public:
  // The chunk a reply is for: its name, tensor shape and current values.
  struct Chunk {
    const std::string* key = nullptr;
    uint32_t chunk = 0;
    const std::vector<uint64_t>* shape = nullptr;
    const float* values = nullptr;
    size_t num_elements = 0;
  };

  // Encodes the difference between the chunk's values and the view `rank`
  // holds (`held_version`: the current or the previous one; any other gets
  // a dense reply that resets the view) into `payload` and makes the result
  // the rank's current view; sets the reply's codec fields and versions.
  // `out->clock()` must be set (it seeds random codecs).
  absl::Status Compress(const PullViewEnvironment& env, const Chunk& chunk, uint32_t rank,
                        const std::string& codec_params, uint64_t held_version,
                        proto::TensorChunk* out, std::string* payload);

 private:
  // Two versions: the latest reply's (`values`) and the one before it
  // (`previous`), which is what the rank holds if that reply was lost; a
  // reply re-made from `previous` is decoded by the rank exactly as the
  // shard decodes it, so the two stay bit-identical. At most two copies.
  struct View {
    std::vector<float> values;  // empty until the rank's first compressed pull
    uint64_t version = 0;       // 0: none
    std::vector<float> previous;
    uint64_t previous_version = 0;  // 0: none
    std::string encoder_params;
    std::unique_ptr<Codec> encoder;
  };
  std::vector<View> views_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_PULL_VIEWS_H_
