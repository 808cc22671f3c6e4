// ChatService::Converse and Generate: one turn streamed from the workers, with failover.
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "coordinator/chat_service.h"
#include "coordinator/grpc_status.h"
#include "coordinator/router.h"

namespace recall::coordinator {

struct ChatService::Reply {
  std::vector<int32_t> tokens;  // streamed to the client so far
  std::string text;
  v1::TurnDone done;
  std::string worker;
  int failovers = 0;
  bool client_gone = false;
};

namespace {

// Cancels `worker_ctx` when the client's call is cancelled, until destroyed.
class CancelWatch {
 public:
  CancelWatch(grpc::ServerContext* client, grpc::ClientContext* worker_ctx)
      : thread_([this, client, worker_ctx] {
          while (!stop_.load()) {
            if (client->IsCancelled()) {
              worker_ctx->TryCancel();
              return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  ~CancelWatch() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A worker failure (the stream broke or the worker is unreachable), as opposed to an answer.
bool IsWorkerFailure(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED || code == grpc::StatusCode::CANCELLED;
}

}  // namespace

void ChatService::WriteDone(const Reply& reply, grpc::ServerWriter<v1::ConverseEvent>* writer) {
  v1::ConverseEvent done;
  v1::ConverseDone* d = done.mutable_done();
  d->set_finish_reason(reply.done.finish_reason());
  *d->mutable_usage() = reply.done.usage();
  d->set_kv_bytes(reply.done.kv_bytes());
  d->set_evictions(reply.done.evictions());
  d->set_worker(reply.worker);
  d->set_failovers(reply.failovers);
  if (reply.done.has_episodes()) *d->mutable_episodes() = reply.done.episodes();
  writer->Write(done);
}

grpc::Status ChatService::StreamTurn(grpc::ServerContext* context, const std::string& session_id,
                                     const std::string& bound,
                                     const std::vector<v1::ChatMessage>& history,
                                     const v1::RunTurnRequest& base,
                                     grpc::ServerWriter<v1::ConverseEvent>* writer,
                                     Reply* reply) {
  std::vector<std::string> excluded;
  std::string sticky = bound;
  bool send_history = false;
  std::string last_error = "no worker is registered";
  Stopwatch since_start;
  const int max_tokens =
      base.sampling().has_max_tokens() ? base.sampling().max_tokens() : options_.default_max_tokens;
  for (int attempt = 0; attempt < options_.max_attempts + 1; ++attempt) {
    if (!reply->tokens.empty() && static_cast<int>(reply->tokens.size()) >= max_tokens) {
      // A worker died after delivering the whole reply but before its final event.
      reply->done.set_finish_reason(v1::FINISH_REASON_LENGTH);
      reply->done.mutable_usage()->set_generated_tokens(static_cast<int>(reply->tokens.size()));
      return grpc::Status::OK;
    }
    const std::optional<RouteDecision> route =
        Route(workers_.Snapshot(), session_id, sticky, excluded);
    if (!route.has_value()) break;
    metrics_.GetCounter("recall_coordinator_routes_total", "Routing decisions",
                        absl::StrCat("worker=\"", route->worker, "\",kind=\"",
                                     route->sticky ? "sticky" : "hashed", "\""))
        ->Increment();
    v1::RunTurnRequest req = base;
    if (send_history || !route->sticky) {
      for (const v1::ChatMessage& m : history) *req.add_history() = m;
    }
    req.mutable_resume_tokens()->Add(reply->tokens.begin(), reply->tokens.end());
    auto stub = workers_.Stub(route->worker);
    grpc::ClientContext wctx;
    grpc::Status status;
    bool got_done = false;
    bool history_needed = false;
    {
      CancelWatch watch(context, &wctx);
      auto reader = stub->RunTurn(&wctx, req);
      v1::TurnEvent ev;
      while (reader->Read(&ev)) {
        if (ev.has_done()) {
          reply->done = ev.done();
          got_done = true;
          continue;
        }
        if (ev.has_history_needed()) {
          history_needed = true;
          continue;
        }
        const v1::TokenEvent& t = ev.tokens();
        if (reply->tokens.empty() && t.token_ids_size() > 0) {
          metrics_.GetHistogram("recall_coordinator_time_to_first_token_seconds",
                                "From the request to the first token sent",
                                metrics::ExponentialBuckets(0.005, 2, 14))
              ->Observe(since_start.ElapsedSeconds());
        }
        reply->tokens.insert(reply->tokens.end(), t.token_ids().begin(), t.token_ids().end());
        reply->text += t.text();
        v1::ConverseEvent out;
        *out.mutable_tokens() = t;
        if (!writer->Write(out)) {
          reply->client_gone = true;
          wctx.TryCancel();
        }
      }
      status = reader->Finish();
    }
    if (context->IsCancelled() || reply->client_gone) {
      reply->client_gone = true;
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the turn");
    }
    if (status.ok() && got_done) {
      reply->worker = route->worker;
      metrics_.GetCounter("recall_coordinator_generated_tokens_total", "Tokens streamed")
          ->Increment(static_cast<double>(reply->tokens.size()));
      return grpc::Status::OK;
    }
    last_error = absl::StrCat(route->worker, ": ", status.error_message());
    if (history_needed && !send_history) {
      send_history = true;  // the worker does not hold the session: rebuild it there
      continue;
    }
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      excluded.push_back(route->worker);  // full: try another worker
      sticky.clear();
      send_history = true;
      continue;
    }
    if (!IsWorkerFailure(status.error_code()) && !(status.ok() && !got_done)) {
      return status;  // the worker's answer (a bad request): not retried
    }
    // The worker died or broke the stream: resume elsewhere with what was delivered.
    RECALL_LOG(WARNING) << "worker " << route->worker << " failed during a turn of "
                        << session_id << " (" << status.error_message() << "); "
                        << reply->tokens.size() << " tokens delivered, failing over";
    workers_.ReportFailure(route->worker);
    metrics_.GetCounter("recall_coordinator_failovers_total", "Turns moved off a failed worker")
        ->Increment();
    excluded.push_back(route->worker);
    sticky.clear();
    send_history = true;
    ++reply->failovers;
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("no worker could take the turn (", last_error,
                                   "); retryable"));
}

grpc::Status ChatService::Converse(grpc::ServerContext* context,
                                   const v1::ConverseRequest* request,
                                   grpc::ServerWriter<v1::ConverseEvent>* writer) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (request->session_id().empty()) return Invalid("session_id", "is required");
  if (request->message().empty()) return Invalid("message", "is empty");
  if (request->message().size() > options_.max_message_bytes) {
    return Invalid("message", absl::StrCat(request->message().size(), " bytes; at most ",
                                           options_.max_message_bytes));
  }
  if (!IsUtf8(request->message())) return Invalid("message", "is not valid UTF-8");
  RECALL_GRPC_ASSIGN_OR_RETURN(const SessionRecord rec,
                               store_.Get(tenant, request->session_id()));
  if (rec.message_count / 2 >= options_.max_turns) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("session_id: the session has reached the limit of ",
                                     options_.max_turns, " turns"));
  }
  const std::string key = tenant + "/" + rec.id;
  if (!BeginTurn(key)) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "session_id: a turn of this session is running; send the next when it "
                        "ends");
  }
  struct End {
    ChatService* s;
    std::string key;
    ~End() { s->EndTurn(key); }
  } end{this, key};

