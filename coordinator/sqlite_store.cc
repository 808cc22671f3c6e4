// SessionStore on SQLite: one connection guarded by a mutex, WAL journal, synchronous=FULL
// so an appended message is on disk when Append returns. A streaming reply's writes are
// parts (reply_parts), merged by Get and folded into the message by Replace.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/session_store.h"
#include "coordinator/sqlite_salvage.h"
#include "coordinator/wal_check.h"
#include "nlohmann/json.hpp"

namespace recall::coordinator {
namespace {

// The layout this code writes, in PRAGMA user_version (0: a file from before it was kept,
// whose missing columns are added at open). A file of a later version is refused: this code
// would drop what it does not know of.
constexpr int kSchemaVersion = 1;

constexpr char kSchema[] = R"sql(
PRAGMA journal_mode=WAL;
PRAGMA synchronous=FULL;
PRAGMA foreign_keys=ON;
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  model TEXT NOT NULL,
  cache BLOB NOT NULL,
  metadata TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  worker TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions(tenant, id);
CREATE TABLE IF NOT EXISTS messages (
  session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  idx INTEGER NOT NULL,
  role TEXT NOT NULL,
  content BLOB NOT NULL,
  reply BLOB NOT NULL DEFAULT x'',
  state INTEGER NOT NULL DEFAULT 0,
  lease_ms INTEGER NOT NULL DEFAULT 0,
  turn_id TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (session_id, idx));
CREATE TABLE IF NOT EXISTS records (
  tenant TEXT NOT NULL,
  name TEXT NOT NULL,
  value BLOB NOT NULL,
  written_ms INTEGER NOT NULL,
  session TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (tenant, name));
CREATE INDEX IF NOT EXISTS records_by_age ON records(written_ms);
CREATE TABLE IF NOT EXISTS reply_parts (
  session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  idx INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  content BLOB NOT NULL,
  ids BLOB NOT NULL,
  PRIMARY KEY (session_id, idx, seq));
)sql";

// The indexes a turn's reads use (GetRecent) and DeleteIdle's, made once the columns are
// there (a file from before some of them gets them first).
constexpr char kIndexes[] = R"sql(
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions(active_ms);
CREATE INDEX IF NOT EXISTS messages_not_complete ON messages(session_id, idx) WHERE state != 0;
CREATE INDEX IF NOT EXISTS messages_by_turn_id ON messages(session_id, turn_id)
  WHERE turn_id != '';
CREATE INDEX IF NOT EXISTS records_by_session ON records(session) WHERE session != '';
)sql";

// Token ids as little-endian int32 bytes, and back (a reply part's ids).
std::string EncodeIds(const std::vector<int32_t>& ids) {
  std::string out;
  out.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    const uint32_t u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((u >> (8 * b)) & 0xFF));
  }
  return out;
}

