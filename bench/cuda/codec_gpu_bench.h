// GPU codec throughput benchmark: device encode / decode versus a
// device-to-device cudaMemcpy of the same buffer.

#ifndef HARRIER_BENCH_CUDA_CODEC_GPU_BENCH_H_
#define HARRIER_BENCH_CUDA_CODEC_GPU_BENCH_H_

namespace harrier::bench {

// For every (codec, d): best-of-repetitions time of DeviceCodec::Encode
// (device input to host payload) and Decode (host payload to device output),
// and of a device-to-device copy of the 4d input bytes; throughput in GB/s of
// fp32 input. One JSON line per pair on stdout:
//   {"bench":"codec_gpu","codec":..,"elements":..,"encode_gbps":..,
//    "decode_gbps":..,"memcpy_gbps":..,"encode_ratio":..,"decode_ratio":..,
//    "wire_bytes":..}
// argv[0] is the binary's name. Flags as RunCodecBench: --sizes=,
// --codecs=SPEC;SPEC, --min_time=, --help. Returns 0 on success, 1 on a
// codec or CUDA failure (including no device), 2 on a usage error.
int RunCodecGpuBench(int argc, char** argv);

}  // namespace harrier::bench

#endif  // HARRIER_BENCH_CUDA_CODEC_GPU_BENCH_H_
