// Conversations: what every edge of the coordinator does to a session around a turn, so the
// gRPC Chat service (chat_service.h) and the OpenAI-compatible HTTP API (http_api.h) create,
// store and run turns the same way; the turn itself is a TurnRunner's (turn_runner.h).
//
//   Create  a session in the store: the tenant's session limit, the model (the one served
//           when none is named; NotFound for a model no worker serves), the KV type (one of
//           the workers' types), an optional system prompt.
//   Begin   a turn: mark the session as running (one turn at a time per session), load it,
//           ask the edge's planner which messages the turn adds (and how much of the stored
//           transcript it keeps: a client's diverging message list rewrites the tail), check
//           the turn limit, store the messages and the reply's place, in progress, as one
//           write (durable before any worker sees them) and build the TurnSpec: the new
//           messages, the complete turns before them as history (CompleteTurns), the bound
//           worker, the session's cache settings.
//   Resume  an interrupted (or failed) last turn named by its turn id: back in progress with
//           the part sent, the worker continuing it from there (resume tokens).
//   Journal the turn's reply as it streams: a TurnJournal (turn_journal.h) stores each batch
//           of tokens before the edge sends it.
//   Finish  it: store the reply complete and the worker binding, or, when the turn failed,
//           what was sent of it, marked interrupted (some was sent) or failed (none); count
//           it; clear the running mark. A request refused before any reply (a bad field, a
//           turn that can never fit: the codes a retry cannot fix) is taken back: that turn did
//           not happen, and the messages it replaced are put back. Later prompts hold only the
//           complete turns.
//   OneOff  the TurnSpec of a throwaway one-turn session (gRPC Generate, /v1/completions):
//           stored nowhere, its cache dropped on the worker after the reply.
//
// Thread safety: thread safe. Create, Begin and Finish do blocking store I/O: call them from a
// thread that may block (the store pool, an HTTP handler thread), never from a TurnSink call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"
#include "coordinator/lease_keeper.h"
#include "coordinator/recent_map.h"
#include "coordinator/session_store.h"
#include "coordinator/tenant_turns.h"
#include "coordinator/turn_runner.h"
#include "coordinator/work_pool.h"
#include "coordinator/worker_registry.h"
#include "recall/v1/chat.pb.h"

namespace recall::coordinator {

struct CoordinatorOptions {
  size_t max_message_bytes = 256 << 10;  // user message / system prompt
  int max_turns = 10000;                 // exchanges per session
  int max_sessions_per_tenant = 100000;
  // Turns a tenant may have running at once through this coordinator (TenantTurns); 0: no
  // limit.
  int max_running_per_tenant = 0;
  int max_attempts = 4;          // workers tried for one turn
  int default_max_tokens = 256;  // the workers' default when a turn leaves it unset
  int store_threads = 4;         // threads for Converse's session store steps
  // How long a reply in progress stays claimed by its coordinator without a write; renewed
  // while the turn runs, silent or not (Redis replicas read a lapsed one as interrupted).
  int turn_lease_seconds = 60;
  // Sessions idle this long (their last turn began or ended then) are deleted (idle_sessions.h); 0:
  // kept until deleted.
  double session_ttl_seconds = 0;
};

// What a turn does to the stored transcript: keep its first `keep` messages (the rest are
// dropped first), then append `add`.
class TurnJournal;

struct TurnMessages {
  int keep = 0;
  std::vector<StoredMessage> add;  // at least one
};

// Decides a turn's messages from the session as stored. An error refuses the turn.
using TurnPlanner = std::function<absl::StatusOr<TurnMessages>(const SessionRecord&)>;

// A turn between Begin and Finish.
struct OpenTurn {
  std::string tenant;
  std::string session_id;
  std::string model;  // the session's
  int index = 0;      // the first new message's position in the transcript
  int reply_index = 0;  // the reply's position (after the new messages)
  // The stored messages from `index` on that the turn replaced (a diverging message list):
  // put back when the turn is taken back.
  std::vector<StoredMessage> replaced;
  // Resume: the reply as it was stored before (the part sent); its journal starts from it.
  std::optional<StoredMessage> resumed;
  // The attempts that a worker took back since the last reply kept (those of a resumed reply,
  // and of the stopped turns this one replaced): they stay with its reply
  // (StoredMessage::taken_back), and a history sent for the turn holds them on its last reply
  // (a worker rebuilding the session for the turn replays them, as the one that kept its
  // cache went through them).
  std::vector<TakenBackTurn> earlier_attempts;
  // A resume's own earlier attempts (TakenBackTurn::own): not in its history; kept on the reply
  // if it is interrupted again, dropped once it completes.
  std::vector<TakenBackTurn> own_attempts;
  TurnSpec spec;      // for a TurnRunner
  std::string key;    // tenant/session: the running mark and the episodes
  std::string writer;  // the reply in progress's StoredMessage::writer: this coordinator
  std::string edge;   // "grpc" or "http", for the turns metric
  // The session was made for this turn (an HTTP conversation naming none): a refused or failed
  // turn deletes it rather than leave an empty session (counted against --max-sessions).
  bool new_session = false;
};

class Conversations {
 public:
  Conversations(SessionStore& store, WorkerRegistry& workers, CoordinatorOptions options,
                metrics::Registry& metrics);

