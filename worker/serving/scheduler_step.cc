// Scheduler: the engine thread (commands, admission, preparing turns, finishing them). The
// batch itself (forward pass on every rank, eviction, sampling) is in scheduler_batch.cc.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/runtime/positions.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/scheduler_turn.h"
#include "worker/serving/turn_prompt.h"

namespace recall::serving {

void Scheduler::Loop() {
  while (true) {
    bool stopping;
    {
      // Running or waiting turns always make progress (Admit admits or fails the first
      // waiting turn when nothing runs), so the thread sleeps only with neither.
      const bool engine_busy = !active_.empty() || !waiting_.empty();
      absl::MutexLock lock(&mu_);
      auto has_work = [this, engine_busy]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return engine_busy || stop_ || !incoming_.empty() || !commands_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      stopping = stop_;
      if (stopping) {
        // Abort what is left, answer pending commands, then exit. (A stop that comes later,
        // while the commands are applied, is seen here next time: it used to end the thread
        // without this abort, leaving turns and commands unanswered.)
        for (auto& t : incoming_) waiting_.push_back(std::move(t));
        incoming_.clear();
        commands_.push_back({Command::Kind::kAbortAll, ""});
      }
    }
    ApplyCommands();
    if (stopping) return;
    Step();
  }
}

bool Scheduler::Step() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& t : incoming_) waiting_.push_back(std::move(t));
    incoming_.clear();
    load_.queued_turns = static_cast<int>(waiting_.size());  // Submit's queue limit counts them
  }
  // A session with a turn waiting is not offloaded or dropped to make room for others.
  for (auto& t : waiting_) {
    if (Session* s = memory_.Find(t->req.session_id)) s->busy = true;
  }
  // Pinned offloads may have passed the host budget while turns ran: back within it, by idle
  // caches (those of sessions with a turn waiting are busy now, and kept).
  memory_.TrimHost();
  episodes_.Collect();
  Admit();
  {
    // The turns just admitted count as running during their first step already (its first
    // token reaches the client before the step ends).
    absl::MutexLock lock(&mu_);
    load_.active_turns = static_cast<int>(active_.size());
    load_.queued_turns = static_cast<int>(waiting_.size());
  }
  if (!active_.empty()) {
    RunBatch();
    memory_.Settle();  // its eviction steps grew the policies' state
  }
  // Publish the load.
  // One entry per second (a step's entry each cost a fifth of a small model's CPU time to
  // sum): at most kRateSeconds + 1 of them.
  const int64_t second = RealClock::Get().NowNanos() / 1000000000;
  while (!token_seconds_.empty() && token_seconds_.front().first < second - kRateSeconds) {
    token_seconds_.pop_front();
  }
  int resident = 0, offloaded = 0;
  int64_t transcript_bytes = 0;
  for (const auto& [id, s] : memory_.sessions()) {
    resident += s->resident() ? 1 : 0;
    offloaded += s->offloaded() ? 1 : 0;
    transcript_bytes += s->transcript_bytes();
  }
  absl::MutexLock lock(&mu_);
  load_.kv_blocks_free = memory_.FreeBlocks();
  load_.active_turns = static_cast<int>(active_.size());
  load_.queued_turns = static_cast<int>(waiting_.size());
  load_.resident_sessions = resident;
  load_.offloaded_sessions = offloaded;
  load_.host_bytes_used = memory_.host_bytes();
  load_.side_bytes = memory_.side_bytes();
  load_.side_blocks = memory_.side_blocks();
  load_.transcript_bytes = transcript_bytes;
  rate_seconds_.assign(token_seconds_.begin(), token_seconds_.end());
  return !active_.empty();
}

