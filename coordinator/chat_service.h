// ChatService: the public API (proto/recall/v1/chat.proto) on the coordinator.
//
// Converse, in order: authenticate; store the user message (durable before any worker sees
// it); run the turn with a TurnRunner (turn_runner.h: routing, failover with resume tokens,
// history on request, another worker when one is full) and stream its tokens to the client;
// when the reply ends, store it and the binding. A turn that fails for good (a bad request,
// no worker, the client cancelled) removes its user message again, so the transcript only
// holds turns that happened. Generate is one turn of a throwaway session, stored nowhere.
//
// Converse and Generate are on gRPC's callback API: a TurnReactor (converse.cc) per call
// drives a TurnRunner and writes its events, and its OnCancel cancels the runner (and so the
// worker's turn) at once. Their session store steps run on a WorkPool, off gRPC's callback
// threads. The unary methods stay on the synchronous API: they do blocking store I/O (and
// DeleteSession a call to the worker), which belongs on the sync server's threads.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"
#include "coordinator/auth.h"
#include "coordinator/session_store.h"
#include "coordinator/turn_runner.h"
#include "coordinator/work_pool.h"
#include "coordinator/worker_registry.h"
#include "recall/v1/chat.grpc.pb.h"

namespace recall::coordinator {

struct CoordinatorOptions {
  size_t max_message_bytes = 256 << 10;  // user message / system prompt
  int max_turns = 10000;                 // exchanges per session
  int max_sessions_per_tenant = 100000;
  int max_attempts = 4;                  // workers tried for one turn
  int default_max_tokens = 256;          // the workers' default when a turn leaves it unset
  int store_threads = 4;                 // threads for Converse's session store steps
};

class ChatService final : public v1::Chat::WithCallbackMethod_Converse<
                              v1::Chat::WithCallbackMethod_Generate<v1::Chat::Service>> {
 public:
  ChatService(SessionStore& store, WorkerRegistry& workers, ApiKeys keys,
              CoordinatorOptions options, metrics::Registry& metrics);

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

  TurnRunnerOptions RunnerOptions() const;
  // The episodes a session's last turn reported (policy "episodic"); kept in memory only.
  void RememberEpisodes(const std::string& key, const v1::TurnDone& done);
  void ForgetEpisodes(const std::string& key);
  bool RecallEpisodes(const std::string& key, v1::EpisodesReport* out);
  // Marks a session as having a turn running; false if it already has one.
  bool BeginTurn(const std::string& key);
  void EndTurn(const std::string& key);

  SessionStore& store_;
  WorkerRegistry& workers_;
  const ApiKeys keys_;
  const CoordinatorOptions options_;
  metrics::Registry& metrics_;
  WorkPool store_pool_;  // Converse's store steps
  absl::Mutex mu_;
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::EpisodesReport> episodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::coordinator
