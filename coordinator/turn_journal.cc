#include "coordinator/turn_journal.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace recall::coordinator {

TurnJournal::TurnJournal(SessionStore& store, WorkPool& pool, LeaseKeeper& keeper, int64_t lease_ms,
                         const OpenTurn& turn, TurnSink* edge)
    : store_(store),
      pool_(pool),
      keeper_(keeper),
      lease_ms_(lease_ms),
      tenant_(turn.tenant),
      session_id_(turn.session_id),
      reply_index_(turn.reply_index),
      edge_(edge) {
  if (turn.resumed.has_value()) sent_ = *turn.resumed;  // the part sent before, stored
  sent_.role = "assistant";
  sent_.state = TurnState::kInProgress;
  sent_.writer = turn.writer;  // the store refuses a write into another writer's reply
  sent_.seed = turn.spec.request.sampling().seed();  // so every write keeps it
  sent_.taken_back = turn.earlier_attempts;
  sent_.taken_back.insert(sent_.taken_back.end(), turn.own_attempts.begin(),
                          turn.own_attempts.end());
  {
    absl::MutexLock lock(&mu_);
    last_write_ms_ = UnixMillis();  // Begin or Resume wrote the reply with its lease
  }
  keeper_.Add(this);
}

TurnJournal::~TurnJournal() { keeper_.Remove(this); }

void TurnJournal::RenewIfSilent(int64_t idle_ms) {
  absl::MutexLock lock(&mu_);
  // A write in flight or queued renews it anyway; after the end, nothing is written.
  if (flushing_ || failed_ || end_.has_value() || UnixMillis() - last_write_ms_ < idle_ms) return;
  renew_ = true;
  Kick();
}

void TurnJournal::SetRunner(std::shared_ptr<TurnRunner> runner) {
  absl::MutexLock lock(&mu_);
  runner_ = std::move(runner);
}

void TurnJournal::OnTokens(const v1::TokenEvent& tokens) {
  absl::MutexLock lock(&mu_);
  if (failed_) return;
  if (pending_.has_value()) {
    MergeTokens(tokens, &*pending_);
  } else {
    pending_ = tokens;
  }
  Kick();
}

void TurnJournal::OnTurnDone(TurnResult result) {
  absl::MutexLock lock(&mu_);
  end_ = std::move(result);
  Kick();
}

void TurnJournal::OnTurnError(absl::Status status) {
  absl::MutexLock lock(&mu_);
  end_ = std::move(status);
  Kick();
}

void TurnJournal::Kick() {
  if (flushing_) return;
  flushing_ = true;
  pool_.Run([this] { Flush(); });
}

void TurnJournal::Flush() {
  while (true) {
    std::optional<v1::TokenEvent> tokens;
    std::optional<absl::StatusOr<TurnResult>> end;
    bool renew_only = false;
    {
      absl::MutexLock lock(&mu_);
      if (failed_) pending_.reset();
      tokens = std::move(pending_);
      pending_.reset();
      if (renew_ && !failed_ && !tokens.has_value() && !end_.has_value()) {
        tokens.emplace();  // an empty part: the lease is renewed, nothing is passed on
        renew_only = true;
      }
      renew_ = false;
      if (tokens.has_value()) last_write_ms_ = UnixMillis();
      if (!tokens.has_value()) {
        if (!end_.has_value()) {
          flushing_ = false;
          return;
        }
        end = std::move(end_);
        end_.reset();
        if (failed_) {
          // The store failed: the turn ends with that, still saying what its worker took back.
          absl::Status failure = failure_;
          if (const auto taken = end->status().GetPayload(kTakenBackPayload); taken.has_value()) {
            failure.SetPayload(kTakenBackPayload, *taken);
          }
          end = failure;
        }
      }
    }
    if (end.has_value()) {
      // Last: the edge may destroy the journal once it has its end.
      if (end->ok()) {
        edge_->OnTurnDone(std::move(**end));
      } else {
        edge_->OnTurnError(end->status());
      }
      return;
    }
    // The delta is written; sent_ becomes the whole (taken back if the write fails).
    StoredMessage delta;
    delta.token_ids.assign(tokens->token_ids().begin(), tokens->token_ids().end());
    delta.content = tokens->text();
    const size_t had_ids = sent_.token_ids.size(), had_text = sent_.content.size();
    sent_.token_ids.insert(sent_.token_ids.end(), delta.token_ids.begin(), delta.token_ids.end());
    sent_.content += delta.content;
    sent_.lease_unix_ms = UnixMillis() + lease_ms_;
    const absl::Status st = store_.AppendReply(tenant_, session_id_, reply_index_, delta, sent_);
    if (!st.ok()) {
      sent_.token_ids.resize(had_ids);
      sent_.content.resize(had_text);
      // No reply in progress there: the session deleted (DeleteSession), or the reply taken
      // over by another writer.
      const bool gone = (absl::IsNotFound(st) || absl::IsFailedPrecondition(st)) &&
                        absl::IsNotFound(store_.Get(tenant_, session_id_).status());
      std::shared_ptr<TurnRunner> runner;
      {
        absl::MutexLock lock(&mu_);
        failed_ = true;
        if (gone) {
          // Deleted while its turn ran (DeleteSession): nothing is kept, and a retry of the
          // turn finds no session.
          failure_ = absl::NotFoundError(absl::StrCat(
              "session_id: the session was deleted while its turn ran (", st.message(), ")"));
        } else if (absl::IsFailedPrecondition(st)) {
          // Another writer took the reply over (a coordinator that read this one's lease as
          // lapsed): the turn goes on there, not here.
          failure_ = absl::AbortedError(absl::StrCat(
              "the turn was taken over by another writer while its reply streamed (", st.message(),
              "); read the session for its reply (not retryable: "
              "it would run the turn again)"));
        } else if (absl::IsDataLoss(st)) {
          // A damaged store (SQLite's "malformed"): sending the turn again fails the same way.
          failure_ = absl::DataLossError(absl::StrCat(
              "the session store is damaged (", st.message(), "); the reply stops at the ",
              sent_.token_ids.size(), " tokens sent (not retryable: the store needs repair)"));
        } else {
          failure_ = absl::UnavailableError(
              absl::StrCat("the session store failed while the reply was streaming (", st.message(),
                           "); the reply stops at the ", sent_.token_ids.size(),
                           " tokens stored; the turn is kept as interrupted: a retry resumes "
                           "it on this coordinator once the store answers, on another once its "
                           "lease passes (--turn-lease, 60 s by default; 409 until then) "
                           "(retryable)"));
        }
        runner = runner_;
      }
      if (runner != nullptr) runner->Cancel();  // its end comes through OnTurnError
      continue;
    }
    if (!renew_only) edge_->OnTokens(*tokens);
  }
}

}  // namespace recall::coordinator
