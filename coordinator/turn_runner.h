// TurnRunner: one turn on the workers, end to end, for any edge of the coordinator (the
// gRPC Chat service today, an HTTP API later). The edge stores what it stores, builds a
// TurnSpec, and forwards what the runner reports to its TurnSink.
//
// What one turn is:
//   - Route it (router.h): to the session's bound worker while that worker is healthy, else
//     by weighted rendezvous hashing, never to a worker that already failed this turn.
//   - Stream RunTurn from that worker, reporting each TokenEvent to the sink as it arrives.
//   - HistoryNeeded event (the worker lacks the session): run it again on the same route with
//     the transcript (spec.history, or read then: spec.fetch_history), once. With
//     spec.send_history it goes with every attempt.
//   - RESOURCE_EXHAUSTED (the worker is full): try another worker, with the transcript.
//   - The worker fails (unreachable, the stream breaks, it ends without a TurnDone): mark it
//     down, and resume on another worker with the transcript plus the tokens already
//     reported (resume_tokens), so the sink's stream continues with no gap and no repeat.
//     When max_tokens were already delivered, the turn ends there (finish reason LENGTH).
//   - Any other error is the worker's answer (a bad request): reported, not retried.
//   - At most `max_attempts + 1` attempts; then UNAVAILABLE (retryable).
// The sink then gets exactly one OnTurnDone (the TurnDone, the worker, the failovers, the
// whole reply) or OnTurnError. Cancel ends the turn with CANCELLED, after the worker answered
// an Abort of the attempt (so the session's next turn does not find it still running there).
// With spec.drop_after, a one-turn session's cache is dropped on its worker before OnTurnDone.
// Metrics: routes, time to first token, tokens streamed and failovers (the names of the
// Prometheus series are in turn_runner.cc).
//
// The worker call is gRPC's callback client API: one ClientReadReactor per attempt, whose
// reactions report to the sink and, when the call ends, decide and start the next attempt. No
// thread waits on a worker and nothing polls: Cancel cancels the call in flight with
// ClientContext::TryCancel, and its end (CANCELLED) ends the turn. A blocking Read on a
// thread per turn would have been simpler to read, but would hold a thread for every running
// turn and need a join in the edge's reactor; the callback form keeps the attempt loop as one
// small decision function (OnCallEnded) over the same state.
//
// Threading: Start and Cancel may be called from any thread. Sink calls come one at a time,
// from gRPC's callback threads (or from inside Start, when the turn ends at once, or from
// the thread that answers spec.fetch_history), never with the runner's lock held; they must not
// block (no store I/O: hand it to a thread that may). A sink may call Cancel from inside a sink
// call.
//
// Ownership: Create returns a shared_ptr; the runner keeps itself alive while a worker call
// is in flight. The sink must outlive the terminal call; the runner never touches it after.
// When the terminal call comes, the runner's worker calls are torn down already (the
// Generate cache drop included), so the caller may destroy the registry right after it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics/registry.h"
#include "coordinator/router.h"
#include "coordinator/session_store.h"
#include "coordinator/tenant_turns.h"
#include "coordinator/worker_registry.h"
#include "grpcpp/grpcpp.h"
#include "recall/v1/worker.grpc.pb.h"

