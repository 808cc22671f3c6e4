// WorkerService: the gRPC face of the Scheduler (proto/recall/v1/worker.proto), on gRPC's
// callback API, so no thread is held per call. Converts requests to engine calls at the edge
// and engine statuses to gRPC codes; applies the documented defaults of unset fields.
// RunTurn streams through a RunTurnReactor (run_turn_reactor.h): tokens are written as the
// engine produces them, a slow reader gets coalesced messages and never slows the batch, and
// a cancelled call aborts its turn within one step. The unary calls answer without waiting
// on the engine thread (DropSession and Abort finish from the scheduler's completion).
#pragma once

#include <string>

#include "common/grpc/cluster_credential.h"
#include "grpcpp/grpcpp.h"
#include "recall/v1/worker.grpc.pb.h"
#include "worker/serving/scheduler.h"

namespace recall::service {

struct WorkerIdentity {
  std::string model;       // e.g. the model path's last component
  int tp_size = 1;
  std::string version;
  std::string instance;  // InfoResponse.instance: this process's random id
};

grpc::Status ToGrpcStatus(const absl::Status& status);

// Wire request -> engine request, with the documented defaults for unset fields.
serving::TurnRequest FromProto(const v1::RunTurnRequest& request, int default_max_tokens);
serving::CacheRequest FromProto(const v1::CacheSettings& cache);
// A session's cache settings as they resolve (a worker's defaults, or a request over them);
// kv_dtype is left unset.
v1::CacheSettings ToProto(const serving::CacheDefaults& cache);
// A turn's taken-back tokens (an Abort's answer, a TurnDone).
void ToProto(const serving::TakenBackTurn& taken, v1::TakenBackTurn* out);

class WorkerService final : public v1::Worker::CallbackService {
 public:
  // Every call must carry `cluster` (when it is enabled).
  WorkerService(serving::Scheduler& scheduler, WorkerIdentity identity,
                grpcutil::ClusterCredential cluster = grpcutil::ClusterCredential::Open());

  grpc::ServerWriteReactor<v1::TurnEvent>* RunTurn(grpc::CallbackServerContext* context,
                                                   const v1::RunTurnRequest* request) override;
  grpc::ServerUnaryReactor* DropSession(grpc::CallbackServerContext* context,
                                        const v1::DropSessionRequest* request,
                                        v1::DropSessionResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request,
                                    v1::LoadReport* response) override;
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const v1::InfoRequest* request,
                                 v1::InfoResponse* response) override;
  grpc::ServerUnaryReactor* CheckSession(grpc::CallbackServerContext* context,
                                         const v1::CheckSessionRequest* request,
                                         v1::CheckSessionResponse* response) override;

 private:
  serving::Scheduler& scheduler_;
  const WorkerIdentity identity_;
  const grpcutil::ClusterCredential cluster_;

  // The cluster check of a unary call: the reactor finished with its error, or nullptr.
  grpc::ServerUnaryReactor* Refused(grpc::CallbackServerContext* context);
};

}  // namespace recall::service
