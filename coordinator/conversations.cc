#include "coordinator/conversations.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/random_id.h"
#include "coordinator/router.h"
#include "coordinator/turn_ids.h"
#include "coordinator/turn_journal.h"

namespace recall::coordinator {
namespace {

// Whether none of a turn's reply reached its client (`sent`: the journal's record of it).
bool NothingSent(const StoredMessage& sent) {
  return sent.token_ids.empty() && sent.content.empty();
}

// `earlier` (a turn's taken-back attempts: they ran after the last reply kept) on the last
// reply of `history` the model gave (a rebuild replays them after it, replay.h).
void AttachTakenBack(const std::vector<TakenBackTurn>& earlier,
                     std::vector<StoredMessage>& history) {
  for (auto it = history.rbegin(); !earlier.empty() && it != history.rend(); ++it) {
    if (it->role != "assistant" || it->finish == 0) continue;
    it->taken_back_after.insert(it->taken_back_after.end(), earlier.begin(), earlier.end());
    return;
  }
}

v1::ChatMessage ToProto(const StoredMessage& m) {
  v1::ChatMessage out;
  out.set_role(m.role);
  out.set_content(m.content);
  out.mutable_token_ids()->Add(m.token_ids.begin(), m.token_ids.end());
  if (m.finish != 0) out.set_finish_reason(static_cast<v1::FinishReason>(m.finish));
  for (const TakenBackTurn& t : m.taken_back_after) {
    v1::TakenBackTurn* p = out.add_taken_back_after();
    p->mutable_token_ids()->Add(t.token_ids.begin(), t.token_ids.end());
    p->set_prompt_tokens(t.prompt_tokens);
  }
  return out;
}

// The workers whose limits apply: those answering (a stopped worker's --max-tokens-limit held
// for every turn after it went), or all of them when none answers.
std::vector<WorkerView> Answering(std::vector<WorkerView> all) {
  std::vector<WorkerView> up;
  for (WorkerView& w : all) {
    if (w.healthy) up.push_back(std::move(w));
  }
  return up.empty() ? all : up;
}

// A seed for a turn whose request sets none (sampling then differs from turn to turn).
uint64_t RandomSeed() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

// The request's sampling; an unset seed draws a fresh one, chosen here and stored with the
// reply (StoredMessage::seed), so a failover or a resumed turn takes the same draws.
v1::SamplingParams WithSeed(const v1::SamplingParams& sampling) {
  v1::SamplingParams out = sampling;
  if (!out.has_seed()) out.set_seed(RandomSeed());
  return out;
}

}  // namespace

Conversations::Conversations(SessionStore& store, WorkerRegistry& workers,
                             CoordinatorOptions options, metrics::Registry& metrics)
    : store_(store),
      workers_(workers),
      options_(options),
      instance_id_(RandomId("c-")),
      metrics_(metrics),
      journal_pool_(std::max(1, options.store_threads)),
      lease_keeper_(absl::Milliseconds(LeaseMs() / 8)) {}

TurnRunnerOptions Conversations::RunnerOptions() const {
  TurnRunnerOptions o;
  o.max_attempts = options_.max_attempts;
  o.default_max_tokens = options_.default_max_tokens;
  o.tenant_turns = &tenant_turns_;
  return o;
}

absl::Status Conversations::ExplainMissing(const absl::Status& status) const {
  if (!absl::IsNotFound(status) || options_.session_ttl_seconds <= 0 ||
      !absl::StartsWith(status.message(), "session_id:")) {
    return status;
  }
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), " (sessions idle for ", options_.session_ttl_seconds,
                   " s are deleted: the coordinator's --session-ttl)"));
}

absl::Status Conversations::CheckWorkerKnown() const {
  std::vector<std::string> silent;  // listed, never answered with their model
  for (const WorkerView& w : workers_.Snapshot()) {
    if (!w.info.model().empty()) return absl::OkStatus();
    silent.push_back(w.address);
  }
  constexpr char kNone[] = "no worker is registered yet to make the session for";
  if (silent.empty()) {
    return absl::UnavailableError(
        absl::StrCat(kNone, " (a worker joins once it has loaded its model); retryable"));
  }
  const size_t listed = silent.size();
  if (silent.size() > 3) silent.resize(3);
  return absl::UnavailableError(absl::StrCat(
      kNone, ": the ", listed, " listed (", absl::StrJoin(silent, ", "), listed > 3 ? ", ..." : "",
      ") have not answered: not running, unreachable, or still loading their model; retryable"));
}

