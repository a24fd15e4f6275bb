#ifndef HARRIER_SERVER_PARAM_BUFFER_H_
#define HARRIER_SERVER_PARAM_BUFFER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace harrier {

// One version of a dense chunk's parameters: 64-byte aligned floats. A
// chunk publishes a version and never writes it again while anyone else
// holds it (copy-on-write), so a pull may send it as it is, holding a
// reference until its transport is done with the bytes. Thread-safe to read
// once published; writes only by its chunk, under the chunk's lock, while
// it is the sole holder.
class ParamBuffer {
 public:
  explicit ParamBuffer(size_t num_elements);  // contents uninitialised
  ~ParamBuffer();
  ParamBuffer(const ParamBuffer&) = delete;
  ParamBuffer& operator=(const ParamBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(float); }
  // CRC32C of the bytes, computed by the first caller and cached: once per
  // version, not once per pull. Racing callers compute the same value.
  uint32_t Crc() const;
  // The bytes are about to change (the sole holder writes them).
  void Invalidate() { crc_.store(0, std::memory_order_relaxed); }

 private:
  float* const data_;
  const size_t size_;
  // (1 << 32) | crc once known; 0 before.
  mutable std::atomic<uint64_t> crc_{0};
};

}  // namespace harrier

#endif  // HARRIER_SERVER_PARAM_BUFFER_H_
