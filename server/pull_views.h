#ifndef HARRIER_SERVER_PULL_VIEWS_H_
#define HARRIER_SERVER_PULL_VIEWS_H_

// Compressed pulls of one dense chunk (server/README.md, "Compressed pull
// views"): per rank, the parameters as the rank has rebuilt them from its
// replies so far, and the encoder of that stream (PowerSGD warm-starts). A
// reply sends C(parameters - view) and the view advances by what the rank
// decodes, so what the codec drops stays in the next difference.
//
// Views are immutable buffers shared between ranks: ranks that pull the
// same parameters hold the same view (under BSP every rank, every round),
// so with a codec whose payload depends on its input alone the reply is
// encoded once and every such rank is sent that payload and moves to the
// same next view. Ranks whose views differ (a lost reply, an SSP lead) get
// replies of their own.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/codec/codec.h"
#include "proto/harrier.pb.h"
#include "server/codec_cache.h"
#include "server/table.h"

namespace harrier {

struct ShardCounters;

// What every chunk's views share: the shard's codec cache and counters,
// the last view version handed out, and the parameter budget that counts
// the views' buffers (--max_param_bytes; null: not counted).
struct PullViewEnvironment {
  CodecCache* codecs = nullptr;
  ShardCounters* counters = nullptr;
  std::atomic<uint64_t>* last_version = nullptr;
  int num_workers = 1;
  ParamBudget* budget = nullptr;
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
    // Changes whenever `values` do (the slot's count of its versions):
    // replies made from equal versions of equal views are equal.
    uint64_t values_version = 0;
  };

  // Encodes the difference between the chunk's values and the view `rank`
  // holds (`held_version`: the current or the previous one; any other gets
  // a dense reply that resets the view) into `payload` and makes the result
  // the rank's current view; sets the reply's codec fields and versions.
  // `out->clock()` must be set (it seeds random codecs). Every view buffer
  // is counted in `env.budget` while any rank holds it, and so is what each
  // rank's encoder keeps between calls (Codec::RetainedBytes: PowerSGD's
  // warm-start factor, top-k's scratch): a new buffer, or an encoder's
  // growth, past --max_param_bytes fails RESOURCE_EXHAUSTED and the rank
  // keeps the view it holds (a refused encoder is dropped: its next pull
  // starts a fresh one).
  absl::Status Compress(const PullViewEnvironment& env, const Chunk& chunk, uint32_t rank,
                        const std::string& codec_params, uint64_t held_version,
                        proto::TensorChunk* out, std::string* payload);

 private:
  using Values = std::shared_ptr<const std::vector<float>>;

  // Two versions: the latest reply's (`values`) and the one before it
  // (`previous`), which is what the rank holds if that reply was lost; a
  // reply re-made from `previous` is decoded by the rank exactly as the
  // shard decodes it, so the two stay bit-identical. Each is a buffer that
  // other ranks' views may share.
  struct View {
    Values values;          // null until the rank's first compressed pull
    uint64_t version = 0;   // 0: none (versions are the rank's own)
    Values previous;
    uint64_t previous_version = 0;  // 0: none
    std::string encoder_params;
    std::unique_ptr<Codec> encoder;
    HeldBudgetBytes encoder_held;  // encoder->RetainedBytes() after its last encode
  };
  // The last reply encoded with a codec that SharesReplies: from view
  // `base` (a buffer's identity is its content: buffers never change) and
  // the parameters at `values_version`, the payload and the view it makes.
  struct SharedReply {
    Values base;
    uint64_t values_version = 0;
    std::string codec_params;
    std::string payload;
    Values next;
  };
  // The dense view of the parameters at `dense_version`, for every rank
  // whose view starts there.
  absl::StatusOr<Values> DenseView(const PullViewEnvironment& env, const Chunk& chunk);

  std::vector<View> views_;
  SharedReply last_;
  Values dense_;
  uint64_t dense_version_ = 0;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_PULL_VIEWS_H_
