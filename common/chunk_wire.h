#ifndef HARRIER_COMMON_CHUNK_WIRE_H_
#define HARRIER_COMMON_CHUNK_WIRE_H_

// TensorChunk messages on the wire without copying their payload.
//
// A TensorChunk is sent as two pieces: the serialised header (every field
// but `payload`) followed by the tag and length of field 11 (`payload`), and
// then the payload bytes themselves. The concatenation is exactly a valid
// TensorChunk encoding, so typed peers (generated stubs) read and write the
// same messages; only Harrier's own data path splits them.

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/payload_view.h"
#include "proto/harrier.pb.h"

namespace harrier {

// The first wire piece of a chunk: `header` serialised (its payload field is
// ignored and must be empty), then field 11's tag and `payload_size`.
std::string EncodeChunkPrefix(const proto::TensorChunk& header, size_t payload_size);

// Parses one received TensorChunk message (any slicing, any field order, as
// a typed peer may send it) into its header fields and a view of its
// payload. The payload view points into `slices`, which the caller keeps
// alive and unchanged while it uses `payload`. INVALID_ARGUMENT for bytes
// that are not a TensorChunk.
absl::Status DecodeChunk(const std::vector<grpc::Slice>& slices, proto::TensorChunk* header,
                         PayloadView* payload);

}  // namespace harrier

#endif  // HARRIER_COMMON_CHUNK_WIRE_H_