  const CoordinatorOptions& options() const { return options_; }
  int64_t LeaseMs() const { return int64_t{std::max(1, options_.turn_lease_seconds)} * 1000; }
  // This coordinator's id in the replies it writes (StoredMessage::writer): random, per run.
  const std::string& instance_id() const { return instance_id_; }
  // Whether a turn of the session `key` ("tenant/id") runs here now (or is being stored).
  bool Running(const std::string& key) const;
  // A coordinator stopping (SIGTERM) takes no new turn while its running ones end: from then
  // on TakingTurns is UNAVAILABLE (retryable: another replica takes it), and so is a session
  // turn (Begin, Resume). Not undone.
  void StopTakingTurns() { stopping_.store(true); }
  absl::Status TakingTurns() const;
  // ResourceExhausted (retryable) while `tenant` has max_running_per_tenant turns running here.
  absl::Status CheckRunningTurns(const std::string& tenant) const {
    return tenant_turns_.Check(tenant);
  }
  // Whether `reply` (of session `key`) is in progress by this coordinator (or a store that
  // keeps no writer: SQLite, one coordinator's) with no turn of the session running here: an
  // orphan, a turn whose end could not be stored (a store outage), to be taken as interrupted
  // rather than as running until its lease passes.
  bool OwnOrphan(const std::string& key, const StoredMessage& reply) const {
    return reply.state == TurnState::kInProgress && WrittenHere(reply) && !Running(key);
  }
  // Whether `reply` was written by this coordinator (or a store that keeps no writer).
  bool WrittenHere(const StoredMessage& reply) const {
    return reply.writer.empty() || reply.writer == instance_id_;
  }
  // FailedPrecondition naming `messages` when `kept_turns` and the user messages of `added`
  // pass the coordinator's max_turns.
  absl::Status CheckTurnCount(int kept_turns, const std::vector<StoredMessage>& added) const;
  // Waits up to `timeout` for no turn of session `key` to run here; whether none does.
  bool AwaitNotRunning(const std::string& key, absl::Duration timeout) const;
  SessionStore& store() const { return store_; }
  TurnRunnerOptions RunnerOptions() const;

  // Unavailable (retryable) before any worker is known (recall serve's worker still loading its
  // model): a session made then would be stored with no model and no cache settings, for good.
  absl::Status CheckWorkerKnown() const;
  // `status`, and when it is a session not found while idle sessions are deleted
  // (--session-ttl), saying so.
  absl::Status ExplainMissing(const absl::Status& status) const;

  // A new session of `tenant`, with the system prompt as its first message when not empty.
  // ResourceExhausted at the tenant's limit; NotFound for a model no worker serves;
  // InvalidArgument / FailedPrecondition for a KV type that is no type / that no worker stores.
  absl::StatusOr<SessionRecord> Create(const std::string& tenant, const std::string& model,
                                       const v1::CacheSettings& cache,
                                       const std::map<std::string, std::string>& metadata,
                                       const std::string& system_prompt);