absl::StatusOr<SessionRecord> Conversations::Create(
    const std::string& tenant, const std::string& model, const v1::CacheSettings& cache,
    const std::map<std::string, std::string>& metadata, const std::string& system_prompt) {
  const std::vector<WorkerView> workers = workers_.Snapshot();
  std::set<std::string> served;
  for (const WorkerView& w : workers) {
    if (!w.info.model().empty()) served.insert(w.info.model());
  }
  // A session is made for the model it names, or the one the workers serve: its turns go to
  // the workers serving it.
  SessionRecord r;
  r.model = model;
  if (r.model.empty() && served.size() == 1) r.model = *served.begin();
  if (r.model.empty() && served.size() > 1) {
    return flags::FieldError("model", absl::StrCat("required: the workers serve several models (",
                                                   absl::StrJoin(served, ", "), ")"));
  }
  if (!r.model.empty() && !served.empty() && served.count(r.model) == 0) {
    return UnknownModel(r.model, std::vector<std::string>(served.begin(), served.end()));
  }
  RECALL_RETURN_IF_ERROR(CheckKvDtype(cache));
  RECALL_ASSIGN_OR_RETURN(const v1::CacheSettings kept,
                          CheckNewSession(r.model, cache, system_prompt));
  r.id = RandomId("s-");
  r.tenant = tenant;
  kept.SerializeToString(&r.cache_settings);
  r.metadata = metadata;
  r.created_unix_ms = UnixMillis();
  // Counted and created as one step of the store: concurrent creations (a burst of HTTP
  // requests naming no session, replicas sharing Redis) each saw the count before the others'
  // writes and passed the limit.
  if (absl::Status made = store_.Create(r, options_.max_sessions_per_tenant);
      absl::IsResourceExhausted(made)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the tenant has reached its limit of ", options_.max_sessions_per_tenant, " sessions",
        options_.session_ttl_seconds > 0
            ? absl::StrCat("; delete some (sessions idle for ", options_.session_ttl_seconds,
                           " s are deleted: --session-ttl)")
            : std::string("; delete some, or have the coordinator delete idle ones "
                          "(--session-ttl)"),
        " (not retryable)"));
  } else if (!made.ok()) {
    return made;
  }
  if (!system_prompt.empty()) {
    RECALL_RETURN_IF_ERROR(store_.Append(tenant, r.id, 0, {"system", system_prompt}));
    r.messages.push_back({"system", system_prompt});
    r.message_count = 1;
  }
  metrics_.GetCounter("recall_coordinator_sessions_created_total", "Sessions created")->Increment();
  return r;
}

absl::StatusOr<OpenTurn> Conversations::Open(
    const std::string& tenant, const std::string& session_id, const std::string& edge,
    const std::optional<std::string>& recent_turn_id,
    const std::function<absl::Status(const SessionRecord&, OpenTurn&)>& fill) {
  OpenTurn turn;
  turn.tenant = tenant;
  turn.session_id = session_id;
  turn.key = tenant + "/" + session_id;
  turn.writer = instance_id_;
  turn.edge = edge;
  RECALL_RETURN_IF_ERROR(TakingTurns());
  // A tenant at its limit is refused before the store is touched (its runner counts the turn).
  RECALL_RETURN_IF_ERROR(tenant_turns_.Check(tenant));
  if (!MarkRunning(turn.key)) {
    // A session this tenant does not have answers NOT_FOUND however many of its turns come
    // at once (the second of two said one of its turns was running).
    if (absl::Status st = store_.Get(tenant, session_id).status(); absl::IsNotFound(st)) {
      return st;
    }
    return absl::FailedPreconditionError(
        "session_id: a turn of this session is running; send the next when it ends "
        "(retryable)");
  }
  // Everything below happens with the mark set; an error clears it.
  absl::Status status = [&]() -> absl::Status {
    RECALL_ASSIGN_OR_RETURN(const SessionRecord rec,
                            recent_turn_id.has_value()
                                ? store_.GetRecent(tenant, session_id, *recent_turn_id)
                                : store_.Get(tenant, session_id));
    return fill(rec, turn);
  }();
  if (!status.ok()) {
    ClearRunning(turn.key);
    return ExplainMissing(status);
  }
  return turn;
}

