// A server interceptor that turns gRPC's answer to a request it could not parse (INTERNAL
// with an empty message: malformed protobuf bytes, or a string field that is not UTF-8) into
// INVALID_ARGUMENT naming the method and what to check. Every other status passes unchanged.
#pragma once

#include <memory>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace recall::grpcutil {

// For grpc::ServerBuilder::experimental().SetInterceptorCreators.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
ParseErrorInterceptors();

}  // namespace recall::grpcutil
