// Fuzz target: every codec's decoder and the shard's aggregator must refuse
// or accept any payload without crashing, and never write past the output.
#include <cstdint>
#include <string>
#include <vector>

#include "common/codec/codec.h"

namespace {

const char* const kSpecs[] = {"none",  "fp16",   "bf16",           "topk:ratio=0.05",
                              "randomk:ratio=0.05,seed=3",          "threshold:tau=0.5",
                              "qsgd:levels=16,bucket=64",           "terngrad",
                              "sign",  "efsign", "signum",          "onebit",
                              "powersgd:rank=2"};
constexpr size_t kElements = 96;

}  // namespace

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds;
  std::vector<float> gradient(kElements);
  for (size_t i = 0; i < kElements; ++i) gradient[i] = static_cast<float>(i % 7) - 3.0f;
  for (const char* text : kSpecs) {
    auto spec = harrier::CodecSpec::Parse(text);
    auto codec = harrier::CreateCodec(*spec);
    std::string payload;
    if ((*codec)->Encode(gradient, harrier::CodecContext{42}, &payload).ok()) {
      seeds.push_back(payload);
    }
  }
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string payload(reinterpret_cast<const char*>(data), size);
  // Guard words around the output catch a decoder writing out of bounds.
  std::vector<float> out(kElements + 2, 0.0f);
  out.front() = out.back() = 12345.0f;
  for (const char* text : kSpecs) {
    auto spec = harrier::CodecSpec::Parse(text);
    auto codec = harrier::CreateCodec(*spec);
    (*codec)->Decode(payload, absl::MakeSpan(out.data() + 1, kElements)).IgnoreError();
    (*codec)->DecodeAdd(payload, 0.5f, absl::MakeSpan(out.data() + 1, kElements)).IgnoreError();
    auto aggregator = harrier::Aggregator::Create(*spec, kElements);
    if ((*aggregator)->Add(payload).ok()) {
      (*aggregator)->Finish(absl::MakeSpan(out.data() + 1, kElements)).IgnoreError();
    }
    if (out.front() != 12345.0f || out.back() != 12345.0f) __builtin_trap();
  }
  return 0;
}
