// A server interceptor that turns gRPC's answer to a request it could not parse (malformed
// protobuf bytes, or a string field that is not UTF-8) into INVALID_ARGUMENT naming the method
// and what to check. gRPC says INTERNAL with an empty message on the synchronous API, and
// UNIMPLEMENTED with an empty message on the callback API (as for a method that does not
// exist, which stays UNIMPLEMENTED). Every other status passes unchanged.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace recall::grpcutil {

// For grpc::ServerBuilder::experimental().SetInterceptorCreators. `services`: the full names
// of the services registered (e.g. "recall.v1.Chat"), whose methods are the ones that exist.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
ParseErrorInterceptors(const std::vector<std::string>& services);

}  // namespace recall::grpcutil
