// The CPU codecs (codec.h, error_feedback.h) behind CodecBackend: push
// streams, pull mirrors and checksums on host memory. What the client uses
// for every tensor that lives in host memory.

#ifndef HARRIER_COMMON_CODEC_HOST_CODEC_BACKEND_H_
#define HARRIER_COMMON_CODEC_HOST_CODEC_BACKEND_H_

#include <memory>

#include "common/codec/codec_backend.h"

namespace harrier {

std::shared_ptr<CodecBackend> NewHostCodecBackend();

}  // namespace harrier

#endif  // HARRIER_COMMON_CODEC_HOST_CODEC_BACKEND_H_
