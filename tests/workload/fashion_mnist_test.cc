#include "worker/workload/fashion_mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace harrier::workload {
namespace {

using Bytes = std::vector<unsigned char>;

// A fresh directory under Bazel's per-test temp dir.
std::string MakeTempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  mkdir(dir.c_str(), 0755);
  return dir;
}

void AppendBigEndian32(uint32_t value, Bytes* out) {
  out->push_back(static_cast<unsigned char>(value >> 24));
  out->push_back(static_cast<unsigned char>(value >> 16));
  out->push_back(static_cast<unsigned char>(value >> 8));
  out->push_back(static_cast<unsigned char>(value));
}

// IDX image file of `count` images of rows x cols; pixel k of image i is
// (i * 7 + k) % 256 so contents are checkable.
Bytes ImageFile(uint32_t count, uint32_t rows, uint32_t cols,
                uint32_t magic = 0x803) {
  Bytes out;
  AppendBigEndian32(magic, &out);
  AppendBigEndian32(count, &out);
  AppendBigEndian32(rows, &out);
  AppendBigEndian32(cols, &out);
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t k = 0; k < rows * cols; ++k) {
      out.push_back(static_cast<unsigned char>((i * 7 + k) % 256));
    }
  }
  return out;
}

Bytes LabelFile(const std::vector<unsigned char>& labels,
                uint32_t magic = 0x801) {
  Bytes out;
  AppendBigEndian32(magic, &out);
  AppendBigEndian32(static_cast<uint32_t>(labels.size()), &out);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void WritePlain(const std::string& path, const Bytes& bytes) {
  FILE* file = std::fopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size());
  REQUIRE(std::fclose(file) == 0);
}

void WriteGzip(const std::string& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
}

Bytes ReadPlain(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "rb");
  REQUIRE(file != nullptr);
  Bytes out;
  int c;
  while ((c = std::fgetc(file)) != EOF) out.push_back(static_cast<unsigned char>(c));
  std::fclose(file);
  return out;
}

Bytes Truncate(Bytes bytes, size_t drop) {
  bytes.resize(bytes.size() - drop);
  return bytes;
}

// Writes a test split (t10k-*) into `dir`, images gzip'd, labels plain, so
// both naming forms are exercised.
void WriteSplit(const std::string& dir, const Bytes& images,
                const Bytes& labels) {
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz", images);
  WritePlain(dir + "/t10k-labels-idx1-ubyte", labels);
}

const std::vector<unsigned char> kFiveLabels = {0, 9, 3, 3, 1};

void ExpectError(const absl::StatusOr<Dataset>& result, absl::StatusCode code,
                 const std::string& file) {
  INFO(result.status().ToString());
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == code);
  CHECK(absl::StrContains(result.status().message(), file));
}

TEST_CASE("loads the real Fashion-MNIST splits") {
  absl::StatusOr<Dataset> train =
      LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
  REQUIRE(train.ok());
  absl::StatusOr<Dataset> test =
      LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  REQUIRE(test.ok());
  for (const auto& [data, expected] :
       {std::make_pair(&*train, 60000), std::make_pair(&*test, 10000)}) {
    REQUIRE(data->num_examples == expected);
    REQUIRE(data->rows == 28);
    REQUIRE(data->cols == 28);
    REQUIRE(data->images.size() == size_t{28} * 28 * expected);
    REQUIRE(data->labels.size() == static_cast<size_t>(expected));
    // Fashion-MNIST is balanced: every class has a tenth of the examples.
    std::array<int, 10> counts{};
    for (uint8_t label : data->labels) {
      REQUIRE(label < 10);
      ++counts[label];
    }
    for (int count : counts) CHECK(count == expected / 10);
    float lo = 1.0f, hi = 0.0f;
    for (float pixel : data->images) {
      lo = std::min(lo, pixel);
      hi = std::max(hi, pixel);
    }
    CHECK(lo == 0.0f);
    CHECK(hi == 1.0f);
  }
}

TEST_CASE("loads gzip and plain IDX files and scales pixels") {
  const std::string dir = MakeTempDir("valid");
  WriteSplit(dir, ImageFile(5, 3, 2), LabelFile(kFiveLabels));
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir, Split::kTest);
  INFO(data.status().ToString());
  REQUIRE(data.ok());
  REQUIRE(data->num_examples == 5);
  REQUIRE(data->rows == 3);
  REQUIRE(data->cols == 2);
  REQUIRE(data->labels == std::vector<uint8_t>(kFiveLabels.begin(),
                                               kFiveLabels.end()));
  // Image 4, pixel 5: (4 * 7 + 5) % 256 = 33.
  CHECK(data->image(4)[5] == Approx(33.0f / 255.0f));
}

TEST_CASE("prefers the .gz file when both forms exist") {
  const std::string dir = MakeTempDir("both");
  WriteSplit(dir, ImageFile(5, 3, 2), LabelFile(kFiveLabels));
  // A broken plain copy must not be read.
  WritePlain(dir + "/t10k-images-idx3-ubyte", Bytes{1, 2, 3});
  REQUIRE(LoadFashionMnist(dir, Split::kTest).ok());
}

TEST_CASE("missing files are NotFound and named") {
  const std::string dir = MakeTempDir("missing");
  ExpectError(LoadFashionMnist(dir, Split::kTrain), absl::StatusCode::kNotFound,
              "train-images-idx3-ubyte");
  WriteGzip(dir + "/train-images-idx3-ubyte.gz", ImageFile(5, 3, 2));
  ExpectError(LoadFashionMnist(dir, Split::kTrain), absl::StatusCode::kNotFound,
              "train-labels-idx1-ubyte");
  ExpectError(LoadIdxPair(dir + "/nope", dir + "/nope2"),
              absl::StatusCode::kNotFound, dir + "/nope");
}

