// SessionStore on Redis (several coordinator replicas sharing sessions). Layout:
//   recall:s:<id>        hash: tenant, model, cache, metadata (JSON), created_ms, worker
//   recall:m:<id>        list of messages, each a JSON object {"role", "content"} (a reply
//                        also "token_ids", "finish", "seed", a decimal string, and "tb",
//                        its taken-back attempts: [{"p": prompt tokens, "t": ids, "o": 1 for
//                        TakenBackTurn::own}, ...])
//   recall:t:<tenant>    sorted set of the tenant's session ids (score 0: ordered by id)
//   recall:p:<id>        list of reply parts (AppendReply), each JSON {"i": message index,
//                        "c": text, "t": token ids}, merged into their messages by Get and
//                        dropped when their message is replaced or truncated
//   recall:u:<id>        sorted set: the turn ids of the user messages (score: the index of
//                        the first message with the id)
//   recall:n:<id>        sorted set: the replies that are not complete (member and score:
//                        their index)
//   recall:o:<id>        sorted set: the session's records (PutSessionRecord), "LEN:KEY" and
//                        the value written, scored by when it expires (deleted with the
//                        session while they hold it; the expired pruned at each write)
//   recall:a             sorted set of every session id, scored by when its last turn began
//                        or its reply ended (or it was made): DeleteIdle's order; sessions
//                        from before it, by when a coordinator first opened the store with
//                        them (recall:a:complete marks that done)
// The two sorted sets index the transcript for GetRecent (a turn reads the last turn, not the
// transcript). The session hash's field ix is the message count they cover; a write that
// finds it differing from the list's length (a coordinator from before the index wrote the
// session) deletes it, and GetRecent derives the index from the messages again (as it does
// for an entry that no longer matches its message).
// Every check-and-write (create if absent, append at an index, tenant checks) is one Lua
// script, so replicas cannot interleave. Durability is Redis's: run it with
// `appendonly yes` and `appendfsync always` for "stored before it is sent to a worker".
// One connection guarded by a mutex, reconnected after an I/O error.
#include <hiredis/hiredis.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/session_store.h"
#include "nlohmann/json.hpp"

namespace recall::coordinator {
namespace {

using Reply = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

// KEYS: session, tenant set, turn ids, unfinished, activity. ARGV: tenant, model, cache,
// metadata, created_ms, worker, id, now, the tenant's session limit. 0: the id exists; -1:
// the tenant is at its limit. The index sets go first (a coordinator from before them
// deleted a session of this id without them).
constexpr char kCreate[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[9]) then return -1 end
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], 'tenant', ARGV[1], 'model', ARGV[2], 'cache', ARGV[3],
           'metadata', ARGV[4], 'created_ms', ARGV[5], 'worker', ARGV[6], 'ix', '0')
redis.call('ZADD', KEYS[2], 0, ARGV[7])
redis.call('ZADD', KEYS[5], ARGV[8], ARGV[7])
return 1)lua";

// Lua: the transcript index (the layout above). KEYS[1] the session, KEYS[4] its turn ids,
// KEYS[5] its unfinished replies. ix_valid(n): whether the index covers the n messages the
// list holds (else it is dropped for good); ix_drop(i): forgets messages from index i on;
// ix_add(i, m): indexes message JSON m at index i; ix_set(n): the index covers n messages.
#define RECALL_INDEX_LUA                                                             \
  "local function ix_valid(n)\n"                                                     \
  "  if redis.call('HGET', KEYS[1], 'ix') == tostring(n) then return true end\n"     \
  "  redis.call('HDEL', KEYS[1], 'ix')\n"                                            \
  "  return false\n"                                                                 \
  "end\n"                                                                            \
  "local function ix_drop(i)\n"                                                      \
  "  redis.call('ZREMRANGEBYSCORE', KEYS[4], i, '+inf')\n"                           \
  "  redis.call('ZREMRANGEBYSCORE', KEYS[5], i, '+inf')\n"                           \
  "end\n"                                                                            \
  "local function ix_add(i, m)\n"                                                    \
  "  local ok, d = pcall(cjson.decode, m)\n"                                         \
  "  if not ok or type(d) ~= 'table' then return end\n"                              \
  "  if d.role == 'user' and type(d.turn_id) == 'string' and d.turn_id ~= '' then\n" \
  "    redis.call('ZADD', KEYS[4], 'NX', i, d.turn_id)\n"                            \
  "  end\n"                                                                          \
  "  if d.role == 'assistant' and d.state ~= nil and d.state ~= 0 then\n"            \
  "    redis.call('ZADD', KEYS[5], i, tostring(i))\n"                                \
  "  else\n"                                                                         \
  "    redis.call('ZREM', KEYS[5], tostring(i))\n"                                   \
  "  end\n"                                                                          \
  "end\n"                                                                            \
  "local function ix_set(n) redis.call('HSET', KEYS[1], 'ix', tostring(n)) end\n"

// KEYS: session, messages, parts, turn ids, unfinished, activity. ARGV: tenant, index, now,
// messages... -1 not found, -2 - n: the list has n messages, not index.
constexpr char kAppend[] = RECALL_INDEX_LUA R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
local n = redis.call('LLEN', KEYS[2])
if n ~= tonumber(ARGV[2]) then return -2 - n end
local indexed = ix_valid(n)
for i = 4, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
  if indexed then ix_add(n + i - 4, ARGV[i]) end
end
if indexed then ix_set(n + #ARGV - 3) end
redis.call('ZADD', KEYS[6], ARGV[3], string.sub(KEYS[1], 10))
return 1)lua";

// Lua: keeps the parts list (KEYS[3]) to the parts p for which KEEP holds (an expression of
// the part's message index, pi). A part that does not decode (a damaged store) is dropped
// instead of failing the script halfway (Redis does not roll a failed script back).
#define RECALL_KEEP_PARTS(KEEP)                                       \
  "local ps = redis.call('LRANGE', KEYS[3], 0, -1)\n"                 \
  "redis.call('DEL', KEYS[3])\n"                                      \
  "for _, p in ipairs(ps) do\n"                                       \
  "  local ok, d = pcall(cjson.decode, p)\n"                          \
  "  local pi = ok and type(d) == 'table' and tonumber(d.i) or nil\n" \
  "  if pi ~= nil and " KEEP                                          \
  " then redis.call('RPUSH', KEYS[3], p) end\n"                       \
  "end\n"

