// Sends raw bytes as the request of a gRPC method, to see what a server answers to a request
// it cannot parse (and to a method that does not exist).
#pragma once

#include <chrono>
#include <future>
#include <string>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace recall::testing {

// `method`: e.g. "/recall.v1.Chat/CreateSession"; `bearer`: sent as "authorization: Bearer
// ..." when not empty. A server-streaming method answers with its status (and any messages,
// which are dropped).
inline grpc::Status RawCall(grpc::Channel* channel, const std::string& method,
                            const std::string& bytes, const std::string& bearer) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext ctx;
  if (!bearer.empty()) ctx.AddMetadata("authorization", "Bearer " + bearer);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status st) { done.set_value(std::move(st)); });
  return done.get_future().get();
}

}  // namespace recall::testing
