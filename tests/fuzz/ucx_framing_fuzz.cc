// Fuzz target: the UCX data path's framing (common/transport/framing.h) on
// an arbitrary active-message header: DecodeHeader, then what a receiver
// does with the body for each op (a chunk header, a pull request, a
// status), and how many data bytes are its body when it says the body came
// in the data. A decoded frame must re-encode to the same bytes, so sender
// and receiver agree on every field.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/transport/framing.h"
#include "proto/harrier.pb.h"

namespace transport = harrier::transport;

namespace {

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

std::vector<std::string> FuzzSeeds() {
  std::vector<std::string> seeds;
  harrier::proto::TensorChunk chunk;
  chunk.set_key("w");
  chunk.set_rank(1);
  chunk.set_clock(3);
  chunk.set_num_elements(16);
  transport::Frame frame;
  frame.op = transport::Op::kPush;
  frame.connection_id = 9;
  frame.request_id = 4;
  frame.index = 0;
  frame.count = 2;
  frame.payload_bytes = 64;
  frame.arg = 5000;
  seeds.push_back(transport::EncodeHeader(frame, transport::EncodeChunkHeader(chunk)));
  frame.op = transport::Op::kPull;
  harrier::proto::PullRequest pull;
  pull.set_rank(1);
  pull.set_clock(3);
  seeds.push_back(transport::EncodeHeader(frame, pull.SerializeAsString()));
  seeds.push_back(transport::EncodeStatus(9, 4, 1, absl::NotFoundError("no key w")));
  // A pull whose body (thousands of row ids) goes in the data.
  harrier::proto::ChunkRef* ref = pull.add_chunks();
  ref->set_key("emb");
  ref->set_row_ids(std::string(8 * 4096, '\x01'));
  transport::EncodedRequest large = transport::EncodeRequest(frame, pull.SerializeAsString());
  Check(large.data_prefix.size() > transport::kMaxHeaderBodyBytes);
  seeds.push_back(large.header);
  frame.op = transport::Op::kHello;
  // Regression (UBSan): a default string_view body has a null data().
  seeds.push_back(transport::EncodeHeader(frame, absl::string_view()));
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  transport::Frame frame;
  absl::string_view body;
  // A copy of exactly `size` bytes, so reading past the header is caught.
  const std::vector<char> header(data, data + size);
  if (!transport::DecodeHeader(header.data(), header.size(), &frame, &body).ok()) return 0;
  Check(body.data() >= header.data() && body.data() + body.size() == header.data() + header.size());
  const std::string expected(header.begin(), header.end());
  Check(transport::EncodeHeader(frame, body) == expected);
  // Any data length: a body in the data is within its bounds, or refused.
  for (uint64_t extra : {uint64_t{0}, uint64_t{4097}, uint64_t{64} << 20, uint64_t{1} << 40}) {
    const uint64_t length = frame.payload_bytes + extra;
    if (length < frame.payload_bytes) continue;  // wrapped
    auto in_data = transport::BodyBytesInData(frame, length);
    if (in_data.ok()) {
      Check(frame.body_in_data ? (*in_data > transport::kMaxHeaderBodyBytes &&
                                  *in_data <= transport::kMaxDataBodyBytes && *in_data == extra)
                               : (*in_data == 0 && extra == 0));
    }
  }

  switch (frame.op) {
    case transport::Op::kPush:
    case transport::Op::kPushPull:
    case transport::Op::kReplyChunk: {
      harrier::proto::TensorChunk chunk;
      if (chunk.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
        transport::EncodeChunkHeader(chunk);
      }
      break;
    }
    case transport::Op::kPull: {
      harrier::proto::PullRequest pull;
      pull.ParseFromArray(body.data(), static_cast<int>(body.size()));
      break;
    }
    case transport::Op::kStatus: {
      const absl::Status status = transport::DecodeStatus(frame, body);
      if (frame.arg < 0 || frame.arg > static_cast<int64_t>(absl::StatusCode::kUnauthenticated)) {
        Check(status.code() == absl::StatusCode::kInternal);
      } else {
        // A known code comes back as sent, with the body as its message.
        Check(static_cast<int64_t>(status.code()) == frame.arg);
        Check(status.ok() || status.message() == body);
      }
      break;
    }
    default:
      break;
  }
  return 0;
}