  // The user's message is durable before any worker sees it.
  const int index = rec.message_count;
  absl::Status st = store_.Append(tenant, rec.id, index, {"user", request->message()});
  if (!st.ok()) return ToGrpc(st);

  std::vector<v1::ChatMessage> history;
  for (const StoredMessage& m : rec.messages) {
    v1::ChatMessage pm;
    pm.set_role(m.role);
    pm.set_content(m.content);
    history.push_back(std::move(pm));
  }
  v1::RunTurnRequest base;
  base.set_session_id(rec.id);
  v1::ChatMessage* user = base.add_messages();
  user->set_role("user");
  user->set_content(request->message());
  base.set_history_length(index);
  *base.mutable_sampling() = request->sampling();
  base.mutable_cache()->ParseFromString(rec.cache_settings);

  Reply reply;
  grpc::Status status = StreamTurn(context, rec.id, rec.worker, history, base, writer, &reply);
  metrics_.GetCounter("recall_coordinator_turns_total", "Converse turns by status code",
                      absl::StrCat("code=\"", static_cast<int>(status.error_code()), "\""))
      ->Increment();
  if (!status.ok()) {
    // The turn did not happen: the transcript keeps only completed turns.
    store_.Truncate(tenant, rec.id, index).IgnoreError();
    return status;
  }
  st = store_.Append(tenant, rec.id, index + 1, {"assistant", reply.text});
  if (!st.ok()) return ToGrpc(st);
  if (reply.worker != rec.worker) store_.Bind(tenant, rec.id, reply.worker).IgnoreError();
  RememberEpisodes(key, reply.done);
  WriteDone(reply, writer);
  return grpc::Status::OK;
}

grpc::Status ChatService::Generate(grpc::ServerContext* context,
                                   const v1::GenerateRequest* request,
                                   grpc::ServerWriter<v1::ConverseEvent>* writer) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (request->prompt().empty()) return Invalid("prompt", "is empty");
  if (request->prompt().size() > options_.max_message_bytes) {
    return Invalid("prompt", absl::StrCat(request->prompt().size(), " bytes; at most ",
                                          options_.max_message_bytes));
  }
  if (!IsUtf8(request->prompt())) return Invalid("prompt", "is not valid UTF-8");
  static std::atomic<int64_t> counter{0};
  const std::string id = absl::StrCat("gen-", tenant, "-", counter++, "-",
                                      RealClock::Get().NowNanos());
  v1::RunTurnRequest base;
  base.set_session_id(id);
  v1::ChatMessage* user = base.add_messages();
  user->set_role("user");
  user->set_content(request->prompt());
  *base.mutable_sampling() = request->sampling();
  *base.mutable_cache() = request->cache();
  Reply reply;
  grpc::Status status = StreamTurn(context, id, "", {}, base, writer, &reply);
  if (auto stub = workers_.Stub(reply.worker); stub != nullptr) {
    grpc::ClientContext ctx;  // the session was one turn long: free its cache now
    v1::DropSessionRequest drop;
    drop.set_session_id(id);
    v1::DropSessionResponse ignored;
    stub->DropSession(&ctx, drop, &ignored);
  }
  if (!status.ok()) return status;
  WriteDone(reply, writer);
  return grpc::Status::OK;
}

}  // namespace recall::coordinator
