#include "common/grpc/server_start.h"

#include "absl/strings/str_cat.h"
#include "common/listen_socket.h"
#include "grpcpp/health_check_service_interface.h"

namespace recall::grpcutil {

absl::Status CannotListen(absl::string_view flag, const std::string& address,
                          absl::string_view otherwise) {
  const std::string reason = ReasonCannotListen(address);
  return absl::UnavailableError(absl::StrCat(flag, ": cannot listen on ", address,
                                             reason.empty() ? otherwise : ": ", reason));
}

void MarkServing(grpc::Server& server, std::initializer_list<absl::string_view> services) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(true);
  for (absl::string_view service : services) {
    health->SetServingStatus(std::string(service), true);
  }
}

}  // namespace recall::grpcutil
