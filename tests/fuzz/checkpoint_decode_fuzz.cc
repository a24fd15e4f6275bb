// Fuzz target: a checkpoint file's bytes, however damaged, are decoded or
// refused without crashing.
#include <cstdint>
#include <string>
#include <vector>

#include "server/checkpoint.h"

std::vector<std::string> FuzzSeeds() {
  harrier::ShardCheckpoint checkpoint;
  checkpoint.num_workers = 2;
  checkpoint.version = 7;
  checkpoint.sync = "bsp";
  harrier::SlotCheckpoint slot;
  slot.key = "fc0.weight";
  slot.shape = {4, 2};
  slot.values = {1, 2, 3, 4, 5, 6, 7, 8};
  slot.optimizer_first = slot.values;
  slot.pushed = {3, 3};
  checkpoint.slots.push_back(slot);
  return {harrier::EncodeCheckpoint(checkpoint)};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = harrier::DecodeCheckpoint(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (decoded.ok()) harrier::CheckCheckpointConsistency(*decoded).IgnoreError();
  return 0;
}
