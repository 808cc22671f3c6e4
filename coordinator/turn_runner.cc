#include "coordinator/turn_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "coordinator/random_id.h"

namespace recall::coordinator {
namespace {

// A worker failure (the stream broke or the worker is unreachable), as opposed to an answer.
bool IsWorkerFailure(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED || code == grpc::StatusCode::CANCELLED;
}

absl::Status ToAbsl(const grpc::Status& s) {
  // gRPC and absl share the canonical code numbers.
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

// One RunTurn attempt on gRPC's callback client API. It holds itself (and the runner) from
// Start until OnDone, the call's last reaction, and reports every event and then the call's
// end (after letting itself go) to the runner. Reactions of one call run one at a time: a
// read is started only after the previous one was handled, and OnDone comes after them all.
class TurnRunner::Call final : public grpc::ClientReadReactor<v1::TurnEvent> {
 public:
  Call(std::shared_ptr<TurnRunner> runner, std::shared_ptr<v1::Worker::Stub> stub,
       std::string worker, v1::RunTurnRequest request)
      : runner_(std::move(runner)),
        stub_(std::move(stub)),
        worker_(std::move(worker)),
        request_(std::move(request)) {}

  void Start(std::shared_ptr<Call> self) {
    // A worker that hangs (stopped, wedged) keeps its stream open without a word: when its
    // heartbeats mark it down and its stream has been silent too, the call ends, and the turn
    // fails over like a broken stream. (A worker whose heartbeats are late while its tokens
    // come, on a starved machine, keeps its turn.)
    {
      absl::MutexLock lock(&event_mu_);
      last_event_ = absl::Now();
    }
    watch_ = runner_->workers_.Watch(worker_, [weak = std::weak_ptr<Call>(self)] {
      std::shared_ptr<Call> call = weak.lock();
      if (call == nullptr || absl::Now() - call->LastEvent() < kSilence) return;
      call->worker_down_ = true;
      call->Cancel();
    });
    self_ = std::move(self);
    runner_->workers_.Attach(&context_);
    stub_->async()->RunTurn(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }

  // Thread safe; harmless once the call ended.
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows with its status
    {
      absl::MutexLock lock(&event_mu_);
      last_event_ = absl::Now();
    }
    runner_->OnEvent(event_);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    // Let go of the call (its context, its stub) before the runner decides what next: once
    // the runner reports the end of the turn, no call of it may be left over, or the last
    // reference to a channel could go on this gRPC thread (which gRPC does not survive).
    std::shared_ptr<TurnRunner> runner = runner_;
    runner->workers_.Unwatch(watch_);
    const grpc::Status ended =
        worker_down_ && status.error_code() == grpc::StatusCode::CANCELLED
            ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "the worker stopped answering its heartbeats during the turn")
            : status;
    self_.reset();  // `this` may be gone from here on
    runner->OnCallEnded(ended);
  }

 private:
  const std::shared_ptr<TurnRunner> runner_;
  const std::shared_ptr<v1::Worker::Stub> stub_;
  const std::string worker_;
  const v1::RunTurnRequest request_;
  grpc::ClientContext context_;
  v1::TurnEvent event_;
  std::shared_ptr<Call> self_;
  absl::Time LastEvent() {
    absl::MutexLock lock(&event_mu_);
    return last_event_;
  }
  static constexpr absl::Duration kSilence = absl::Seconds(2);

  uint64_t watch_ = 0;
  std::atomic<bool> worker_down_{false};
  absl::Mutex event_mu_;
  absl::Time last_event_ ABSL_GUARDED_BY(event_mu_);
};

// A unary call to the turn's worker before the runner reports the end, on a reactor for the
// same reason as Call: its OnDone comes after gRPC let go of the call, so once it let go of
// its context and stub, no reference to the channel is left on this gRPC thread when the
// runner reports the end. (The std::function form of a unary call lets go of the call only
// after its callback returned, i.e. after the report, when the caller may already have
// destroyed the channel.) Best effort: whatever the call's outcome, the end is reported.
//   - kDrop: the DropSession of a one-turn session (its cache is derived state and would age
//     out anyway), then OnTurnDone.
//   - kAbort: the Abort of a cancelled attempt by its request id, then OnTurnError(CANCELLED).
//     The worker learns of a cancelled stream on its own callback thread, possibly after the
//     session's next turn arrived, which it would refuse as "already has a turn running";
//     its Abort answers once the turn is gone, so the next turn finds the session free.
class TurnRunner::EndCall final : public grpc::ClientUnaryReactor {
 public:
  enum class Kind { kDrop, kAbort };

