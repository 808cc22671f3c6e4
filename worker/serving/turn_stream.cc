#include "worker/serving/turn_stream.h"

#include "common/logging.h"

namespace recall::serving {

const char* TurnFinishName(TurnFinish finish) {
  switch (finish) {
    case TurnFinish::kLength:
      return "length";
    case TurnFinish::kStop:
      return "stop";
    case TurnFinish::kContext:
      return "context";
  }
  return "?";
}

void TurnStream::PushToken(int32_t id, std::string_view text, TokenLogprob* logprob) {
  bool notify;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    pending_.token_ids.push_back(id);
    if (logprob != nullptr) pending_.logprobs.push_back(std::move(*logprob));
    pending_.text.append(text);
    notify = has_listener_;
  }
  if (notify) listener_();
}

void TurnStream::PushText(std::string_view text) {
  if (text.empty()) return;
  bool notify;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    pending_.text.append(text);
    notify = has_listener_;
  }
  if (notify) listener_();
}

void TurnStream::Finish(absl::Status status, TurnSummary summary) {
  bool notify;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    pending_.done = true;
    pending_.status = std::move(status);
    pending_.summary = std::move(summary);
    notify = has_listener_;
  }
  if (notify) listener_();
}

void TurnStream::SetListener(std::function<void()> listener) {
  bool pending;
  {
    absl::MutexLock lock(&mu_);
    RECALL_CHECK(!has_listener_) << "TurnStream::SetListener called twice";
    listener_ = std::move(listener);
    has_listener_ = true;
    pending = HasPending();
  }
  if (pending) listener_();
}

bool TurnStream::HasPending() const {
  return !delivered_end_ && (finished_ || !pending_.token_ids.empty() || !pending_.text.empty());
}

bool TurnStream::Next(absl::Duration timeout, TurnUpdate* out) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &TurnStream::HasPending), timeout);
  if (!HasPending()) return false;
  *out = std::move(pending_);
  pending_ = TurnUpdate();
  if (out->done) delivered_end_ = true;
  return true;
}

}  // namespace recall::serving
