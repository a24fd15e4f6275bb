#include "worker/workload/fashion_mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace harrier::workload {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dim

// Generous bounds so a corrupt header fails cleanly instead of asking for
// gigabytes: real files are 28x28 and at most 60000 examples.
constexpr uint32_t kMaxSide = 4096;
constexpr uint64_t kMaxPixels = uint64_t{1} << 31;

// Bytes are read in chunks this size, so memory grows with what the file
// actually holds, not with what its header claims.
constexpr size_t kChunkBytes = size_t{1} << 20;

// A gzip (or plain: zlib passes those through) file opened for reading.
// Move-only; closes on destruction.
class GzReader {
 public:
  GzReader() = default;
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;
  ~GzReader() {
    if (file_ != nullptr) gzclose(file_);
  }

  absl::Status Open(const std::string& path) {
    path_ = path;
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ != nullptr) return absl::OkStatus();
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot open ", path, ": ",
                     err != 0 ? std::strerror(err) : "out of memory");
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::UnavailableError(message);
  }

  // Reads exactly `size` bytes; a short read means the file is truncated.
  absl::Status ReadExactly(void* dst, size_t size, const char* what) {
    auto* out = static_cast<unsigned char*>(dst);
    size_t done = 0;
    while (done < size) {
      const unsigned want =
          static_cast<unsigned>(std::min(size - done, kChunkBytes));
      const int got = gzread(file_, out + done, want);
      if (got < 0) return GzError(what);
      if (got == 0) {
        return absl::DataLossError(absl::StrCat(
            path_, " is truncated: reading ", what, " at byte ", offset_,
            ", ", size - done, " bytes short", ZlibDetail()));
      }
      done += static_cast<size_t>(got);
      offset_ += static_cast<uint64_t>(got);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> ReadBigEndian32(const char* what) {
    unsigned char b[4];
    absl::Status status = ReadExactly(b, sizeof(b), what);
    if (!status.ok()) return status;
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
           (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  // A file longer than its header says is as suspect as a short one; also
  // makes zlib verify the gzip trailer's CRC and length.
  absl::Status ExpectEnd() {
    unsigned char extra;
    const int got = gzread(file_, &extra, 1);
    if (got < 0) return GzError("the gzip trailer");
    if (got > 0) {
      return absl::DataLossError(absl::StrCat(
          path_, " is longer than its header says: data continues past byte ",
          offset_));
    }
    return absl::OkStatus();
  }

  const std::string& path() const { return path_; }

 private:
  std::string ZlibDetail() {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code == Z_OK || message == nullptr || *message == '\0') return "";
    // zlib prefixes its message with the path, which ours already names.
    absl::string_view text = message;
    absl::ConsumePrefix(&text, absl::StrCat(path_, ": "));
    return absl::StrCat(" (zlib: ", text, ")");
  }

  absl::Status GzError(const char* what) {
    return absl::DataLossError(absl::StrCat(path_, " is corrupt: reading ",
                                            what, " at byte ", offset_,
                                            ZlibDetail()));
  }

  gzFile file_ = nullptr;
  std::string path_;
  uint64_t offset_ = 0;  // decompressed bytes consumed so far
};

absl::Status CheckMagic(const GzReader& reader, uint32_t magic,
                        uint32_t expected, const char* kind) {
  if (magic == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(reader.path(), " is not an IDX ", kind, " file: magic 0x",
                   absl::Hex(magic, absl::kZeroPad8), ", expected 0x",
                   absl::Hex(expected, absl::kZeroPad8)));
}

absl::Status LoadImages(const std::string& path, Dataset* data) {
  GzReader reader;
  absl::Status status = reader.Open(path);
  if (!status.ok()) return status;
  absl::StatusOr<uint32_t> magic = reader.ReadBigEndian32("the magic number");
  if (!magic.ok()) return magic.status();
  status = CheckMagic(reader, *magic, kImagesMagic, "image");
  if (!status.ok()) return status;
  uint32_t dims[3];
  for (uint32_t& dim : dims) {
    absl::StatusOr<uint32_t> value = reader.ReadBigEndian32("the dimensions");
    if (!value.ok()) return value.status();
    dim = *value;
  }
  const uint32_t count = dims[0], rows = dims[1], cols = dims[2];
  const uint64_t pixels = uint64_t{count} * rows * cols;
  if (count == 0 || rows == 0 || cols == 0 || rows > kMaxSide ||
      cols > kMaxSide || pixels > kMaxPixels) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has implausible dimensions ", count, " x ", rows,
                     " x ", cols));
  }
  data->num_examples = static_cast<int>(count);
  data->rows = static_cast<int>(rows);
  data->cols = static_cast<int>(cols);
  data->images.clear();
  data->images.reserve(std::min<uint64_t>(pixels, kChunkBytes * 64));
  std::vector<unsigned char> chunk(kChunkBytes);
  for (uint64_t done = 0; done < pixels;) {
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(pixels - done, chunk.size()));
    status = reader.ReadExactly(chunk.data(), n, "pixels");
    if (!status.ok()) return status;
    for (size_t i = 0; i < n; ++i) {
      data->images.push_back(static_cast<float>(chunk[i]) * (1.0f / 255.0f));
    }
    done += n;
  }
  return reader.ExpectEnd();
}

