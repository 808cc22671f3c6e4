// HttpTurn: one turn on a TurnRunner for an HTTP request, whose handler thread waits for the
// runner's reports (cpp-httplib is blocking: a request is served on one thread of its pool).
//
// The TurnSink calls only queue text and record the end, and wake the waiting thread; they
// never block or do store I/O (which the HTTP thread does, through Conversations).
//
// Ownership: Start returns a shared_ptr; the runner's sink calls hold a reference while they
// run, so the HTTP side may drop its reference as soon as Next reports the end.
// Thread safety: Next and Cancel from the HTTP thread; the sink calls from the runner's.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/turn_journal.h"
#include "coordinator/turn_runner.h"

namespace recall::coordinator {

class HttpTurn final : public TurnSink, public std::enable_shared_from_this<HttpTurn> {
 public:
  // Starts `spec` on a runner. `workers` and `metrics` must outlive the turn. With `journal`
  // (a session turn's, made for this HttpTurn as its edge), the runner reports through it.
  static std::shared_ptr<HttpTurn> Start(
      WorkerRegistry& workers, metrics::Registry& metrics, TurnRunnerOptions options, TurnSpec spec,
      const std::function<std::unique_ptr<TurnJournal>(TurnSink* edge)>& journal = nullptr);

  struct Update {
    std::string text;  // the reply's text that arrived since the last call
    std::vector<v1::TokenLogprob> logprobs;  // its tokens' (when requested), likewise
    bool ended = false;
  };
  // Blocks until there is new text or logprobs, or the turn ended, or `timeout` passed (an
  // empty update, not ended).
  Update Next(absl::Duration timeout = absl::InfiniteDuration());
  // Every token's logprob received from the workers (when requested; a resumed turn's
  // stored part has none).
  std::vector<v1::TokenLogprob> logprobs() const;
  // The turn's end. REQUIRES: Next reported it.
  const absl::StatusOr<TurnResult>& outcome() const { return outcome_; }
  // Cancels the turn (the worker's turn is aborted); it then ends with CANCELLED.
  void Cancel();
  // The reply as sent: stored by the journal, or, without one (a completion), as the worker
  // streamed it (its resumed part first). REQUIRES: Next reported the end.
  StoredMessage sent() const;

  // ---- TurnSink.
  void OnTokens(const v1::TokenEvent& tokens) override;
  void OnTurnDone(TurnResult result) override;
  void OnTurnError(absl::Status status) override;

 private:
  HttpTurn() = default;
  void End(absl::StatusOr<TurnResult> outcome);

  std::shared_ptr<TurnRunner> runner_;    // set before the runner starts
  std::unique_ptr<TurnJournal> journal_;  // likewise
  mutable absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::TokenLogprob> pending_logprobs_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::TokenLogprob> logprobs_ ABSL_GUARDED_BY(mu_);  // all of them
  StoredMessage received_ ABSL_GUARDED_BY(mu_);  // without a journal: the reply so far
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // Written once, under mu_, before ended_; read by the HTTP thread after it saw ended_.
  absl::StatusOr<TurnResult> outcome_ = absl::UnknownError("the turn has not ended");
};

}  // namespace recall::coordinator
