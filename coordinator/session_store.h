// SessionStore: the source of truth for sessions, their transcripts and their worker
// bindings. Worker caches are derived state: any worker can rebuild a session from here.
//
// Every call is scoped by tenant: a session of another tenant is NotFound, exactly like a
// session that does not exist. Implementations are thread safe.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recall::coordinator {

// A session id as messages quote it: at most 64 bytes, then how long it was.
inline std::string QuotedId(const std::string& id) {
  if (id.size() <= 64) return "\"" + id + "\"";
  return "\"" + id.substr(0, 64) + "...\" (" + std::to_string(id.size()) + " bytes)";
}

// How a turn stands, kept on its assistant reply (the messages before the reply, back to the
// previous reply, are the turn's prompt and share its state). docs/architecture.md,
// "Transcripts", has the semantics.
//   kComplete    the reply ended (stop, length): the turn is part of every later prompt.
//   kInProgress  the reply is streaming; `content` and `token_ids` hold what the client was
//                sent so far (written before it was sent). A coordinator that restarts marks
//                its in-progress turns interrupted (SQLite); on Redis, shared by replicas, one
//                whose lease passed reads as interrupted.
//   kInterrupted the turn broke after part of the reply was sent (client cancel, coordinator
//                or store failure); the partial reply is kept.
//   kFailed      the turn ended with an error before any of the reply was sent.
// Only complete turns go into later prompts: an interrupted or failed turn's messages are
// kept for the record (GetSession shows them) but never sent to a model again.
enum class TurnState : int { kComplete = 0, kInProgress = 1, kInterrupted = 2, kFailed = 3 };
const char* TurnStateName(TurnState state);

// What an aborted attempt of a turn fed to a session that evicts, which its worker then gave
// back (v1::TakenBackTurn, from the Abort's answer).
struct TakenBackTurn {
  std::vector<int32_t> token_ids;
  int prompt_tokens = 0;
  // An attempt of the very reply that holds it (interrupted by a fault: its client left, its
  // coordinator stopped), not of a stopped turn that reply replaced: a resume of that reply
  // leaves it out and has the worker rebuild, so that the reply is the one without the fault.
  bool own = false;
};

struct StoredMessage {
  std::string role;
  std::string content;
  // An assistant reply: its token ids as the worker streamed them and how it ended
  // (v1::FinishReason), so a worker rebuilding the session replays it exactly. Empty / 0 when
  // unknown (a reply stored before these were kept).
  std::vector<int32_t> token_ids;
  int finish = 0;
  // An assistant reply: its turn's attempts that a worker aborted and took back, in order (a
  // session that evicts keeps what they evicted; a rebuild does the same, replay.h).
  std::vector<TakenBackTurn> taken_back;
  // Set by CompleteTurns on a complete reply: the taken-back attempts of the turns after it
  // (those it leaves out, and the one it keeps next), for the worker's history.
  std::vector<TakenBackTurn> taken_back_after;
  TurnState state = TurnState::kComplete;  // an assistant reply's turn
  // An assistant reply: the sampling seed its turn ran with (the request's, or the one the
  // coordinator drew for it), so a resumed turn takes the same draws. Unset when unknown.
  std::optional<uint64_t> seed;
  int64_t lease_unix_ms = 0;  // kInProgress: its writer vouches for it until then (0: always)
  // The coordinator writing it (its instance id, Conversations::instance_id): for a reply
  // in progress, so another coordinator sharing the store leaves it alone and its writer
  // knows its own orphans (a turn whose end could not be stored); for a write, so the store
  // refuses it over another writer's reply in progress under a live lease (AppendReply,
  // Replace). "" when unknown (SQLite keeps none: one coordinator owns its file).
  std::string writer;
  // A user message: the client's id for its turn (ConverseRequest.turn_id; "" when none), so
  // a retried Converse finds the turn instead of running it twice.
  std::string turn_id;
};

