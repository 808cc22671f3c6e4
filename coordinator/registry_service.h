// recall.v1.Registry on the coordinator: workers register themselves (and are drained) here.
// The same API keys apply when auth is on: registration is an operator's act.
#pragma once

#include "coordinator/auth.h"
#include "coordinator/worker_registry.h"
#include "recall/v1/registry.grpc.pb.h"

namespace recall::coordinator {

class RegistryService final : public v1::Registry::Service {
 public:
  RegistryService(WorkerRegistry& workers, const ApiKeys& keys) : workers_(workers), keys_(keys) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse*) override {
    if (auto tenant = keys_.Authenticate(*context); !tenant.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(tenant.status().message()));
    }
    const std::string& a = request->address();
    if (a.empty() || a.find(':') == std::string::npos || a.size() > 256) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "address: expected HOST:PORT");
    }
    workers_.Add(a);
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                     v1::DrainResponse*) override {
    if (auto tenant = keys_.Authenticate(*context); !tenant.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(tenant.status().message()));
    }
    workers_.Drain(request->address());
    return grpc::Status::OK;
  }

 private:
  WorkerRegistry& workers_;
  const ApiKeys& keys_;
};

}  // namespace recall::coordinator
