// ChatService::Converse and Generate on gRPC's callback API: a TurnReactor per call runs one
// turn with a TurnRunner and writes its events to the client.
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/chat_service.h"
#include "coordinator/grpc_status.h"
#include "coordinator/turn_ids.h"
#include "coordinator/turn_journal.h"

namespace recall::coordinator {

namespace {

v1::ConverseEvent DoneEvent(const TurnResult& r) {
  v1::ConverseEvent event;
  v1::ConverseDone* d = event.mutable_done();
  d->set_finish_reason(r.done.finish_reason());
  *d->mutable_usage() = r.done.usage();
  d->set_kv_bytes(r.done.kv_bytes());
  d->set_state_bytes(r.done.state_bytes());
  d->set_peak_kv_bytes(r.done.peak_kv_bytes());
  d->set_rebuilt(r.done.rebuilt());
  d->set_evictions(r.done.evictions());
  d->set_worker(r.worker);
  d->set_failovers(r.failovers);
  if (r.done.has_episodes()) *d->mutable_episodes() = r.done.episodes();
  return event;
}

}  // namespace

// One Converse or Generate call.
//
// Writes: events go out one write at a time, in order; tokens that arrive while a write is in
// flight are merged into one event, so a slow client never slows the worker. One Finish path:
// End records the call's status (and its last event), once; Pump finishes the call when
// nothing is left to write.
//
// Converse: Prepare (store pool) -> TurnRunner -> Complete (end pool) -> End.
// Generate: TurnRunner -> End. A refused request: End at once.
// OnCancel and a failed write cancel the runner; the call still ends through End, when the
// runner reports its (CANCELLED) end. So Finish comes after the runner's last report and after
// every store step, and OnDone, which deletes the reactor, after both: nothing refers to the
// reactor once it is gone.
class ChatService::TurnReactor final : public grpc::ServerWriteReactor<v1::ConverseEvent>,
                                       public TurnSink {
 public:
  TurnReactor(ChatService& service, bool converse) : service_(service), converse_(converse) {}

  // Converse: the store steps and the turn run from the store pool. `request` lives until
  // OnDone.
  void StartConverse(std::string tenant, const v1::ConverseRequest* request) {
    tenant_ = std::move(tenant);
    service_.store_pool_.Run([this, request] { Prepare(*request); });
  }

  // Starts the turn (a Converse turn's events pass through its journal). Last in its caller:
  // the call may end at once.
  void Run(TurnSpec spec) {
    std::shared_ptr<TurnRunner> runner = TurnRunner::Create(
        service_.workers_, service_.metrics_, service_.conversations_.RunnerOptions(),
        std::move(spec), journal_ != nullptr ? static_cast<TurnSink*>(journal_.get()) : this);
    if (journal_ != nullptr) journal_->SetRunner(runner);
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      runner_ = runner;
      cancelled = cancelled_;
    }
    if (cancelled) runner->Cancel();  // it then ends as soon as it starts
    runner->Start();
  }

  // The call's status and last event. Called once; last in its caller.
  void End(grpc::Status status, std::optional<v1::ConverseEvent> last = std::nullopt) {
    {
      absl::MutexLock lock(&mu_);
      RECALL_CHECK(!end_.has_value()) << "a Converse call ended twice";
      if (last.has_value() && !broken_) events_.push_back(std::move(*last));
      end_ = std::move(status);
    }
    Pump();
  }

  // ---- TurnSink.
  void OnTokens(const v1::TokenEvent& tokens) override {
    {
      absl::MutexLock lock(&mu_);
      if (broken_) return;
      if (!events_.empty() && events_.back().has_tokens()) {
        MergeTokens(tokens, events_.back().mutable_tokens());
      } else {
        *events_.emplace_back().mutable_tokens() = tokens;
      }
    }
    Pump();
  }

  void OnTurnDone(TurnResult result) override {
    if (!converse_) {
      End(grpc::Status::OK, DoneEvent(result));
      return;
    }
    service_.end_pool_.Run(
        [this, result = std::move(result)]() mutable { Complete(std::move(result)); });
  }