// The messages of `messages[0, count)` that a prompt may contain: without the turns that
// are not complete (a reply that is not, and the messages of its turn before it). Messages
// after the last reply (a turn being asked) and system messages are kept. Each kept reply's
// taken_back_after holds the taken-back attempts of the replies after it, up to the next kept
// one (its own included): what ran after it, in order.
std::vector<StoredMessage> CompleteTurns(const std::vector<StoredMessage>& messages, int count);

// StoredMessage's reply fields as bytes (little-endian int32: finish, then the ids; with a
// seed, first the marker -2 and the seed's low and high words; before that, per taken-back
// attempt, the marker -3, its prompt tokens, its count of ids and the ids), and back. (The
// state and lease are columns / fields of their own.) Bytes without the markers (written
// before seeds or attempts were kept) read as before, with none.
std::string EncodeReply(const StoredMessage& m);

// The refusal of a turn while another coordinator sharing the store runs one on the session
// (FailedPrecondition naming session_id).
absl::Status RunningElsewhere();
void DecodeReply(const std::string& bytes, StoredMessage* m);

struct SessionRecord {
  std::string id;
  std::string tenant;
  std::string model;
  std::string cache_settings;  // serialized recall.v1.CacheSettings
  std::map<std::string, std::string> metadata;
  int64_t created_unix_ms = 0;
  std::string worker;          // the worker the session is bound to ("" = none)
  // The transcript: all of it (Get), its recent turns (GetRecent) or none (List).
  std::vector<StoredMessage> messages;
  int message_count = 0;
  // GetRecent: messages[i] is the transcript's message first_message + i, and first_message
  // is 0 or just after an assistant reply (so `messages` holds whole turns); of the messages
  // before it, `earlier_in_prompt` are ones CompleteTurns keeps. Get: 0 and 0.
  int first_message = 0;
  int earlier_in_prompt = 0;
};

// A session SessionStore::DeleteIdle deleted.
struct IdleSession {
  std::string tenant, id;
  std::string worker;  // the worker it was bound to ("" none): its cache is dropped there
};

// A store's Create refusal for a tenant at its session limit (Conversations words it).
absl::Status TenantFull(int tenant_limit);

class SessionStore {
 public:
  virtual ~SessionStore() = default;