// KEYS: session, messages, parts, turn ids, unfinished, activity. ARGV: tenant, index,
// message, writer, now. -1 not found,
// -2 - n: the list has n messages, none at index; 2: the message there is another writer's
// reply, in progress under a live lease or complete (the writer's turn was taken over: its
// late end must not overwrite the new one; a lapsed lease, an interrupted or failed reply may
// be taken over). The message's parts go (it is written whole).
constexpr char kReplace[] = RECALL_INDEX_LUA R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
local n = redis.call('LLEN', KEYS[2])
local index = tonumber(ARGV[2])
if index >= n then return -2 - n end
if ARGV[4] ~= '' then
  local ok, c = pcall(cjson.decode, redis.call('LINDEX', KEYS[2], index))
  if ok and type(c) == 'table' and c.w ~= nil and c.w ~= ARGV[4] and
     (c.state == nil or (c.state == 1 and (c.lease_ms or 0) >= tonumber(ARGV[5]))) then
    return 2
  end
end
if ix_valid(n) then
  local ok, old = pcall(cjson.decode, redis.call('LINDEX', KEYS[2], index))
  if ok and type(old) == 'table' and type(old.turn_id) == 'string' and
     tonumber(redis.call('ZSCORE', KEYS[4], old.turn_id)) == index then
    redis.call('ZREM', KEYS[4], old.turn_id)
  end
  ix_add(index, ARGV[3])
end
redis.call('LSET', KEYS[2], index, ARGV[3])
redis.call('ZADD', KEYS[6], ARGV[5], string.sub(KEYS[1], 10))  -- a reply ended, or resumed
)lua" RECALL_KEEP_PARTS("pi ~= index") "return 1";

// KEYS: session, messages, parts. ARGV: tenant, index, lease, part ("": none), renew_before,
// writer.
// -1 not found, -2 no message there, -3 it is not in progress, or by another writer (when
// both are known: a coordinator whose lease lapsed and whose turn another one resumed). The
// message's lease is renewed (its JSON, which holds no parts, rewritten) only when it ends
// before renew_before.
constexpr char kAppendReply[] = R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
local i = tonumber(ARGV[2])
local m = redis.call('LINDEX', KEYS[2], i)
if not m then return -2 end
local msg = cjson.decode(m)
if msg.state ~= 1 then return -3 end
if ARGV[6] ~= '' and msg.w ~= nil and msg.w ~= ARGV[6] then return -3 end
if (msg.lease_ms or 0) < tonumber(ARGV[5]) then
  msg.lease_ms = tonumber(ARGV[3])
  redis.call('LSET', KEYS[2], i, cjson.encode(msg))
end
if ARGV[4] ~= '' then redis.call('RPUSH', KEYS[3], ARGV[4]) end
return 1)lua";

std::string ToJson(const StoredMessage& message) {
  nlohmann::json m = {{"role", message.role}, {"content", message.content}};
  if (!message.token_ids.empty() || message.finish != 0) {
    m["token_ids"] = message.token_ids;
    m["finish"] = message.finish;
  }
  if (message.state != TurnState::kComplete) m["state"] = static_cast<int>(message.state);
  if (message.lease_unix_ms != 0) m["lease_ms"] = message.lease_unix_ms;
  if (!message.writer.empty()) m["w"] = message.writer;
  if (!message.turn_id.empty()) m["turn_id"] = message.turn_id;
  // As a string: the scripts that rewrite a message decode it with cjson, whose numbers are
  // doubles (53 bits).
  if (message.seed.has_value()) m["seed"] = std::to_string(*message.seed);
  for (const TakenBackTurn& t : message.taken_back) {
    nlohmann::json record = {{"p", t.prompt_tokens}, {"t", t.token_ids}};
    if (t.own) record["o"] = 1;
    m["tb"].push_back(std::move(record));
  }
  return m.dump();
}

// KEYS: session, messages, tenant set, parts, turn ids, unfinished, activity, records. ARGV:
// tenant, id.
// Lua: deletes the session (KEYS as kDelete's, ARGV[2] its id) and the records it owns that
// still hold what it wrote; returns 1.
#define RECALL_DELETE_LUA                                                \
  "redis.call('DEL', KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6])\n"     \
  "redis.call('ZREM', KEYS[3], ARGV[2])\n"                               \
  "redis.call('ZREM', KEYS[7], ARGV[2])\n"                               \
  "for _, m in ipairs(redis.call('ZRANGE', KEYS[8], 0, -1)) do\n"        \
  "  local colon = string.find(m, ':', 1, true)\n"                       \
  "  local n = colon and tonumber(string.sub(m, 1, colon - 1))\n"        \
  "  if n then\n"                                                        \
  "    local key = string.sub(m, colon + 1, colon + n)\n"                \
  "    if redis.call('GET', key) == string.sub(m, colon + n + 1) then\n" \
  "      redis.call('DEL', key)\n"                                       \
  "    end\n"                                                            \
  "  end\n"                                                              \
  "end\n"                                                                \
  "redis.call('DEL', KEYS[8])\n"                                         \
  "return 1"

// KEYS: session, record, the session's records. ARGV: tenant, value, ttl in ms, "1" to add
// only, now (ms). Writes the record if the session is the tenant's (1; else -1, nothing
// written) and, adding, there is none (else 0). The session's records are a sorted set of
// "LEN:KEY" + value, scored by when each expires; those expired go at each write, so a
// session that lives for weeks keeps a day of them.
constexpr char kPutSessionRecord[] = R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
local now = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), string.len(KEYS[2]) .. ':' .. KEYS[2] .. ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1)lua";

constexpr char kDelete[] = R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
)lua" RECALL_DELETE_LUA;

// KEYS: as kDelete's. ARGV: tenant, id, before, now. Deletes the session if it is still the
// tenant's, idle since before `before` and its last message is not a reply in progress under
// a live lease (a turn's reply is its last message while it runs): 1; else 0.
constexpr char kDeleteIdle[] = R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return 0 end
local active = redis.call('ZSCORE', KEYS[7], ARGV[2])
if not active or tonumber(active) >= tonumber(ARGV[3]) then return 0 end
local last = redis.call('LINDEX', KEYS[2], -1)
if last then
  local ok, m = pcall(cjson.decode, last)
  if ok and type(m) == 'table' and m.state == 1 and (m.lease_ms or 0) >= tonumber(ARGV[4]) then
    return 0
  end