void AppendIds(const std::string& bytes, std::vector<int32_t>* ids) {
  for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
    uint32_t u = 0;
    for (int b = 0; b < 4; ++b)
      u |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + b])) << (8 * b);
    ids->push_back(static_cast<int32_t>(u));
  }
}

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& Bind(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindText(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  // A statement that could not be prepared (a damaged schema page) steps to that error.
  int Step() { return stmt_ == nullptr ? rc_ : sqlite3_step(stmt_); }
  std::string Text(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p == nullptr ? "" : std::string(static_cast<const char*>(p),
                                           static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  sqlite3_stmt* stmt() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// How an operator repairs a damaged store file.
std::string RepairAdvice(const std::string& path) {
  return absl::StrCat("To repair it, stop the coordinator, keep a copy of the file, then: sqlite3 ",
                      path,
                      " .recover | sqlite3 NEW.db, and serve NEW.db in its place (or restore it "
                      "from a backup)");
}

class SqliteStore final : public SessionStore {
 public:
  // `lock_fd`: the open lock file this store holds (OpenSqliteStore), closed with it.
  SqliteStore(sqlite3* db, int lock_fd, std::string path)
      : db_(db), lock_fd_(lock_fd), path_(std::move(path)) {}
  ~SqliteStore() override {
    sqlite3_close(db_);
    close(lock_fd_);
  }

  using SessionStore::Create;
  absl::Status Create(const SessionRecord& r, int tenant_limit) override {
    absl::MutexLock lock(&mu_);
    // Counted and inserted in one statement; a taken id is tried (and refused) first.
    Stmt s(db_,
           "INSERT INTO sessions (id, tenant, model, cache, metadata, created_ms, worker, "
           "active_ms) SELECT ?, ?, ?, ?, ?, ?, ?, ? "
           "WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1) "
           "OR (SELECT COUNT(*) FROM sessions WHERE tenant = ?2) < ?9");
    nlohmann::json meta = r.metadata;
    s.BindText(1, r.id).BindText(2, r.tenant).BindText(3, r.model).Bind(4, r.cache_settings)
        .BindText(5, meta.dump()).Bind(6, r.created_unix_ms).BindText(7, r.worker);
    s.Bind(8, UnixMillis()).Bind(9, int64_t{tenant_limit});
    const int rc = s.Step();
    if (rc == SQLITE_CONSTRAINT) {
      return absl::AlreadyExistsError(absl::StrCat("session_id: \"", r.id, "\" exists"));
    }
    RECALL_RETURN_IF_ERROR(Check(rc, "create session"));
    if (sqlite3_changes(db_) == 0) return TenantFull(tenant_limit);
    return absl::OkStatus();
  }

  absl::StatusOr<SessionRecord> Get(const std::string& tenant, const std::string& id) override {
    absl::MutexLock lock(&mu_);
    SessionRecord r;
    RECALL_RETURN_IF_ERROR(LoadHeader(tenant, id, &r));
    RECALL_RETURN_IF_ERROR(LoadMessages(id, &r));
    return r;
  }

  // Reads from the start of the last turn, and of `turn_id`'s turn, on (indexed: the cost
  // is the turns read, not the transcript's length).
  absl::StatusOr<SessionRecord> GetRecent(const std::string& tenant, const std::string& id,
                                          const std::string& turn_id) override {
    absl::MutexLock lock(&mu_);
    SessionRecord r;
    RECALL_RETURN_IF_ERROR(LoadHeader(tenant, id, &r));
    if (r.message_count == 0) return r;
    RECALL_ASSIGN_OR_RETURN(int first, TurnStart(id, r.message_count - 1));
    if (!turn_id.empty()) {
      Stmt t(
          db_,
          "SELECT MIN(idx) FROM messages INDEXED BY messages_by_turn_id WHERE session_id = ? AND "
          "turn_id = ? AND "
          "turn_id != '' AND role = 'user'");
      t.BindText(1, id).BindText(2, turn_id);
      const int rc = t.Step();
      if (rc != SQLITE_ROW) return Check(rc, "find turn");
      if (sqlite3_column_type(t.stmt(), 0) != SQLITE_NULL && t.Int(0) < first) {
        RECALL_ASSIGN_OR_RETURN(first, TurnStart(id, static_cast<int>(t.Int(0))));
      }
    }
    r.first_message = first;
    // Of the messages before `first`, those CompleteTurns leaves out: each reply that is not
    // complete, and the messages of its turn before it (back to the previous reply).
    Stmt left(db_,
              "SELECT r.idx, (SELECT COUNT(*) FROM messages u WHERE u.session_id = r.session_id "
              "AND u.idx < r.idx AND u.role != 'system' AND u.idx > COALESCE((SELECT p.idx FROM "
              "messages p WHERE p.session_id = r.session_id AND p.idx < r.idx AND p.role = "
              "'assistant' ORDER BY p.idx DESC LIMIT 1), -1)) FROM messages r INDEXED BY "
              "messages_not_complete WHERE "
              "r.session_id = ? AND r.state != 0 AND r.idx < ? AND r.role = 'assistant'");
    left.BindText(1, id).Bind(2, static_cast<int64_t>(first));
    int left_out = 0;
    int rc;
    while ((rc = left.Step()) == SQLITE_ROW) left_out += 1 + static_cast<int>(left.Int(1));
    if (rc != SQLITE_DONE) return Check(rc, "read transcript");
    r.earlier_in_prompt = first - left_out;
    RECALL_RETURN_IF_ERROR(LoadMessages(id, &r));
    return r;
  }

  absl::Status AppendReply(const std::string& tenant, const std::string& id, int index,
                           const StoredMessage& delta, const StoredMessage& whole) override {
    absl::MutexLock lock(&mu_);
    // Streaming: no fsync (see Replace).
    RECALL_RETURN_IF_ERROR(Exec("PRAGMA synchronous=NORMAL", "append reply"));
    absl::Cleanup full = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      Exec("PRAGMA synchronous=FULL", "append reply").IgnoreError();
    };
    return InTransaction("append reply", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      Stmt lease(db_,
                 "UPDATE messages SET lease_ms = ? WHERE session_id = ? AND idx = ? AND state = 1 "
                 "AND EXISTS (SELECT 1 FROM sessions WHERE id = ? AND tenant = ?)");
      lease.Bind(1, whole.lease_unix_ms).BindText(2, id).Bind(3, static_cast<int64_t>(index));
      lease.BindText(4, id).BindText(5, tenant);
      RECALL_RETURN_IF_ERROR(Check(lease.Step(), "append reply"));
      if (sqlite3_changes(db_) == 0) {
        return absl::FailedPreconditionError(absl::StrCat("session \"", id,
                                                          "\" has no reply in progress at ", index,
                                                          ": another turn changed it"));
      }
      // An empty delta (a lease renewal while the turn is silent) adds no part.
      if (delta.content.empty() && delta.token_ids.empty()) return absl::OkStatus();
      Stmt part(db_,
                "INSERT INTO reply_parts (session_id, idx, seq, content, ids) VALUES (?, ?, "
                "(SELECT COALESCE(MAX(seq), -1) + 1 FROM reply_parts WHERE session_id = ? AND "
                "idx = ?), ?, ?)");
      part.BindText(1, id).Bind(2, static_cast<int64_t>(index)).BindText(3, id);
      part.Bind(4, static_cast<int64_t>(index)).Bind(5, delta.content);
      part.Bind(6, EncodeIds(delta.token_ids));
      return Check(part.Step(), "append reply");
    });
  }

  absl::StatusOr<std::vector<SessionRecord>> List(const std::string& tenant,
                                                  const std::string& after,
                                                  int limit) override {
    absl::MutexLock lock(&mu_);
    Stmt s(db_,
           "SELECT id, model, cache, metadata, created_ms, worker, "
           "(SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE session_id = sessions.id) "
           "FROM sessions WHERE tenant = ? AND id > ? ORDER BY id LIMIT ?");
    s.BindText(1, tenant).BindText(2, after).Bind(3, limit);
    std::vector<SessionRecord> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      SessionRecord r;
      r.tenant = tenant;
      if (const absl::Status st = Fill(s, &r); !st.ok()) {
        // A damaged session is listed (without its metadata), so that the others are and it
        // can be found and deleted; reading it says what is damaged.
        RECALL_LOG(WARNING) << st.message() << "; listed as far as it can be read";
      }
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Check(rc, "list sessions");
    return out;
  }

  absl::Status Delete(const std::string& tenant, const std::string& id) override {
    absl::MutexLock lock(&mu_);
    return InTransaction("delete session", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Stmt s(db_, "DELETE FROM sessions WHERE tenant = ? AND id = ?");
      s.BindText(1, tenant).BindText(2, id);
      RECALL_RETURN_IF_ERROR(Check(s.Step(), "delete session"));
      if (sqlite3_changes(db_) == 0) return NotFound(id);
      return DeleteSessionRecords(id);
    });
  }

  absl::StatusOr<std::vector<IdleSession>> DeleteIdle(int64_t before_unix_ms, int limit) override {
    absl::MutexLock lock(&mu_);
    std::vector<IdleSession> out;
    RECALL_RETURN_IF_ERROR(InTransaction(
        "delete idle sessions", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
          Stmt idle(db_,
                    "SELECT tenant, id, worker FROM sessions INDEXED BY sessions_by_activity WHERE "
                    "active_ms < ? AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = "
                    "sessions.id AND m.state = 1 AND m.lease_ms >= ?) ORDER BY active_ms LIMIT ?");
          idle.Bind(1, before_unix_ms).Bind(2, UnixMillis()).Bind(3, limit);
          int rc;
          while ((rc = idle.Step()) == SQLITE_ROW)
            out.push_back({idle.Text(0), idle.Text(1), idle.Text(2)});
          if (rc != SQLITE_DONE) return Check(rc, "delete idle sessions");
          for (const IdleSession& gone : out) {
            Stmt d(db_, "DELETE FROM sessions WHERE id = ?");
            d.BindText(1, gone.id);
            RECALL_RETURN_IF_ERROR(Check(d.Step(), "delete idle sessions"));
            RECALL_RETURN_IF_ERROR(DeleteSessionRecords(gone.id));
          }
          return absl::OkStatus();
        }));
    return out;
  }

  absl::Status AppendAll(const std::string& tenant, const std::string& id, int index,
                         const std::vector<StoredMessage>& messages) override {
    return ReplaceTail(tenant, id, index, index, messages, "");  // the count checked inside
  }

  // No writers here (one coordinator per file): `writer` is not checked.
  absl::Status ReplaceTail(const std::string& tenant, const std::string& id, int keep, int count,
                           const std::vector<StoredMessage>& messages,
                           const std::string& /*writer*/) override {
    absl::MutexLock lock(&mu_);
    return InTransaction(
        "replace messages", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
          SessionRecord r;
          RECALL_RETURN_IF_ERROR(LoadHeader(tenant, id, &r));
          if (r.message_count != count) {
            return absl::FailedPreconditionError(absl::StrCat("session \"", id, "\" has ",
                                                              r.message_count, " messages, not ",
                                                              count, ": another turn changed it"));
          }
          for (const char* sql : {"DELETE FROM messages WHERE session_id = ? AND idx >= ?",
                                  "DELETE FROM reply_parts WHERE session_id = ? AND idx >= ?"}) {
            Stmt s(db_, sql);
            s.BindText(1, id).Bind(2, keep);
            RECALL_RETURN_IF_ERROR(Check(s.Step(), "replace messages"));
          }
          Stmt active(db_, "UPDATE sessions SET active_ms = ? WHERE id = ?");  // a turn began
          active.Bind(1, UnixMillis()).BindText(2, id);
          RECALL_RETURN_IF_ERROR(Check(active.Step(), "replace messages"));
          return InsertMessages(id, keep, messages);
        });
  }

  absl::Status Replace(const std::string& tenant, const std::string& id, int index,
                       const StoredMessage& message) override {
    absl::MutexLock lock(&mu_);
    SessionRecord r;
    RECALL_RETURN_IF_ERROR(LoadHeader(tenant, id, &r));
    // A reply still streaming is written without an fsync (WAL, synchronous=NORMAL): it
    // survives the coordinator's crash (the write is in the OS's cache), not the machine's;
    // every other write, the ended reply included, is fsync'd (synchronous=FULL).
    const bool streaming = message.state == TurnState::kInProgress;
    if (streaming) RECALL_RETURN_IF_ERROR(Exec("PRAGMA synchronous=NORMAL", "replace message"));
    absl::Cleanup full = [this, streaming]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (streaming) Exec("PRAGMA synchronous=FULL", "replace message").IgnoreError();
    };
    // The message whole, its parts (AppendReply) folded in: one transaction.
    return InTransaction(
        "replace message", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
          Stmt s(db_,
                 "UPDATE messages SET role = ?, content = ?, reply = ?, state = ?, lease_ms = ?, "
                 "turn_id = ? WHERE session_id = ? AND idx = ?");
          s.BindText(1, message.role).Bind(2, message.content).Bind(3, EncodeReply(message));
          s.Bind(4, static_cast<int64_t>(message.state)).Bind(5, message.lease_unix_ms);
          s.BindText(6, message.turn_id).BindText(7, id).Bind(8, static_cast<int64_t>(index));
          RECALL_RETURN_IF_ERROR(Check(s.Step(), "replace message"));
          if (sqlite3_changes(db_) == 0) {
            return absl::FailedPreconditionError(
                absl::StrCat("session \"", id, "\" has ", r.message_count, " messages, none at ",
                             index, ": another turn changed it"));
          }
          Stmt parts(db_, "DELETE FROM reply_parts WHERE session_id = ? AND idx = ?");
          parts.BindText(1, id).Bind(2, static_cast<int64_t>(index));
          RECALL_RETURN_IF_ERROR(Check(parts.Step(), "replace message"));
          // A reply ended, or resumed: the session is active.
          Stmt active(db_, "UPDATE sessions SET active_ms = ? WHERE id = ?");
          active.Bind(1, UnixMillis()).BindText(2, id);
          return Check(active.Step(), "replace message");
        });
  }

  absl::StatusOr<int> InterruptInProgress() override {
    absl::MutexLock lock(&mu_);
    Stmt s(db_, "UPDATE messages SET state = 2, lease_ms = 0 WHERE state = 1");
    RECALL_RETURN_IF_ERROR(Check(s.Step(), "mark interrupted turns"));
    return sqlite3_changes(db_);
  }

  absl::Status Truncate(const std::string& tenant, const std::string& id, int index) override {
    absl::MutexLock lock(&mu_);
    SessionRecord r;
    RECALL_RETURN_IF_ERROR(LoadHeader(tenant, id, &r));
    return InTransaction(
        "truncate transcript", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
          for (const char* sql : {"DELETE FROM messages WHERE session_id = ? AND idx >= ?",
                                  "DELETE FROM reply_parts WHERE session_id = ? AND idx >= ?"}) {
            Stmt s(db_, sql);
            s.BindText(1, id).Bind(2, index);
            RECALL_RETURN_IF_ERROR(Check(s.Step(), "truncate transcript"));
          }
          return absl::OkStatus();
        });
  }

  absl::Status Bind(const std::string& tenant, const std::string& id,
                    const std::string& worker) override {
    absl::MutexLock lock(&mu_);
    Stmt s(db_, "UPDATE sessions SET worker = ? WHERE tenant = ? AND id = ?");
    s.BindText(1, worker).BindText(2, tenant).BindText(3, id);
    return Check(s.Step(), "bind session");
  }

  absl::StatusOr<int> CountSessions(const std::string& tenant) override {
    absl::MutexLock lock(&mu_);
    Stmt s(db_, "SELECT COUNT(*) FROM sessions WHERE tenant = ?");
    s.BindText(1, tenant);
    const int rc = s.Step();
    if (rc != SQLITE_ROW) return Check(rc == SQLITE_DONE ? SQLITE_ERROR : rc, "count sessions");
    return static_cast<int>(s.Int(0));
  }

 private:
  static absl::Status NotFound(const std::string& id) {
    return absl::NotFoundError(absl::StrCat("session_id: no session ", QuotedId(id)));
  }

  absl::Status PutRecord(const std::string& tenant, const std::string& name,
                         const std::string& value) override {
    return WriteRecord(tenant, name, value, /*replace=*/true);
  }

  absl::Status AddRecord(const std::string& tenant, const std::string& name,
                         const std::string& value) override {
    return WriteRecord(tenant, name, value, /*replace=*/false);
  }

  absl::Status PutSessionRecord(const std::string& tenant, const std::string& id,
                                const std::string& name, const std::string& value) override {
    return WriteRecord(tenant, name, value, /*replace=*/true, &id);
  }

  absl::Status AddSessionRecord(const std::string& tenant, const std::string& id,
                                const std::string& name, const std::string& value) override {
    return WriteRecord(tenant, name, value, /*replace=*/false, &id);
  }

  // Writes a record after forgetting those past their day; without `replace`, AlreadyExists
  // when one of that name is kept. With `session`, a record of that session of `tenant`
  // (NotFound when there is none).
  absl::Status WriteRecord(const std::string& tenant, const std::string& name,
                           const std::string& value, bool replace,
                           const std::string* session = nullptr) {
    absl::MutexLock lock(&mu_);
    const int64_t now = UnixMillis();
    Stmt purge(db_, "DELETE FROM records WHERE written_ms < ?");
    purge.Bind(1, now - kRecordTtlMs);
    RECALL_RETURN_IF_ERROR(Check(purge.Step(), "forget old records"));
    if (session != nullptr) {  // no other writer: one coordinator per file, under mu_
      Stmt find(db_, "SELECT 1 FROM sessions WHERE id = ? AND tenant = ?");
      find.BindText(1, *session).BindText(2, tenant);
      const int rc = find.Step();
      if (rc == SQLITE_DONE) return NotFound(*session);
      RECALL_RETURN_IF_ERROR(Check(rc, "write record"));
    }
    Stmt s(db_, replace ? "INSERT OR REPLACE INTO records (tenant, name, value, written_ms, "
                          "session) VALUES (?, ?, ?, ?, ?)"
                        : "INSERT OR IGNORE INTO records (tenant, name, value, written_ms, "
                          "session) VALUES (?, ?, ?, ?, ?)");
    s.BindText(1, tenant).BindText(2, name).Bind(3, value).Bind(4, now);
    s.BindText(5, session != nullptr ? *session : std::string());
    RECALL_RETURN_IF_ERROR(Check(s.Step(), "write record"));
    if (!replace && sqlite3_changes(db_) == 0) {
      return absl::AlreadyExistsError("the record is kept");
    }
    return absl::OkStatus();
  }

  // Forgets the records of session `id` (PutSessionRecord), within a write.
  absl::Status DeleteSessionRecords(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Stmt s(db_, "DELETE FROM records WHERE session = ? AND session != ''");  // its index
    s.BindText(1, id);
    return Check(s.Step(), "delete the session's records");
  }

  absl::Status DeleteRecord(const std::string& tenant, const std::string& name,
                            const std::string& value) override {
    absl::MutexLock lock(&mu_);
    Stmt s(db_, "DELETE FROM records WHERE tenant = ? AND name = ? AND value = ?");
    s.BindText(1, tenant).BindText(2, name).Bind(3, value);
    return Check(s.Step(), "delete record");
  }

  absl::StatusOr<std::string> GetRecord(const std::string& tenant,
                                        const std::string& name) override {
    absl::MutexLock lock(&mu_);
    Stmt s(db_, "SELECT value, written_ms FROM records WHERE tenant = ? AND name = ?");
    s.BindText(1, tenant).BindText(2, name);
    const int rc = s.Step();
    if (rc == SQLITE_ROW && s.Int(1) >= UnixMillis() - kRecordTtlMs) return s.Text(0);
    RECALL_RETURN_IF_ERROR(Check(rc, "read record"));
    return absl::NotFoundError("no record");
  }

  absl::Status Check(int rc, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return absl::OkStatus();
    // A damaged file (or one that is not a database) does not mend by retrying: DATA_LOSS,
    // so a client stops and an operator is called. Busy, full, I/O: retryable.
    const int primary = rc & 0xFF;
    if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB) {
      return absl::DataLossError(absl::StrCat("session store: ", what, ": ", sqlite3_errmsg(db_),
                                              " (the file is damaged. ", RepairAdvice(path_), ")"));
    }
    if (primary == SQLITE_READONLY || primary == SQLITE_CANTOPEN || primary == SQLITE_PERM) {
      // Retrying does not mend permissions either.
      return absl::InternalError(absl::StrCat(
          "session store: ", what, ": ", sqlite3_errmsg(db_), " (", path_,
          ", its -wal and -shm files and their folder must be writable by this process)"));
    }
    return absl::UnavailableError(
        absl::StrCat("session store: ", what, ": ", sqlite3_errmsg(db_), " (retryable)"));
  }

  absl::Status Exec(const char* sql, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return Check(sqlite3_exec(db_, sql, nullptr, nullptr, nullptr), what);
  }

  // Runs `body` in one transaction (BEGIN IMMEDIATE): committed when it succeeds, rolled back
  // when it fails.
  template <typename Body>
  absl::Status InTransaction(const char* what, Body body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RECALL_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", what));
    if (absl::Status st = body(); !st.ok()) {
      Exec("ROLLBACK", what).IgnoreError();
      return st;
    }
    return Commit(what);
  }

  // COMMIT; when it fails (SQLite may leave the transaction open, e.g. on SQLITE_BUSY), the
  // transaction is rolled back, so later writes are not taken into it and lost.
  absl::Status Commit(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status st = Exec("COMMIT", what);
    if (!st.ok() && sqlite3_get_autocommit(db_) == 0) Exec("ROLLBACK", what).IgnoreError();
    return st;
  }

  // Inserts `messages` at index..; inside a transaction.
  absl::Status InsertMessages(const std::string& id, int index,
                              const std::vector<StoredMessage>& messages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < messages.size(); ++i) {
      const StoredMessage& message = messages[i];
      Stmt s(db_,
             "INSERT INTO messages (session_id, idx, role, content, reply, state, lease_ms, "
             "turn_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
      s.BindText(1, id).Bind(2, index + static_cast<int64_t>(i)).BindText(3, message.role);
      s.Bind(4, message.content).Bind(5, EncodeReply(message));
      s.Bind(6, static_cast<int64_t>(message.state)).Bind(7, message.lease_unix_ms);
      s.BindText(8, message.turn_id);
      RECALL_RETURN_IF_ERROR(Check(s.Step(), "append message"));
    }
    return absl::OkStatus();
  }

  static constexpr int64_t kMaxMessageIndex = int64_t{1} << 30;
  // The row's fields; DataLoss for damaged metadata or message indexes, the fields before them
  // filled.
  static absl::Status Fill(const Stmt& s, SessionRecord* r) {
    r->id = s.Text(0);
    r->model = StoredText(s.Text(1));
    r->cache_settings = s.Text(2);
    r->created_unix_ms = s.Int(4);
    r->worker = StoredText(s.Text(5));
    // A message index past what a transcript reaches is a damaged row (it went through an int,
    // and a turn's planner found the session holding a negative number of messages).
    const int64_t count = s.Int(6);
    if (count < 0 || count > kMaxMessageIndex) {
      return absl::DataLossError(absl::StrCat("session store: session ", QuotedId(r->id),
                                              " has a message at index ", count - 1,
                                              " (damaged; at most ", kMaxMessageIndex, ")"));
    }
    r->message_count = static_cast<int>(count);
    RECALL_ASSIGN_OR_RETURN(r->metadata, ParseStoredMetadata(s.Text(3), r->id));
    return absl::OkStatus();
  }

  // The messages from r->first_message on, into r->messages, with their reply parts merged.
  absl::Status LoadMessages(const std::string& id, SessionRecord* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t first = r->first_message;
    Stmt m(db_,
           "SELECT role, content, reply, state, lease_ms, turn_id FROM messages WHERE "
           "session_id = ? AND idx >= ? ORDER BY idx");
    m.BindText(1, id).Bind(2, first);
    int rc;
    while ((rc = m.Step()) == SQLITE_ROW) {
      StoredMessage& msg = r->messages.emplace_back();
      msg.role = StoredText(m.Text(0));
      msg.content = m.Text(1);  // made valid once its parts are in
      DecodeReply(m.Text(2), &msg);
      const int64_t state = m.Int(3);
      msg.state = state >= 0 && state <= 3 ? static_cast<TurnState>(state) : TurnState::kFailed;
      msg.lease_unix_ms = m.Int(4);
      msg.turn_id = StoredText(m.Text(5));
    }
    if (rc != SQLITE_DONE) return Check(rc, "read transcript");
    // Replies written part by part (AppendReply): their parts after what the row holds.
    Stmt p(db_,
           "SELECT idx, content, ids FROM reply_parts WHERE session_id = ? AND idx >= ? "
           "ORDER BY idx, seq");
    p.BindText(1, id).Bind(2, first);
    while ((rc = p.Step()) == SQLITE_ROW) {
      const int64_t idx = p.Int(0) - first;
      if (idx < 0 || idx >= static_cast<int64_t>(r->messages.size())) continue;
      StoredMessage& msg = r->messages[static_cast<size_t>(idx)];
      msg.content += p.Text(1);
      AppendIds(p.Text(2), &msg.token_ids);
    }
    if (rc != SQLITE_DONE) return Check(rc, "read reply parts");
    for (StoredMessage& msg : r->messages) msg.content = StoredText(std::move(msg.content));
    return absl::OkStatus();
  }

  // Where the turn of message `index` starts: just after the last assistant reply before it
  // (0 when none).
  absl::StatusOr<int> TurnStart(const std::string& id, int index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Stmt s(db_,
           "SELECT idx FROM messages WHERE session_id = ? AND idx < ? AND role = 'assistant' "
           "ORDER BY idx DESC LIMIT 1");
    s.BindText(1, id).Bind(2, static_cast<int64_t>(index));
    const int rc = s.Step();
    if (rc == SQLITE_ROW) return static_cast<int>(s.Int(0)) + 1;
    RECALL_RETURN_IF_ERROR(Check(rc, "read transcript"));
    return 0;
  }

  absl::Status LoadHeader(const std::string& tenant, const std::string& id, SessionRecord* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Stmt s(db_,
           "SELECT id, model, cache, metadata, created_ms, worker, "
           "(SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE session_id = sessions.id) "
           "FROM sessions WHERE tenant = ? AND id = ?");
    s.BindText(1, tenant).BindText(2, id);
    const int rc = s.Step();
    if (rc == SQLITE_DONE) return NotFound(id);
    if (rc != SQLITE_ROW) return Check(rc, "read session");
    r->tenant = tenant;
    return Fill(s, r);
  }

  absl::Mutex mu_;
  sqlite3* db_;
  const int lock_fd_;
  const std::string path_;
};

