// recall.v1.Registry on the coordinator: workers register themselves (and are drained) here.
// Registration is the cluster's act, not a tenant's: with a cluster credential
// (--cluster-token-file) only calls carrying it are accepted (none: UNAUTHENTICATED; a
// tenant's API key: PERMISSION_DENIED). Without one the registry is open when tenants are
// off (local use), and closed (FAILED_PRECONDITION) when API keys are on, since any tenant
// could otherwise add or drain workers.
#pragma once

#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/grpc/cluster_credential.h"
#include "common/logging.h"
#include "coordinator/auth.h"
#include "coordinator/worker_registry.h"
#include "recall/v1/registry.grpc.pb.h"

namespace recall::coordinator {

class RegistryService final : public v1::Registry::Service {
 public:
  RegistryService(WorkerRegistry& workers, const ApiKeys& keys, grpcutil::ClusterCredential cluster)
      : workers_(workers), keys_(keys), cluster_(std::move(cluster)) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    if (grpc::Status st = Admit(*context); !st.ok()) {
      RefusedOnce(request->address(), st);
      return st;
    }
    const std::string& a = request->address();
    // (A port past 65535 was taken, and dialed wrapped around: 99999 as 34463.)
    if (a.size() > 256 || !flags::SplitHostPort("address", a).ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "address: expected HOST:PORT (port in [0, 65535])");
    }
    if (request->instance().size() > 64) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "instance: at most 64 bytes");
    }
    {
      absl::MutexLock lock(&mu_);
      refused_.erase(a);  // a later refusal (a token rotated again) is said again
    }
    workers_.Add(a, /*registered=*/true, request->instance());
    response->set_not_used(workers_.NotUsedReason(a));
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                     v1::DrainResponse*) override {
    if (grpc::Status st = Admit(*context); !st.ok()) return st;
    // (An unknown address was OK: a worker advertising another address than the one it
    // registered or was listed with heard nothing of it, and went on getting turns.)
    if (!workers_.Drain(request->address())) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "address: no worker \"" + request->address().substr(0, 256) +
                              "\" is known to this coordinator (registered or in --workers)");
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status Admit(const grpc::ServerContextBase& context) const {
    if (cluster_.enabled()) return cluster_.Check(context, "recall.v1.Registry");
    if (keys_.enabled()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "recall.v1.Registry is closed: this coordinator checks API keys and has "
                          "no --cluster-token-file, so workers cannot register (list them with "
                          "--workers, or give the coordinator and the workers a cluster token)");
    }
    return grpc::Status::OK;
  }

  // Said once per address until it registers (the worker repeats every 5 s): the worker says
  // why it cannot register, and the coordinator, whose clients then find no worker, said
  // nothing.
  void RefusedOnce(const std::string& address, const grpc::Status& st) {
    {
      absl::MutexLock lock(&mu_);
      if (refused_.size() >= 1024 || !refused_.insert(address.substr(0, 256)).second) return;
    }
    RECALL_LOG(WARNING) << "refused the registration of worker \"" << address.substr(0, 256)
                        << "\": " << st.error_message();
  }

  WorkerRegistry& workers_;
  const ApiKeys& keys_;
  const grpcutil::ClusterCredential cluster_;
  absl::Mutex mu_;
  std::set<std::string> refused_ ABSL_GUARDED_BY(mu_);  // addresses told of
};

}  // namespace recall::coordinator
