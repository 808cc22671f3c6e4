#include "worker/service/run_turn_reactor.h"

#include <utility>

#include "worker/service/worker_service.h"
#include "worker/serving/turn_request.h"

namespace recall::service {
namespace {

v1::FinishReason ToProto(serving::TurnFinish f) {
  switch (f) {
    case serving::TurnFinish::kLength:
      return v1::FINISH_REASON_LENGTH;
    case serving::TurnFinish::kStop:
      return v1::FINISH_REASON_STOP;
    case serving::TurnFinish::kContext:
      return v1::FINISH_REASON_CONTEXT;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const serving::TurnSummary& s, v1::TurnDone* done) {
  done->set_finish_reason(ToProto(s.finish));
  done->mutable_usage()->set_prompt_tokens(s.prompt_tokens);
  done->mutable_usage()->set_cached_tokens(s.cached_tokens);
  done->mutable_usage()->set_generated_tokens(s.generated_tokens);
  done->set_kv_bytes(s.kv_bytes);
  done->set_state_bytes(s.state_bytes);
  done->set_peak_kv_bytes(s.peak_kv_bytes);
  done->set_held_tokens(s.held_tokens);
  done->set_evictions(s.evictions);
  done->set_evicted_tokens(s.evicted_tokens);
  done->set_rebuilt(s.rebuilt);
  if (!s.episode_windows.empty()) {
    v1::EpisodesReport* e = done->mutable_episodes();
    for (int w : s.episode_windows) e->add_windows(w);
    e->set_active(s.episode);
    e->set_replayed_tokens(s.replayed_tokens);
  }
}

}  // namespace

grpc::ServerWriteReactor<v1::TurnEvent>* RunTurnReactor::Start(
    serving::Scheduler& scheduler, std::string request_id, int history_length,
    absl::StatusOr<std::shared_ptr<serving::TurnStream>> stream) {
  std::shared_ptr<RunTurnReactor> r(
      new RunTurnReactor(scheduler, std::move(request_id), history_length));
  r->self_ = r;
  if (!stream.ok()) {
    {
      absl::MutexLock lock(&r->mu_);
      r->end_ = ToGrpcStatus(stream.status());
    }
    r->Pump();
    return r.get();
  }
  {
    absl::MutexLock lock(&r->mu_);
    r->stream_ = *stream;
  }
  // Called on the engine thread for each update (and here if one is already pending).
  (*stream)->SetListener([weak = std::weak_ptr<RunTurnReactor>(r)] {
    if (std::shared_ptr<RunTurnReactor> live = weak.lock()) live->Pump();
  });
  return r.get();
}

RunTurnReactor::RunTurnReactor(serving::Scheduler& scheduler, std::string request_id,
                               int history_length)
    : scheduler_(scheduler), request_id_(std::move(request_id)), history_length_(history_length) {}

void RunTurnReactor::Pump() {
  bool write = false;
  grpc::Status finish;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || finished_) return;
    if (events_.empty() && !end_.has_value()) TakeUpdate();
    if (!events_.empty()) {
      write_ = std::move(events_.front());
      events_.pop_front();
      writing_ = true;
      write = true;
    } else if (end_.has_value()) {
      finished_ = true;
      finish = *end_;
    } else {
      return;  // nothing yet: the listener calls again
    }
  }
  if (write) {
    StartWrite(&write_);
  } else {
    Finish(finish);
  }
}

void RunTurnReactor::TakeUpdate() {
  serving::TurnUpdate u;
  if (stream_ == nullptr || !stream_->TryNext(&u)) return;
  if (!u.token_ids.empty() || !u.text.empty()) {
    v1::TokenEvent* tokens = events_.emplace_back().mutable_tokens();
    tokens->mutable_token_ids()->Add(u.token_ids.begin(), u.token_ids.end());
    for (serving::TokenLogprob& lp : u.logprobs) {
      tokens->add_logprobs(lp.logprob);
      v1::TokenLogprob* detail = tokens->add_token_logprobs();
      detail->set_logprob(lp.logprob);
      detail->set_token(std::move(lp.token));
      detail->mutable_top_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
      detail->mutable_top_logprobs()->Add(lp.top_logprobs.begin(), lp.top_logprobs.end());
      for (std::string& t : lp.top_tokens) detail->add_top_tokens(std::move(t));
    }
    tokens->set_text(std::move(u.text));
  }
  if (!u.done) return;
  if (serving::IsHistoryNeeded(u.status)) {
    events_.emplace_back().mutable_history_needed()->set_history_length(history_length_);
  }
  if (!u.status.ok()) {
    end_ = ToGrpcStatus(u.status);
    return;
  }
  ToProto(u.summary, events_.emplace_back().mutable_done());
  end_ = grpc::Status::OK;
}

void RunTurnReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
  }
  if (!ok) {
    Stop("the client went away");  // the stream is broken
    return;
  }
  Pump();
}

void RunTurnReactor::OnCancel() { Stop("the client cancelled the turn"); }

void RunTurnReactor::Stop(const char* why) {
  bool abort = false;
  {
    absl::MutexLock lock(&mu_);
    events_.clear();  // nobody reads them any more
    if (!end_.has_value()) {
      end_ = grpc::Status(grpc::StatusCode::CANCELLED, why);
      abort = true;
    }
  }
  if (abort) scheduler_.AbortRequestAsync(request_id_);
  Pump();
}

void RunTurnReactor::OnDone() {
  // The last reaction. Drop gRPC's reference; a listener call in progress holds another.
  std::shared_ptr<RunTurnReactor> self = std::move(self_);
}

}  // namespace recall::service