void Scheduler::ApplyCommands() {
  std::vector<Command> commands;
  {
    // Every turn submitted so far is queued first, in the same lock: a command finds each turn
    // submitted before it was posted, even one still incoming (the engine was in a step when
    // it came), and also those submitted since (a drop or an abort of a session or of all
    // ends those too: they came before the command was applied).
    absl::MutexLock lock(&mu_);
    commands.swap(commands_);
    for (auto& t : incoming_) waiting_.push_back(std::move(t));
    incoming_.clear();
    load_.queued_turns = static_cast<int>(waiting_.size());  // Submit's queue limit counts them
  }
  for (Command& c : commands) {
    std::vector<std::shared_ptr<Turn>> hit;
    auto matches = [&](const Turn& t) {
      switch (c.kind) {
        case Command::Kind::kAbortRequest:
          return t.req.request_id == c.key;
        case Command::Kind::kAbortSession:
        case Command::Kind::kDrop:
        case Command::Kind::kDropIfIdle:
          return t.req.session_id == c.key;
        case Command::Kind::kAbortAll:
          return true;
      }
      return false;
    };
    for (auto& t : active_)
      if (matches(*t)) hit.push_back(t);
    for (auto& t : waiting_)
      if (matches(*t)) hit.push_back(t);
    auto answer = [&c](absl::StatusOr<int64_t> result) {
      if (c.done) c.done(std::move(result));
    };
    const bool drop = c.kind == Command::Kind::kDrop || c.kind == Command::Kind::kDropIfIdle;
    if (c.kind == Command::Kind::kDropIfIdle) {
      bool parked = false;
      {
        absl::MutexLock lock(&mu_);
        for (const auto& [id, t] : after_abort_) parked |= matches(*t);
      }
      if (!hit.empty() || parked) {
        // A turn came since the coordinator found this copy stale: it is in use again.
        answer(absl::FailedPreconditionError(
            absl::StrCat("session_id: session \"", c.key, "\" has a turn running; not dropped")));
        continue;
      }
    }
    // What the drop frees, as held before its turns end (a touched turn's end drops it).
    Session* held = drop ? memory_.Find(c.key) : nullptr;
    const int64_t freed = held != nullptr && held->resident() ? held->bytes_held() : 0;
    std::vector<std::shared_ptr<Turn>> hit_after_abort;  // never queued: nothing to undo
    {
      absl::MutexLock lock(&mu_);
      for (auto it = after_abort_.begin(); it != after_abort_.end();) {
        if (!matches(*it->second)) {
          ++it;
          continue;
        }
        busy_requests_.erase(it->second->req.request_id);
        hit_after_abort.push_back(std::move(it->second));
        it = after_abort_.erase(it);
      }
    }
    // A dropped session's turns end NOT_FOUND, the session's answer: as CANCELLED (a broken
    // stream to a coordinator) they were failed over to another worker, which the coordinator
    // marked down for it, and ran there on a session being deleted.
    const auto ended = [&c, drop](const Turn& t) {
      return drop ? absl::NotFoundError(absl::StrCat("session_id: session \"", c.key,
                                                     "\" was dropped while its turn ",
                                                     t.req.request_id, " ran"))
                  : absl::CancelledError(absl::StrCat("turn ", t.req.request_id, " aborted"));
    };
    for (auto& t : hit) {
      t->dropped = drop;  // counted as cancelled
      FinishTurn(*t, ended(*t));
    }
    for (auto& t : hit_after_abort) {
      metrics_->cancelled->Increment();
      t->stream->Finish(ended(*t));
      hit.push_back(std::move(t));  // counted
    }
    if (c.kind == Command::Kind::kAbortRequest && hit.empty()) {
      // It had ended as its client left: taken back all the same.
      Session* ended = nullptr;
      for (const auto& [id, held] : memory_.sessions()) {
        if (held->last_turn.has_value() && held->last_turn->request_id == c.key) ended = held.get();
      }
      if (ended != nullptr && !ended->busy && TakeBackFinished(*ended)) {
        answer(1);
        continue;
      }
    }
    if (!drop) {
      answer(static_cast<int64_t>(hit.size()));
      continue;
    }
    if (held == nullptr && hit.empty()) {
      answer(absl::NotFoundError(
          absl::StrCat("session_id: this worker holds no session \"", c.key, "\"")));
      continue;
    }
    if (Session* s = memory_.Find(c.key)) memory_.Drop(*s);  // (a touched turn's end dropped it)
    answer(freed);
  }
}