// One store per file: a second coordinator on the same sessions.db would mark the first's
// running turns interrupted at its start, and their transcripts would interleave. An
// exclusive flock on PATH.lock, held while the store is open (the kernel lets it go when the
// process dies, however).
absl::StatusOr<int> LockStoreFile(const std::string& path) {
  const std::string lock_path = path + ".lock";
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("session store ", path, ": cannot open ", lock_path, ": ", strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    close(fd);
    if (e == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session store ", path, " is in use by another coordinator (", lock_path,
          " is locked); run one coordinator per data directory (coordinators that share "
          "sessions keep them in Redis: recall-coordinator --store "
          "redis://HOST:PORT)"));
    }
    return absl::UnavailableError(
        absl::StrCat("session store ", path, ": cannot lock ", lock_path, ": ", strerror(e)));
  }
  return fd;
}

// What the lock file holds once a store was made in its file (OpenSqliteStore's `emptied`):
// that file's identity, so a file moved away and made anew is not taken for an emptied one.
std::string StoreMark(const struct stat& file) {
  return absl::StrCat("a Recall session store was made in device ", file.st_dev, " inode ",
                      file.st_ino, "\n");
}

void MarkStoreMade(int lock_fd, const std::string& path) {
  // Best effort (a lock without it only leaves an emptied file unsaid); written before the
  // old mark is cut, so a full disk does not erase it.
  struct stat file;
  if (::stat(path.c_str(), &file) != 0) return;
  const std::string mark = StoreMark(file);
  if (pwrite(lock_fd, mark.data(), mark.size(), 0) == static_cast<ssize_t>(mark.size())) {
    [[maybe_unused]] const int cut = ftruncate(lock_fd, static_cast<off_t>(mark.size()));
  }
}

