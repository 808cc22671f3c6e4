#include "coordinator/http_turn.h"

#include <utility>

namespace recall::coordinator {

std::shared_ptr<HttpTurn> HttpTurn::Start(
    WorkerRegistry& workers, metrics::Registry& metrics, TurnRunnerOptions options, TurnSpec spec,
    const std::function<std::unique_ptr<TurnJournal>(TurnSink* edge)>& journal) {
  std::shared_ptr<HttpTurn> turn(new HttpTurn());
  {
    absl::MutexLock lock(&turn->mu_);
    turn->received_.role = "assistant";
    turn->received_.token_ids = spec.resume_tokens;
    turn->received_.content = spec.resume_text;
  }
  if (journal != nullptr) turn->journal_ = journal(turn.get());
  TurnSink* sink =
      turn->journal_ != nullptr ? static_cast<TurnSink*>(turn->journal_.get()) : turn.get();
  turn->runner_ = TurnRunner::Create(workers, metrics, options, std::move(spec), sink);
  if (turn->journal_ != nullptr) turn->journal_->SetRunner(turn->runner_);
  turn->runner_->Start();
  return turn;
}

HttpTurn::Update HttpTurn::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](HttpTurn* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
                             return !t->pending_.empty() || !t->pending_logprobs_.empty() ||
                                    t->ended_;
                           },
                           this),
                       timeout);
  Update u;
  u.text = std::move(pending_);
  pending_.clear();
  u.logprobs = std::move(pending_logprobs_);
  pending_logprobs_.clear();
  // The end is reported once what came before it was taken.
  u.ended = ended_ && u.text.empty() && u.logprobs.empty();
  return u;
}

std::vector<v1::TokenLogprob> HttpTurn::logprobs() const {
  absl::MutexLock lock(&mu_);
  return logprobs_;
}

void HttpTurn::Cancel() { runner_->Cancel(); }

StoredMessage HttpTurn::sent() const {
  if (journal_ != nullptr) return journal_->sent();
  absl::MutexLock lock(&mu_);
  return received_;
}

void HttpTurn::OnTokens(const v1::TokenEvent& tokens) {
  std::shared_ptr<HttpTurn> self = shared_from_this();  // alive until the lock is released
  absl::MutexLock lock(&mu_);
  received_.token_ids.insert(received_.token_ids.end(), tokens.token_ids().begin(),
                             tokens.token_ids().end());
  received_.content += tokens.text();
  pending_ += tokens.text();
  pending_logprobs_.insert(pending_logprobs_.end(), tokens.token_logprobs().begin(),
                           tokens.token_logprobs().end());
  logprobs_.insert(logprobs_.end(), tokens.token_logprobs().begin(), tokens.token_logprobs().end());
}

void HttpTurn::OnTurnDone(TurnResult result) { End(std::move(result)); }

void HttpTurn::OnTurnError(absl::Status status) { End(std::move(status)); }

void HttpTurn::End(absl::StatusOr<TurnResult> outcome) {
  std::shared_ptr<HttpTurn> self = shared_from_this();  // alive until the lock is released
  absl::MutexLock lock(&mu_);
  outcome_ = std::move(outcome);
  ended_ = true;
}

}  // namespace recall::coordinator