void Conversations::BuildSpec(const SessionRecord& rec, int index,
                              const std::vector<StoredMessage>& messages,
                              const v1::SamplingParams& sampling, const v1::CacheSettings& cache,
                              OpenTurn& turn) {
  turn.model = rec.model;
  turn.index = index;
  turn.reply_index = index + static_cast<int>(messages.size());
  TurnSpec& spec = turn.spec;
  // The prompt holds the complete turns only; where the stored transcript has others, the
  // worker's copy may hold them: it compares and rebuilds. (rec holds whole turns from
  // first_message on, and counts the earlier ones the prompt holds.)
  std::vector<StoredMessage> history = CompleteTurns(rec.messages, index - rec.first_message);
  const int before = rec.earlier_in_prompt + static_cast<int>(history.size());
  if (before != index) spec.send_history = true;
  // Leading exchanges of the turn's messages whose replies carry their token ids (a new
  // session made from a conversation whose replies another session kept) go as history, so
  // the worker replays them as they were generated instead of tokenizing their text.
  size_t replayed = 0;
  if (before == index) {
    for (size_t i = 0; i + 1 < messages.size(); ++i) {  // the last one stays the turn's
      if (messages[i].role != "assistant") continue;
      if (messages[i].token_ids.empty() || messages[i].finish == 0) break;
      replayed = i + 1;
    }
  }
  const std::vector<StoredMessage> leading(
      messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(replayed));
  if (replayed > 0) spec.send_history = true;
  const int history_length = before + static_cast<int>(replayed);
  if (rec.first_message == 0) {
    AttachTakenBack(turn.earlier_attempts, history);
    history.insert(history.end(), leading.begin(), leading.end());
    for (const StoredMessage& h : history) spec.history.push_back(ToProto(h));
  } else {
    // Read on the journal pool (a store read may block; the runner asks from a gRPC thread).
    spec.fetch_history = [this, tenant = turn.tenant, id = turn.session_id, index, leading,
                          earlier = turn.earlier_attempts](HistoryCallback done) {
      journal_pool_.Run([this, tenant, id, index, leading, earlier, done = std::move(done)]() {
        done(ReadHistory(tenant, id, index, leading, earlier));
      });
    };
  }
  spec.bound = rec.worker;
  spec.model = rec.model;
  spec.tenant = turn.tenant;
  v1::RunTurnRequest& request = spec.request;
  request.set_session_id(turn.session_id);
  for (size_t i = replayed; i < messages.size(); ++i)
    *request.add_messages() = ToProto(messages[i]);
  request.set_history_length(history_length);
  *request.mutable_sampling() = WithSeed(sampling);
  *request.mutable_cache() = cache;
}

absl::StatusOr<std::vector<v1::ChatMessage>> Conversations::ReadHistory(
    const std::string& tenant, const std::string& session_id, int index,
    const std::vector<StoredMessage>& replayed, const std::vector<TakenBackTurn>& earlier) {
  RECALL_ASSIGN_OR_RETURN(const SessionRecord rec, store_.Get(tenant, session_id));
  std::vector<StoredMessage> history = CompleteTurns(rec.messages, index);
  AttachTakenBack(earlier, history);
  history.insert(history.end(), replayed.begin(), replayed.end());
  std::vector<v1::ChatMessage> out;
  out.reserve(history.size());
  for (const StoredMessage& h : history) out.push_back(ToProto(h));
  return out;
}

absl::StatusOr<v1::CacheSettings> Conversations::StoredCache(const SessionRecord& rec) {
  v1::CacheSettings cache;
  if (!cache.ParseFromString(rec.cache_settings)) {
    return absl::DataLossError(
        absl::StrCat("session ", QuotedId(rec.id), ": its stored cache settings are damaged"));
  }
  return cache;
}