  // AlreadyExists if the id is taken (by any tenant); ResourceExhausted when the record's
  // tenant already has `tenant_limit` sessions, counted and created as one step of the store
  // (coordinator replicas sharing Redis each passed a count-then-create limit by one).
  virtual absl::Status Create(const SessionRecord& record, int tenant_limit) = 0;
  absl::Status Create(const SessionRecord& record) {
    return Create(record, std::numeric_limits<int>::max());
  }
  // With the transcript.
  virtual absl::StatusOr<SessionRecord> Get(const std::string& tenant,
                                            const std::string& id) = 0;
  // The session with the end of its transcript only (SessionRecord::first_message): from
  // the start of its last turn (the messages after the last assistant reply before its last
  // message) on, and from the user message whose turn_id is `turn_id` on when the session has
  // one ("" for none). What a Converse reads, so that a turn's cost does not grow with the
  // session's length (SQLite and Redis keep indexes for it). The default reads it all (Get;
  // first_message 0).
  virtual absl::StatusOr<SessionRecord> GetRecent(const std::string& tenant, const std::string& id,
                                                  const std::string& turn_id) {
    return Get(tenant, id);
  }
  // Sessions of `tenant` with id > after, in id order, without transcripts.
  virtual absl::StatusOr<std::vector<SessionRecord>> List(const std::string& tenant,
                                                          const std::string& after,
                                                          int limit) = 0;
  virtual absl::Status Delete(const std::string& tenant, const std::string& id) = 0;
  // Replaces the transcript's messages from `keep` on (and their reply parts) with
  // `messages`, in one atomic, durable write, if it still has `count` messages
  // (FailedPrecondition otherwise: another turn changed it). REQUIRES: keep <= count. What a
  // turn that rewrites the transcript's tail writes (and what puts it back when the turn is
  // taken back): a failure or a crash leaves the old tail, never none.
  // `writer` (StoredMessage::writer; "" none): refused with RunningElsewhere() while the last
  // message is another writer's reply in progress under a live lease (stores that keep
  // writers: Redis).
  virtual absl::Status ReplaceTail(const std::string& tenant, const std::string& id, int keep,
                                   int count, const std::vector<StoredMessage>& messages,
                                   const std::string& writer) = 0;
  // Appends `messages` at position `index`, all or none, where `index` must equal the current
  // message count (so two writers cannot interleave turns): FailedPrecondition otherwise.
  // Durable on return.
  virtual absl::Status AppendAll(const std::string& tenant, const std::string& id, int index,
                                 const std::vector<StoredMessage>& messages) = 0;
  absl::Status Append(const std::string& tenant, const std::string& id, int index,
                      const StoredMessage& message) {
    return AppendAll(tenant, id, index, std::vector<StoredMessage>{message});
  }
  // Appends `delta` (its token ids and text) to the reply in progress at `index`, which is
  // then `whole` (with whole's lease): a reply as it streams. A store that can append writes
  // the delta only (SQLite and Redis: a part per write, merged into the message by Get,
  // folded by Replace and dropped by Truncate and ReplaceTail, so a long reply costs O(its
  // length) bytes written, not O(length^2)); an empty delta renews the lease and adds no part;
  // the default writes `whole` (Replace). FailedPrecondition when there is no reply in
  // progress there, or (stores that keep writers) it is another writer's.
  virtual absl::Status AppendReply(const std::string& tenant, const std::string& id, int index,
                                   const StoredMessage& delta, const StoredMessage& whole) {
    return Replace(tenant, id, index, whole);
  }
  // Overwrites the message at `index` (a reply as it grows and ends); FailedPrecondition when
  // the transcript has no message there, or (stores that keep writers) it is another
  // writer's reply, complete or in progress under a live lease. Durable on return.
  virtual absl::Status Replace(const std::string& tenant, const std::string& id, int index,
                               const StoredMessage& message) = 0;
  // At a coordinator's start: marks every in-progress turn interrupted (their writer is gone)
  // and returns how many. A store shared by several coordinators (Redis) marks none: its
  // in-progress turns read as interrupted once their lease has passed.
  virtual absl::StatusOr<int> InterruptInProgress() = 0;
  // Removes messages from position `index` on (a turn that did not happen).
  virtual absl::Status Truncate(const std::string& tenant, const std::string& id, int index) = 0;
  virtual absl::Status Bind(const std::string& tenant, const std::string& id,
                            const std::string& worker) = 0;
  virtual absl::StatusOr<int> CountSessions(const std::string& tenant) = 0;
  // Deletes up to `limit` sessions idle since before `before_unix_ms` (when their last turn
  // began, or its reply ended or was resumed; or when they were made, without turns), oldest
  // first, and returns them: none whose last reply is being written under a live lease.
  // Sessions whose activity is unknown (made by an older coordinator) count as active from
  // the store's next open (SQLite) or its first open that keeps activity (Redis).
  virtual absl::StatusOr<std::vector<IdleSession>> DeleteIdle(int64_t before_unix_ms,
                                                              int limit) = 0;