end
)lua" RECALL_DELETE_LUA;

// KEYS: session, messages, parts, turn ids, unfinished. ARGV: tenant, index. The dropped
// messages' parts go too.
constexpr char kTruncate[] = RECALL_INDEX_LUA R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
local i = tonumber(ARGV[2])
local n = redis.call('LLEN', KEYS[2])
if ix_valid(n) and i < n then
  ix_drop(i)
  ix_set(i)
end
if i == 0 then redis.call('DEL', KEYS[2]) else redis.call('LTRIM', KEYS[2], 0, i - 1) end
)lua" RECALL_KEEP_PARTS("pi < i") "return 1";

// KEYS: session, messages, parts, turn ids, unfinished, activity. ARGV: tenant, keep, count,
// writer, now, messages... -1 not found, -2 - n: the list has n messages, not count; 2: its last
// message is a reply in progress of another writer under a live lease (a turn running
// there). The messages from keep on (and their parts) are replaced by the given ones, in one
// script: atomic.
constexpr char kReplaceTail[] = RECALL_INDEX_LUA R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
local n = redis.call('LLEN', KEYS[2])
if n ~= tonumber(ARGV[3]) then return -2 - n end
if n > 0 and ARGV[4] ~= '' then
  local ok, c = pcall(cjson.decode, redis.call('LINDEX', KEYS[2], n - 1))
  if ok and type(c) == 'table' and c.state == 1 and c.w ~= nil and c.w ~= ARGV[4] and
     (c.lease_ms or 0) >= tonumber(ARGV[5]) then
    return 2
  end
end
local i = tonumber(ARGV[2])
local indexed = ix_valid(n)
if i < n then
  if indexed then ix_drop(i) end
  if i == 0 then redis.call('DEL', KEYS[2]) else redis.call('LTRIM', KEYS[2], 0, i - 1) end
)lua" RECALL_KEEP_PARTS("pi < i") R"lua(
end
for j = 6, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[j])
  if indexed then ix_add(i + j - 6, ARGV[j]) end
end
if indexed then ix_set(i + #ARGV - 5) end
redis.call('ZADD', KEYS[6], ARGV[5], string.sub(KEYS[1], 10))  -- a turn began
return 1)lua";

// KEYS: session, messages, parts, turn ids, unfinished. ARGV: turn id ("": none), tenant.
// The session's header fields; then (the session being the tenant's) the index of the first
// message read, how many before it a prompt holds (CompleteTurns), the messages from there on
// and the reply parts; -1 for none. One script: a consistent view. The index is derived from
// the messages again when it does not cover them (a session from before it, or one that a
// coordinator from before it wrote: its writes drop ix, or leave an entry that no longer
// matches its message); every write keeps it from then on.
constexpr char kGetRecent[] = RECALL_INDEX_LUA R"lua(
local h = redis.call('HMGET', KEYS[1], 'tenant', 'model', 'cache', 'metadata', 'created_ms',
                     'worker')
if h[1] ~= ARGV[2] then return {h, -1} end
local n = redis.call('LLEN', KEYS[2])
local function decoded(i)
  local ok, d = pcall(cjson.decode, redis.call('LINDEX', KEYS[2], i))
  if ok and type(d) == 'table' then return d end
  return nil
end
local function role_at(i)
  local d = decoded(i)
  return d and d.role
end
local function reindex()
  redis.call('DEL', KEYS[4], KEYS[5])
  for i, m in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do ix_add(i - 1, m) end
  ix_set(n)
end
if redis.call('HGET', KEYS[1], 'ix') ~= tostring(n) then reindex() end
-- Just after the last assistant reply before message i (0: none).
local function turn_start(i)
  for j = i - 1, 0, -1 do
    if role_at(j) == 'assistant' then return j + 1 end
  end
  return 0
end
-- The indexed position of turn id t: nil when none, false when its message is not that.
local function turn_at(t)
  local u = redis.call('ZSCORE', KEYS[4], t)
  if not u then return nil end
  u = tonumber(u)
  local d = decoded(u)
  if d and d.role == 'user' and d.turn_id == t then return u end
  return false
end
-- The messages before `first` a prompt leaves out: each reply there that is not complete,
-- and the messages of its turn; nil when an entry does not match its message.
local function left_out(first)
  local left = 0
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. first)) do
    local ri = tonumber(r)
    local d = decoded(ri)
    if not d or d.role ~= 'assistant' or d.state == nil or d.state == 0 then return nil end
    left = left + 1
    for j = ri - 1, 0, -1 do
      local role = role_at(j)
      if role == 'assistant' then break end
      if role ~= 'system' then left = left + 1 end
    end
  end
  return left
end
local first = 0
if n > 0 then first = turn_start(n - 1) end
if ARGV[1] ~= '' then
  local u = turn_at(ARGV[1])
  if u == false then
    reindex()
    u = turn_at(ARGV[1])
  end
  if u and u < first then first = turn_start(u) end
end
local left = left_out(first)
if left == nil then
  reindex()
  left = left_out(first)
  if left == nil then return {h, -1} end  -- cannot be: the caller says Internal
end
return {h, first, first - left, redis.call('LRANGE', KEYS[2], first, -1),
        redis.call('LRANGE', KEYS[3], 0, -1)})lua";

#undef RECALL_DELETE_LUA
#undef RECALL_KEEP_PARTS
#undef RECALL_INDEX_LUA

// KEYS: session, messages, parts. The session's header fields, messages and reply parts, read
// in one script: a consistent view (another replica's write cannot fall between the reads).
constexpr char kGet[] = R"lua(
return {redis.call('HMGET', KEYS[1], 'tenant', 'model', 'cache', 'metadata', 'created_ms',
                   'worker'),
        redis.call('LRANGE', KEYS[2], 0, -1), redis.call('LRANGE', KEYS[3], 0, -1)})lua";

// KEYS: session. ARGV: tenant, worker.
constexpr char kBind[] = R"lua(
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'worker', ARGV[2])
return 1)lua";