void Scheduler::Admit() {
  while (!waiting_.empty() && static_cast<int>(active_.size()) < options_.max_active) {
    std::shared_ptr<Turn> t = waiting_.front();
    if (!t->prepared) {
      absl::Status st = Prepare(*t);
      if (!st.ok()) {
        FinishTurn(*t, st);
        continue;
      }
    }
    if (!t->touched) {
      if (absl::Status st = CheckPeakFits(*t); !st.ok()) {
        FinishTurn(*t, st);
        continue;
      }
    }
    const RankBlocks need = BlocksToAdmit(*t);
    const int64_t most = *std::max_element(need.begin(), need.end());
    if (most > memory_.PoolBlocks()) {
      FinishTurn(*t, absl::ResourceExhaustedError(absl::StrCat(
                         "the turn needs ", most, " KV blocks but the whole pool has ",
                         memory_.PoolBlocks(),
                         ": use a smaller budget or a shorter transcript (not retryable)")));
      continue;
    }
    if (!MakeRoom(need, t->session)) {
      if (active_.empty()) {  // nothing will free memory: should not happen, never hang
        t->worker_failed = true;
        FinishTurn(*t, absl::ResourceExhaustedError(absl::StrCat(
                           "cannot free ", most, " KV blocks",
                           memory_.side_deficit() > 0
                               ? absl::StrCat(" and ", memory_.side_deficit(),
                                              " more for the policies' state and the turns' "
                                              "scratch")
                               : "",
                           "; retry after ", options_.retry_after_ms, " ms")));
        continue;
      }
      return;  // wait for running turns to end
    }
    absl::Status st = EnsureResident(*t);
    if (!st.ok()) {
      FinishTurn(*t, st);  // a restore's failure is the worker's (EnsureResident says)
      continue;
    }
    waiting_.pop_front();
    t->touched = true;
    t->admitted_at = ++step_;
    t->session->last_used = step_;
    active_.push_back(std::move(t));
  }
}

absl::Status Scheduler::PrepareEpisodes(Turn& t) {
  Session& s = *t.session;
  RECALL_ASSIGN_OR_RETURN(const size_t held, episodes_.BeginTurn(s, t.req.messages));
  if (held < s.tokens.size()) {
    t.prompt.insert(t.prompt.begin(), s.tokens.begin() + held, s.tokens.end());
    t.n_replay = static_cast<int>(s.tokens.size() - held);
    t.cached_tokens -= t.n_replay;
    metrics_->replayed_tokens->Increment(t.n_replay);
  }
  return absl::OkStatus();
}

namespace {

// A turn ended by its own fault or for want of room (a prompt past the context, a session
// whose policy cannot go on, a pool it outgrew), not by the worker's failure: counted apart
// in recall_worker_turns_total, so an operator's error rate is the worker's.
bool RefusedTurn(const absl::Status& status) {
  return absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status) ||
         absl::IsResourceExhausted(status) || absl::IsOutOfRange(status);
}

// The messages of the request's history past the session's copy, when the history is that
// copy and those messages more, none a reply the model gave: the cache has not seen them
// (a stopped turn's messages: the user's, sent again with the part of the reply the client
// got and a new message), and the continuation feeds them first. nullopt otherwise: a copy
// behind by a reply the model gave (it has its tokens: the session went on elsewhere) is
// rebuilt, which replays that reply from its tokens where its text could tokenize otherwise;
// an episodic session's episodes hold its whole transcript.
std::optional<std::vector<model::ChatMessage>> MessagesPastCopy(const Session& s,
                                                                const TurnRequest& r) {
  const size_t copy = static_cast<size_t>(s.message_count);
  if (s.episodic != nullptr || static_cast<int>(r.history.size()) != r.history_length ||
      r.history.size() <= copy) {
    return std::nullopt;
  }
  for (size_t i = copy; i < r.history.size(); ++i) {
    if (r.history[i].role == "assistant" && i < r.history_replies.size() &&
        r.history_replies[i].has_value()) {
      return std::nullopt;
    }
  }
  if (TranscriptDigest(
          {r.history.begin(), r.history.begin() + static_cast<std::ptrdiff_t>(copy)}) != s.digest) {
    return std::nullopt;
  }
  return std::vector<model::ChatMessage>(r.history.begin() + static_cast<std::ptrdiff_t>(copy),
                                         r.history.end());
}

}  // namespace