  void OnTurnError(absl::Status status) override {
    // The worker names the text it was sent "messages"; this call's is its message (Converse)
    // or prompt (Generate).
    status = RenameField(status, "messages", converse_ ? "message" : "prompt");
    if (!converse_) {
      End(ToGrpc(status));
      return;
    }
    service_.end_pool_.Run([this, status = std::move(status)] { Complete(status); });
  }

  // ---- gRPC reactions.
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    if (!ok) {
      Stop();  // the stream is broken: the client went away
      return;
    }
    Pump();
  }

  void OnCancel() override { Stop(); }

  void OnDone() override { delete this; }

 private:
  // Converse, on the store pool: a turn the request's turn_id names, streamed back as stored;
  // else the session, the turn limit, the running-turn mark, the user message (durable before
  // any worker sees it); then the turn.
  void Prepare(const v1::ConverseRequest& request) {
    const std::string& message = request.message();
    const std::string& turn_id = request.turn_id();
    if (!turn_id.empty()) {
      absl::StatusOr<SessionRecord> rec =
          service_.store_.GetRecent(tenant_, request.session_id(), turn_id);
      if (!rec.ok()) {
        End(ToGrpc(service_.conversations_.ExplainMissing(rec.status())));
        return;
      }
      if (const int i = FindTurn(*rec, turn_id); i >= 0) {
        Replay(*rec, i, request);
        return;
      }
    }
    absl::StatusOr<OpenTurn> turn = service_.conversations_.Begin(
        tenant_, request.session_id(),
        [&message, &turn_id](const SessionRecord& rec) -> absl::StatusOr<TurnMessages> {
          if (!turn_id.empty() && FindTurn(rec, turn_id) >= 0) {
            // Stored between the look above and the running mark: that request ran it.
            return absl::FailedPreconditionError(
                absl::StrCat("turn_id ", QuotedId(turn_id),
                             ": a request with this id ran the turn meanwhile; send it again to "
                             "get that turn (retryable)"));
          }
          StoredMessage user{"user", message};
          user.turn_id = turn_id;
          return TurnMessages{rec.message_count, {std::move(user)}};
        },
        request.sampling(), "grpc", turn_id);
    if (!turn.ok()) {
      End(ToGrpc(turn.status()));
      return;
    }
    turn_ = std::move(*turn);
    journal_ = service_.conversations_.Journal(*turn_, this);
    Run(turn_->spec);
  }

  // The turn whose user message is the transcript's message `user` (rec holds it), as stored: its
  // reply (the assistant message after it) as one tokens event, then done with replayed set and the
  // turn's state; or, when it was interrupted or failed and is the session's last turn, resumed:
  // the stored part as one tokens event, then the rest as the worker continues it.
  void Replay(const SessionRecord& rec, int user, const v1::ConverseRequest& request) {
    const StoredMessage& asked = rec.messages[static_cast<size_t>(user - rec.first_message)];
    if (asked.content != request.message()) {
      End(Invalid("turn_id", absl::StrCat(QuotedId(request.turn_id()), " names message ", user,
                                          " of the session, whose text differs from this "
                                          "message; a new turn needs a new id")));
      return;
    }
    StoredMessage reply = TurnReply(rec, user);
    // This coordinator's own, whose end the store could not take: interrupted, resumed below.
    if (service_.conversations_.OwnOrphan(rec.tenant + "/" + rec.id, reply)) {
      reply.state = TurnState::kInterrupted;
    }
    if (reply.state == TurnState::kInProgress) {
      End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("turn_id ", QuotedId(request.turn_id()),
                                    ": that turn is still running; send this again once it has "
                                    "ended (retryable)")));
      return;
    }
    const bool ended = reply.state == TurnState::kInterrupted || reply.state == TurnState::kFailed;
    if (ended && user + 2 == rec.message_count) {
      Resume(request);
      return;
    }
    if (!reply.content.empty() || !reply.token_ids.empty()) {
      v1::TokenEvent tokens;
      tokens.mutable_token_ids()->Add(reply.token_ids.begin(), reply.token_ids.end());
      tokens.set_text(reply.content);
      OnTokens(tokens);
    }
    v1::ConverseEvent done;
    done.mutable_done()->set_finish_reason(static_cast<v1::FinishReason>(reply.finish));
    done.mutable_done()->set_replayed(true);
    done.mutable_done()->set_turn_state(static_cast<v1::TurnState>(reply.state));
    End(grpc::Status::OK, std::move(done));
  }

  // Converse, on the store pool: the request's turn continued where it stopped
  // (Conversations::Resume), its stored part sent first.
  void Resume(const v1::ConverseRequest& request) {
    absl::StatusOr<OpenTurn> turn = service_.conversations_.Resume(
        tenant_, request.session_id(), "turn_id", request.turn_id(), request.sampling(), "grpc");
    if (!turn.ok()) {
      End(ToGrpc(turn.status()));
      return;
    }
    turn_ = std::move(*turn);
    resumed_ = true;
    const StoredMessage& part = *turn_->resumed;
    if (!part.content.empty() || !part.token_ids.empty()) {
      v1::TokenEvent tokens;
      tokens.mutable_token_ids()->Add(part.token_ids.begin(), part.token_ids.end());
      tokens.set_text(part.content);
      OnTokens(tokens);
    }
    journal_ = service_.conversations_.Journal(*turn_, this);
    Run(turn_->spec);
  }

  // Converse, on the end pool: store the reply complete and the binding, or what the client
  // was sent of it, interrupted (or failed when nothing); then end the call (the running mark
  // is cleared before the client can see the end).
  void Complete(absl::StatusOr<TurnResult> outcome) {
    // A client that left before the reply's end reached it did not get the whole reply (the
    // worker may have finished first): the turn is interrupted, with what was sent.
    bool client_left;
    {
      absl::MutexLock lock(&mu_);
      client_left = broken_;
      completing_ = true;
    }
    const absl::StatusOr<TurnResult> as_stored =
        outcome.ok() && client_left
            ? absl::StatusOr<TurnResult>(service_.conversations_.StoppedAfterItsEnd(*outcome))
            : outcome;
    const absl::Status stored = service_.conversations_.Finish(*turn_, as_stored, journal_->sent());
    if (!outcome.ok()) {
      End(ToGrpc(outcome.status()));
    } else if (!stored.ok()) {
      End(ToGrpc(stored));
    } else {
      v1::ConverseEvent done = DoneEvent(*outcome);
      done.mutable_done()->set_resumed(resumed_);
      End(grpc::Status::OK, std::move(done));
    }
  }

  // Starts the next write, or finishes the call; does nothing while a write is in flight.
  void Pump() {
    bool write = false;
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!events_.empty()) {
        write_ = std::move(events_.front());
        events_.pop_front();
        writing_ = true;
        write = true;
      } else if (end_.has_value()) {
        finished_ = true;
        finish = *end_;
      } else {
        return;
      }
    }
    if (write) {
      StartWrite(&write_);
    } else {
      Finish(finish);
    }
  }

  // The client is gone (cancelled, or a write failed): write nothing more and cancel the
  // turn; the call ends when the runner reports.
  void Stop() {
    std::shared_ptr<TurnRunner> runner;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      broken_ = true;
      events_.clear();
      runner = runner_;
      // A Converse turn is then ending, not running: the session's next turn waits for its
      // end (as an HTTP client's does) instead of being refused. (turn_ was set before
      // runner_.) Not once its end is being stored: the session may run another turn by then,
      // which would be taken for ending. (Under mu_: before Complete's Finish.)
      if (runner != nullptr && converse_ && turn_.has_value() && !completing_) {
        service_.conversations_.Ending(*turn_);
      }
    }
    if (runner != nullptr) runner->Cancel();
    Pump();
  }

  ChatService& service_;
  const bool converse_;  // else Generate
  // Converse: the caller's tenant; the turn, set by Prepare, read by Complete.
  std::string tenant_;
  std::optional<OpenTurn> turn_;
  std::unique_ptr<TurnJournal> journal_;  // Converse: set by Prepare before the turn runs
  bool resumed_ = false;                  // Converse: the turn was resumed (Resume)

  absl::Mutex mu_;
  std::shared_ptr<TurnRunner> runner_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::ConverseEvent> events_ ABSL_GUARDED_BY(mu_);  // not yet written
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // nobody reads the stream any more
  bool completing_ ABSL_GUARDED_BY(mu_) = false;  // Complete began: the turn's end is stored
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::ConverseEvent write_;  // the write in flight (only touched while writing_)
};

