// TurnJournal: a TurnSink between a TurnRunner and an edge (gRPC Converse, the HTTP API) that
// stores a session turn's reply before the client sees it, so what a client was sent is what
// the transcript holds, whatever dies when (session_store.h, TurnState).
//
// Each batch of tokens is written to the turn's reply (state in progress, with a lease) on a
// store thread and only then passed on to the edge; tokens that arrive while a write is in
// flight go into the next write, so a slow store costs latency, not a write per token. While
// the turn is silent (no token for a while: a long prefill, a queue), the LeaseKeeper has it
// write an empty part, which renews the lease, so replicas never read a running turn as
// interrupted. The
// end (done or error) is passed on after the last write. When a write fails, nothing more is
// passed on: the runner is cancelled and the turn ends UNAVAILABLE naming the store, with the
// reply as last stored (Conversations::Finish then marks it interrupted).
//
// Threading: the TurnSink calls come from the runner (they never block: they queue and post
// to the pool); the edge's sink is called from the pool's threads, one call at a time, in
// order. Ownership: the edge owns the journal and keeps it until its own terminal call came;
// the journal touches nothing of its own after making that call.
#pragma once

#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/conversations.h"
#include "coordinator/lease_keeper.h"
#include "coordinator/session_store.h"
#include "coordinator/turn_runner.h"
#include "coordinator/work_pool.h"

namespace recall::coordinator {

class TurnJournal final : public TurnSink, public LeaseKeeper::Renewable {
 public:
  // `lease_ms`: how long an in-progress reply's writer vouches for it after each write (Redis
  // replicas read an older one as interrupted). The journal is in `keeper` while it lives.
  TurnJournal(SessionStore& store, WorkPool& pool, LeaseKeeper& keeper, int64_t lease_ms,
              const OpenTurn& turn, TurnSink* edge);
  ~TurnJournal() override;

  // The runner, to cancel when a write fails. Before the runner starts.
  void SetRunner(std::shared_ptr<TurnRunner> runner);
  // What was passed on to the edge: the reply so far. Read after the edge's terminal call.
  const StoredMessage& sent() const { return sent_; }

  // ---- TurnSink (from the runner).
  void OnTokens(const v1::TokenEvent& tokens) override;
  void OnTurnDone(TurnResult result) override;
  void OnTurnError(absl::Status status) override;

  // ---- LeaseKeeper::Renewable: an empty write when nothing was written for `idle_ms`.
  void RenewIfSilent(int64_t idle_ms) override;

 private:
  // Posts Flush unless one is running. REQUIRES: mu_ held.
  void Kick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On the pool: writes and passes on what queued, until nothing is left.
  void Flush();

  SessionStore& store_;
  WorkPool& pool_;
  LeaseKeeper& keeper_;
  const int64_t lease_ms_;
  const std::string tenant_, session_id_;
  const int reply_index_;
  TurnSink* const edge_;
  StoredMessage sent_;  // touched by Flush only (one at a time), read after the end

  absl::Mutex mu_;
  std::shared_ptr<TurnRunner> runner_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::TokenEvent> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<TurnResult>> end_ ABSL_GUARDED_BY(mu_);
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
  bool renew_ ABSL_GUARDED_BY(mu_) = false;     // an empty write asked for (RenewIfSilent)
  int64_t last_write_ms_ ABSL_GUARDED_BY(mu_);  // Unix ms of the last write's start
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // a write failed: drop what comes
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::coordinator