absl::Status LoadLabels(const std::string& path, Dataset* data) {
  GzReader reader;
  absl::Status status = reader.Open(path);
  if (!status.ok()) return status;
  absl::StatusOr<uint32_t> magic = reader.ReadBigEndian32("the magic number");
  if (!magic.ok()) return magic.status();
  status = CheckMagic(reader, *magic, kLabelsMagic, "label");
  if (!status.ok()) return status;
  absl::StatusOr<uint32_t> count = reader.ReadBigEndian32("the label count");
  if (!count.ok()) return count.status();
  if (*count != static_cast<uint32_t>(data->num_examples)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds ", *count, " labels but the image file has ",
                     data->num_examples, " images"));
  }
  data->labels.resize(*count);
  status = reader.ReadExactly(data->labels.data(), data->labels.size(),
                              "labels");
  if (!status.ok()) return status;
  for (size_t i = 0; i < data->labels.size(); ++i) {
    if (data->labels[i] >= kFashionMnistClasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": label ", data->labels[i], " of example ", i,
          " is out of range [0, ", kFashionMnistClasses, ")"));
    }
  }
  return reader.ExpectEnd();
}

bool FileExists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

// Prefers the compressed file the Debian package ships; falls back to an
// uncompressed copy someone unpacked.
absl::StatusOr<std::string> ResolveIdxPath(const std::string& data_dir,
                                           const std::string& base) {
  std::string prefix = data_dir;
  if (!prefix.empty() && prefix.back() != '/') prefix += '/';
  const std::string compressed = absl::StrCat(prefix, base, ".gz");
  if (FileExists(compressed)) return compressed;
  const std::string plain = prefix + base;
  if (FileExists(plain)) return plain;
  return absl::NotFoundError(absl::StrCat(
      "Fashion-MNIST file not found: neither ", compressed, " nor ", plain,
      " exists (install dataset-fashion-mnist or pass another directory)"));
}

Dataset Slice(const Dataset& data, int begin, int end) {
  Dataset out;
  out.rows = data.rows;
  out.cols = data.cols;
  out.num_examples = end - begin;
  const size_t size = static_cast<size_t>(data.example_size());
  out.images.assign(data.images.begin() + begin * size,
                    data.images.begin() + end * size);
  out.labels.assign(data.labels.begin() + begin, data.labels.begin() + end);
  return out;
}

}  // namespace

absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_path,
                                    const std::string& labels_path) {
  Dataset data;
  absl::Status status = LoadImages(images_path, &data);
  if (!status.ok()) return status;
  status = LoadLabels(labels_path, &data);
  if (!status.ok()) return status;
  return data;
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& data_dir,
                                         Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  absl::StatusOr<std::string> images =
      ResolveIdxPath(data_dir, prefix + "-images-idx3-ubyte");
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels =
      ResolveIdxPath(data_dir, prefix + "-labels-idx1-ubyte");
  if (!labels.ok()) return labels.status();
  return LoadIdxPair(*images, *labels);
}

Dataset ShardOf(const Dataset& data, int rank, int num_workers) {
  if (num_workers <= 0 || rank < 0 || rank >= num_workers) {
    return Slice(data, 0, 0);
  }
  // 64-bit products: rank * num_examples can pass 2^31.
  const int64_t n = data.num_examples;
  const int begin = static_cast<int>(rank * n / num_workers);
  const int end = static_cast<int>((rank + 1) * n / num_workers);
  return Slice(data, begin, end);
}

Dataset Subset(const Dataset& data, int max_examples) {
  const int n = max_examples < 0
                    ? data.num_examples
                    : std::min(max_examples, data.num_examples);
  return Slice(data, 0, n);
}

}  // namespace harrier::workload
