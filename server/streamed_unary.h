#ifndef HARRIER_SERVER_STREAMED_UNARY_H_
#define HARRIER_SERVER_STREAMED_UNARY_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include <utility>

#include "server/job_token.h"

namespace harrier {

// The server side of a unary method registered as "streamed unary"
// (WithStreamedUnaryMethod_X).
template <class Request, class Response>
using UnaryStreamer = grpc::ServerUnaryStreamer<Request, Response>;

// Serves a streamed-unary call its caller has admitted: reads the one
// message, runs `handle(request, response)` as the unary handler would, and
// writes its response back.
template <class Request, class Response, class Handler>
grpc::Status ServeAdmittedUnary(UnaryStreamer<Request, Response>* streamer, Handler&& handle) {
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

// Serves a unary method registered as streamed unary: gRPC hands such a
// call over at its headers, before reading its message, where a plain unary
// handler runs only once gRPC has received the whole message. So the job
// token is checked before a byte of the body is taken in: a client without
// the token cannot make the shard buffer a large request (it is refused at
// its headers, as a push stream is). On gRPC's synchronous threads (bounded
// by --grpc_max_threads).
template <class Request, class Response, class Handler>
grpc::Status ServeStreamedUnary(const JobTokenCheck& token_check, grpc::ServerContext* context,
                                UnaryStreamer<Request, Response>* streamer, Handler&& handle) {
  if (auto status = token_check.Check(*context); !status.ok()) return status;
  return ServeAdmittedUnary(streamer, std::forward<Handler>(handle));
}

}  // namespace harrier

#endif  // HARRIER_SERVER_STREAMED_UNARY_H_
