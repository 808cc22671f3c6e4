// A server interceptor over every status a server sends:
// - gRPC's answer to a request it could not parse (malformed protobuf bytes, or a string field
//   that is not UTF-8) becomes INVALID_ARGUMENT naming the method and what to check. gRPC says
//   INTERNAL with an empty message on the synchronous API, and UNIMPLEMENTED with an empty
//   message on the callback API (as for a method that does not exist, which stays
//   UNIMPLEMENTED).
// - A message longer than kMaxStatusMessageBytes is cut there (at a character), saying how
//   long it was. gRPC sends it in a trailer, which a peer refuses past its metadata limit (8 KiB
//   by default) with RESOURCE_EXHAUSTED in place of the status: an error quoting a 9000-byte
//   cache.policy reached the caller as "received initial metadata size exceeds limit", and a
//   worker's refusal of a new session's settings read to the coordinator as a worker that
//   could not check them (the session was made and every turn of it failed).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace recall::grpcutil {

inline constexpr size_t kMaxStatusMessageBytes = 2048;

// `message` cut to kMaxStatusMessageBytes as above (unchanged when shorter).
std::string CutStatusMessage(const std::string& message);

// For grpc::ServerBuilder::experimental().SetInterceptorCreators. `services`: the full names
// of the services registered (e.g. "recall.v1.Chat"), whose methods are the ones that exist.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
StatusInterceptors(const std::vector<std::string>& services);

}  // namespace recall::grpcutil