TEST_CASE("corrupt headers and contents are rejected with the file named") {
  const std::string dir = MakeTempDir("corrupt");
  const std::string images = dir + "/t10k-images-idx3-ubyte.gz";
  const std::string labels = dir + "/t10k-labels-idx1-ubyte";
  const Bytes good_labels = LabelFile(kFiveLabels);

  SECTION("wrong image magic") {
    WriteSplit(dir, ImageFile(5, 3, 2, 0x801), good_labels);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kInvalidArgument, images);
  }
  SECTION("wrong label magic") {
    WriteSplit(dir, ImageFile(5, 3, 2), LabelFile(kFiveLabels, 0x803));
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kInvalidArgument, labels);
  }
  SECTION("zero-sized dimension") {
    WriteSplit(dir, ImageFile(5, 0, 2), good_labels);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kInvalidArgument, images);
  }
  SECTION("absurd dimensions fail without a huge allocation") {
    Bytes header;
    for (uint32_t v : {0x803u, 0x7fffffffu, 4096u, 4096u}) {
      AppendBigEndian32(v, &header);
    }
    WriteSplit(dir, header, good_labels);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kInvalidArgument, images);
  }
  SECTION("label out of range") {
    WriteSplit(dir, ImageFile(5, 3, 2), LabelFile({0, 1, 10, 2, 3}));
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kInvalidArgument, labels);
  }
  SECTION("image and label counts disagree") {
    WriteSplit(dir, ImageFile(4, 3, 2), good_labels);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kInvalidArgument, labels);
  }
  SECTION("truncated header") {
    WriteSplit(dir, Truncate(ImageFile(5, 3, 2), 5 * 6 + 6), good_labels);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kDataLoss, images);
  }
  SECTION("truncated pixels") {
    WriteSplit(dir, Truncate(ImageFile(5, 3, 2), 1), good_labels);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kDataLoss, images);
  }
  SECTION("truncated labels") {
    WriteSplit(dir, ImageFile(5, 3, 2), Truncate(good_labels, 2));
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kDataLoss, labels);
  }
  SECTION("trailing bytes") {
    Bytes long_labels = good_labels;
    long_labels.push_back(0);
    WriteSplit(dir, ImageFile(5, 3, 2), long_labels);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kDataLoss, labels);
  }
  SECTION("truncated gzip stream") {
    WriteSplit(dir, ImageFile(50, 28, 28), LabelFile(Bytes(50, 1)));
    const Bytes compressed = ReadPlain(images);
    WritePlain(images, Truncate(compressed, compressed.size() / 2));
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kDataLoss, images);
  }
  SECTION("gzip trailer with a bad checksum") {
    WriteSplit(dir, ImageFile(5, 3, 2), good_labels);
    Bytes compressed = ReadPlain(images);
    compressed[compressed.size() - 8] ^= 0xff;  // first byte of the CRC-32
    WritePlain(images, compressed);
    ExpectError(LoadFashionMnist(dir, Split::kTest),
                absl::StatusCode::kDataLoss, images);
  }
}

// n examples of 1x2 pixels; example i's first pixel encodes i.
Dataset Numbered(int n) {
  Dataset data;
  data.num_examples = n;
  data.rows = 1;
  data.cols = 2;
  for (int i = 0; i < n; ++i) {
    data.images.push_back(static_cast<float>(i));
    data.images.push_back(-1.0f);
    data.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return data;
}

TEST_CASE("shards cover every example exactly once") {
  for (int n : {0, 1, 7, 10, 1001}) {
    const Dataset data = Numbered(n);
    for (int workers : {1, 2, 3, 4, 7, 16}) {
      std::vector<int> seen(n, 0);
      int smallest = n, largest = 0;
      for (int rank = 0; rank < workers; ++rank) {
        const Dataset shard = ShardOf(data, rank, workers);
        REQUIRE(shard.rows == 1);
        REQUIRE(shard.cols == 2);
        REQUIRE(shard.images.size() == size_t{2} * shard.num_examples);
        REQUIRE(shard.labels.size() == static_cast<size_t>(shard.num_examples));
        smallest = std::min(smallest, shard.num_examples);
        largest = std::max(largest, shard.num_examples);
        for (int i = 0; i < shard.num_examples; ++i) {
          const int original = static_cast<int>(shard.image(i)[0]);
          REQUIRE(original >= 0);
          REQUIRE(original < n);
          REQUIRE(shard.labels[i] == original % 10);
          ++seen[original];
        }
      }
      INFO("n=" << n << " workers=" << workers);
      for (int count : seen) REQUIRE(count == 1);
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK(ShardOf(Numbered(10), 3, 3).num_examples == 0);
  CHECK(ShardOf(Numbered(10), -1, 3).num_examples == 0);
}

TEST_CASE("subset takes a prefix") {
  const Dataset data = Numbered(10);
  const Dataset four = Subset(data, 4);
  REQUIRE(four.num_examples == 4);
  REQUIRE(four.images.size() == 8);
  CHECK(four.image(3)[0] == 3.0f);
  CHECK(Subset(data, 100).num_examples == 10);
  CHECK(Subset(data, -1).num_examples == 10);
  CHECK(Subset(data, 0).num_examples == 0);
}

}  // namespace
}  // namespace harrier::workload
