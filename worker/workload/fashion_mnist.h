#ifndef HARRIER_WORKER_WORKLOAD_FASHION_MNIST_H_
#define HARRIER_WORKER_WORKLOAD_FASHION_MNIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace harrier::workload {

// Where Debian's dataset-fashion-mnist package installs the IDX files.
constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST has ten classes; labels are in [0, kNumClasses).
constexpr int kFashionMnistClasses = 10;

enum class Split { kTrain, kTest };

// Images and labels held in memory. A plain value: copyable, movable,
// thread-compatible.
struct Dataset {
  int num_examples = 0;
  int rows = 0;
  int cols = 0;
  // num_examples * rows * cols pixels, example-major then row-major,
  // scaled from bytes to [0, 1].
  std::vector<float> images;
  // num_examples labels, each in [0, kFashionMnistClasses).
  std::vector<uint8_t> labels;

  int example_size() const { return rows * cols; }
  const float* image(int i) const {
    return images.data() + static_cast<size_t>(i) * example_size();
  }
};

// Loads one split of Fashion-MNIST from `data_dir`, which holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each gzip-compressed with a
// ".gz" suffix (preferred) or uncompressed without it.
//
// Errors name the offending file: NotFound when neither form exists,
// DataLoss when a file is truncated, has trailing bytes or is corrupt gzip,
// InvalidArgument for a wrong magic number, bad dimensions, a label >= 10 or
// image and label counts that disagree. Thread-safe (no shared state).
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& data_dir,
                                         Split split);

// The same checks for an explicit pair of IDX files (either may be gzip or
// plain; zlib detects which), for data sets laid out differently.
absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_path,
                                    const std::string& labels_path);

// The examples worker `rank` of `num_workers` trains on: the contiguous
// range [rank * n / num_workers, (rank + 1) * n / num_workers), so every
// example lands in exactly one shard and shard sizes differ by at most one.
// Requires 0 <= rank < num_workers; otherwise returns an empty data set
// with the same geometry.
Dataset ShardOf(const Dataset& data, int rank, int num_workers);

// The first min(max_examples, num_examples) examples (all when
// max_examples < 0), for quick runs and tests.
Dataset Subset(const Dataset& data, int max_examples);

}  // namespace harrier::workload

#endif  // HARRIER_WORKER_WORKLOAD_FASHION_MNIST_H_