  EndCall(std::shared_ptr<TurnRunner> runner, std::shared_ptr<v1::Worker::Stub> stub, Kind kind)
      : runner_(std::move(runner)), stub_(std::move(stub)), kind_(kind) {}

  void Start(std::shared_ptr<EndCall> self) {
    self_ = std::move(self);
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    runner_->workers_.Attach(&context_);
    if (kind_ == Kind::kDrop) {
      drop_.set_session_id(runner_->spec_.request.session_id());
      stub_->async()->DropSession(&context_, &drop_, &dropped_, this);
    } else {
      abort_.set_request_id(runner_->request_id_);
      stub_->async()->Abort(&context_, &abort_, &aborted_, this);
    }
    StartCall();
  }

  void OnDone(const grpc::Status&) override {
    std::shared_ptr<TurnRunner> runner = runner_;
    const Kind kind = kind_;
    absl::Status cancelled = absl::CancelledError("the client cancelled the turn");
    WithTakenBack(aborted_, cancelled);
    self_.reset();  // `this` is gone from here on
    if (kind == Kind::kDrop) {
      runner->Ended();
      runner->sink_->OnTurnDone(std::move(runner->result_));
    } else {
      runner->Fail(std::move(cancelled));
    }
  }

 private:
  const std::shared_ptr<TurnRunner> runner_;
  const std::shared_ptr<v1::Worker::Stub> stub_;
  const Kind kind_;
  grpc::ClientContext context_;
  v1::DropSessionRequest drop_;
  v1::DropSessionResponse dropped_;
  v1::AbortRequest abort_;
  v1::AbortResponse aborted_;
  std::shared_ptr<EndCall> self_;
};

std::shared_ptr<TurnRunner> TurnRunner::Create(WorkerRegistry& workers, metrics::Registry& metrics,
                                               TurnRunnerOptions options, TurnSpec spec,
                                               TurnSink* sink) {
  return std::shared_ptr<TurnRunner>(
      new TurnRunner(workers, metrics, options, std::move(spec), sink));
}

TurnRunner::TurnRunner(WorkerRegistry& workers, metrics::Registry& metrics,
                       TurnRunnerOptions options, TurnSpec spec, TurnSink* sink)
    : workers_(workers),
      metrics_(metrics),
      options_(options),
      spec_(std::move(spec)),
      sink_(sink),
      running_(RunningTurns(metrics)),
      sticky_(spec_.bound),
      send_history_(spec_.send_history) {
  result_.tokens = spec_.resume_tokens;
  result_.text = spec_.resume_text;
}

TurnRunner::~TurnRunner() = default;

void TurnRunner::Start() {
  running_->Add(1);
  if (options_.tenant_turns != nullptr) {
    if (absl::Status st = options_.tenant_turns->Acquire(spec_.tenant); !st.ok()) {
      Fail(std::move(st));
      return;
    }
    counted_ = true;
  }
  NextAttempt();
}

void TurnRunner::Ended() {
  running_->Add(-1);
  if (counted_) options_.tenant_turns->Release(spec_.tenant);
}

metrics::Gauge* TurnRunner::RunningTurns(metrics::Registry& metrics) {
  return metrics.GetGauge("recall_coordinator_turns_running",
                          "Turns running (a stopping coordinator waits for them to end)");
}

void TurnRunner::Cancel() {
  std::shared_ptr<Call> call;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    call = call_;
  }
  if (call != nullptr) call->Cancel();  // its end (CANCELLED) ends the turn
}

void TurnRunner::NextAttempt() {
  if (Cancelled()) {
    Fail(absl::CancelledError("the client cancelled the turn"));
    return;
  }
  if (attempt_ >= options_.max_attempts + 1) {
    FailNoWorker();
    return;
  }
  ++attempt_;
  const v1::SamplingParams& sampling = spec_.request.sampling();
  const int max_tokens =
      sampling.has_max_tokens() ? sampling.max_tokens() : options_.default_max_tokens;
  if (!result_.tokens.empty() && static_cast<int>(result_.tokens.size()) >= max_tokens) {
    // A worker died after delivering the whole reply but before its final event.
    result_.done.set_finish_reason(v1::FINISH_REASON_LENGTH);
    result_.done.mutable_usage()->set_generated_tokens(static_cast<int>(result_.tokens.size()));
    Succeed();
    return;
  }
  std::shared_ptr<v1::Worker::Stub> stub;
  {
    const std::vector<WorkerView> known = workers_.Snapshot();
    // A session made before sessions kept their model (none, with several served) stays on
    // the model of the worker it is bound to.
    std::string model = spec_.model;
    for (const WorkerView& w : known) {
      if (model.empty() && !spec_.bound.empty() && w.address == spec_.bound) model = w.info.model();
    }
    const std::vector<WorkerView> all = WorkersWithModel(known, model);
    if (all.empty() && !known.empty()) {
      std::set<std::string> served;
      for (const WorkerView& w : known) {
        if (!w.info.model().empty()) served.insert(w.info.model());
      }
      Fail(workers_.SessionModelNotServed(model, {served.begin(), served.end()}));
      return;
    }
    const std::string& kv_dtype = spec_.request.cache().kv_dtype();
    const std::string& policy = spec_.request.cache().policy();
    const std::vector<WorkerView> typed = WorkersStoring(all, kv_dtype);
    const std::vector<WorkerView> snapshot = WorkersServing(typed, policy);
    if (snapshot.empty() && !typed.empty()) {
      Fail(absl::FailedPreconditionError(
          absl::StrCat("cache.policy: no worker serves ", policy,
                       " now (the session was made with it; episodic runs only on one CPU rank)")));
      return;
    }
    if (snapshot.empty() && !all.empty()) {
      std::vector<std::string> types;
      for (const WorkerView& w : all) {
        const std::string& t = w.info.default_cache().kv_dtype();
        if (!t.empty() && std::find(types.begin(), types.end(), t) == types.end()) {
          types.push_back(t);
        }
      }
      if (!types.empty()) {
        Fail(absl::FailedPreconditionError(
            absl::StrCat("cache.kv_dtype: no worker stores ", kv_dtype, " (the workers store ",
                         absl::StrJoin(types, ", "),
                         "); create the session without kv_dtype or with one of those (not "
                         "retryable)")));
        return;
      }
    }
    route_ = Route(snapshot, spec_.request.session_id(), sticky_, excluded_);
    if (!route_.has_value() && excluded_.empty() && !snapshot.empty()) {
      // Known, none tried: they are down, draining or stopping (not "none known").
      // Named by what narrowed them (a session's KV type or policy leaves out workers of the
      // model that are up: "the 1 worker(s) serving" it read as if the others were gone).
      std::string narrowed;
      if (!kv_dtype.empty() && typed.size() < all.size()) {
        absl::StrAppend(&narrowed, " storing ", kv_dtype, " KV (the session's cache.kv_dtype)");
      }
      if (snapshot.size() < typed.size()) {
        absl::StrAppend(&narrowed, narrowed.empty() ? " " : " and ", "serving policy ", policy);
      }
      last_error_ = absl::StrCat("the ", snapshot.size(), " worker(s) serving ",
                                 model.empty() ? "it" : "\"" + model + "\"", narrowed,
                                 " are not answering, draining or shutting down");
    }
    for (const WorkerView& w : snapshot) {
      if (route_.has_value() && w.address == route_->worker) stub = w.stub;
    }
  }
  if (!route_.has_value()) {
    FailNoWorker();
    return;
  }
  RECALL_CHECK(stub != nullptr) << "routed to " << route_->worker << ", which has no stub";
  metrics_
      .GetCounter("recall_coordinator_routes_total", "Routing decisions",
                  absl::StrCat("worker=\"", route_->worker, "\",kind=\"",
                               route_->sticky ? "sticky" : "hashed", "\""))
      ->Increment();
  Send(std::move(stub));
}

void TurnRunner::Send(std::shared_ptr<v1::Worker::Stub> stub) {
  // The session is in use on this worker again: a drop of its copy there still pending (it
  // had moved away) would end this turn or the copy it builds.
  workers_.KeepSession(route_->worker, spec_.request.session_id());
  const bool with_history = send_history_ || !route_->sticky;
  if (with_history && spec_.fetch_history && !fetched_.has_value()) {
    // Read first; this attempt goes on when the history is here (on the reader's thread).
    spec_.fetch_history([self = shared_from_this(), stub = std::move(stub)](
                            absl::StatusOr<std::vector<v1::ChatMessage>> history) mutable {
      if (!history.ok()) {
        stub.reset();
        self->Fail(absl::Status(history.status().code(),
                                absl::StrCat("reading the session's history for a worker: ",
                                             history.status().message())));
        return;
      }
      self->fetched_ = std::move(*history);
      self->Send(std::move(stub));
    });
    return;
  }
  v1::RunTurnRequest request = spec_.request;
  if (with_history) {
    for (const v1::ChatMessage& m : History()) *request.add_history() = m;
    // A history read whole is the truth: where the count the turn began with differs (a
    // store's index behind an older coordinator's writes), the worker compares and rebuilds.
    if (fetched_.has_value()) request.set_history_length(static_cast<int>(fetched_->size()));
  }
  request.mutable_resume_tokens()->Add(result_.tokens.begin(), result_.tokens.end());
  request_id_ = RandomId("c-");  // so the worker's Abort by request id finds this attempt
  request.set_request_id(request_id_);
  got_done_ = false;
  history_needed_ = false;
  auto call = std::make_shared<Call>(shared_from_this(), std::move(stub), route_->worker,
                                     std::move(request));
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    cancelled = cancelled_;
    if (!cancelled) call_ = call;
  }
  if (cancelled) {
    Fail(absl::CancelledError("the client cancelled the turn"));
    return;
  }
  // Last, holding nothing: the call's reactions may run on other threads at once and end the
  // turn, after which nothing here may hold a stub (see Call::OnDone).
  Call* started = call.get();
  started->Start(std::move(call));
}

