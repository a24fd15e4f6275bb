#ifndef HARRIER_SERVER_STREAMED_UNARY_H_
#define HARRIER_SERVER_STREAMED_UNARY_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include "server/job_token.h"

namespace harrier {

// Serves a unary method registered as "streamed unary"
// (WithStreamedUnaryMethod_X): gRPC hands such a call over at its headers,
// before reading its message, where a plain unary handler runs only once
// gRPC has received the whole message. So the job token is checked before
// a byte of the body is taken in: a client without the token cannot make
// the shard buffer a large request (it is refused at its headers, as a push
// stream is). Then the one message is read, `handle(request, response)`
// runs as the unary handler would, and its response goes back. On gRPC's
// synchronous threads (bounded by --grpc_max_threads).
template <class Request, class Response, class Handler>
grpc::Status ServeStreamedUnary(const JobTokenCheck& token_check, grpc::ServerContext* context,
                                grpc::ServerUnaryStreamer<Request, Response>* streamer,
                                Handler&& handle) {
  if (auto status = token_check.Check(*context); !status.ok()) return status;
  Request request;
  if (!streamer->Read(&request)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the request message did not arrive");
  }
  Response response;
  if (grpc::Status status = handle(request, &response); !status.ok()) return status;
  if (!streamer->Write(response)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  return grpc::Status::OK;
}

}  // namespace harrier

#endif  // HARRIER_SERVER_STREAMED_UNARY_H_