// "; the disk holding PATH is full (N bytes free)" when it has under 1 MiB free, else "":
// SQLite says only "disk I/O error" when it cannot make its log on a full disk.
std::string DiskFullHint(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return "";
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes >= (1u << 20)) return "";
  return absl::StrCat("; the disk holding it is full (", free_bytes, " bytes free)");
}

// Runs `sql` on the store being opened; on failure closes it and says why (DataLoss: a file
// whose schema cannot be set up), with how to repair a damaged one.
absl::Status SetUp(sqlite3* db, const char* sql, const std::string& path) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return absl::OkStatus();
  const std::string msg = err ? err : "?";
  sqlite3_free(err);
  sqlite3_close(db);
  std::string advice = DiskFullHint(path);
  if ((rc & 0xFF) == SQLITE_CORRUPT) {
    advice = absl::StrCat(": the file is damaged. ", RepairAdvice(path));
  } else if ((rc & 0xFF) == SQLITE_NOTADB) {
    advice =
        ": it is not an SQLite database (move it away, or give another --data-dir or "
        "--store)";
  }
  return absl::DataLossError(absl::StrCat("session store ", path, ": ", msg, advice));
}

// The columns of `table`.
std::set<std::string> Columns(sqlite3* db, const char* table) {
  std::set<std::string> out;
  Stmt info(db, absl::StrCat("PRAGMA table_info(", table, ")").c_str());
  while (info.Step() == SQLITE_ROW) out.insert(info.Text(1));
  return out;
}

