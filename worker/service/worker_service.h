// WorkerService: the gRPC face of the Scheduler (proto/recall/v1/worker.proto). Converts
// requests to engine calls at the edge and engine statuses to gRPC codes; applies the
// documented defaults of unset fields. Streams are read by a per-RPC thread that takes all
// pending tokens at once, so a slow reader gets coalesced messages and never slows the
// batch; a cancelled stream aborts its turn within one step.
#pragma once

#include <string>

#include "grpcpp/grpcpp.h"
#include "recall/v1/worker.grpc.pb.h"
#include "worker/serving/scheduler.h"

namespace recall::service {

struct WorkerIdentity {
  std::string model;       // e.g. the model path's last component
  int tp_size = 1;
  std::string version;
};

grpc::Status ToGrpcStatus(const absl::Status& status);

// Wire request -> engine request, with the documented defaults for unset fields.
serving::TurnRequest FromProto(const v1::RunTurnRequest& request, int default_max_tokens);

class WorkerService final : public v1::Worker::Service {
 public:
  WorkerService(serving::Scheduler& scheduler, WorkerIdentity identity);

  grpc::Status RunTurn(grpc::ServerContext* context, const v1::RunTurnRequest* request,
                       grpc::ServerWriter<v1::TurnEvent>* writer) override;
  grpc::Status DropSession(grpc::ServerContext* context, const v1::DropSessionRequest* request,
                           v1::DropSessionResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status GetLoad(grpc::ServerContext* context, const v1::GetLoadRequest* request,
                       v1::LoadReport* response) override;
  grpc::Status Info(grpc::ServerContext* context, const v1::InfoRequest* request,
                    v1::InfoResponse* response) override;

 private:
  serving::Scheduler& scheduler_;
  const WorkerIdentity identity_;
};

}  // namespace recall::service