absl::Status Scheduler::PrepareContext(Turn& t) {
  const TurnRequest& r = t.req;
  const model::ModelConfig& config = model_.config;
  Session* s = memory_.Find(r.session_id);
  // The worker's copy of the transcript is usable when it has as many messages as the
  // request says came before, and they equal the request's history when one is sent (by
  // digest: the session keeps only its last messages).
  // (Not a session that took a turn back whose record nobody collected: the transcript lacks
  // it, so only a rebuild from the transcript is what a later rebuild would be.)
  // (Nor one the request says went through steps its history lacks: RunTurnRequest.rebuild.)
  if (s != nullptr && (Uncollected(r.session_id) || r.rebuild)) {
    memory_.Drop(*s);
    s = nullptr;
  }
  bool same_history = s != nullptr && s->message_count == r.history_length &&
                      (r.history.empty() || TranscriptDigest(r.history) == s->digest);
  // Or it is the worker's copy before its last turn, or with some of that turn's first
  // messages (a regenerate of it; a stopped reply that had ended): without eviction that turn
  // is taken back first, as an abort before its end would have, and the cache goes on (the
  // messages past the copy by MessagesPastCopy, below). With eviction that turn's steps
  // evicted, which a rebuild for the regenerate (the worker lost the session) could not redo:
  // so, for one rule, such a session is rebuilt from the transcript either way.
  if (!same_history && s != nullptr && s->last_turn.has_value() && s->evictors.empty()) {
    const Session::LastTurn& last = *s->last_turn;
    const bool before_last = last.message_count == r.history_length &&
                             (r.history.empty() || TranscriptDigest(r.history) == last.digest);
    const bool into_last =
        static_cast<int64_t>(r.history.size()) == r.history_length &&
        r.history_length > last.message_count && r.history_length < s->message_count &&
        TranscriptDigest({r.history.begin(),
                          r.history.begin() + static_cast<std::ptrdiff_t>(last.message_count)}) ==
            last.digest;
    if ((before_last || into_last) && TakeBackFinished(*s)) same_history = before_last;
  }
  // Or the history is the worker's copy and some messages more: they go first.
  std::vector<model::ChatMessage> caught_up;
  if (!same_history && s != nullptr && s->cache() != nullptr) {
    std::optional<std::vector<model::ChatMessage>> past = MessagesPastCopy(*s, r);
    same_history = past.has_value();
    if (same_history) caught_up = *std::move(past);
  }
  if (same_history && s->cache() != nullptr) {
    std::vector<model::ChatMessage> added = caught_up;
    added.insert(added.end(), r.messages.begin(), r.messages.end());
    RECALL_ASSIGN_OR_RETURN(std::optional<std::string> more_text,
                            ContinuationText(options_.chat_format, s->messages, added));
    if (more_text.has_value()) {
      std::vector<int32_t> tokens = s->pending;
      const std::vector<int32_t> more = tokenizer_.Encode(s->reply_tail + *more_text, false);
      tokens.insert(tokens.end(), more.begin(), more.end());
      // The session's length so far (its tokens, whatever their positions) and the new ones.
      const int64_t context = s->cache()->sequence_length() + static_cast<int64_t>(tokens.size());
      // A compact session goes on past the context length (PlanFeed re-positions it).
      if (context >= config.max_seq_len && s->positions == runtime::Positions::kOriginal) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages: the conversation needs ", context, " tokens of context (",
                         s->cache()->next_position(), " so far + ", tokens.size(),
                         " new) and its reply at least one more; the model's context length is ",
                         config.max_seq_len, "; ",
                         PastContextAdvice(s->evictor() != nullptr &&
                                           !s->evictor()->policy().compresses_prefill())));
      }
      // One whose policy evicts only at its first prompt cannot make room for them.
      const int64_t held =
          static_cast<int64_t>(s->max_length()) + static_cast<int64_t>(tokens.size());
      if (s->ends_at_context() && held >= config.max_seq_len) {
        return absl::InvalidArgumentError(absl::StrCat(
            "messages: the session's cache holds ", s->max_length(), " tokens, and with the ",
            tokens.size(),
            " of this turn and its reply at least one more they exceed the "
            "model's context length ",
            config.max_seq_len, "; its cache policy (",
            s->evictor() != nullptr ? "it evicts at the first prompt only" : "it does not evict",
            ") does not go on past it (start a new session)"));
      }
      if (!tokens.empty()) {
        t.session = s;
        t.continues = true;
        t.caught_up = std::move(caught_up);
        t.prompt = std::move(tokens);
        t.cached_tokens = static_cast<int>(std::min<int64_t>(s->tokens_fed, INT32_MAX));
        t.prompt_tokens = static_cast<int>(context);
        if (s->episodic != nullptr) RECALL_RETURN_IF_ERROR(PrepareEpisodes(t));
        t.prepared = true;
        s->busy = true;
        return absl::OkStatus();
      }
    }
  }
  // Rebuild: from the request's history, else from the worker's own copy when it is whole.
  std::vector<model::ChatMessage> all;
  if (static_cast<int>(r.history.size()) == r.history_length) {
    all = r.history;
  } else if (same_history && s->holds_transcript()) {
    all = s->messages;
  } else {
    return HistoryNeededError(r.session_id, r.history_length);
  }
  const std::vector<model::ChatMessage> history = all;
  all.insert(all.end(), r.messages.begin(), r.messages.end());
  // With the replies' tokens, the history is replayed through the steps that built the
  // cache; without them (or where that cannot be exact), its rendering is prefilled.
  // (Not where the first prompt was compressed once, SnapKV, nor for episodic sessions,
  // whose episodes replay their own way.)
  const absl::StatusOr<SessionCacheSpec> spec = caches_.Resolve(r.cache, 0);
  const bool replayable = spec.ok() && spec->policy != "snapkv" && spec->policy != "episodic";
  std::optional<ReplayPlan> replay;
  if (replayable && !r.history_replies.empty() && r.history_replies.size() == history.size()) {
    RECALL_ASSIGN_OR_RETURN(replay, PlanReplay(options_.chat_format, tokenizer_, history,
                                               r.history_replies, r.messages));
  }
  std::vector<int32_t> tokens;
  if (replay.has_value()) {
    tokens = std::move(replay->tokens);
    t.step_ranges = std::move(replay->step_ranges);
    t.give_backs = std::move(replay->give_backs);
  } else {
    RECALL_ASSIGN_OR_RETURN(std::string full, model::RenderChat(options_.chat_format, all, true));
    tokens = tokenizer_.Encode(full, true);
  }
  if (tokens.empty()) return absl::InvalidArgumentError("messages: render to no tokens");
  // What the cache holds once the prompt is fed (a replay gives some back on the way, where
  // its turns did, which fitted then).
  const size_t kept = tokens.size() - t.GivenBack();
  // A session whose cache re-positions at the context length and evicts as it is fed is
  // rebuilt from a transcript of any length, fed as it fits (PlanFeed); any other must fit
  // the context.
  const bool compact = spec.ok() && spec->positions == runtime::Positions::kCompact;
  if (static_cast<int64_t>(kept) >= config.max_seq_len && (!spec.ok() || spec->ends_at_context())) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the transcript is ", kept,
                     " tokens and its reply needs at least one more; the model's context length "
                     "is ",
                     config.max_seq_len));
  }
  if (s != nullptr) memory_.Drop(*s);
  auto fresh = std::make_unique<Session>();
  fresh->id = r.session_id;
  fresh->SetTranscript(history);
  if (compact) fresh->positions = runtime::Positions::kCompact;
  s = &memory_.Add(std::move(fresh));
  // (A history of system messages only is a session's first turn: nothing is rebuilt.)
  if (std::any_of(history.begin(), history.end(),
                  [](const model::ChatMessage& m) { return m.role != "system"; })) {
    t.rebuilt = true;
    metrics_->rebuilds->Increment();
  }
  t.session = s;
  t.prompt = std::move(tokens);
  t.prompt_tokens = static_cast<int>(kept);
  t.prepared = true;
  s->busy = true;
  return absl::OkStatus();
}