absl::StatusOr<OpenTurn> Conversations::Begin(const std::string& tenant,
                                              const std::string& session_id,
                                              const TurnPlanner& plan,
                                              const v1::SamplingParams& sampling,
                                              const std::string& edge,
                                              const std::optional<std::string>& recent_turn_id) {
  return Open(
      tenant, session_id, edge, recent_turn_id,
      [&](const SessionRecord& rec, OpenTurn& turn) -> absl::Status {
        // A reply in progress by another coordinator sharing the store is a turn running
        // there (its lease is live: a lapsed one reads as interrupted): the transcript is
        // not cut under it. One of this coordinator's own is an orphan (its running mark is
        // held here now: a turn whose end could not be stored), which the turn replaces or
        // follows like an interrupted one.
        if (!rec.messages.empty() && rec.messages.back().state == TurnState::kInProgress &&
            !WrittenHere(rec.messages.back())) {
          return RunningElsewhere();  // checked again in the write (ReplaceTail)
        }
        RECALL_ASSIGN_OR_RETURN(const v1::CacheSettings cache, StoredCache(rec));
        RECALL_RETURN_IF_ERROR(CheckMaxTokens(rec.model, sampling));  // before anything is kept
        RECALL_ASSIGN_OR_RETURN(TurnMessages m, plan(rec));
        RECALL_CHECK(!m.add.empty() && m.keep >= rec.first_message && m.keep <= rec.message_count)
            << "a turn planner kept " << m.keep << " of " << rec.message_count
            << " messages (read from " << rec.first_message << ") and added " << m.add.size();
        // The turns it keeps: the user messages before `keep` (of the part not read, a turn
        // is two messages; a reply edited by the client can make `keep` odd).
        int kept_turns = rec.first_message / 2;
        for (int i = rec.first_message; i < m.keep; ++i) {
          kept_turns += rec.messages[static_cast<size_t>(i - rec.first_message)].role == "user";
        }
        if (kept_turns >= options_.max_turns) {
          return absl::FailedPreconditionError(absl::StrCat(
              "session_id: the session has reached the limit of ", options_.max_turns,
              " turns (the coordinator's max_turns); start a new session, or have the limit "
              "raised (not retryable)"));
        }
        // A list of many turns (a new session made from a client's whole conversation).
        RECALL_RETURN_IF_ERROR(CheckTurnCount(kept_turns, m.add));
        if (m.keep < rec.message_count) {
          turn.replaced.assign(rec.messages.begin() + (m.keep - rec.first_message),
                               rec.messages.end());
          turn.spec.send_history = true;  // a worker's copy of that length may differ
          for (const StoredMessage& r : turn.replaced) {
            for (TakenBackTurn t : r.taken_back) {
              t.own = false;  // an attempt of a turn this one replaces: the cache went on
              turn.earlier_attempts.push_back(std::move(t));
            }
          }
        }
        // The messages it replaces out, the turn's messages and its reply's place in: one
        // atomic write (a failure leaves the transcript as it was).
        const v1::SamplingParams seeded = WithSeed(sampling);
        std::vector<StoredMessage> write = m.add;
        StoredMessage& reply = write.emplace_back();
        reply.role = "assistant";
        reply.state = TurnState::kInProgress;
        reply.lease_unix_ms = UnixMillis() + LeaseMs();
        reply.writer = instance_id_;
        reply.seed = seeded.seed();
        reply.taken_back = turn.earlier_attempts;
        RECALL_RETURN_IF_ERROR(
            store_.ReplaceTail(tenant, session_id, m.keep, rec.message_count, write, instance_id_));
        BuildSpec(rec, m.keep, m.add, seeded, cache, turn);
        return absl::OkStatus();
      });
}

absl::StatusOr<OpenTurn> Conversations::Resume(const std::string& tenant,
                                               const std::string& session_id,
                                               const std::string& field, const std::string& turn_id,
                                               const v1::SamplingParams& sampling,
                                               const std::string& edge) {
  return Open(
      tenant, session_id, edge, std::nullopt,
      [&](const SessionRecord& rec, OpenTurn& turn) -> absl::Status {
        const auto refuse = [&](const std::string& why) {
          return flags::FieldError(field, absl::StrCat("\"", turn_id, "\" ", why),
                                   absl::StatusCode::kFailedPrecondition);
        };
        const int user = FindTurn(rec, turn_id);
        if (user < 0) return refuse("is not in the session (its turn was replaced; not retryable)");
        const int reply_index = user + 1;
        if (reply_index != rec.message_count - 1 ||
            rec.messages[static_cast<size_t>(reply_index)].role != "assistant") {
          return refuse(
              "names a turn the session went on from; it cannot be resumed (not retryable)");
        }
        StoredMessage partial = rec.messages[static_cast<size_t>(reply_index)];
        // In progress by this coordinator while it holds the session's running mark: an
        // orphan (its end could not be stored), resumed like an interrupted turn.
        const bool orphan = partial.state == TurnState::kInProgress && WrittenHere(partial);
        if (partial.state == TurnState::kComplete ||
            (partial.state == TurnState::kInProgress && !orphan)) {
          return refuse("names a turn that is complete or running, not one to resume");
        }
        RECALL_ASSIGN_OR_RETURN(const v1::CacheSettings cache, StoredCache(rec));
        RECALL_RETURN_IF_ERROR(CheckMaxTokens(rec.model, sampling));
        // Refused before any reply (a failed turn that can never run): back as stored.
        turn.replaced.assign(rec.messages.begin() + user, rec.messages.end());
        // The draws the turn took: its stored seed when the request names none (the request
        // that began it named none either, or the seed was stored from it).
        v1::SamplingParams seeded = sampling;
        if (!seeded.has_seed() && partial.seed.has_value()) seeded.set_seed(*partial.seed);
        seeded = WithSeed(seeded);
        partial.seed = seeded.seed();
        partial.state = TurnState::kInProgress;
        partial.lease_unix_ms = UnixMillis() + LeaseMs();
        partial.writer = instance_id_;
        RECALL_RETURN_IF_ERROR(store_.Replace(tenant, session_id, reply_index, partial));
        // Its own attempts (taken back when a fault interrupted it) are left out, and a worker
        // whose cache went through them rebuilds it: the reply is the one without the fault.
        for (const TakenBackTurn& t : partial.taken_back) {
          (t.own ? turn.own_attempts : turn.earlier_attempts).push_back(t);
        }
        BuildSpec(rec, user, {rec.messages[static_cast<size_t>(user)]}, seeded, cache, turn);
        if (!turn.own_attempts.empty()) turn.spec.request.set_rebuild(true);
        turn.resumed = partial;
        turn.spec.send_history = true;  // the worker's copy may hold the interrupted turn
        turn.spec.resume_tokens = partial.token_ids;
        turn.spec.resume_text = partial.content;
        return absl::OkStatus();
      });
}