bool TurnRunner::Cancelled() {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void TurnRunner::OnEvent(const v1::TurnEvent& event) {
  if (event.has_done()) {
    result_.done = event.done();
    got_done_ = true;
    return;
  }
  if (event.has_history_needed()) {
    history_needed_ = true;
    return;
  }
  const v1::TokenEvent& t = event.tokens();
  if (result_.tokens.empty() && t.token_ids_size() > 0) {
    result_.first_token_seconds = since_start_.ElapsedSeconds();
    metrics_
        .GetHistogram("recall_coordinator_time_to_first_token_seconds",
                      "From the request to the first token sent",
                      metrics::ExponentialBuckets(0.005, 2, 14))
        ->Observe(since_start_.ElapsedSeconds());
  }
  result_.tokens.insert(result_.tokens.end(), t.token_ids().begin(), t.token_ids().end());
  result_.text += t.text();
  sink_->OnTokens(t);
}

void TurnRunner::OnCallEnded(const grpc::Status& status) {
  std::shared_ptr<Call> ended;
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    ended = std::move(call_);
    cancelled = cancelled_;
  }
  ended.reset();  // the call is torn down here (unless a Cancel holds it for a moment)
  if (cancelled) {
    // When the cancel ended the call, or the turn ended as it came (not the worker's failure:
    // no waiting on a dead worker), have the worker abort the turn, or take it back when it
    // had ended, before the end is reported (see EndCall).
    std::shared_ptr<v1::Worker::Stub> stub =
        status.error_code() == grpc::StatusCode::CANCELLED || status.ok()
            ? workers_.Stub(route_->worker)
            : nullptr;
    if (stub == nullptr) {
      Fail(absl::CancelledError("the client cancelled the turn"));
      return;
    }
    auto abort =
        std::make_shared<EndCall>(shared_from_this(), std::move(stub), EndCall::Kind::kAbort);
    abort->Start(abort);
    return;
  }
  const std::string worker = route_->worker;
  if (status.ok() && got_done_) {
    result_.worker = worker;
    metrics_.GetCounter("recall_coordinator_generated_tokens_total", "Tokens streamed")
        ->Increment(static_cast<double>(result_.tokens.size()));
    Succeed();
    return;
  }
  last_error_ = absl::StrCat(worker, ": ", status.error_message());
  if (history_needed_ && !send_history_) {
    send_history_ = true;  // the worker does not hold the session: rebuild it there
    NextAttempt();
    return;
  }
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    // The answer the client hears if no worker takes the turn: one that may have room later
    // (a retry hint) over one whose pool never will (its client would not retry).
    if (exhausted_.empty() || !absl::StrContains(last_error_, "not retryable") ||
        absl::StrContains(exhausted_, "not retryable")) {
      exhausted_ = last_error_;
    }
    excluded_.push_back(worker);  // full: try another worker
    sticky_.clear();
    send_history_ = true;
    NextAttempt();
    return;
  }
  if (!IsWorkerFailure(status.error_code()) && !(status.ok() && !got_done_)) {
    Fail(ToAbsl(status));  // the worker's answer (a bad request): not retried
    return;
  }
  // The worker died or broke the stream: resume elsewhere with what was delivered.
  RECALL_LOG(WARNING) << "worker " << worker << " failed during a turn of "
                      << spec_.request.session_id() << " (" << status.error_message() << "); "
                      << result_.tokens.size() << " tokens delivered, failing over";
  workers_.ReportFailure(worker);
  metrics_
      .GetCounter("recall_coordinator_failovers_total",
                  "Worker failures during a turn (each sends the turn on to another worker "
                  "when one is left; else the turn fails)")
      ->Increment();
  excluded_.push_back(worker);
  sticky_.clear();
  send_history_ = true;
  ++result_.failovers;
  NextAttempt();
}