  // Begins a turn of `tenant`'s session `session_id` (see the top). NotFound for a session
  // that does not exist (or is another tenant's); FailedPrecondition while a turn of it runs or
  // at the turn limit; the planner's errors; store errors. Every error leaves the session as
  // it was and not running.
  // With `recent_turn_id` the planner is given the transcript's recent turns only, with the
  // user message of that turn id when there is one ("" for none): SessionStore::GetRecent, so
  // that a turn appended to a long session costs what a turn of a short one does (gRPC
  // Converse). The history then goes to a worker only when one needs it, read at that moment
  // (TurnSpec::fetch_history). Without it the planner sees the whole transcript (the HTTP
  // edge compares it with the request's messages).
  absl::StatusOr<OpenTurn> Begin(const std::string& tenant, const std::string& session_id,
                                 const TurnPlanner& plan, const v1::SamplingParams& sampling,
                                 const std::string& edge,
                                 const std::optional<std::string>& recent_turn_id = std::nullopt);
  // `tenant`'s session `session_id` as stored (NotFound for none, or another tenant's).
  absl::StatusOr<SessionRecord> Load(const std::string& tenant, const std::string& session_id) {
    return store_.Get(tenant, session_id);
  }
  // Resumes the turn whose user message has turn id `turn_id` (turn_ids.h) and whose reply
  // was interrupted or failed: marks the session running, stores the reply back in progress
  // (the part sent kept) and builds a spec that sends that message again with the complete
  // turns before it as history and the part sent as resume tokens (TurnSpec), so the worker
  // continues the reply where it stopped. FailedPrecondition naming `field` when the turn is
  // not the session's last (the session went on), is complete or running, or is gone; and
  // Begin's errors. Finish ends it like any turn.
  absl::StatusOr<OpenTurn> Resume(const std::string& tenant, const std::string& session_id,
                                  const std::string& field, const std::string& turn_id,
                                  const v1::SamplingParams& sampling, const std::string& edge);
  // The journal of `turn`'s reply, passing on to `edge` (see TurnJournal).
  std::unique_ptr<TurnJournal> Journal(const OpenTurn& turn, TurnSink* edge);
  // Ends a turn that Begin opened: stores the reply complete (outcome ok), or `sent` (what the
  // client was sent: the journal's) as interrupted, or failed when nothing was sent. Store
  // errors are returned (the running mark is cleared either way).
  // A turn refused before any reply (TakenBack) is taken back: its messages out, or its
  // session deleted when it was made for the turn (new_session).
  absl::Status Finish(const OpenTurn& turn, const absl::StatusOr<TurnResult>& outcome,
                      const StoredMessage& sent);
  // `turn`'s client left: the turn ends as soon as its worker lets it go, and Finish stores
  // it. A next turn of its session (the client stopped a reply and sent its list again) waits
  // for that, as for an end being stored, instead of finding the session running.
  void Ending(const OpenTurn& turn);
  // A turn whose reply ended on its worker (`result`) as its client left: stored as
  // interrupted, so its worker is asked to take it back too (an Abort by its request id, which
  // the worker honours while the session did nothing since; else its copy differs and the next
  // turn rebuilds). Blocks for the worker's answer (at most 2 s). The CANCELLED status to
  // store it with, carrying what the worker took back (TakenBackBy).
  absl::Status StoppedAfterItsEnd(const TurnResult& result);
  // Whether Finish deletes the turn's session: one made for it (new_session) whose turn was
  // refused or failed before any of its reply was sent (not one its client stopped).
  static bool DeletesItsSession(const OpenTurn& turn, const absl::StatusOr<TurnResult>& outcome,
                                const StoredMessage& sent);
  // Whether Finish takes the turn back: refused (a bad request, a limit, a precondition)
  // before any of its reply was sent.
  static bool TakenBack(const absl::StatusOr<TurnResult>& outcome, const StoredMessage& sent);
  // At start: the turns a previous run left in progress, marked interrupted (their count).
  absl::StatusOr<int> InterruptLeftoverTurns() { return store_.InterruptInProgress(); }

  // A one-turn session of `tenant` whose only message is `prompt` (from the user), on a
  // worker serving `model` ("": any).
  TurnSpec OneOff(const std::string& tenant, const std::string& model, const std::string& prompt,
                  const v1::SamplingParams& sampling, const v1::CacheSettings& cache) const;

  // NotFound (UnknownModel) for a model no worker serves; InvalidArgument for none ("")
  // when the workers serve several; a cluster with no worker known yet passes (the turn says
  // so).
  absl::Status CheckModel(const std::string& model) const;
  // A cache's kv_dtype: InvalidArgument for one that is none of f32, bf16, f16, int8;
  // FailedPrecondition naming what the workers store when none stores it. Unset passes.
  absl::Status CheckKvDtype(const v1::CacheSettings& cache) const;
  // A cache's policy: InvalidArgument listing the policies when no worker knows it (a turn
  // routed with it found no worker: FailedPrecondition, as for a session made with it). Unset,
  // or no worker known yet, passes.
  absl::Status CheckPolicy(const v1::CacheSettings& cache) const;
  // The same among the workers that could serve a session (`candidates`, down ones too):
  // InvalidArgument when no worker that said runs its policy (unknown), or when the
  // candidates that said do not run it and every candidate said; else OK.
  absl::Status CheckPolicyAmong(const std::vector<WorkerView>& candidates,
                                const v1::CacheSettings& cache) const;
  // A new session's cache settings and system prompt, checked by a worker serving `model`
  // ("" for any) that stores its kv_dtype and runs its policy (Worker.CheckSession; a policy
  // those workers do not run, CheckPolicyAmong): InvalidArgument naming the
  // field as its first turn would be refused; else the settings to keep for the session,
  // resolved with that worker's defaults (so a worker with other defaults that serves or
  // rebuilds it later runs the same cache). When no such worker answers (a worker of an
  // older version, or none reachable now) `cache` as given: the first turn checks it.
  absl::StatusOr<v1::CacheSettings> CheckNewSession(const std::string& model,
                                                    const v1::CacheSettings& cache,
                                                    const std::string& system_prompt) const;