// Damaged pages that the queries may read rarely or never (an index's: a lookup that no longer
// finds a session), found by PRAGMA quick_check, which reads the whole file. Empty for a sound
// file, and for one that is no database (its open says so). A check that could not run (the
// file locked past the timeout, out of memory) is Unavailable naming why, not damage; an I/O
// error reading it is damage (an unreadable sector).
absl::StatusOr<std::vector<std::string>> DamagedPages(sqlite3* db, const std::string& path) {
  std::vector<std::string> problems;
  Stmt check(db, "PRAGMA quick_check(5)");
  int rc;
  while ((rc = check.Step()) == SQLITE_ROW) {
    std::string problem = check.Text(0);
    if (problem == "ok" || problem == "*** in database main ***") continue;
    std::replace(problem.begin(), problem.end(), '\n', ' ');
    problems.push_back(std::move(problem));
  }
  if (rc == SQLITE_DONE || (rc & 0xFF) == SQLITE_NOTADB) return problems;
  if ((rc & 0xFF) == SQLITE_BUSY || (rc & 0xFF) == SQLITE_LOCKED || (rc & 0xFF) == SQLITE_NOMEM) {
    return absl::UnavailableError(absl::StrCat("session store ", path, ": cannot check it (",
                                               sqlite3_errstr(rc), "); retryable"));
  }
  problems.push_back(sqlite3_errstr(rc));  // damage, an unreadable sector (I/O) among it
  return problems;
}