namespace recall::coordinator {

struct TurnRunnerOptions {
  int max_attempts = 4;          // workers tried for one turn (failover, RESOURCE_EXHAUSTED)
  int default_max_tokens = 256;  // the workers' default when the turn leaves it unset
  // Counts the turn under its tenant (TurnSpec::tenant) from Start to its end; a tenant at its
  // limit ends the turn at Start with RESOURCE_EXHAUSTED. Null: not counted.
  TenantTurns* tenant_turns = nullptr;
};

// How a TurnSpec's history is handed over when it is read late (TurnSpec::fetch_history).
using HistoryCallback = std::function<void(absl::StatusOr<std::vector<v1::ChatMessage>> history)>;

// What to run.
struct TurnSpec {
  // The request for the worker: session_id (also the routing key), messages, history_length,
  // sampling and cache. Its history and resume_tokens are the runner's to fill.
  v1::RunTurnRequest request;
  std::vector<v1::ChatMessage> history;  // the transcript before the turn
  // When set, `history` is empty and this reads it, once, when an attempt first needs it (a
  // worker that does not hold the session, a failover): it must not block, and calls its
  // callback once, from any thread, with the history or the error that ends the turn. So a
  // turn on a worker that holds the session never reads the transcript.
  std::function<void(HistoryCallback)> fetch_history;
  std::string bound;                     // the session's worker; empty: none yet
  std::string model;                     // only workers serving this model; empty: any
  std::string tenant;                    // whose turn (TurnRunnerOptions::tenant_turns)
  bool drop_after = false;               // a one-turn session: drop its cache when done
  // Send the history from the first attempt, so the worker compares it with its copy: the
  // transcript was rewritten (a client's diverging message list), and a worker's copy of the
  // same length may hold other messages.
  bool send_history = false;
  // A turn resumed after an interruption (Conversations::Resume): the reply so far. The
  // worker gets its tokens as the decode steps they were and continues; the result holds
  // them (and the text) before what follows; only what follows is reported to the sink.
  std::vector<int32_t> resume_tokens;
  std::string resume_text;
};

// A turn that happened.
struct TurnResult {
  v1::TurnDone done;            // the worker's summary
  std::string worker;           // who finished it (empty when failover found it complete)
  std::string request_id;       // its RunTurn's there (for an Abort that takes it back)
  int failovers = 0;            // workers lost during the turn
  std::vector<std::string> tried;  // workers that failed the turn or were full, in order
  std::vector<int32_t> tokens;  // the whole reply, as reported to the sink
  std::string text;
  double first_token_seconds = 0;  // from Start to the first token (0: none)
  double seconds = 0;              // from Start to the end
};

// A turn cancelled on a session that evicts: what its worker's Abort answered it took back
// rides on the CANCELLED status as this payload (a serialized v1::AbortResponse), so the edge
// stores it with the interrupted reply (StoredMessage::taken_back). TakenBackBy reads it
// (none when there is none); WithTakenBack sets it.
inline constexpr char kTakenBackPayload[] = "type.googleapis.com/recall.v1.AbortResponse";
std::vector<TakenBackTurn> TakenBackBy(const absl::Status& status);
void WithTakenBack(const v1::AbortResponse& answer, absl::Status& status);
// The proto's records as the store keeps them.
std::vector<TakenBackTurn> FromProto(
    const google::protobuf::RepeatedPtrField<v1::TakenBackTurn>& taken);

// Appends `from`'s tokens, logprobs (both forms) and text to `into` (tokens that queued up go on as
// one event).
void MergeTokens(const v1::TokenEvent& from, v1::TokenEvent* into);

// Where a TurnRunner reports. See the threading notes above.
class TurnSink {
 public:
  virtual ~TurnSink() = default;
  // Tokens (one or more, with the text they add) in order, each delivered once.
  virtual void OnTokens(const v1::TokenEvent& tokens) = 0;
  // The end: exactly one of these, last.
  virtual void OnTurnDone(TurnResult result) = 0;
  virtual void OnTurnError(absl::Status status) = 0;
};

class TurnRunner : public std::enable_shared_from_this<TurnRunner> {
 public:
  // `workers`, `metrics` and `sink` must outlive the turn.
  static std::shared_ptr<TurnRunner> Create(WorkerRegistry& workers, metrics::Registry& metrics,
                                            TurnRunnerOptions options, TurnSpec spec,
                                            TurnSink* sink);
  ~TurnRunner();

  // Starts the turn. REQUIRES: called once. From Start to its end (the sink's report) the turn
  // counts in the gauge RunningTurns (a stopping coordinator waits for it to reach 0).
  void Start();
  static metrics::Gauge* RunningTurns(metrics::Registry& metrics);
  // Ends the turn with CANCELLED, promptly: the worker call in flight is cancelled (its
  // worker aborts the turn). Idempotent; a turn that already ended is not affected.
  void Cancel();

 private:
  class Call;  // one RunTurn attempt
  class EndCall;  // a one-turn session's DropSession, a cancelled attempt's Abort

  TurnRunner(WorkerRegistry& workers, metrics::Registry& metrics, TurnRunnerOptions options,
             TurnSpec spec, TurnSink* sink);
  // The turn ended (before its report to the sink): out of RunningTurns.
  void Ended();

  // Routes and starts the next attempt, or ends the turn.
  void NextAttempt();
  // Starts the attempt routed to (route_) on `stub`, with the history when it needs it (read
  // first when it is not yet: spec_.fetch_history).
  void Send(std::shared_ptr<v1::Worker::Stub> stub);
  // The history to send: spec_.history, or what fetch_history read.
  const std::vector<v1::ChatMessage>& History() const {
    return fetched_.has_value() ? *fetched_ : spec_.history;
  }
  bool Cancelled();
  // From the attempt in flight (its reactions run one at a time).
  void OnEvent(const v1::TurnEvent& event);
  void OnCallEnded(const grpc::Status& status);
  // Terminal reports. Nothing touches the runner's state after them.
  void Succeed();
  // Ends the turn when no worker is left to try: RESOURCE_EXHAUSTED if workers were full,
  // UNAVAILABLE otherwise.
  void FailNoWorker();
  void Fail(absl::Status status);

  WorkerRegistry& workers_;
  metrics::Registry& metrics_;
  const TurnRunnerOptions options_;
  const TurnSpec spec_;
  TurnSink* const sink_;
  metrics::Gauge* const running_;  // RunningTurns
  bool counted_ = false;           // under options_.tenant_turns (Start, Ended)

  // The attempt loop's state. Touched by Start and then only by the attempt in flight,
  // whose reactions are serialized, and by the next attempt after it ended.
  Stopwatch since_start_;
  int attempt_ = 0;
  std::vector<std::string> excluded_;  // workers that failed or were full
  std::string exhausted_;              // the last RESOURCE_EXHAUSTED answer of a worker, if any
  std::string sticky_;                 // the bound worker, until it fails
  bool send_history_ = false;
  // (None tried: none known, e.g. a recall serve whose worker is still loading its model.)
  std::string last_error_ = "no worker is registered (a worker joins once it has loaded its model)";
  std::optional<RouteDecision> route_;  // the attempt in flight
  std::string request_id_;              // the attempt in flight's (RunTurnRequest.request_id)
  bool got_done_ = false;
  bool history_needed_ = false;
  std::optional<std::vector<v1::ChatMessage>> fetched_;  // spec_.fetch_history's answer
  TurnResult result_;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Call> call_ ABSL_GUARDED_BY(mu_);  // the attempt in flight
};

}  // namespace recall::coordinator
