#include "server/param_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "common/crc32c.h"

namespace harrier {

ParamBuffer::ParamBuffer(size_t num_elements)
    : data_(static_cast<float*>(std::aligned_alloc(
          64, std::max<size_t>(64, (num_elements * sizeof(float) + 63) / 64 * 64)))),
      size_(num_elements) {
  if (data_ == nullptr) throw std::bad_alloc();  // as std::vector would
}

ParamBuffer::~ParamBuffer() { std::free(data_); }

uint32_t ParamBuffer::Crc() const {
  uint64_t cached = crc_.load(std::memory_order_acquire);
  if (cached == 0) {
    cached = (uint64_t{1} << 32) | Crc32c(data_, bytes());
    crc_.store(cached, std::memory_order_release);
  }
  return static_cast<uint32_t>(cached);
}

}  // namespace harrier