absl::Status Scheduler::Prepare(Turn& t) {
  const std::vector<int32_t>& resume = t.req.resume_tokens;
  for (size_t i = 0; i < resume.size(); ++i) {
    if (resume[i] < 0 || resume[i] >= model_.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("resume_tokens[", i, "]: ", resume[i],
                                                     " is outside [0, ", model_.config.vocab_size,
                                                     ")"));
    }
  }
  RECALL_RETURN_IF_ERROR(PrepareContext(t));
  // Resumed tokens that already complete a stop string ended the reply: the one that
  // completed it was sampled and never fed, so it is not fed here either, and nothing more is
  // sampled (Turn::resume_stop).
  size_t fed_resume = resume.size();
  if (!resume.empty()) {
    model::TokenStreamDecoder decoder(tokenizer_);
    decoder.Next(t.prompt.back());
    decoder.Flush();
    StopText stop = t.stop_text;
    for (size_t i = 0; i < resume.size(); ++i) {
      if (stop.Append(decoder.Next(resume[i]))) {
        fed_resume = i;
        t.resume_stop = resume[i];
        break;
      }
    }
  }
  if (fed_resume > 0) {
    // A session without a cache yet (new, or rebuilt from its transcript) starts at 0; one
    // that does not fit would reach the forward pass, whose error is its whole batch's.
    const size_t next = t.session->cache() != nullptr
                            ? static_cast<size_t>(t.session->cache()->next_position())
                            : 0;
    // Reply token i is fed at base + i. A reply that ended at the context sampled its last
    // token at the context's end, never fed: resumed whole (a worker died as it ended), that
    // token ends it again, unfed (it was refused, not retryable: a tester's turns near the
    // context's end never completed after a failover).
    // (A stop string found in them ended the reply first: then nothing past the context fits.)
    const size_t base = next + t.prompt.size() - t.GivenBack();
    const size_t context = static_cast<size_t>(model_.config.max_seq_len);
    if (t.session->positions == runtime::Positions::kOriginal && base + fed_resume > context) {
      if (base + fed_resume > context + 1 || t.resume_stop >= 0) {
        t.session->busy = false;
        return absl::InvalidArgumentError(absl::StrCat("resume_tokens: ", resume.size(),
                                                       " reply tokens after ", base,
                                                       " do not fit the context length ", context));
      }
      --fed_resume;
      t.resume_stop = resume[fed_resume];
      t.resume_finish = TurnFinish::kContext;
    }
  }
  if (fed_resume > 0) {
    // The reply tokens the client has were fed as decode steps: so are they here.
    t.step_ranges.emplace_back(t.prompt.size(), t.prompt.size() + fed_resume);
    t.prompt.insert(t.prompt.end(), resume.begin(),
                    resume.begin() + static_cast<std::ptrdiff_t>(fed_resume));
    t.n_resume = static_cast<int>(fed_resume);
    // Each resumed token took one draw when it was sampled: the turn goes on with the draws
    // that followed, so a seeded turn continues with the tokens it would have had.
    if (t.req.sampling.temperature > 0.0f) {
      for (int i = 0; i < t.n_resume; ++i) t.rng.NextFloat();
    }
  }
  return absl::OkStatus();
}