std::unique_ptr<TurnJournal> Conversations::Journal(const OpenTurn& turn, TurnSink* edge) {
  return std::make_unique<TurnJournal>(store_, journal_pool_, lease_keeper_, LeaseMs(), turn, edge);
}

absl::Status Conversations::Finish(const OpenTurn& turn, const absl::StatusOr<TurnResult>& outcome,
                                   const StoredMessage& sent) {
  metrics_
      .GetCounter("recall_coordinator_turns_total", "Session turns by status code and edge",
                  absl::StrCat("code=\"", static_cast<int>(outcome.status().code()), "\",edge=\"",
                               turn.edge, "\""))
      ->Increment();
  {
    absl::MutexLock lock(&mu_);
    finishing_.insert(turn.key);  // the next turn waits for the end stored below
  }
  absl::Status stored;
  if (DeletesItsSession(turn, outcome, sent)) {
    // Refused, or failed before any reply, in a session made for it: the session goes too
    // (it holds nothing else; a client that retries makes another).
    stored = store_.Delete(turn.tenant, turn.session_id);
  } else if (TakenBack(outcome, sent)) {
    // The request was refused before any reply: the turn did not happen. Its messages out,
    // what they replaced back, in one write.
    stored = store_.ReplaceTail(turn.tenant, turn.session_id, turn.index, turn.reply_index + 1,
                                turn.replaced, turn.writer);
  } else if (!outcome.ok()) {
    StoredMessage ended = sent;
    ended.role = "assistant";
    ended.state = NothingSent(sent) ? TurnState::kFailed : TurnState::kInterrupted;
    ended.lease_unix_ms = 0;
    ended.writer = turn.writer;                        // not over another coordinator's takeover
    ended.seed = turn.spec.request.sampling().seed();  // a resume takes the same draws
    ended.taken_back = turn.earlier_attempts;
    ended.taken_back.insert(ended.taken_back.end(), turn.own_attempts.begin(),
                            turn.own_attempts.end());
    for (TakenBackTurn& t : TakenBackBy(outcome.status())) {
      t.own = true;
      ended.taken_back.push_back(std::move(t));
    }
    stored = store_.Replace(turn.tenant, turn.session_id, turn.reply_index, ended);
  } else {
    StoredMessage reply{"assistant", outcome->text};
    reply.token_ids = outcome->tokens;  // so a rebuild replays the reply exactly
    reply.finish = static_cast<int>(outcome->done.finish_reason());
    reply.seed = turn.spec.request.sampling().seed();
    reply.taken_back = turn.earlier_attempts;  // a rebuild for the turn replayed them too
    reply.writer = turn.writer;  // not over another coordinator's takeover
    stored = store_.Replace(turn.tenant, turn.session_id, turn.reply_index, reply);
    if (stored.ok() && outcome->worker != turn.spec.bound) {
      store_.Bind(turn.tenant, turn.session_id, outcome->worker).IgnoreError();
      // The session moved (its worker failed, was full, or was not known yet after a
      // restart): the copy it left there is stale, and was held there until memory pressure
      // pushed it out.
      workers_.DropLater(turn.spec.bound, turn.session_id);
    }
    // So were the copies the workers it failed on (or that were full) began.
    for (const std::string& w : outcome->tried) {
      if (stored.ok() && w != outcome->worker) workers_.DropLater(w, turn.session_id);
    }
    if (stored.ok()) RememberEpisodes(turn.key, outcome->done);
  }
  // Deleted while its turn ran: the workers that ran it (its own, one it failed over to)
  // keep its cache unless told (DeleteSession dropped it on the bound worker only, before
  // the turn ended).
  if (absl::IsNotFound(stored)) {
    workers_.DropEverywhere(turn.session_id);
  }
  LogTurn(turn, outcome, sent);
  ClearRunning(turn.key);
  return stored;
}

absl::Status Conversations::TakingTurns() const {
  if (!stopping_.load()) return absl::OkStatus();
  return absl::UnavailableError(
      "the coordinator is shutting down (its running turns are ending); retryable");
}

