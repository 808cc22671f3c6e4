// ChatService: the public API (proto/recall/v1/chat.proto) on the coordinator.
//
// Converse, in order: authenticate; store the user message (durable before any worker sees
// it); route (sticky to the session's worker while healthy, else weighted rendezvous
// hashing, see router.h); stream RunTurn from that worker to the client. When the worker
// says the session is not resident, resend with the transcript. When the worker fails
// mid-reply, mark it down and resume on another worker with the transcript plus the tokens
// already streamed (resume_tokens): the client's stream continues with no gap and no repeat.
// When the reply ends, store it and the binding. A turn that fails for good (a bad request,
// no worker) removes its user message again, so the transcript only holds turns that happened.
#pragma once

#include <memory>
#include <map>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"
#include "coordinator/auth.h"
#include "coordinator/session_store.h"
#include "coordinator/worker_registry.h"
#include "recall/v1/chat.grpc.pb.h"

namespace recall::coordinator {

struct CoordinatorOptions {
  size_t max_message_bytes = 256 << 10;  // user message / system prompt
  int max_turns = 10000;                 // exchanges per session
  int max_sessions_per_tenant = 100000;
  int max_attempts = 4;                  // workers tried for one turn
  int default_max_tokens = 256;          // the workers' default when a turn leaves it unset
};

class ChatService final : public v1::Chat::Service {
 public:
  ChatService(SessionStore& store, WorkerRegistry& workers, ApiKeys keys,
              CoordinatorOptions options, metrics::Registry& metrics);

  grpc::Status CreateSession(grpc::ServerContext* context, const v1::CreateSessionRequest* request,
                             v1::Session* response) override;
  grpc::Status Converse(grpc::ServerContext* context, const v1::ConverseRequest* request,
                        grpc::ServerWriter<v1::ConverseEvent>* writer) override;
  grpc::Status GetSession(grpc::ServerContext* context, const v1::GetSessionRequest* request,
                          v1::Session* response) override;
  grpc::Status ListSessions(grpc::ServerContext* context, const v1::ListSessionsRequest* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status DeleteSession(grpc::ServerContext* context, const v1::DeleteSessionRequest* request,
                             v1::DeleteSessionResponse* response) override;
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::ConverseEvent>* writer) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;

 private:
  struct Reply;  // one turn's streaming state (converse.cc)

  // Streams one turn from the workers to `writer`, with failover. `history` is the
  // transcript before the turn. Fills *done on success.
  grpc::Status StreamTurn(grpc::ServerContext* context, const std::string& session_id,
                          const std::string& bound, const std::vector<v1::ChatMessage>& history,
                          const v1::RunTurnRequest& base,
                          grpc::ServerWriter<v1::ConverseEvent>* writer, Reply* reply);
  static void WriteDone(const Reply& reply, grpc::ServerWriter<v1::ConverseEvent>* writer);
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
  absl::Mutex mu_;
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::EpisodesReport> episodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::coordinator