void Scheduler::CutAtStop(Turn& t) {
  Session& s = *t.session;
  // The last token sampled (the one that completed the stop string) was never fed.
  const int fed = static_cast<int>(t.generated.size()) - 1;
  const TokensAtCut cut = TokensBeforeCut(t.text_ends, t.stop_text.text().size(), fed);
  s.Unfeed(fed - cut.tokens);
  s.reply_tail = t.stop_text.text().substr(cut.tail);
}

bool Scheduler::GiveBack(Session& s, const std::string& request_id, int64_t fed_before,
                         int64_t prompt_fed, bool replayable) {
  if (s.episodic != nullptr || !s.resident() || s.tokens_fed < fed_before) return false;
  const int64_t n = s.tokens_fed - fed_before;
  // Without eviction the turn's tokens changed nothing before them: giving them back leaves
  // the cache as it was. With it, the turn's steps evicted and scored; that stays, and a
  // rebuild must do the same (replay.h): it needs the tokens (in the session's copy, which
  // keeps at least a context length of the last), fed as the replay feeds them (`replayable`:
  // a prompt, then decode steps, after a reply; not a policy that compresses each prompt).
  // Until the Abort's answer collects the record, the session is not continued (a caller that
  // never asked, a coordinator that died, stores none: its next turn rebuilds).
  if (!s.evictors.empty() && n > 0) {
    if (!replayable || s.evictor()->policy().compresses_prefill() ||
        n > static_cast<int64_t>(s.tokens.size())) {
      return false;
    }
    TakenBack taken;
    taken.session_id = s.id;
    taken.turn.token_ids.assign(s.tokens.end() - n, s.tokens.end());
    taken.turn.prompt_tokens = static_cast<int>(std::min(prompt_fed, n));
    absl::MutexLock lock(&taken_back_mu_);
    uncollected_.insert(s.id);
    taken_back_tokens_ += static_cast<int64_t>(taken.turn.token_ids.size());
    auto [it, added] = taken_back_.try_emplace(request_id);
    if (added) {
      taken_back_order_.push_back(request_id);
    } else {
      taken_back_tokens_ -= static_cast<int64_t>(it->second.turn.token_ids.size());
    }
    it->second = std::move(taken);
    // The oldest go first (their sessions stay uncollected: they rebuild).
    while (taken_back_order_.size() > 1 &&
           (static_cast<int>(taken_back_order_.size()) > kRememberedAborts ||
            taken_back_tokens_ > options_.taken_back_tokens)) {
      auto oldest = taken_back_.find(taken_back_order_.front());
      taken_back_tokens_ -= static_cast<int64_t>(oldest->second.turn.token_ids.size());
      taken_back_.erase(oldest);
      taken_back_order_.pop_front();
    }
  }
  s.Unfeed(static_cast<int>(n));
  metrics_->taken_back->Increment();
  return true;
}