TurnSpec Conversations::OneOff(const std::string& tenant, const std::string& model,
                               const std::string& prompt, const v1::SamplingParams& sampling,
                               const v1::CacheSettings& cache) const {
  static std::atomic<int64_t> counter{0};
  TurnSpec spec;
  spec.model = model;
  spec.tenant = tenant;
  spec.request.set_session_id(
      absl::StrCat("gen-", tenant, "-", counter++, "-", RealClock::Get().NowNanos()));
  v1::ChatMessage* user = spec.request.add_messages();
  user->set_role("user");
  user->set_content(prompt);
  *spec.request.mutable_sampling() = WithSeed(sampling);
  *spec.request.mutable_cache() = cache;
  spec.drop_after = true;  // the session was one turn long: free its cache at once
  return spec;
}

// One line per session turn (at INFO; RECALL_LOG_LEVEL=WARNING silences it).
void Conversations::LogTurn(const OpenTurn& turn, const absl::StatusOr<TurnResult>& outcome,
                            const StoredMessage& sent) const {
  if (!outcome.ok()) {
    RECALL_LOG(INFO) << "turn session=" << turn.session_id << " edge=" << turn.edge
                     << " ended=" << absl::StatusCodeToString(outcome.status().code())
                     << " sent_tokens=" << sent.token_ids.size();
    return;
  }
  const v1::Usage& u = outcome->done.usage();
  const double decode = outcome->seconds - outcome->first_token_seconds;
  const int generated = static_cast<int>(outcome->tokens.size());
  RECALL_LOG(INFO) << "turn session=" << turn.session_id << " edge=" << turn.edge
                   << " worker=" << outcome->worker << " prompt=" << u.prompt_tokens()
                   << " cached=" << u.cached_tokens() << " generated=" << generated
                   << " ttft_ms=" << static_cast<int64_t>(outcome->first_token_seconds * 1e3)
                   << " tok_per_s="
                   << (generated > 1 && decode > 0 ? static_cast<int64_t>((generated - 1) / decode)
                                                   : 0)
                   << " evictions=" << outcome->done.evictions()
                   << " kv_bytes=" << outcome->done.kv_bytes()
                   << " failovers=" << outcome->failovers;
}

std::vector<v1::ModelInfo> Conversations::Models() const {
  std::map<std::string, v1::ModelInfo> models;
  for (const WorkerView& w : workers_.Snapshot()) {
    if (w.info.model().empty()) continue;
    v1::ModelInfo& m = models[w.info.model()];
    m.set_name(w.info.model());
    m.set_context_length(w.info.context_length());
    if (m.policies().empty()) *m.mutable_policies() = w.info.policies();
    m.set_workers(m.workers() + (w.healthy && !w.draining ? 1 : 0));
  }
  std::vector<v1::ModelInfo> out;
  for (auto& [name, m] : models) out.push_back(std::move(m));
  return out;
}

absl::Status Conversations::CheckModel(const std::string& model) const {
  const std::vector<v1::ModelInfo> served = Models();
  if (served.empty()) return absl::OkStatus();  // no worker known yet: the turn will say so
  if (model.empty()) {
    if (served.size() == 1) return absl::OkStatus();
    std::vector<std::string> names;
    for (const v1::ModelInfo& m : served) names.push_back(m.name());
    return flags::FieldError("model", absl::StrCat("required: the workers serve several models (",
                                                   absl::StrJoin(names, ", "), ")"));
  }
  std::vector<std::string> names;
  for (const v1::ModelInfo& m : served) {
    if (m.name() == model) return absl::OkStatus();
    names.push_back(m.name());
  }
  return UnknownModel(model, names);
}

absl::Status Conversations::CheckKvDtype(const v1::CacheSettings& cache) const {
  if (!cache.has_kv_dtype()) return absl::OkStatus();
  const std::string& t = cache.kv_dtype();
  if (t != "f32" && t != "bf16" && t != "f16" && t != "int8") {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.kv_dtype: \"", t, "\" is not one of f32, bf16, f16, int8"));
  }
  std::set<std::string> stored;
  for (const WorkerView& w : workers_.Snapshot()) {
    if (!w.info.default_cache().kv_dtype().empty())
      stored.insert(w.info.default_cache().kv_dtype());
  }
  if (!stored.empty() && stored.count(t) == 0) {
    return absl::FailedPreconditionError(absl::StrCat("cache.kv_dtype: no worker stores ", t,
                                                      " (the workers store ",
                                                      absl::StrJoin(stored, ", "), ")"));
  }
  return absl::OkStatus();
}

