// Fuzz target: the bytes of a push message as the shard receives them. They
// are parsed as a TensorChunk and pushed into a real ShardStore; whatever
// the status, the store must not crash, and a refused push must leave the
// parameters unchanged.
#include <cstdint>
#include <string>
#include <vector>

#include "common/codec/codec.h"
#include "common/crc32c.h"
#include "server/shard_store.h"

namespace {

constexpr size_t kElements = 64;

harrier::ShardStore& Store() {
  static harrier::ShardStore* store = [] {
    harrier::ShardStoreOptions options;
    options.num_workers = 2;
    options.sync.mode = harrier::SyncMode::kAsp;
    options.sync.staleness = -1;
    harrier::OptimizerOptions sgd;
    auto* created = new harrier::ShardStore(options, *harrier::CreateOptimizer(sgd));
    harrier::proto::InitRequest init;
    init.set_key("w");
    init.add_shape(kElements);
    init.set_num_elements(kElements);
    init.set_dtype(harrier::proto::DTYPE_FLOAT32);
    init.set_initial_values(std::string(kElements * sizeof(float), '\0'));
    init.set_checksum(harrier::Crc32c(init.initial_values().data(), init.initial_values().size()));
    created->Init(init).IgnoreError();
    return created;
  }();
  return *store;
}

std::string Seed(const std::string& codec_text) {
  std::vector<float> gradient(kElements, 0.25f);
  harrier::proto::TensorChunk chunk;
  chunk.set_key("w");
  chunk.set_rank(0);
  chunk.set_clock(0);
  chunk.set_num_elements(kElements);
  chunk.set_dtype(harrier::proto::DTYPE_FLOAT32);
  auto spec = harrier::CodecSpec::Parse(codec_text);
  auto codec = harrier::CreateCodec(*spec);
  std::string payload;
  (*codec)->Encode(gradient, harrier::CodecContext{1}, &payload).IgnoreError();
  if (spec->id == harrier::CodecId::kNone) {
    payload.assign(reinterpret_cast<const char*>(gradient.data()), kElements * sizeof(float));
  } else {
    chunk.set_codec(static_cast<uint32_t>(spec->id));
    chunk.set_codec_params(spec->ToString());
  }
  chunk.set_payload(payload);
  // A correct checksum so mutations reach the decoders too (the fuzz driver
  // mostly breaks it; some mutations keep it valid by touching the header).
  chunk.set_checksum(harrier::Crc32c(payload.data(), payload.size()));
  return chunk.SerializeAsString();
}

}  // namespace

std::vector<std::string> FuzzSeeds() {
  return {Seed("none"), Seed("topk:ratio=0.1"), Seed("qsgd:levels=4,bucket=16"), Seed("sign")};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harrier::proto::TensorChunk chunk;
  if (!chunk.ParseFromArray(data, static_cast<int>(size))) return 0;
  // Recompute the checksum half the time so the payload validation is
  // exercised, not only the checksum check.
  if (size % 2 == 0) {
    chunk.set_checksum(harrier::Crc32c(chunk.payload().data(), chunk.payload().size()));
  }
  harrier::ShardStore& store = Store();
  const auto before = store.Snapshot("w", 0);
  const absl::Status status = store.Push({chunk});
  if (!status.ok() && before.ok() && *store.Snapshot("w", 0) != *before) __builtin_trap();
  return 0;
}