// A store's tables and the columns every version of them has (later ones are added at open).
const std::vector<std::pair<std::string, std::vector<std::string>>>& StoreTables() {
  static const auto* const kTables =
      new std::vector<std::pair<std::string, std::vector<std::string>>>{
          {"sessions", {"id", "tenant", "model", "cache", "metadata", "created_ms", "worker"}},
          {"messages", {"session_id", "idx", "role", "content"}},
          {"records", {"tenant", "name", "value", "written_ms"}},
          {"reply_parts", {"session_id", "idx", "seq", "content", "ids"}}};
  return *kTables;
}

// A file holding other tables, or these under other columns (another program's database, or
// hand-made), was taken over (its tables kept beside ours) or failed at its first index
// ("no such column: tenant"): FailedPrecondition naming what is foreign or missing.
absl::Status CheckTables(sqlite3* db, const std::string& path) {
  const std::string not_ours =
      "not a Recall session store; move it away, or give another "
      "--data-dir or --store";
  std::vector<std::string> foreign;
  {
    Stmt tables(db,
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                "'sqlite\\_%' ESCAPE '\\'");
    while (tables.Step() == SQLITE_ROW) {
      const std::string name = tables.Text(0);
      bool ours = false;
      for (const auto& [table, columns] : StoreTables()) ours = ours || table == name;
      ours = ours || name == "key_records";  // an older store's (idempotency keys), unused
      if (!ours) foreign.push_back(name);
    }
  }
  if (!foreign.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("session store ", path, " holds table(s) ",
                                                      absl::StrJoin(foreign, ", "),
                                                      " of no session store: ", not_ours));
  }
  for (const auto& [table, wanted] : StoreTables()) {
    const std::set<std::string> have = Columns(db, table.c_str());
    if (have.empty()) continue;  // made at open
    for (const std::string& column : wanted) {
      if (have.count(column) == 0) {
        return absl::FailedPreconditionError(absl::StrCat("session store ", path, ": its table ",
                                                          table, " has no column ", column, ": ",
                                                          not_ours));
      }
    }
  }
  return absl::OkStatus();
}