absl::Status Conversations::CheckPolicy(const v1::CacheSettings& cache) const {
  if (!cache.has_policy()) return absl::OkStatus();
  std::vector<std::string> known;
  for (const WorkerView& w : workers_.Snapshot()) {
    for (const std::string& p : w.info.policies()) {
      if (p == cache.policy()) return absl::OkStatus();
      if (std::find(known.begin(), known.end(), p) == known.end()) known.push_back(p);
    }
  }
  if (known.empty()) return absl::OkStatus();
  if (cache.policy() == "episodic") {  // a policy, that no worker here runs
    return absl::InvalidArgumentError(absl::StrCat(
        "cache.policy: no worker serves episodic sessions (they run on a worker of one CPU rank, "
        "without --tp or --device cuda); the workers serve ",
        absl::StrJoin(known, ", ")));
  }
  return absl::InvalidArgumentError(absl::StrCat("cache.policy: unknown policy \"", cache.policy(),
                                                 "\" (one of ", absl::StrJoin(known, ", "), ")"));
}

absl::Status Conversations::CheckPolicyAmong(const std::vector<WorkerView>& candidates,
                                             const v1::CacheSettings& cache) const {
  if (!cache.has_policy()) return absl::OkStatus();
  std::vector<std::string> run;  // what the candidates whose Info arrived run
  bool not_known = false;        // a candidate's Info has not arrived
  for (const WorkerView& w : candidates) {
    not_known = not_known || w.info.policies().empty();
    for (const std::string& p : w.info.policies()) {
      if (p == cache.policy()) return absl::OkStatus();
      if (std::find(run.begin(), run.end(), p) == run.end()) run.push_back(p);
    }
  }
  RECALL_RETURN_IF_ERROR(CheckPolicy(cache));  // no worker that said runs it: unknown
  // Known to some worker: a candidate not heard from yet may run it (its turn says); no
  // candidate at all, the other checks say why.
  if (not_known || run.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "cache.policy: the workers that could serve this session (its model and KV type) do not "
      "run \"",
      cache.policy(), "\" (they run ", absl::StrJoin(run, ", "), ")",
      cache.policy() == "episodic" ? "; episodic runs only on workers of one CPU rank" : ""));
}

absl::StatusOr<v1::CacheSettings> Conversations::CheckNewSession(
    const std::string& model, const v1::CacheSettings& cache,
    const std::string& system_prompt) const {
  // No model named among several: which one serves the session is not known yet.
  if (model.empty() && Models().size() > 1) return cache;
  // The workers that could serve it; of them, only one that runs its policy checks it (a
  // worker without it, e.g. a TP worker asked for episodic, refused it as unknown while the
  // workers that run it were down, answering or not).
  const std::vector<WorkerView> candidates =
      WorkersStoring(WorkersWithModel(workers_.Snapshot(), model), cache.kv_dtype());
  RECALL_RETURN_IF_ERROR(CheckPolicyAmong(candidates, cache));
  for (const WorkerView& w : WorkersServing(candidates, cache.policy())) {
    if (!w.healthy || w.draining || w.stub == nullptr) continue;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    workers_.Attach(&ctx);
    v1::CheckSessionRequest request;
    *request.mutable_cache() = cache;
    request.set_system_prompt(system_prompt);
    v1::CheckSessionResponse response;
    const grpc::Status st = w.stub->CheckSession(&ctx, request, &response);
    if (st.ok()) return response.has_resolved() ? response.resolved() : cache;
    if (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return absl::InvalidArgumentError(st.error_message());
    }
    if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) return cache;
    RECALL_LOG(WARNING) << "worker " << w.address << " could not check a new session's settings ("
                        << st.error_message() << "); asking another";
  }
  return cache;
}

absl::Status Conversations::UnknownModel(const std::string& model,
                                         const std::vector<std::string>& served) {
  return absl::NotFoundError(
      absl::StrCat("model: no worker serves \"", model, "\"", ServedModelsSuffix(served)));
}

int Conversations::MaxTokensLimit(const std::string& model) const {
  int limit = 0;
  for (const WorkerView& w : Answering(workers_.Snapshot())) {
    if (!model.empty() && w.info.model() != model) continue;
    const int l = w.info.max_tokens_limit();
    if (l > 0 && (limit == 0 || l < limit)) limit = l;
  }
  return limit;
}

int Conversations::LargestModelMaxTokens() const {
  std::map<std::string, int> per_model;  // each model's smallest limit
  for (const WorkerView& w : Answering(workers_.Snapshot())) {
    const int l = w.info.max_tokens_limit();
    if (l <= 0) continue;
    auto [it, added] = per_model.emplace(w.info.model(), l);
    if (!added) it->second = std::min(it->second, l);
  }
  int largest = 0;
  for (const auto& [model, limit] : per_model) largest = std::max(largest, limit);
  return largest;
}

