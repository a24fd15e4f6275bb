#include "worker/tensor_table.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace harrier {

TensorTable::TensorTable(const Partitioner& partitioner, size_t chunk_elements)
    : partitioner_(partitioner), chunk_elements_(std::max<size_t>(1, chunk_elements)) {}

TensorInfo TensorTable::Plan(const std::string& name, const std::vector<int64_t>& shape) const {
  TensorInfo info;
  info.name = name;
  info.shape = shape;
  info.num_elements = 1;
  for (int64_t dim : shape) info.num_elements *= static_cast<size_t>(dim);
  std::map<int, ShardGroup> by_shard;
  for (const ChunkSpan& span :
       SplitIntoChunks(name, info.num_elements, chunk_elements_, partitioner_)) {
    by_shard[span.shard].shard = span.shard;
    by_shard[span.shard].spans.push_back(span);
  }
  for (auto& entry : by_shard) info.groups.push_back(std::move(entry.second));
  return info;
}

void TensorTable::Add(TensorInfo info) {
  auto entry = std::make_shared<const TensorInfo>(std::move(info));
  absl::MutexLock lock(&mutex_);
  tensors_[entry->name] = std::move(entry);
}

absl::StatusOr<std::shared_ptr<const TensorInfo>> TensorTable::Find(
    const std::string& name) const {
  absl::ReaderMutexLock lock(&mutex_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' is not registered"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<const TensorInfo>> TensorTable::Lookup(const std::string& name,
                                                                      size_t elements) const {
  absl::StatusOr<std::shared_ptr<const TensorInfo>> found = Find(name);
  if (!found.ok()) return found.status();
  std::shared_ptr<const TensorInfo> info = *std::move(found);
  if (info->num_elements != elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has ", info->num_elements,
                                                   " elements, got a buffer of ", elements));
  }
  return info;
}

absl::StatusOr<std::shared_ptr<const TensorInfo>> TensorTable::LookupPair(
    const std::string& name, size_t in_elements, size_t out_elements) const {
  auto info = Lookup(name, in_elements);
  if (info.ok() && out_elements != in_elements) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': output buffer of ",
                                                   out_elements, " elements for ", in_elements));
  }
  return info;
}

}  // namespace harrier