void TurnRunner::FailNoWorker() {
  // Every worker that answered was full (or the turn can never fit one): the client hears
  // RESOURCE_EXHAUSTED with the worker's reason (a retry hint, or "not retryable"), not
  // UNAVAILABLE.
  if (!exhausted_.empty()) {
    Fail(absl::ResourceExhaustedError(
        absl::StrCat("no worker has room for the turn (", exhausted_, ")")));
    return;
  }
  Fail(absl::UnavailableError(
      absl::StrCat("no worker could take the turn (", last_error_, "); retryable")));
}

void MergeTokens(const v1::TokenEvent& from, v1::TokenEvent* into) {
  into->mutable_token_ids()->Add(from.token_ids().begin(), from.token_ids().end());
  into->mutable_logprobs()->Add(from.logprobs().begin(), from.logprobs().end());
  into->mutable_token_logprobs()->Add(from.token_logprobs().begin(), from.token_logprobs().end());
  into->mutable_text()->append(from.text());
}

void TurnRunner::Succeed() {
  result_.seconds = since_start_.ElapsedSeconds();
  result_.tried = excluded_;
  result_.request_id = request_id_;
  std::shared_ptr<v1::Worker::Stub> stub =
      spec_.drop_after ? workers_.Stub(result_.worker) : nullptr;
  if (stub == nullptr) {
    Ended();
    sink_->OnTurnDone(std::move(result_));
    return;
  }
  // The session was one turn long: free its cache, then report (best effort: the cache is
  // derived state and would age out anyway).
  auto drop = std::make_shared<EndCall>(shared_from_this(), std::move(stub), EndCall::Kind::kDrop);
  drop->Start(drop);
}

std::vector<TakenBackTurn> FromProto(
    const google::protobuf::RepeatedPtrField<v1::TakenBackTurn>& taken) {
  std::vector<TakenBackTurn> out;
  for (const v1::TakenBackTurn& t : taken) {
    out.push_back({{t.token_ids().begin(), t.token_ids().end()}, t.prompt_tokens()});
  }
  return out;
}

std::vector<TakenBackTurn> TakenBackBy(const absl::Status& status) {
  const auto payload = status.GetPayload(kTakenBackPayload);  // an absl::optional
  v1::AbortResponse answer;
  if (!payload.has_value() || !answer.ParseFromString(std::string(*payload))) return {};
  return FromProto(answer.taken_back());
}

void WithTakenBack(const v1::AbortResponse& answer, absl::Status& status) {
  if (answer.taken_back_size() > 0) {
    status.SetPayload(kTakenBackPayload, absl::Cord(answer.SerializeAsString()));
  }
}

void TurnRunner::Fail(absl::Status status) {
  Ended();
  sink_->OnTurnError(std::move(status));
}

}  // namespace recall::coordinator