absl::Status Conversations::CheckMaxTokens(const std::string& model,
                                           const v1::SamplingParams& sampling) const {
  if (!sampling.has_max_tokens()) return absl::OkStatus();
  const int limit = MaxTokensLimit(model);
  if (limit <= 0 || sampling.max_tokens() <= limit) return absl::OkStatus();
  return flags::FieldError(
      "sampling.max_tokens",
      absl::StrCat("must be in [1, ", limit, "]", model.empty() ? "" : " for \"" + model + "\"",
                   ", got ", sampling.max_tokens(),
                   " (the smallest limit of its answering workers: --max-tokens-limit, or the "
                   "context; not retryable)"));
}

void Conversations::RememberEpisodes(const std::string& key, const v1::TurnDone& done) {
  absl::MutexLock lock(&mu_);
  last_done_.Put(key, done);  // episodes unset: not built (yet, or any more after a rebuild)
}

void Conversations::ForgetEpisodes(const std::string& key) {
  absl::MutexLock lock(&mu_);
  last_done_.Erase(key);
}

bool Conversations::RecallEpisodes(const std::string& key, v1::EpisodesReport* out) {
  absl::MutexLock lock(&mu_);
  const v1::TurnDone* done = last_done_.Find(key);
  if (done == nullptr || !done->has_episodes()) return false;
  *out = done->episodes();
  return true;
}

bool Conversations::RecallLastTurn(const std::string& key, v1::TurnDone* out) {
  absl::MutexLock lock(&mu_);
  const v1::TurnDone* done = last_done_.Find(key);
  if (done == nullptr) return false;
  *out = *done;
  return true;
}

absl::Status Conversations::StoppedAfterItsEnd(const TurnResult& result) {
  v1::AbortResponse taken;  // what the worker took back (an evicting session's record)
  std::shared_ptr<v1::Worker::Stub> stub =
      result.worker.empty() || result.request_id.empty() ? nullptr : workers_.Stub(result.worker);
  if (stub != nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    workers_.Attach(&context);
    v1::AbortRequest request;
    request.set_request_id(result.request_id);
    if (!stub->Abort(&context, request, &taken).ok()) taken.Clear();
  }
  absl::Status stopped = absl::CancelledError("the client left before the end");
  WithTakenBack(taken, stopped);
  return stopped;
}

bool Conversations::DeletesItsSession(const OpenTurn& turn,
                                      const absl::StatusOr<TurnResult>& outcome,
                                      const StoredMessage& sent) {
  // (Not when another coordinator took the turn over: ABORTED.)
  return turn.new_session && !outcome.ok() && !absl::IsCancelled(outcome.status()) &&
         !absl::IsAborted(outcome.status()) && NothingSent(sent);
}

bool Conversations::TakenBack(const absl::StatusOr<TurnResult>& outcome,
                              const StoredMessage& sent) {
  const absl::StatusCode code = outcome.status().code();
  const bool refused =
      code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kOutOfRange ||
      code == absl::StatusCode::kFailedPrecondition ||
      code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kPermissionDenied ||
      code == absl::StatusCode::kNotFound;
  return !outcome.ok() && refused && NothingSent(sent);
}

void Conversations::Ending(const OpenTurn& turn) {
  absl::MutexLock lock(&mu_);
  if (running_.count(turn.key) > 0) finishing_.insert(turn.key);
}

bool Conversations::MarkRunning(const std::string& key) {
  const auto finished = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return finishing_.count(key) == 0; };
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&finished), kFinishWait);
  return running_.insert(key).second;
}

bool Conversations::Running(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  return running_.count(key) > 0 || finishing_.count(key) > 0;
}

bool Conversations::AwaitNotRunning(const std::string& key, absl::Duration timeout) const {
  const auto idle = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return running_.count(key) == 0 && finishing_.count(key) == 0;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

absl::Status Conversations::CheckTurnCount(int kept_turns,
                                           const std::vector<StoredMessage>& added) const {
  int turns = kept_turns;
  for (const StoredMessage& m : added) turns += m.role == "user";
  if (turns <= options_.max_turns) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("messages: the conversation has ", turns,
                   " turns with this one, past the limit of ", options_.max_turns,
                   " turns a session holds (the coordinator's max_turns); start a new "
                   "conversation, or have the limit raised (not retryable)"));
}

void Conversations::ClearRunning(const std::string& key) {
  absl::MutexLock lock(&mu_);
  running_.erase(key);
  finishing_.erase(key);
}

}  // namespace recall::coordinator