std::string SessionKey(const std::string& id) { return "recall:s:" + id; }
std::string MessagesKey(const std::string& id) { return "recall:m:" + id; }
std::string TenantKey(const std::string& t) { return "recall:t:" + t; }
std::string PartsKey(const std::string& id) { return "recall:p:" + id; }
std::string TurnIdsKey(const std::string& id) { return "recall:u:" + id; }
std::string UnfinishedKey(const std::string& id) { return "recall:n:" + id; }
std::string RecordsKey(const std::string& id) { return "recall:o:" + id; }
constexpr char kActivityKey[] = "recall:a";
// The layout this code writes, set at the first open (a store from before it was kept has
// none and is taken as this one). A store of a later layout is refused: this code would
// drop what it does not know of.
constexpr char kLayoutKey[] = "recall:layout";
constexpr int kLayoutVersion = 1;
constexpr char kActivityDoneKey[] = "recall:a:complete";  // KeepActivityOfOlderSessions ran

// The command that runs `script` on session `id`'s transcript, whose KEYS are its session,
// messages, parts, turn ids and unfinished keys and the activity set (the scripts that read
// or write the transcript and its index), with `argv` as ARGV.
std::vector<std::string> TranscriptEval(const char* script, const std::string& id,
                                        std::vector<std::string> argv) {
  std::vector<std::string> args = {"EVAL",
                                   script,
                                   "6",
                                   SessionKey(id),
                                   MessagesKey(id),
                                   PartsKey(id),
                                   TurnIdsKey(id),
                                   UnfinishedKey(id),
                                   kActivityKey};
  args.insert(args.end(), std::make_move_iterator(argv.begin()),
              std::make_move_iterator(argv.end()));
  return args;
}
// The command that runs a deleting script (kDelete, kDeleteIdle) on `tenant`'s session `id`:
// ARGV tenant, id, then `more`.
std::vector<std::string> DeleteEval(const char* script, const std::string& tenant,
                                    const std::string& id, std::vector<std::string> more) {
  std::vector<std::string> args = {"EVAL",
                                   script,
                                   "8",
                                   SessionKey(id),
                                   MessagesKey(id),
                                   TenantKey(tenant),
                                   PartsKey(id),
                                   TurnIdsKey(id),
                                   UnfinishedKey(id),
                                   kActivityKey,
                                   RecordsKey(id),
                                   tenant,
                                   id};
  args.insert(args.end(), std::make_move_iterator(more.begin()),
              std::make_move_iterator(more.end()));
  return args;
}

// A named record (SessionStore::PutRecord): the tenant's length keeps (tenant, name) pairs
// apart.
std::string RecordKey(const std::string& tenant, const std::string& name) {
  return absl::StrCat("recall:r:", tenant.size(), ":", tenant, name);
}

absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session_id: no session ", QuotedId(id)));
}

// AppendReply renews a streaming reply's lease (rewriting its message) only when less than
// half of it is left, at the lease `whole` asks for: a write every half lease, not one per
// part.
int64_t RenewBefore(int64_t new_lease_unix_ms) {
  const int64_t now = UnixMillis();
  return now + (new_lease_unix_ms - now) / 2;
}

class RedisStore final : public SessionStore {
 public:
  RedisStore(std::string host, int port) : host_(std::move(host)), port_(port) {}
  ~RedisStore() override {
    if (ctx_ != nullptr) redisFree(ctx_);
  }

  absl::Status PutRecord(const std::string& tenant, const std::string& name,
                         const std::string& value) override {
    absl::MutexLock lock(&mu_);
    return Command({"SET", RecordKey(tenant, name), value, "PX", std::to_string(kRecordTtlMs)})
        .status();
  }

