// The chunk codec alone: push encoding (dense chunks borrowed, compressed
// ones carrying the wire spec) and the pull side (reply checks, the mirror
// that compressed replies update).
#include "worker/chunk_codec.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "common/codec/codec.h"
#include "common/crc32c.h"
#include "common/partitioner.h"
#include "worker/tensor_table.h"

namespace harrier {
namespace {

constexpr size_t kElements = 8;

TensorInfo OneChunk(const std::string& name) {
  HashPartitioner partitioner(1);
  return TensorTable(partitioner, kElements).Plan(name, {kElements});
}

proto::TensorChunk Reply(const std::string& name, const std::string& payload, uint32_t codec,
                         const std::string& codec_params) {
  proto::TensorChunk reply;
  reply.set_key(name);
  reply.set_chunk(0);
  reply.set_num_elements(kElements);
  reply.set_codec(codec);
  reply.set_codec_params(codec_params);
  reply.set_checksum(Crc32c(payload.data(), payload.size()));
  return reply;
}

std::string Dense(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

TEST_CASE("dense pushes borrow the gradient; compressed ones name the codec") {
  auto dense = ChunkCodec::Create("none", "none", 0);
  REQUIRE(dense.ok());
  const TensorInfo info = OneChunk("w");
  REQUIRE((*dense)->AddTensor(info).ok());
  const std::vector<float> gradient(kElements, 2.0f);
  OutgoingChunk chunk;
  REQUIRE((*dense)->EncodePush({"w", 0}, gradient, 0, 0, &chunk).ok());
  CHECK(chunk.is_borrowed);
  CHECK(chunk.payload().data() == reinterpret_cast<const char*>(gradient.data()));
  CHECK(chunk.header.codec() == 0);
  // The transport takes the borrowed gradient's CRC as it sends it.
  CHECK(chunk.checksum_pending);
  const uint32_t crc = Crc32c(chunk.payload().data(), chunk.payload().size());
  CHECK(ChecksumOf(chunk) == crc);
  CHECK(WireHeader(chunk).checksum() == crc);

  auto topk = ChunkCodec::Create("topk:ratio=0.25", "none", 0);
  REQUIRE(topk.ok());
  REQUIRE((*topk)->AddTensor(info).ok());
  OutgoingChunk compressed;
  REQUIRE((*topk)->EncodePush({"w", 0}, gradient, 0, 0, &compressed).ok());
  CHECK_FALSE(compressed.is_borrowed);
  CHECK(compressed.header.codec() == static_cast<uint32_t>(CodecId::kTopK));
  CHECK_FALSE(compressed.checksum_pending);
  CHECK(compressed.header.checksum() ==
        Crc32c(compressed.payload().data(), compressed.payload().size()));
  CHECK(compressed.header.codec_params() == "topk:ratio=0.25");
}

TEST_CASE("compressed pull replies update the mirror that the first dense one set") {
  const std::string spec = "topk:ratio=0.25";
  auto codec = ChunkCodec::Create("none", spec, 0);
  REQUIRE(codec.ok());
  REQUIRE((*codec)->AddTensor(OneChunk("w")).ok());
  CHECK((*codec)->PullParams({"w", 0}) == spec);
  const std::vector<ChunkSpan> spans = OneChunk("w").groups[0].spans;
  std::vector<float> out(kElements, -1.0f);

  // The diff encoded as the shard would: top 2 of 8.
  std::vector<float> diff = {0, 0, 5, 0, 0, 0, -7, 0};
  std::string payload;
  auto encoder = CreateCodec(*CodecSpec::Parse(spec));
  REQUIRE((*encoder)->Encode(diff, CodecContext{}, &payload).ok());
  const proto::TensorChunk compressed =
      Reply("w", payload, static_cast<uint32_t>(CodecId::kTopK), spec);

  // Before any dense reply there is nothing to add the difference to.
  CHECK(absl::IsDataLoss(
      (*codec)->DecodePull("w", spans, compressed, PayloadView(payload), out.data())));
  CHECK(out == std::vector<float>(kElements, -1.0f));

  const std::vector<float> base = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string dense = Dense(base);
  REQUIRE((*codec)
              ->DecodePull("w", spans, Reply("w", dense, 0, ""), PayloadView(dense), out.data())
              .ok());
  CHECK(out == base);

  REQUIRE((*codec)->DecodePull("w", spans, compressed, PayloadView(payload), out.data()).ok());
  CHECK(out == std::vector<float>({1, 2, 8, 4, 5, 6, 0, 8}));
  // The mirror kept the sum: a second difference adds to it.
  REQUIRE((*codec)->DecodePull("w", spans, compressed, PayloadView(payload), out.data()).ok());
  CHECK(out == std::vector<float>({1, 2, 13, 4, 5, 6, -7, 8}));
}

TEST_CASE("the mirror records the view version of the last reply it applied") {
  const std::string spec = "topk:ratio=0.25";
  auto codec = ChunkCodec::Create("none", spec, 0);
  REQUIRE(codec.ok());
  REQUIRE((*codec)->AddTensor(OneChunk("w")).ok());
  const std::vector<ChunkSpan> spans = OneChunk("w").groups[0].spans;
  std::vector<float> out(kElements);
  CHECK((*codec)->ViewVersion({"w", 0}) == 0);  // no view yet: the shard answers dense
  const std::string dense = Dense(std::vector<float>(kElements, 1.0f));
  proto::TensorChunk first = Reply("w", dense, 0, "");
  first.set_view_version(41);
  REQUIRE((*codec)->DecodePull("w", spans, first, PayloadView(dense), out.data()).ok());
  CHECK((*codec)->ViewVersion({"w", 0}) == 41);
  std::string payload;
  auto encoder = CreateCodec(*CodecSpec::Parse(spec));
  REQUIRE((*encoder)
              ->Encode(std::vector<float>{0, 0, 5, 0, 0, 0, -7, 0}, CodecContext{}, &payload)
              .ok());
  proto::TensorChunk compressed = Reply("w", payload, static_cast<uint32_t>(CodecId::kTopK), spec);
  compressed.set_view_version(42);
  REQUIRE((*codec)->DecodePull("w", spans, compressed, PayloadView(payload), out.data()).ok());
  CHECK((*codec)->ViewVersion({"w", 0}) == 42);
  // A reply made for another view than the one held is refused.
  proto::TensorChunk other_base = compressed;
  other_base.set_pull_view_version(41);
  other_base.set_view_version(44);
  const std::vector<float> before = out;
  CHECK(absl::IsDataLoss(
      (*codec)->DecodePull("w", spans, other_base, PayloadView(payload), out.data())));
  CHECK((*codec)->ViewVersion({"w", 0}) == 42);
  other_base.set_pull_view_version(42);  // the right base applies
  REQUIRE((*codec)->DecodePull("w", spans, other_base, PayloadView(payload), out.data()).ok());
  CHECK((*codec)->ViewVersion({"w", 0}) == 44);
  CHECK(out != before);
  // A refused reply changes neither the view nor its version.
  compressed.set_view_version(43);
  compressed.set_checksum(compressed.checksum() ^ 1);
  CHECK_FALSE((*codec)->DecodePull("w", spans, compressed, PayloadView(payload), out.data()).ok());
  CHECK((*codec)->ViewVersion({"w", 0}) == 44);
  // A chunk pulled dense has no view.
  auto plain = ChunkCodec::Create("none", "none", 0);
  REQUIRE((*plain)->AddTensor(OneChunk("w")).ok());
  CHECK((*plain)->ViewVersion({"w", 0}) == 0);
}

TEST_CASE("a bad pull reply is refused and writes nothing") {
  const std::string spec = "topk:ratio=0.25";
  auto codec = ChunkCodec::Create("none", spec, 0);
  REQUIRE(codec.ok());
  REQUIRE((*codec)->AddTensor(OneChunk("w")).ok());
  const std::vector<ChunkSpan> spans = OneChunk("w").groups[0].spans;
  const std::string dense = Dense(std::vector<float>(kElements, 3.0f));
  std::vector<float> out(kElements, -1.0f);

  proto::TensorChunk corrupt = Reply("w", dense, 0, "");
  corrupt.set_checksum(corrupt.checksum() ^ 1);
  CHECK(
      absl::IsDataLoss((*codec)->DecodePull("w", spans, corrupt, PayloadView(dense), out.data())));
  CHECK(absl::IsDataLoss(
      (*codec)->DecodePull("v", spans, Reply("w", dense, 0, ""), PayloadView(dense), out.data())));
  const std::string short_payload = dense.substr(4);
  CHECK(absl::IsDataLoss((*codec)->DecodePull("w", spans, Reply("w", short_payload, 0, ""),
                                              PayloadView(short_payload), out.data())));
  REQUIRE((*codec)
              ->DecodePull("w", spans, Reply("w", dense, 0, ""), PayloadView(dense), out.data())
              .ok());
  std::fill(out.begin(), out.end(), -1.0f);
  std::string payload;
  auto other = CreateCodec(*CodecSpec::Parse("topk:ratio=0.5"));
  REQUIRE((*other)->Encode(std::vector<float>(kElements, 1.0f), CodecContext{}, &payload).ok());
  CHECK(absl::IsDataLoss((*codec)->DecodePull(
      "w", spans, Reply("w", payload, static_cast<uint32_t>(CodecId::kTopK), "topk:ratio=0.5"),
      PayloadView(payload), out.data())));
  CHECK(out == std::vector<float>(kElements, -1.0f));
}

// A codec holding "staged", a one-chunk tensor of staging buffers, and
// "plain", the same without.
std::unique_ptr<ChunkCodec> StagedAndPlainCodec() {
  auto codec = ChunkCodec::Create("none", "none", 0);
  REQUIRE(codec.ok());
  TensorInfo staged = OneChunk("staged");
  staged.staging_buffers = true;
  REQUIRE((*codec)->AddTensor(staged).ok());
  REQUIRE((*codec)->AddTensor(OneChunk("plain")).ok());
  return std::move(*codec);
}

TEST_CASE("a caller's staging buffers: pushes sent in place, pulls checked while copied") {
  auto codec = StagedAndPlainCodec();
  const std::vector<float> gradient(kElements, 2.0f);

  OutgoingChunk in_place;
  REQUIRE(codec->EncodePush({"staged", 0}, gradient, 0, 0, &in_place).ok());
  CHECK(in_place.is_borrowed);
  CHECK(in_place.checksum_pending);
  CHECK(in_place.send_in_place);
  OutgoingChunk copied;
  REQUIRE(codec->EncodePush({"plain", 0}, gradient, 0, 0, &copied).ok());
  CHECK(copied.is_borrowed);
  CHECK_FALSE(copied.send_in_place);

  // The reply in two pieces, as gRPC hands them over.
  std::vector<float> values(kElements);
  for (size_t i = 0; i < kElements; ++i) values[i] = 0.5f * static_cast<float>(i);
  const std::string dense = Dense(values);
  PayloadView pieces;
  pieces.Append(absl::string_view(dense).substr(0, 12));
  pieces.Append(absl::string_view(dense).substr(12));
  const std::vector<ChunkSpan> spans = OneChunk("staged").groups[0].spans;
  std::vector<float> out(kElements, -1.0f);
  REQUIRE(
      codec->DecodePull("staged", spans, Reply("staged", dense, 0, ""), pieces, out.data()).ok());
  CHECK(out == values);

  // A corrupt reply fails the pull either way; only the staging is written.
  proto::TensorChunk corrupt = Reply("staged", dense, 0, "");
  corrupt.set_checksum(corrupt.checksum() ^ 1);
  std::fill(out.begin(), out.end(), -1.0f);
  const absl::Status staging_status =
      codec->DecodePull("staged", spans, corrupt, pieces, out.data());
  CHECK(absl::IsDataLoss(staging_status));
  CHECK(out == values);
  proto::TensorChunk corrupt_plain = Reply("plain", dense, 0, "");
  corrupt_plain.set_checksum(corrupt_plain.checksum() ^ 1);
  std::fill(out.begin(), out.end(), -1.0f);
  CHECK(absl::IsDataLoss(codec->DecodePull("plain", OneChunk("plain").groups[0].spans,
                                           corrupt_plain, pieces, out.data())));
  CHECK(out == std::vector<float>(kElements, -1.0f));
}

TEST_CASE("a staging buffer takes dense replies in place, then checks them there") {
  auto codec = StagedAndPlainCodec();
  const std::vector<ChunkSpan> spans = OneChunk("staged").groups[0].spans;
  const size_t bytes = kElements * sizeof(float);
  std::vector<float> values(kElements);
  for (size_t i = 0; i < kElements; ++i) values[i] = 0.25f * static_cast<float>(i);
  const std::string dense = Dense(values);
  std::vector<float> out(kElements, -1.0f);

  CHECK(codec->LandsInStaging("staged"));
  CHECK_FALSE(codec->LandsInStaging("plain"));
  const ReplyLanding landing =
      codec->LandInStaging("staged", spans, Reply("staged", dense, 0, ""), bytes, out.data());
  CHECK(landing.data == out.data());
  CHECK(landing.capacity == bytes);
  CHECK(landing.memory == MemoryKind::kHost);
  // Nowhere: another tensor, another size, a compressed reply, a tensor
  // that is not staging.
  CHECK(
      codec->LandInStaging("staged", spans, Reply("other", dense, 0, ""), bytes, out.data()).data ==
      nullptr);
  CHECK(codec->LandInStaging("staged", spans, Reply("staged", dense, 0, ""), bytes - 4, out.data())
            .data == nullptr);
  CHECK(codec
            ->LandInStaging(
                "staged", spans,
                Reply("staged", dense, static_cast<uint32_t>(CodecId::kTopK), "topk:ratio=0.5"),
                bytes, out.data())
            .data == nullptr);
  CHECK(codec
            ->LandInStaging("plain", OneChunk("plain").groups[0].spans,
                            Reply("plain", dense, 0, ""), bytes, out.data())
            .data == nullptr);

  // The transport received the reply where the landing said: checked there.
  std::memcpy(out.data(), dense.data(), bytes);
  const PayloadView landed(absl::string_view(reinterpret_cast<const char*>(out.data()), bytes));
  REQUIRE(
      codec->DecodePull("staged", spans, Reply("staged", dense, 0, ""), landed, out.data()).ok());
  CHECK(out == values);
  CHECK(codec->landed_in_staging_bytes() == bytes);
  proto::TensorChunk corrupt = Reply("staged", dense, 0, "");
  corrupt.set_checksum(corrupt.checksum() ^ 1);
  CHECK(absl::IsDataLoss(codec->DecodePull("staged", spans, corrupt, landed, out.data())));
  // A reply that failed its check is not counted as landed.
  CHECK(codec->landed_in_staging_bytes() == bytes);
}

TEST_CASE("a CRC the transport took as the bytes arrived is what a reply is checked by") {
  auto codec = StagedAndPlainCodec();
  std::vector<float> values(kElements);
  for (size_t i = 0; i < kElements; ++i) values[i] = 1.5f * static_cast<float>(i);
  const std::string dense = Dense(values);
  const uint32_t crc = Crc32c(dense.data(), dense.size());

  for (const std::string name : {"plain", "staged"}) {
    INFO(name);
    const std::vector<ChunkSpan> spans = OneChunk(name).groups[0].spans;
    std::vector<float> out(kElements, -1.0f);
    PayloadView received(dense);
    received.set_crc32c(crc);
    REQUIRE(codec->DecodePull(name, spans, Reply(name, dense, 0, ""), received, out.data()).ok());
    CHECK(out == values);

    // The transport's CRC differs from the header's: refused, nothing
    // written, even though the bytes themselves match the header (the
    // codec does not read them again).
    std::fill(out.begin(), out.end(), -1.0f);
    PayloadView damaged(dense);
    damaged.set_crc32c(crc ^ 1);
    CHECK(absl::IsDataLoss(
        codec->DecodePull(name, spans, Reply(name, dense, 0, ""), damaged, out.data())));
    CHECK(out == std::vector<float>(kElements, -1.0f));
  }

  // Landed in place: the transport's CRC stands for the landed bytes.
  const std::vector<ChunkSpan> spans = OneChunk("staged").groups[0].spans;
  std::vector<float> out = values;
  PayloadView landed(absl::string_view(reinterpret_cast<const char*>(out.data()), dense.size()));
  landed.set_crc32c(crc ^ 1);
  CHECK(absl::IsDataLoss(
      codec->DecodePull("staged", spans, Reply("staged", dense, 0, ""), landed, out.data())));
  landed.set_crc32c(crc);
  REQUIRE(
      codec->DecodePull("staged", spans, Reply("staged", dense, 0, ""), landed, out.data()).ok());
  // Only the landing that passed its check counts.
  CHECK(codec->landed_in_staging_bytes() == dense.size());
}

TEST_CASE("chunks below compress_min_bytes travel dense both ways") {
  auto codec = ChunkCodec::Create("topk:ratio=0.25", "topk:ratio=0.25", 1 << 20);
  REQUIRE(codec.ok());
  REQUIRE((*codec)->AddTensor(OneChunk("w")).ok());
  CHECK((*codec)->PullParams({"w", 0}).empty());
  const std::vector<float> gradient(kElements, 1.0f);
  OutgoingChunk chunk;
  REQUIRE((*codec)->EncodePush({"w", 0}, gradient, 0, 0, &chunk).ok());
  CHECK(chunk.is_borrowed);
  CHECK(chunk.header.codec() == 0);
  CHECK(chunk.header.pull_codec_params().empty());
}

}  // namespace
}  // namespace harrier