namespace {

// Converse's checks that need no store. Fills *tenant.
grpc::Status CheckConverse(const ApiKeys& keys, const CoordinatorOptions& options,
                           const grpc::ServerContextBase& context,
                           const v1::ConverseRequest& request, std::string* tenant) {
  RECALL_GRPC_ASSIGN_OR_RETURN(*tenant, keys.Authenticate(context));
  if (grpc::Status st = CheckSessionId(request.session_id()); !st.ok()) return st;
  if (request.message().empty()) return Invalid("message", "is empty");
  if (request.message().size() > options.max_message_bytes) {
    return Invalid("message", absl::StrCat(request.message().size(), " bytes; at most ",
                                           options.max_message_bytes));
  }
  if (!IsUtf8(request.message())) return Invalid("message", "is not valid UTF-8");
  return ToGrpc(CheckTurnId("turn_id", request.turn_id()));
}

grpc::Status CheckGenerate(const ApiKeys& keys, const CoordinatorOptions& options,
                           const grpc::ServerContextBase& context,
                           const v1::GenerateRequest& request, std::string* tenant) {
  RECALL_GRPC_ASSIGN_OR_RETURN(*tenant, keys.Authenticate(context));
  if (request.prompt().empty()) return Invalid("prompt", "is empty");
  if (request.prompt().size() > options.max_message_bytes) {
    return Invalid("prompt", absl::StrCat(request.prompt().size(), " bytes; at most ",
                                          options.max_message_bytes));
  }
  if (!IsUtf8(request.prompt())) return Invalid("prompt", "is not valid UTF-8");
  return grpc::Status::OK;
}

}  // namespace