  // Small named records of a tenant, for requests that name no session yet, so
  // that what one coordinator learnt holds on any coordinator that shares the store and after
  // a restart: CreateSession's request ids (create_requests.h, names "c:ID"), the
  // Idempotency-Key records (idempotency_keys.h, names "k:KEY") and its index of
  // transcripts (transcript_match.h, names "t:DIGEST"). Binary safe. A record is kept
  // kRecordTtlMs after it was last written, then forgotten (SQLite purges old records as it
  // writes new ones; Redis lets them expire). Durable on return.
  static constexpr int64_t kRecordTtlMs = int64_t{24} * 3600 * 1000;
  virtual absl::Status PutRecord(const std::string& tenant, const std::string& name,
                                 const std::string& value) = 0;
  // NotFound when there is none (or it is older than kRecordTtlMs).
  virtual absl::StatusOr<std::string> GetRecord(const std::string& tenant,
                                                const std::string& name) = 0;
  // PutRecord unless the record is kept already: AlreadyExists then. Of writers racing on any
  // coordinators sharing the store, one adds it (a claim).
  virtual absl::Status AddRecord(const std::string& tenant, const std::string& name,
                                 const std::string& value) = 0;
  // Forgets a record while it holds `value` (OK when it holds another or there is none): a
  // claim or a stale record taken over, not what another writer put there since.
  virtual absl::Status DeleteRecord(const std::string& tenant, const std::string& name,
                                    const std::string& value) = 0;
  // PutRecord of a record that belongs to `tenant`'s session `id`: forgotten with the session
  // (Delete, DeleteIdle) while it holds `value`, or kRecordTtlMs after it was written,
  // whichever comes first, so that records of deleted sessions do not pile up for a day.
  // NotFound (nothing written) when the session is not there. A later PutRecord or
  // PutSessionRecord of the name takes the record over.
  virtual absl::Status PutSessionRecord(const std::string& tenant, const std::string& id,
                                        const std::string& name, const std::string& value) = 0;
  // PutSessionRecord unless the record is kept already: AlreadyExists then (a claim, as
  // AddRecord's).
  virtual absl::Status AddSessionRecord(const std::string& tenant, const std::string& id,
                                        const std::string& name, const std::string& value) = 0;
};

// A stored text as it is served (a proto string field, a prompt): valid UTF-8, with U+FFFD in
// place of bytes that are not (a row damaged on disk failed every listing of its tenant).
std::string StoredText(std::string text);

// SQLite (WAL, synchronous=FULL) in `path`; the file is created if missing.
// A session's stored metadata (a JSON object of strings) back as a map. DataLoss naming the
// session when the stored text is not one: a damaged store is an error, never a crash.
absl::StatusOr<std::map<std::string, std::string>> ParseStoredMetadata(const std::string& text,
                                                                       const std::string& id);

// A file that lost what it held is refused, DataLoss saying what was lost and how to repair
// it, unless `allow_loss` (then a warning, and the sessions that can be read are
// served; SQLite drops a damaged log's frames for good): a damaged sessions.db-wal, damaged
// pages (PRAGMA quick_check), a file emptied to 0 bytes beside an earlier coordinator's lock.
// Refused before SQLite writes to the file, so the damaged log can still be recovered.
absl::StatusOr<std::unique_ptr<SessionStore>> OpenSqliteStore(const std::string& path,
                                                              bool allow_loss = false);

// Redis at host:port (redis_store.cc); Unavailable when it cannot connect. A server that
// keeps nothing on disk (appendonly no and no RDB save points) loses every session when it
// restarts: FailedPrecondition saying so, or with `allow_volatile` a warning on stderr.
absl::StatusOr<std::unique_ptr<SessionStore>> OpenRedisStore(const std::string& host, int port,
                                                             bool allow_volatile = false);

// A --store value: "redis://HOST[:PORT]" (port in [1, 65535]) or "sqlite://PATH"; an error
// naming the field store_url otherwise (a bare HOST:PORT or path among them).
absl::Status CheckStoreUrl(const std::string& url);

// What a coordinator takes of a store that cannot keep everything (its --allow-* switches).
struct StoreRisks {
  bool allow_volatile = false;  // a Redis that keeps nothing on disk (OpenRedisStore)
  bool allow_loss = false;      // an SQLite file that lost sessions (OpenSqliteStore)
};

// A --store value (CheckStoreUrl), or a bare path: SQLite there.
absl::StatusOr<std::unique_ptr<SessionStore>> OpenStore(const std::string& url,
                                                        const StoreRisks& risks = {});

}  // namespace recall::coordinator
