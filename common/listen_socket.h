// A listening TCP socket on host:port, with the system's reason when it cannot be had. The
// metrics endpoint listens on it; the gRPC servers, which open their own sockets and say only
// that they failed, ask it why (ReasonCannotListen).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace recall {

// A socket bound to host:port (port 0: any free port) and listening; the caller closes it.
// Errors: INVALID_ARGUMENT for a host that does not resolve, UNAVAILABLE with the system's
// reason ("Address already in use", "Cannot assign requested address", ...) otherwise.
absl::StatusOr<int> ListenSocket(const std::string& host, int port);

// Why "host:port" cannot be listened on now, as ListenSocket finds it (the socket it gets, if
// any, is closed again): "" when it can, or the address does not parse.
std::string ReasonCannotListen(const std::string& address);

}  // namespace recall