grpc::ServerWriteReactor<v1::ConverseEvent>* ChatService::Converse(
    grpc::CallbackServerContext* context, const v1::ConverseRequest* request) {
  auto* reactor = new TurnReactor(*this, /*converse=*/true);
  std::string tenant;
  grpc::Status checked = CheckConverse(keys_, options_, *context, *request, &tenant);
  if (!checked.ok()) {
    reactor->End(std::move(checked));
  } else {
    reactor->StartConverse(std::move(tenant), request);
  }
  return reactor;
}

grpc::ServerWriteReactor<v1::ConverseEvent>* ChatService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new TurnReactor(*this, /*converse=*/false);
  std::string tenant;
  grpc::Status checked = CheckGenerate(keys_, options_, *context, *request, &tenant);
  if (!checked.ok()) {
    reactor->End(std::move(checked));
    return reactor;
  }
  for (const absl::Status& st :
       {conversations_.TakingTurns(), conversations_.CheckModel(request->model()),
        conversations_.CheckPolicy(request->cache()), conversations_.CheckKvDtype(request->cache()),
        conversations_.CheckMaxTokens(request->model(), request->sampling())}) {
    if (!st.ok()) {
      reactor->End(ToGrpc(st));
      return reactor;
    }
  }
  reactor->Run(conversations_.OneOff(tenant, request->model(), request->prompt(),
                                     request->sampling(), request->cache()));
  return reactor;
}

}  // namespace recall::coordinator
