#include "common/grpc_limits.h"

namespace harrier {

grpc::ChannelArguments MakeChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  args.SetInt("grpc.http2.bdp_probe", 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxHttp2FrameBytes);
  // Each Client gets its own TCP connections rather than sharing a global
  // subchannel pool with other clients in the process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

void ApplyServerTuning(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument("grpc.http2.bdp_probe", 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxHttp2FrameBytes);
}

}  // namespace harrier