bool Scheduler::TakeBack(Turn& t) {
  Session& s = *t.session;
  const bool after_reply = !s.messages.empty() && s.messages.back().role == "assistant";
  // (A failover's resumed reply tokens are steps of its prompt: not replayed as a prompt. One
  // stopped in its prompt: how that was cut into chunks depends on what was left of it, which
  // a replay of the part fed would not see.)
  if (!t.continues || !GiveBack(s, t.req.request_id, t.fed_before, static_cast<int64_t>(t.fed),
                                t.step_ranges.empty() && after_reply && t.fed >= t.prompt.size())) {
    return false;
  }
  s.pending = std::move(t.pending_before);
  s.reply_tail = std::move(t.reply_tail_before);
  return true;
}

bool Scheduler::TakeBackFinished(Session& s) {
  if (!s.last_turn.has_value()) return false;
  Session::LastTurn last = std::move(*s.last_turn);
  s.last_turn.reset();
  if (s.tokens_fed != last.fed_after ||
      !GiveBack(s, last.request_id, last.fed_before, last.prompt_tokens, last.after_reply)) {
    return false;
  }
  s.pending = std::move(last.pending);
  s.reply_tail = std::move(last.reply_tail);
  s.messages = std::move(last.messages);
  s.message_count = last.message_count;
  s.digest = last.digest;
  s.message_bytes = last.message_bytes;
  return true;
}

bool Scheduler::Uncollected(const std::string& session_id) {
  absl::MutexLock lock(&taken_back_mu_);
  return uncollected_.erase(session_id) > 0;
}

std::optional<TakenBackTurn> Scheduler::TakeTakenBack(const std::string& request_id) {
  absl::MutexLock lock(&taken_back_mu_);
  auto it = taken_back_.find(request_id);
  if (it == taken_back_.end()) return std::nullopt;
  std::optional<TakenBackTurn> out = std::move(it->second.turn);
  taken_back_tokens_ -= static_cast<int64_t>(out->token_ids.size());
  uncollected_.erase(it->second.session_id);
  taken_back_.erase(it);
  taken_back_order_.erase(
      std::find(taken_back_order_.begin(), taken_back_order_.end(), request_id));
  return out;
}