// An existing file, read before a writer opens it, on a read-only connection (closing it
// writes nothing; a writer's close checkpoints the log into the file): its damaged pages
// (SayLoss; *damaged then, when allowed) and its tables (CheckTables). A file SQLite cannot
// read is left to the writer's open, which says why.
absl::Status CheckExistingFile(const std::string& path, bool allow_loss, bool* damaged);

// What a store that lost sessions says: refused (DataLoss) unless `allow_loss`, then warned.
absl::Status SayLoss(const std::string& path, const std::string& what, const std::string& fix,
                     bool allow_loss) {
  if (!allow_loss) {
    return absl::DataLossError(absl::StrCat(
        "session store ", path, ": ", what, ". Nothing was written to it. ", fix,
        "; or pass --allow-store-loss to start serving what can be read (what was lost is then "
        "gone for good)"));
  }
  RECALL_LOG(WARNING) << "session store " << path << ": " << what
                      << "; starting anyway (--allow-store-loss): the sessions that can be read "
                         "are served. "
                      << fix;
  return absl::OkStatus();
}

absl::Status CheckExistingFile(const std::string& path, bool allow_loss, bool* damaged) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return absl::OkStatus();
  }
  absl::Cleanup close_db = [db] { sqlite3_close(db); };
  sqlite3_busy_timeout(db, 5000);
  RECALL_ASSIGN_OR_RETURN(const std::vector<std::string> pages, DamagedPages(db, path));
  if (!pages.empty()) {
    RECALL_RETURN_IF_ERROR(
        SayLoss(path, absl::StrCat("it is damaged (", absl::StrJoin(pages, "; "), ")"),
                absl::StrCat("Keep a copy of it. ", RepairAdvice(path)), allow_loss));
    *damaged = true;
  }
  {
    Stmt version(db, "PRAGMA user_version");
    if (version.Step() == SQLITE_ROW && version.Int(0) > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session store ", path, " was written by a newer coordinator (store version ",
          version.Int(0), "; this one knows up to ", kSchemaVersion,
          "): run that version, or move the file away"));
    }
  }
  return CheckTables(db, path);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionStore>> OpenSqliteStore(const std::string& path,
                                                              bool allow_loss) {
  // Said by name (SQLite said "unable to open database file", the lock "cannot open
  // PATH.lock").
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session store ", path, " is a directory; name the database file (",
                     (std::filesystem::path(path) / "sessions.db").string(), ")"));
  }
  if (const std::filesystem::path dir = std::filesystem::path(path).parent_path();
      !dir.empty() && !std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session store ", path, ": its directory ", dir.string(),
                     std::filesystem::exists(dir, ec) ? " is not a directory" : " does not exist"));
  }
  // A store file of 0 bytes beside the lock of a coordinator that had made it (kStoreMade in
  // the lock: a first start that failed before its schema was written leaves an empty file
  // and lock, and no store was lost): the file was emptied, and SQLite would take it as new.
  struct stat file;
  bool emptied = false;
  if (::stat(path.c_str(), &file) == 0 && file.st_size == 0) {
    std::ifstream lock(path + ".lock", std::ios::binary);
    std::string mark(256, '\0');
    lock.read(mark.data(), static_cast<std::streamsize>(mark.size()));
    mark.resize(static_cast<size_t>(lock.gcount()));
    emptied = mark == StoreMark(file);
  }
  RECALL_ASSIGN_OR_RETURN(const int lock_fd, LockStoreFile(path));
  absl::Cleanup unlock = [lock_fd] { close(lock_fd); };  // unless the store takes it
  // A salvage (--allow-store-loss) stopped after its new file was complete: finished first.
  RECALL_ASSIGN_OR_RETURN(const std::string finished, FinishSalvage(path));
  if (!finished.empty()) {
    RECALL_LOG(WARNING) << "session store " << path
                        << ": finished the salvage an earlier start began (the damaged file is "
                           "kept as "
                        << finished << ")";
  }
  // Every tenant's transcripts: a new file is its owner's only (SQLite gives its log and
  // shared memory the file's mode; they were 0644, readable by every local user), and an
  // existing one that others may read is said.
  if (const int made = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      made >= 0) {
    close(made);
  } else if (struct stat mode;
             ::stat(path.c_str(), &mode) == 0 && (mode.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    RECALL_LOG(WARNING) << "session store " << path
                        << " holds every tenant's transcripts and other users of this machine "
                           "may read it (mode "
                        << absl::StrFormat("%04o", mode.st_mode & 07777) << "): chmod 600 " << path
                        << "*";
  }
  if (emptied) {
    RECALL_RETURN_IF_ERROR(
        SayLoss(path,
                absl::StrCat("it is empty (0 bytes), though a coordinator used it before (", path,
                             ".lock): the sessions it held are gone"),
                "Restore the file from a backup", allow_loss));
  }
  // Read before SQLite replays the log (and drops a damaged log's frames without a word).
  if (std::optional<WalDamage> damage = DescribeWalDamage(path + "-wal"); damage.has_value()) {
    if (damage->last_transaction_only) {
      // A power cut in a commit leaves this (the commit frame on disk, an earlier frame of
      // its transaction not), never acknowledged: a start is not refused for it.
      RECALL_LOG(WARNING) << "session store " << path << ": " << damage->what
                          << " (only the log's last transaction: the one a crash in its commit "
                             "cuts short, never acknowledged)";
    } else {
      RECALL_RETURN_IF_ERROR(SayLoss(path, damage->what,
                                     absl::StrCat("Keep a copy of ", path, " and ", path,
                                                  "-wal now (the frames past the damage can be "
                                                  "read from the copy by hand)"),
                                     allow_loss));
    }
  }

  if (struct stat now; ::stat(path.c_str(), &now) == 0 && now.st_size > 0) {
    bool damaged = false;
    RECALL_RETURN_IF_ERROR(CheckExistingFile(path, allow_loss, &damaged));
    if (damaged) {  // allowed: what can be read, into a new file (sqlite_salvage.h)
      RECALL_ASSIGN_OR_RETURN(const std::string salvaged, SalvageSqliteFile(path));
      RECALL_LOG(WARNING) << "session store " << path << ": " << salvaged;
    }
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    const std::string err = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(
        absl::StrCat("session store ", path, ": ", err, DiskFullHint(path)));
  }
  sqlite3_busy_timeout(db, 5000);
  RECALL_RETURN_IF_ERROR(SetUp(db, kSchema, path));
  // Files from before replies' tokens (empty: replayed as text), turn states (complete), turn
  // ids (none), activity and records' sessions (none) were kept get the columns.
  const std::set<std::string> messages = Columns(db, "messages");
  const std::set<std::string> sessions = Columns(db, "sessions");
  const std::set<std::string> records = Columns(db, "records");
  for (const auto& [have, column, sql] :
       {std::tuple<const std::set<std::string>*, const char*, const char*>{
            &messages, "reply", "ALTER TABLE messages ADD COLUMN reply BLOB NOT NULL DEFAULT x''"},
        {&messages, "state", "ALTER TABLE messages ADD COLUMN state INTEGER NOT NULL DEFAULT 0"},
        {&messages, "lease_ms",
         "ALTER TABLE messages ADD COLUMN lease_ms INTEGER NOT NULL DEFAULT 0"},
        {&messages, "turn_id", "ALTER TABLE messages ADD COLUMN turn_id TEXT NOT NULL DEFAULT ''"},
        {&sessions, "active_ms",
         "ALTER TABLE sessions ADD COLUMN active_ms INTEGER NOT NULL DEFAULT 0"},
        {&records, "session", "ALTER TABLE records ADD COLUMN session TEXT NOT NULL DEFAULT ''"}}) {
    if (have->count(column) != 0) continue;
    RECALL_RETURN_IF_ERROR(SetUp(db, sql, path));
  }
  // Sessions whose activity is unknown (a file from before it was kept, or sessions an older
  // coordinator made since) count as active now: none is deleted as idle for an age it was
  // never measured by. At every open, so that an open that failed halfway does it again.
  RECALL_RETURN_IF_ERROR(
      SetUp(db,
            absl::StrCat("UPDATE sessions SET active_ms = ", UnixMillis(), " WHERE active_ms = 0")
                .c_str(),
            path));
  RECALL_RETURN_IF_ERROR(SetUp(db, kIndexes, path));
  RECALL_RETURN_IF_ERROR(
      SetUp(db, absl::StrCat("PRAGMA user_version = ", kSchemaVersion).c_str(), path));
  MarkStoreMade(lock_fd, path);
  std::move(unlock).Cancel();
  return std::unique_ptr<SessionStore>(new SqliteStore(db, lock_fd, path));
}

}  // namespace recall::coordinator