  absl::Status AddRecord(const std::string& tenant, const std::string& name,
                         const std::string& value) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply rep, Command({"SET", RecordKey(tenant, name), value, "PX",
                                                std::to_string(kRecordTtlMs), "NX"}));
    if (rep->type == REDIS_REPLY_NIL) return absl::AlreadyExistsError("the record is kept");
    return absl::OkStatus();
  }

  absl::Status DeleteRecord(const std::string& tenant, const std::string& name,
                            const std::string& value) override {
    absl::MutexLock lock(&mu_);
    return Command({"EVAL",
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end",
                    "1", RecordKey(tenant, name), value})
        .status();
  }

  absl::Status PutSessionRecord(const std::string& tenant, const std::string& id,
                                const std::string& name, const std::string& value) override {
    return WriteSessionRecord(tenant, id, name, value, false);
  }

  absl::Status AddSessionRecord(const std::string& tenant, const std::string& id,
                                const std::string& name, const std::string& value) override {
    return WriteSessionRecord(tenant, id, name, value, true);
  }

  absl::Status WriteSessionRecord(const std::string& tenant, const std::string& id,
                                  const std::string& name, const std::string& value, bool add) {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(
        Reply rep, Command({"EVAL", kPutSessionRecord, "3", SessionKey(id), RecordKey(tenant, name),
                            RecordsKey(id), tenant, value, std::to_string(kRecordTtlMs),
                            add ? "1" : "0", std::to_string(UnixMillis())}));
    if (rep->integer < 0) return NotFound(id);
    if (rep->integer == 0) return absl::AlreadyExistsError("the record is kept");
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> GetRecord(const std::string& tenant,
                                        const std::string& name) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply rep, Command({"GET", RecordKey(tenant, name)}));
    if (rep->type != REDIS_REPLY_STRING) return absl::NotFoundError("no record");
    return std::string(rep->str, rep->len);
  }

  // FailedPrecondition for a store of a layout later than this code's (or a recall:layout
  // key holding something else); a store without one is marked with this code's.
  absl::Status CheckLayout() {
    absl::MutexLock lock(&mu_);
    RECALL_RETURN_IF_ERROR(
        Command({"SET", kLayoutKey, std::to_string(kLayoutVersion), "NX"}).status());
    absl::StatusOr<Reply> rep = Command({"GET", kLayoutKey});
    // A key of another type answers WRONGTYPE.
    if (!rep.ok() && !absl::StrContains(rep.status().message(), "WRONGTYPE")) {
      return rep.status();
    }
    const std::string value = !rep.ok() ? std::string("(not a string)")
                              : (*rep)->type == REDIS_REPLY_STRING
                                  ? std::string((*rep)->str, (*rep)->len)
                                  : std::string();
    int version = 0;
    if (!absl::SimpleAtoi(value, &version) || version < 1 || value != std::to_string(version)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the Redis store at ", host_, ":", port_, ": its key ", kLayoutKey,
                       " holds \"", value.substr(0, 64),
                       "\", not a layout version a coordinator wrote (another "
                       "program's data? --store redis:// needs a Redis of its own)"));
    }
    if (version > kLayoutVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("the Redis store at ", host_, ":", port_,
                       " was written by a newer coordinator (store "
                       "layout ",
                       version, "; this one knows up to ", kLayoutVersion, "): run that version"));
    }
    return absl::OkStatus();
  }

  // Connects, and checks that the server answers PING as Redis does (a port of another
  // service would otherwise be taken, and every request fail later).
  absl::Status Connect() {
    absl::MutexLock lock(&mu_);
    RECALL_RETURN_IF_ERROR(EnsureConnected());
    absl::StatusOr<Reply> pong = Command({"PING"});
    if (!pong.ok() && absl::StrContains(pong.status().message(), "NOAUTH")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the Redis server at ", host_, ":", port_,
          " asks for a password; --store redis:// needs one without (keep it on a network only "
          "the coordinators reach, as the Helm chart does)"));
    }
    // A Redis still loading its data answers LOADING: it is Redis, and serves once loaded.
    const bool loading = !pong.ok() && absl::StrContains(pong.status().message(), "LOADING");
    if (!loading && (!pong.ok() || (*pong)->type != REDIS_REPLY_STATUS ||
                     std::string((*pong)->str, (*pong)->len) != "PONG")) {
      return absl::FailedPreconditionError(
          absl::StrCat("the server at ", host_, ":", port_, " does not answer PING as Redis does",
                       pong.ok() ? "" : absl::StrCat(" (", pong.status().message(), ")"),
                       "; --store redis:// needs a Redis server"));
    }
    return absl::OkStatus();
  }

  using SessionStore::Create;
  absl::Status Create(const SessionRecord& r, int tenant_limit) override {
    nlohmann::json meta = r.metadata;
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(
        Reply rep,
        Command({"EVAL", kCreate, "5", SessionKey(r.id), TenantKey(r.tenant), TurnIdsKey(r.id),
                 UnfinishedKey(r.id), kActivityKey, r.tenant, r.model, r.cache_settings,
                 meta.dump(), std::to_string(r.created_unix_ms), r.worker, r.id,
                 std::to_string(UnixMillis()), std::to_string(tenant_limit)}));
    if (rep->integer == 0) {
      return absl::AlreadyExistsError(absl::StrCat("session_id: \"", r.id, "\" exists"));
    }
    if (rep->integer < 0) return TenantFull(tenant_limit);
    return absl::OkStatus();
  }

  absl::StatusOr<SessionRecord> Get(const std::string& tenant, const std::string& id) override {
    absl::MutexLock lock(&mu_);
    SessionRecord r;
    RECALL_ASSIGN_OR_RETURN(
        Reply all, Command({"EVAL", kGet, "3", SessionKey(id), MessagesKey(id), PartsKey(id)}));
    if (all->type != REDIS_REPLY_ARRAY || all->elements != 3) {
      return absl::InternalError("session store redis: an unexpected answer to a read");
    }
    RECALL_RETURN_IF_ERROR(FillHeader(all->element[0], tenant, id, &r));
    RECALL_RETURN_IF_ERROR(ReadMessages(id, all->element[1], all->element[2], &r));
    r.message_count = static_cast<int>(r.messages.size());
    return r;
  }

  // The index's read (kGetRecent).
  absl::StatusOr<SessionRecord> GetRecent(const std::string& tenant, const std::string& id,
                                          const std::string& turn_id) override {
    absl::MutexLock lock(&mu_);
    SessionRecord r;
    RECALL_ASSIGN_OR_RETURN(Reply all, Command(TranscriptEval(kGetRecent, id, {turn_id, tenant})));
    if (all->type != REDIS_REPLY_ARRAY || all->elements < 2 ||
        all->element[1]->type != REDIS_REPLY_INTEGER) {
      return absl::InternalError("session store redis: an unexpected answer to a read");
    }
    RECALL_RETURN_IF_ERROR(FillHeader(all->element[0], tenant, id, &r));
    if (all->element[1]->integer < 0 || all->elements != 5) {
      return absl::InternalError("session store redis: an unexpected answer to a read");
    }
    r.first_message = static_cast<int>(all->element[1]->integer);
    r.earlier_in_prompt = static_cast<int>(all->element[2]->integer);
    RECALL_RETURN_IF_ERROR(ReadMessages(id, all->element[3], all->element[4], &r));
    r.message_count = r.first_message + static_cast<int>(r.messages.size());
    return r;
  }

  absl::Status AppendReply(const std::string& tenant, const std::string& id, int index,
                           const StoredMessage& delta, const StoredMessage& whole) override {
    const nlohmann::json part = {{"i", index}, {"c", delta.content}, {"t", delta.token_ids}};
    // An empty delta (a lease renewal while the turn is silent) adds no part.
    const std::string written =
        delta.content.empty() && delta.token_ids.empty() ? std::string() : part.dump();
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(
        Reply rep,
        Command({"EVAL", kAppendReply, "3", SessionKey(id), MessagesKey(id), PartsKey(id), tenant,
                 std::to_string(index), std::to_string(whole.lease_unix_ms), written,
                 std::to_string(RenewBefore(whole.lease_unix_ms)), whole.writer}));
    if (rep->integer == -1) return NotFound(id);
    if (rep->integer < -1) {
      return absl::FailedPreconditionError(absl::StrCat("session ", QuotedId(id),
                                                        " has no reply in progress at ", index,
                                                        ": another turn changed it"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<SessionRecord>> List(const std::string& tenant,
                                                  const std::string& after, int limit) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(
        Reply ids, Command({"ZRANGEBYLEX", TenantKey(tenant), after.empty() ? "-" : "(" + after,
                            "+", "LIMIT", "0", std::to_string(limit)}));
    std::vector<SessionRecord> out;
    for (size_t i = 0; i < ids->elements; ++i) {
      SessionRecord r;
      const std::string id(ids->element[i]->str, ids->element[i]->len);
      const absl::Status st = LoadHeader(tenant, id, &r);
      if (absl::IsNotFound(st)) continue;  // deleted since the range was read
      if (absl::IsDataLoss(st)) {
        // A damaged session is listed (without its metadata), so that the others are and it
        // can be found and deleted; reading it says what is damaged.
        RECALL_LOG(WARNING) << st.message() << "; listed without its metadata";
      } else if (!st.ok()) {
        return st;  // not a page with sessions silently missing
      }
      out.push_back(std::move(r));
    }
    return out;
  }

  absl::Status Delete(const std::string& tenant, const std::string& id) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply rep, Command(DeleteEval(kDelete, tenant, id, {})));
    return rep->integer < 0 ? NotFound(id) : absl::OkStatus();
  }

  absl::StatusOr<std::vector<IdleSession>> DeleteIdle(int64_t before_unix_ms, int limit) override {
    absl::MutexLock lock(&mu_);
    std::vector<IdleSession> out;
    int kept = 0;  // idle sessions passed over (a reply being written): the next page's offset
    const absl::Status st = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      while (static_cast<int>(out.size()) < limit) {
        RECALL_ASSIGN_OR_RETURN(
            Reply ids,
            Command({"ZRANGEBYSCORE", kActivityKey, "-inf", absl::StrCat("(", before_unix_ms),
                     "LIMIT", std::to_string(kept), std::to_string(limit - out.size())}));
        if (ids->type != REDIS_REPLY_ARRAY || ids->elements == 0) break;
        for (size_t i = 0; i < ids->elements; ++i) {
          if (ids->element[i]->type != REDIS_REPLY_STRING) continue;
          IdleSession s;
          s.id.assign(ids->element[i]->str, ids->element[i]->len);
          RECALL_ASSIGN_OR_RETURN(Reply h,
                                  Command({"HMGET", SessionKey(s.id), "tenant", "worker"}));
          if (h->type != REDIS_REPLY_ARRAY || h->elements != 2 ||
              h->element[0]->type != REDIS_REPLY_STRING) {
            RECALL_RETURN_IF_ERROR(Command({"ZREM", kActivityKey, s.id}).status());  // gone
            continue;
          }
          s.tenant.assign(h->element[0]->str, h->element[0]->len);
          if (h->element[1]->type == REDIS_REPLY_STRING) {
            s.worker.assign(h->element[1]->str, h->element[1]->len);
          }
          RECALL_ASSIGN_OR_RETURN(
              Reply rep,
              Command(DeleteEval(kDeleteIdle, s.tenant, s.id,
                                 {std::to_string(before_unix_ms), std::to_string(UnixMillis())})));
          if (rep->integer == 1) {
            out.push_back(std::move(s));
          } else {
            ++kept;
          }
        }
      }
      return absl::OkStatus();
    }();
    if (!st.ok()) {
      if (out.empty()) return st;
      // Those deleted before the error go back to be forgotten and dropped; the rest wait.
      RECALL_LOG(WARNING) << "deleting idle sessions: " << st.message() << " (after " << out.size()
                          << ")";
    }
    return out;
  }

  absl::Status AppendAll(const std::string& tenant, const std::string& id, int index,
                         const std::vector<StoredMessage>& messages) override {
    std::vector<std::string> args =
        TranscriptEval(kAppend, id, {tenant, std::to_string(index), std::to_string(UnixMillis())});
    for (const StoredMessage& m : messages) args.push_back(ToJson(m));
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply rep, Command(args));
    if (rep->integer == -1) return NotFound(id);
    if (rep->integer < -1) {
      return absl::FailedPreconditionError(absl::StrCat("session ", QuotedId(id), " has ",
                                                        -2 - rep->integer, " messages, not ", index,
                                                        ": another turn changed it"));
    }
    return absl::OkStatus();
  }

  absl::Status ReplaceTail(const std::string& tenant, const std::string& id, int keep, int count,
                           const std::vector<StoredMessage>& messages,
                           const std::string& writer) override {
    std::vector<std::string> args =
        TranscriptEval(kReplaceTail, id,
                       {tenant, std::to_string(keep), std::to_string(count), writer,
                        std::to_string(UnixMillis())});
    for (const StoredMessage& m : messages) args.push_back(ToJson(m));
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply rep, Command(args));
    if (rep->integer == -1) return NotFound(id);
    if (rep->integer == 2) return RunningElsewhere();
    if (rep->integer < -1) {
      return absl::FailedPreconditionError(absl::StrCat("session ", QuotedId(id), " has ",
                                                        -2 - rep->integer, " messages, not ", count,
                                                        ": another turn changed it"));
    }
    return absl::OkStatus();
  }

  absl::Status Replace(const std::string& tenant, const std::string& id, int index,
                       const StoredMessage& message) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(
        Reply rep, Command(TranscriptEval(kReplace, id,
                                          {tenant, std::to_string(index), ToJson(message),
                                           message.writer, std::to_string(UnixMillis())})));
    if (rep->integer == -1) return NotFound(id);
    if (rep->integer == 2) {
      return absl::FailedPreconditionError(
          absl::StrCat("session ", QuotedId(id), ": the reply at ", index,
                       " is in progress by another coordinator (it took the turn over)"));
    }
    if (rep->integer < -1) {
      return absl::FailedPreconditionError(absl::StrCat("session ", QuotedId(id), " has ",
                                                        -2 - rep->integer, " messages, none at ",
                                                        index, ": another turn changed it"));
    }
    return absl::OkStatus();
  }

  // Replicas share the store: their turns' leases say which are interrupted (Get).
  absl::StatusOr<int> InterruptInProgress() override { return 0; }

  absl::Status Truncate(const std::string& tenant, const std::string& id, int index) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(
        Reply rep, Command(TranscriptEval(kTruncate, id, {tenant, std::to_string(index)})));
    return rep->integer < 0 ? NotFound(id) : absl::OkStatus();
  }

  absl::Status Bind(const std::string& tenant, const std::string& id,
                    const std::string& worker) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(
        Reply rep, Command({"EVAL", kBind, "1", SessionKey(id), tenant, worker}));
    return rep->integer < 0 ? NotFound(id) : absl::OkStatus();
  }

  // Puts the sessions from before activity was kept (absent from kActivityKey) in it, as
  // active now, once per Redis (the key recall:a:complete says it was done); how many.
  absl::StatusOr<int> KeepActivityOfOlderSessions() {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply done, Command({"EXISTS", kActivityDoneKey}));
    if (done->integer == 1) return 0;
    const std::string now = std::to_string(UnixMillis());
    std::string cursor = "0";
    int added = 0;
    do {
      RECALL_ASSIGN_OR_RETURN(Reply page,
                              Command({"SCAN", cursor, "MATCH", "recall:s:*", "COUNT", "1000"}));
      if (page->type != REDIS_REPLY_ARRAY || page->elements != 2 ||
          page->element[0]->type != REDIS_REPLY_STRING ||
          page->element[1]->type != REDIS_REPLY_ARRAY) {
        return absl::InternalError("session store redis: an unexpected answer to SCAN");
      }
      cursor.assign(page->element[0]->str, page->element[0]->len);
      const redisReply* keys = page->element[1];
      for (size_t i = 0; i < keys->elements; ++i) {
        const std::string key(keys->element[i]->str, keys->element[i]->len);
        RECALL_ASSIGN_OR_RETURN(Reply rep, Command({"ZADD", kActivityKey, "NX", now,
                                                    key.substr(SessionKey("").size())}));
        added += static_cast<int>(rep->integer);
      }
    } while (cursor != "0");
    RECALL_RETURN_IF_ERROR(Command({"SET", kActivityDoneKey, now}).status());
    return added;
  }

  // How the server keeps its data: `nothing` says why it keeps nothing on disk ("appendonly
  // no, save \"\""), `weak` what a crash can still lose when it keeps some (snapshots only;
  // an AOF not fsync'd at every write); both empty for appendonly yes, appendfsync always.
  // An error when CONFIG GET is refused.
  struct Persistence {
    std::string nothing, weak;
  };
  absl::StatusOr<Persistence> PersistenceOf() {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply aof, Command({"CONFIG", "GET", "appendonly"}));
    RECALL_ASSIGN_OR_RETURN(Reply save, Command({"CONFIG", "GET", "save"}));
    RECALL_ASSIGN_OR_RETURN(Reply fsync, Command({"CONFIG", "GET", "appendfsync"}));
    const auto value = [](const Reply& r) -> std::string {
      if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || r->element[1]->str == nullptr) {
        return "";
      }
      return std::string(r->element[1]->str, r->element[1]->len);
    };
    const std::string appendonly = value(aof), points = value(save), sync = value(fsync);
    Persistence p;
    if (appendonly != "yes" && points.empty()) {
      p.nothing = absl::StrCat("appendonly ", appendonly.empty() ? "?" : appendonly, ", save \"\"");
    } else if (appendonly != "yes") {
      p.weak = absl::StrCat("it keeps snapshots only (appendonly ", appendonly, ", save \"", points,
                            "\"): a crash of Redis loses the sessions and turns since its last "
                            "snapshot");
    } else if (sync != "always") {
      p.weak = absl::StrCat("appendfsync ", sync.empty() ? "?" : sync,
                            ": a power cut or a crash of its machine loses its last writes");
    }
    return p;
  }

  absl::StatusOr<int> CountSessions(const std::string& tenant) override {
    absl::MutexLock lock(&mu_);
    RECALL_ASSIGN_OR_RETURN(Reply rep, Command({"ZCARD", TenantKey(tenant)}));
    return static_cast<int>(rep->integer);
  }

 private:
  absl::Status EnsureConnected() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ctx_ != nullptr && ctx_->err == 0) return absl::OkStatus();
    if (ctx_ != nullptr) redisFree(ctx_);
    timeval timeout{5, 0};
    ctx_ = redisConnectWithTimeout(host_.c_str(), port_, timeout);
    if (ctx_ == nullptr || ctx_->err != 0) {
      const std::string err = ctx_ ? ctx_->errstr : "out of memory";
      return absl::UnavailableError(absl::StrCat("session store redis://", host_, ":", port_,
                                                 ": ", err, " (retryable)"));
    }
    redisSetTimeout(ctx_, timeout);
    return absl::OkStatus();
  }

  // Runs one command (binary-safe arguments); errors as Unavailable (retryable).
  absl::StatusOr<Reply> Command(const std::vector<std::string>& args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status st = EnsureConnected();
    if (!st.ok()) return st;
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply rep(static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()),
                                                        argv.data(), lens.data())),
              freeReplyObject);
    if (rep == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("session store redis: ", ctx_->errstr, " (retryable)"));
    }
    if (rep->type == REDIS_REPLY_ERROR) {
      // A server that is starting (loading its data), busy with a script, or a replica out of
      // touch with its primary answers again soon: retryable, as a lost connection is.
      const absl::string_view error(rep->str, rep->len);
      for (absl::string_view transient : {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN"}) {
        if (absl::StartsWith(error, transient)) {
          return absl::UnavailableError(
              absl::StrCat("session store redis: ", error, " (retryable)"));
        }
      }
      return absl::InternalError(absl::StrCat("session store redis: ", error));
    }
    return rep;
  }

  absl::Status LoadHeader(const std::string& tenant, const std::string& id, SessionRecord* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RECALL_ASSIGN_OR_RETURN(
        Reply rep, Command({"HMGET", SessionKey(id), "tenant", "model", "cache", "metadata",
                            "created_ms", "worker"}));
    const absl::Status header = FillHeader(rep.get(), tenant, id, r);  // DataLoss: filled
    if (!header.ok() && !absl::IsDataLoss(header)) return header;
    RECALL_ASSIGN_OR_RETURN(Reply len, Command({"LLEN", MessagesKey(id)}));
    r->message_count = static_cast<int>(len->integer);
    return header;
  }

  // The messages of `rep` (JSON; the transcript's from r->first_message on) into r->messages,
  // with their reply parts from `parts` merged in; DataLoss for one that does not decode.
  static absl::Status ReadMessages(const std::string& id, const redisReply* rep,
                                   const redisReply* parts, SessionRecord* r) {
    const int64_t now = UnixMillis();
    for (size_t i = 0; i < rep->elements; ++i) {
      const nlohmann::json m = nlohmann::json::parse(
          std::string(rep->element[i]->str, rep->element[i]->len), nullptr, false);
      if (m.is_discarded() || !m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !m.contains("content") || !m["content"].is_string()) {
        return absl::DataLossError(absl::StrCat("session store: message ", r->first_message + i,
                                                " of session ", QuotedId(id),
                                                " is not a stored message"));
      }
      StoredMessage& msg = r->messages.emplace_back();
      msg.role = m["role"].get<std::string>();
      msg.content = m["content"].get<std::string>();
      if (m.contains("state") && m["state"].is_number_integer()) {
        const int state = m["state"].get<int>();
        msg.state = state >= 0 && state <= 3 ? static_cast<TurnState>(state) : TurnState::kFailed;
      }
      if (m.contains("lease_ms") && m["lease_ms"].is_number_integer()) {
        msg.lease_unix_ms = m["lease_ms"].get<int64_t>();
      }
      if (m.contains("w") && m["w"].is_string()) msg.writer = m["w"].get<std::string>();
      // Its writer is gone (no replica renewed the lease): the turn was interrupted.
      if (msg.state == TurnState::kInProgress && msg.lease_unix_ms != 0 &&
          msg.lease_unix_ms < now) {
        msg.state = TurnState::kInterrupted;
      }
      if (m.contains("token_ids") && m["token_ids"].is_array()) {
        for (const nlohmann::json& t : m["token_ids"]) {
          if (t.is_number_integer()) msg.token_ids.push_back(t.get<int32_t>());
        }
      }
      if (m.contains("finish") && m["finish"].is_number_integer())
        msg.finish = m["finish"].get<int>();
      if (m.contains("turn_id") && m["turn_id"].is_string()) {
        msg.turn_id = m["turn_id"].get<std::string>();
      }
      uint64_t seed = 0;
      if (m.contains("seed") && m["seed"].is_string() &&
          absl::SimpleAtoi(m["seed"].get<std::string>(), &seed)) {
        msg.seed = seed;
      }
      // (A script's cjson writes an empty list as {}: no ids.)
      if (m.contains("tb") && m["tb"].is_array()) {
        for (const nlohmann::json& t : m["tb"]) {
          if (!t.is_object() || !t.contains("p") || !t["p"].is_number_integer()) continue;
          TakenBackTurn& taken = msg.taken_back.emplace_back();
          taken.prompt_tokens = t["p"].get<int>();
          taken.own = t.contains("o");
          if (!t.contains("t") || !t["t"].is_array()) continue;
          for (const nlohmann::json& id : t["t"]) {
            if (id.is_number_integer()) taken.token_ids.push_back(id.get<int32_t>());
          }
        }
      }
    }
    // Replies written part by part (AppendReply): their parts after what the message holds.
    for (size_t k = 0; k < parts->elements; ++k) {
      const nlohmann::json p = nlohmann::json::parse(
          std::string(parts->element[k]->str, parts->element[k]->len), nullptr, false);
      if (p.is_discarded() || !p.is_object() || !p.contains("i") || !p["i"].is_number_integer() ||
          !p.contains("c") || !p["c"].is_string() || !p.contains("t") || !p["t"].is_array()) {
        return absl::DataLossError(absl::StrCat("session store: reply part ", k, " of session ",
                                                QuotedId(id), " is not a stored part"));
      }
      const int64_t at = p["i"].get<int64_t>() - r->first_message;
      if (at < 0 || at >= static_cast<int64_t>(r->messages.size())) continue;
      StoredMessage& msg = r->messages[static_cast<size_t>(at)];
      msg.content += p["c"].get<std::string>();
      for (const nlohmann::json& t : p["t"]) {
        if (t.is_number_integer()) msg.token_ids.push_back(t.get<int32_t>());
      }
    }
    return absl::OkStatus();
  }

  // The header fields from an HMGET's answer (tenant, model, cache, metadata, created_ms,
  // worker); NotFound unless the session is the tenant's.
  static absl::Status FillHeader(const redisReply* rep, const std::string& tenant,
                                 const std::string& id, SessionRecord* r) {
    auto field = [&](int i) {
      const redisReply* e = rep->element[i];
      return e->type == REDIS_REPLY_STRING ? std::string(e->str, e->len) : std::string();
    };
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 6 ||
        rep->element[0]->type != REDIS_REPLY_STRING || field(0) != tenant) {
      return NotFound(id);
    }
    r->id = id;
    r->tenant = tenant;
    r->model = StoredText(field(1));
    r->cache_settings = field(2);
    int64_t created = 0;
    (void)absl::SimpleAtoi(field(4), &created);
    r->created_unix_ms = created;
    r->worker = StoredText(field(5));
    RECALL_ASSIGN_OR_RETURN(r->metadata, ParseStoredMetadata(field(3), id));
    return absl::OkStatus();
  }

  const std::string host_;
  const int port_;
  absl::Mutex mu_;
  redisContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SessionStore>> OpenRedisStore(const std::string& host, int port,
                                                             bool allow_volatile) {
  auto store = std::make_unique<RedisStore>(host, port);
  absl::Status st = store->Connect();
  if (!st.ok()) return st;
  RECALL_RETURN_IF_ERROR(store->CheckLayout());
  const absl::StatusOr<RedisStore::Persistence> persistence = store->PersistenceOf();
  const std::string where = absl::StrCat("--store redis://", host, ":", port);
  if (!persistence.ok()) {
    std::fprintf(stderr,
                 "recall-coordinator: WARNING: %s: cannot tell whether Redis persists "
                 "its data (%s)\n",
                 where.c_str(), std::string(persistence.status().message()).c_str());
  } else if (!persistence->weak.empty()) {
    std::fprintf(stderr,
                 "recall-coordinator: WARNING: %s: %s; run Redis with appendonly yes, "
                 "appendfsync always (the Helm chart does)\n",
                 where.c_str(), persistence->weak.c_str());
  } else if (!persistence->nothing.empty()) {
    const std::string what = absl::StrCat(
        where, ": the Redis server keeps nothing on disk (", persistence->nothing,
        "), so a restart of it loses every session; run it with appendonly yes (the Helm chart "
        "does)");
    if (!allow_volatile) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ", or pass --allow-volatile-store to run anyway"));
    }
    std::fprintf(stderr, "recall-coordinator: WARNING: %s\n", what.c_str());
  }
  RECALL_ASSIGN_OR_RETURN(const int older, store->KeepActivityOfOlderSessions());
  if (older > 0) {
    std::fprintf(stderr,
                 "recall-coordinator: %d session(s) from before activity was kept count as "
                 "active from now (--session-ttl)\n",
                 older);
  }
  return std::unique_ptr<SessionStore>(std::move(store));
}

}  // namespace recall::coordinator
