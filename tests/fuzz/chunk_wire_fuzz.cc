// Fuzz target: the gRPC data path's TensorChunk framing (DecodeChunk), on
// arbitrary bytes cut into arbitrary slices, as a typed peer or a hostile
// client may send them. A decoded chunk must re-encode (EncodeChunkPrefix
// plus its payload) into bytes that decode to the same chunk: the split
// header/payload form the shard relies on and protobuf's own encoding must
// not drift apart.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/chunk_wire.h"
#include "common/payload_view.h"
#include "proto/harrier.pb.h"

namespace {

// The input's first byte picks where the rest is cut into slices, so the
// fuzzer explores slice boundaries inside varints and the payload too.
std::vector<grpc::Slice> Slice(const uint8_t* data, size_t size) {
  std::vector<grpc::Slice> slices;
  if (size == 0) return slices;
  const size_t step = 1 + data[0] % 17;
  ++data;
  --size;
  for (size_t at = 0; at < size; at += step) {
    slices.emplace_back(data + at, std::min(step, size - at));
    if (data[0] & 1) slices.emplace_back();  // empty slices must be skipped
  }
  return slices;
}

std::string Flatten(const harrier::PayloadView& view) {
  std::string bytes(view.size(), '\0');
  view.CopyTo(bytes.data());
  return bytes;
}

}  // namespace

std::vector<std::string> FuzzSeeds() {
  harrier::proto::TensorChunk chunk;
  chunk.set_key("fc0.weight");
  chunk.set_rank(1);
  chunk.set_clock(7);
  chunk.set_chunk(2);
  chunk.set_num_elements(4);
  chunk.set_dtype(harrier::proto::DTYPE_FLOAT32);
  chunk.set_checksum(0x12345678);
  const std::string payload(16, '\x3f');
  std::vector<std::string> seeds;
  for (const char split : {'\x03', '\x10'}) {
    seeds.push_back(split + harrier::EncodeChunkPrefix(chunk, payload.size()) + payload);
  }
  chunk.set_payload(payload);  // protobuf's own order: payload before later fields
  seeds.push_back('\x05' + chunk.SerializeAsString());
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<grpc::Slice> slices = Slice(data, size);
  harrier::proto::TensorChunk header;
  harrier::PayloadView payload;
  if (!harrier::DecodeChunk(slices, &header, &payload).ok()) return 0;
  if (!header.payload().empty()) __builtin_trap();  // the payload is only ever a view
  const std::string bytes = Flatten(payload);

  const std::string again = harrier::EncodeChunkPrefix(header, bytes.size()) + bytes;
  harrier::proto::TensorChunk header2;
  harrier::PayloadView payload2;
  const std::vector<grpc::Slice> one = {grpc::Slice(again.data(), again.size())};
  if (!harrier::DecodeChunk(one, &header2, &payload2).ok()) __builtin_trap();
  if (header2.SerializeAsString() != header.SerializeAsString()) __builtin_trap();
  if (Flatten(payload2) != bytes) __builtin_trap();

  // A typed peer parses the same bytes to the same chunk.
  harrier::proto::TensorChunk typed;
  if (!typed.ParseFromString(again) || typed.payload() != bytes) __builtin_trap();
  return 0;
}