  // The models the workers serve, by name (the healthy, not draining workers counted).
  std::vector<v1::ModelInfo> Models() const;
  // NotFound for `model`, naming the models that are served (a client that asked for
  // "stories260K" learns the name is "stories260K.bin").
  static absl::Status UnknownModel(const std::string& model,
                                   const std::vector<std::string>& served);
  // The smallest max_tokens limit among the answering workers serving `model` (all models for
  // ""; all workers when none answers; 0: none known): a turn may go to any of them.
  int MaxTokensLimit(const std::string& model) const;
  // The largest of the models' MaxTokensLimit (0: none known), from one look at the workers.
  int LargestModelMaxTokens() const;
  // InvalidArgument naming sampling.max_tokens when it passes that limit of `model`'s workers.
  absl::Status CheckMaxTokens(const std::string& model, const v1::SamplingParams& sampling) const;

  // The episodes a session's last turn reported (policy "episodic"); kept in memory only.
  bool RecallEpisodes(const std::string& key, v1::EpisodesReport* out);
  void ForgetEpisodes(const std::string& key);
  // The worker's summary of the session's last turn this coordinator served (kept in memory
  // only, like the episodes, for the kRememberedTurns sessions served last; false when there
  // is none).
  bool RecallLastTurn(const std::string& key, v1::TurnDone* out);
  static constexpr size_t kRememberedTurns = 100000;

 private:
  // Marks the session running, loads it (all of it, or its recent turns: Begin's
  // recent_turn_id) and lets `fill` store the turn's messages and build the turn; an error
  // (the store's, fill's) clears the mark. Begin's and Resume's frame.
  absl::StatusOr<OpenTurn> Open(
      const std::string& tenant, const std::string& session_id, const std::string& edge,
      const std::optional<std::string>& recent_turn_id,
      const std::function<absl::Status(const SessionRecord&, OpenTurn&)>& fill);
  // turn's model, places and spec: `messages` sent at `index` of `rec`'s transcript, the
  // complete turns before them as history: in the spec when rec holds the whole transcript,
  // else read when a worker needs them (TurnSpec::fetch_history).
  void BuildSpec(const SessionRecord& rec, int index, const std::vector<StoredMessage>& messages,
                 const v1::SamplingParams& sampling, const v1::CacheSettings& cache,
                 OpenTurn& turn);
  // The worker's history of a turn at `index` of the session, read whole: its complete turns
  // before `index` (with `earlier`, the turn's taken-back attempts, on its last reply), then
  // `replayed`.
  absl::StatusOr<std::vector<v1::ChatMessage>> ReadHistory(
      const std::string& tenant, const std::string& session_id, int index,
      const std::vector<StoredMessage>& replayed, const std::vector<TakenBackTurn>& earlier);
  // The session's stored cache settings; DataLoss naming the session when they do not parse
  // (run with the defaults instead, a turn would keep another cache than the one asked).
  static absl::StatusOr<v1::CacheSettings> StoredCache(const SessionRecord& rec);
  void RememberEpisodes(const std::string& key, const v1::TurnDone& done);
  void LogTurn(const OpenTurn& turn, const absl::StatusOr<TurnResult>& outcome,
               const StoredMessage& sent) const;
  // Marks a session as having a turn running; false if it already has one (refused at once:
  // waiting would hold a thread per conflicting request; a client that cancelled a turn and
  // sent the next before the coordinator heard of the cancel retries, as the C++ SDK does).
  // A turn whose end is being stored (Finish) is over for its client, who may already see
  // it ended in the session (a cancelled turn: INTERRUPTED), so it is waited for (up to
  // kFinishWait).
  bool MarkRunning(const std::string& key);
  void ClearRunning(const std::string& key);
  static constexpr absl::Duration kFinishWait = absl::Seconds(10);

  SessionStore& store_;
  WorkerRegistry& workers_;
  const CoordinatorOptions options_;
  const std::string instance_id_;
  metrics::Registry& metrics_;
  mutable absl::Mutex mu_;
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};                     // StopTakingTurns
  // Each tenant's running turns, counted by their runners (RunnerOptions).
  mutable TenantTurns tenant_turns_{
      options_.max_running_per_tenant,
      metrics_.GetCounter("recall_coordinator_tenant_limited_total",
                          "Turns refused for their tenant's --max-running-per-tenant")};
  std::set<std::string> finishing_ ABSL_GUARDED_BY(mu_);  // running, in Finish
  WorkPool journal_pool_;  // the journals' store writes
  LeaseKeeper lease_keeper_;  // renews silent journals' leases every eighth of a lease
  // The last turns' summaries by key (kRememberedTurns: a coordinator serves sessions
  // without end).
  RecentMap<v1::TurnDone> last_done_ ABSL_GUARDED_BY(mu_){kRememberedTurns};
};

}  // namespace recall::coordinator
