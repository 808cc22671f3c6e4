// What the coordinator and the worker do alike when their gRPC server starts: say why a port
// could not be listened on, and mark the server and its services SERVING in gRPC's health
// service (grpc.health.v1: Check("") and Check("recall.v1.Chat") etc. answer).
#pragma once

#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server.h"

namespace recall::grpcutil {

// UNAVAILABLE: "--listen: cannot listen on ADDRESS: <the system's reason>", the reason found
// by binding the address again (common/listen_socket.h); when that bind succeeds (the port
// was freed meanwhile, or the failure was not the socket's), `otherwise` is said instead,
// e.g. " (is the port free?)".
absl::Status CannotListen(absl::string_view flag, const std::string& address,
                          absl::string_view otherwise);

// Every named service, and the server as a whole (""), SERVING. SetServingStatus(false) on
// the server's health service later marks them all NOT_SERVING.
void MarkServing(grpc::Server& server, std::initializer_list<absl::string_view> services);

}  // namespace recall::grpcutil
