// ChatService: the public API (proto/recall/v1/chat.proto) on the coordinator.
//
// Converse, in order: authenticate; store the user message (durable before any worker sees
// it; Conversations::Begin); run the turn with a TurnRunner (turn_runner.h: routing, failover
// with resume tokens, history on request, another worker when one is full) and stream its
// tokens to the client; when the reply ends, store it and the binding (Conversations::Finish).
// A turn that fails for good (a bad request, no worker, the client cancelled) removes its user
// message again, so the transcript only holds turns that happened. Generate is one turn of a
// throwaway session, stored nowhere. The HTTP API (http_api.h) does the same through the same
// Conversations and TurnRunner.
//
// Converse and Generate are on gRPC's callback API: a TurnReactor (converse.cc) per call
// drives a TurnRunner and writes its events, and its OnCancel cancels the runner (and so the
// worker's turn) at once. Their session store steps run on a WorkPool, off gRPC's callback
// threads. The unary methods stay on the synchronous API: they do blocking store I/O (and
// DeleteSession a call to the worker), which belongs on the sync server's threads.
#pragma once

#include <memory>
#include <string>

#include "common/metrics/registry.h"
#include "coordinator/auth.h"
#include "coordinator/conversations.h"
#include "coordinator/create_requests.h"
#include "coordinator/session_store.h"
#include "coordinator/turn_runner.h"
#include "coordinator/work_pool.h"
#include "coordinator/worker_registry.h"
#include "recall/v1/chat.grpc.pb.h"

namespace recall::coordinator {

class ChatService final : public v1::Chat::WithCallbackMethod_Converse<
                              v1::Chat::WithCallbackMethod_Generate<v1::Chat::Service>> {
 public:
  // All must outlive the service.
  ChatService(Conversations& conversations, SessionStore& store, WorkerRegistry& workers,
              const ApiKeys& keys, metrics::Registry& metrics);

  // A session's metadata: entries, a key's bytes, and the bytes of all keys and values.
  static constexpr int kMaxMetadataEntries = 64;
  static constexpr size_t kMaxMetadataKeyBytes = 256;
  static constexpr size_t kMaxMetadataBytes = 16 << 10;
  // A ListSessions page's bytes at most (a default gRPC client reads messages up to 4 MiB).
  static constexpr size_t kMaxPageBytes = 3 << 20;

  grpc::Status CreateSession(grpc::ServerContext* context, const v1::CreateSessionRequest* request,
                             v1::Session* response) override;
  grpc::ServerWriteReactor<v1::ConverseEvent>* Converse(
      grpc::CallbackServerContext* context, const v1::ConverseRequest* request) override;
  grpc::Status GetSession(grpc::ServerContext* context, const v1::GetSessionRequest* request,
                          v1::Session* response) override;
  grpc::Status ListSessions(grpc::ServerContext* context, const v1::ListSessionsRequest* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status DeleteSession(grpc::ServerContext* context, const v1::DeleteSessionRequest* request,
                             v1::DeleteSessionResponse* response) override;
  grpc::ServerWriteReactor<v1::ConverseEvent>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;

 private:
  class TurnReactor;  // one Converse or Generate call (converse.cc)

  Conversations& conversations_;
  SessionStore& store_;
  WorkerRegistry& workers_;
  const ApiKeys& keys_;
  const CoordinatorOptions& options_;
  metrics::Registry& metrics_;
  // Converse's store steps after the turn: its end stored. Not store_pool_, whose threads a
  // session's next turns may hold while they wait for that end (Conversations::MarkRunning): a
  // client that cancelled turns in a row held them all, and the end they waited for came only
  // after their 10 s. (Declared first: store_pool_, whose steps start turns, goes first.)
  WorkPool end_pool_;
  WorkPool store_pool_;  // Converse's store steps before the turn runs
  CreateRequests create_requests_;  // CreateSession's request ids
};

}  // namespace recall::coordinator