void Scheduler::FinishTurn(Turn& t, absl::Status status) {
  std::shared_ptr<Turn> keep;  // t may be owned only by the container it is removed from
  auto take = [&](auto& list) {
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (it->get() == &t) {
        keep = *it;
        list.erase(it);
        return;
      }
    }
  };
  take(active_);
  if (keep == nullptr) take(waiting_);
  std::shared_ptr<Turn> next;  // the session's turn that waited for this one's abort
  {
    // Before the stream ends, so a client may send the session's next turn at once.
    absl::MutexLock lock(&mu_);
    busy_sessions_.erase(t.req.session_id);
    busy_requests_.erase(t.req.request_id);
    aborting_sessions_.erase(t.req.session_id);
    if (auto it = after_abort_.find(t.req.session_id); it != after_abort_.end()) {
      next = std::move(it->second);
      after_abort_.erase(it);
      busy_sessions_.insert(t.req.session_id);
    }
  }
  // Waiting now, so a command applied after this one finds it (ApplyCommands).
  if (next != nullptr) waiting_.push_back(std::move(next));
  Session* s = t.session;
  if (status.ok()) {
    // What the decoder held back: after a length or context end it can complete a stop
    // string (a cut, like any other: the last token was not fed); after a stop token it does
    // not cut (every token was fed, as a replay of the reply feeds them).
    if (t.finish != TurnFinish::kStop) {
      t.stop_text.Append(t.decoder->Flush());
    } else if (!t.stop_text.stopped()) {
      t.stop_text.AppendUnchecked(t.decoder->Flush());
    }
    t.stream->PushText(t.stop_text.TakeAll());
    TurnSummary sum;
    sum.finish = t.finish;
    sum.text = t.stop_text.text();
    // The sampled token that ended the reply by length/context/stop string is not in the
    // cache yet: it is fed first at the next turn. A stop token is not part of the text.
    const bool stop_token = t.finish == TurnFinish::kStop && !t.stop_text.stopped();
    if (!stop_token && !t.stop_text.stopped() && !t.generated.empty()) s->pending = {t.next};
    std::vector<model::ChatMessage> added = t.caught_up;
    added.insert(added.end(), t.req.messages.begin(), t.req.messages.end());
    added.push_back({"assistant", sum.text});
    s->last_turn.reset();
    if (t.continues && s->episodic == nullptr && !(t.stop_text.stopped() && !s->evictors.empty())) {
      // (A reply cut in a session that evicts gave back tokens its steps evicted around: a
      // record of a prompt and steps does not replay that.)
      Session::LastTurn& last = s->last_turn.emplace();
      last.request_id = t.req.request_id;
      last.fed_before = t.fed_before;
      last.prompt_tokens = static_cast<int>(t.fed);
      last.after_reply =
          !s->messages.empty() && s->messages.back().role == "assistant" && t.step_ranges.empty();
      last.pending = t.pending_before;
      last.reply_tail = t.reply_tail_before;
      last.messages = s->messages;
      last.message_count = s->message_count;
      last.digest = s->digest;
      last.message_bytes = s->message_bytes;
    }
    s->AddMessages(added);
    if (t.stop_text.stopped()) CutAtStop(t);
    if (s->last_turn.has_value()) s->last_turn->fed_after = s->tokens_fed;
    sum.prompt_tokens = t.prompt_tokens;
    sum.cached_tokens = t.cached_tokens;
    sum.generated_tokens = static_cast<int>(t.generated.size());
    sum.state_bytes = s->state_bytes();
    sum.kv_bytes = s->bytes_held() + sum.state_bytes;
    if (s->cache() != nullptr) sum.held_tokens = s->cache()->max_length();
    sum.peak_kv_bytes = t.peak_kv_bytes;
    if (!s->evictors.empty()) {
      sum.evictions = TotalEvictions(*s) - t.evictions_at_start;
      sum.evicted_tokens = TotalEvictedSlots(*s) - t.evicted_at_start;
    }
    sum.rebuilt = t.rebuilt;
    if (s->episodic != nullptr) episodes_.TurnDone(*s);
    if (s->episodic != nullptr && !s->episodic->list.empty()) {
      for (const auto& e : s->episodic->list) {
        sum.episode_windows.push_back(static_cast<int>(e.windows.size()));
      }
      sum.episode = s->episodic->active;
      sum.replayed_tokens = t.n_replay;
    }
    metrics_->cached_tokens->Increment(t.cached_tokens);
    metrics_->evictions->Increment(static_cast<double>(sum.evictions));
    metrics_->evicted_tokens->Increment(static_cast<double>(sum.evicted_tokens));
    (t.finish == TurnFinish::kLength ? metrics_->finished_length
     : t.finish == TurnFinish::kStop ? metrics_->finished_stop
                                     : metrics_->finished_context)
        ->Increment();
    t.stream->Finish(absl::OkStatus(), std::move(sum));
  } else {
    (absl::IsCancelled(status) || t.dropped    ? metrics_->cancelled
     : RefusedTurn(status) && !t.worker_failed ? metrics_->refused
                                               : metrics_->failed)
        ->Increment();
    t.stream->Finish(status);
    // A partly run turn leaves the cache out of step with the transcript: an aborted one
    // gives back what it fed where that is exact, else the cache is dropped.
    if (t.touched && s != nullptr && !(absl::IsCancelled(status) && TakeBack(t))) {
      memory_.Drop(*s);
    }
  }
  if (Session* held = memory_.Find(t.req.session_id)) {
    held->busy = false;
    held->last_used = step_;
    memory_.DropIfUncached(held->id);  // never got a cache
  }
  // Its scratch goes with it (`keep` may be the last owner, or a caller's loop the next).
  t.probs.clear();
  t.window_queries.clear();
  t.raw_logits = {};
  SettleScratch();
}

}  // namespace recall::serving
