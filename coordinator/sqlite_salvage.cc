#include "coordinator/sqlite_salvage.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/clock.h"
#include "common/status.h"

namespace recall::coordinator {
namespace {

// `name` as an SQL identifier.
std::string Quoted(const std::string& name) {
  return absl::StrCat("\"", absl::StrReplaceAll(name, {{"\"", "\"\""}}), "\"");
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

std::string Text(sqlite3_stmt* s, int col) {
  const unsigned char* p = sqlite3_column_text(s, col);
  return p == nullptr ? "" : reinterpret_cast<const char*>(p);
}

// A prepared statement that finalizes itself; ok() false when it could not be prepared.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) {
    sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  sqlite3_stmt* get() const { return stmt_; }
  int Step() { return stmt_ == nullptr ? SQLITE_ERROR : sqlite3_step(stmt_); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

absl::Status Exec(sqlite3* db, const std::string& sql, const std::string& what) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) == SQLITE_OK) return absl::OkStatus();
  const std::string msg = err != nullptr ? err : sqlite3_errmsg(db);
  sqlite3_free(err);
  return absl::UnavailableError(absl::StrCat(what, ": ", msg));
}

constexpr char kSwapSuffix[] = ".salvage-done";

// fsync of a file (by path); false when it cannot be opened or synced.
bool SyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

// fsync of the directory holding `path` (its renames and links durable); best effort.
void SyncDirectory(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// The marker that the new file is complete: PATH.salvage-done holding the kept file's name.
bool WriteMarker(const std::string& path, const std::string& kept) {
  const std::string marker = path + kSwapSuffix;
  {
    std::ofstream out(marker, std::ios::trunc);
    out << kept << "\n";
    if (!out.flush()) return false;
  }
  if (!SyncFile(marker)) return false;
  SyncDirectory(path);
  return true;
}

// `path` and the files SQLite keeps beside it.
void RemoveFiles(const std::string& path) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::filesystem::remove(path + suffix, ec);
  }
}

// Whether a read of `table` from past rowid `after` gets past damage: its first row's rowid
// (nullopt when it meets damage; INT64_MAX when there is no row past `after`).
std::optional<int64_t> FirstRowidAfter(sqlite3* from, const std::string& table, int64_t after) {
  Statement seek(from, absl::StrCat("SELECT rowid FROM ", Quoted(table),
                                    " WHERE rowid > ?1 ORDER BY rowid LIMIT 1"));
  sqlite3_bind_int64(seek.get(), 1, after);
  const int rc = seek.Step();
  if (rc == SQLITE_ROW) return sqlite3_column_int64(seek.get(), 0);
  if (rc == SQLITE_DONE) return std::numeric_limits<int64_t>::max();
  return std::nullopt;
}

// Copies the rows of `table` that can be read from `from` (the damaged file) into `to`; a
// line saying how many, and how many stretches of rowids were lost to damage. Read in rowid
// order; past a damaged page the read seeks the first rowid it can reach again (a scan stopped
// at the first damaged page: a tester's store lost all 363 messages to one). Two connections:
// a read that meets damage leaves the writer's transaction alone.
absl::StatusOr<std::string> CopyRows(sqlite3* from, sqlite3* to, const std::string& table) {
  std::vector<std::string> columns;
  {
    Statement info(from, absl::StrCat("PRAGMA table_info(", Quoted(table), ")"));
    while (info.Step() == SQLITE_ROW) columns.push_back(Quoted(Text(info.get(), 1)));
  }
  if (columns.empty()) return absl::StrCat(table, ": its columns cannot be read (none copied)");
  const std::string list = absl::StrJoin(columns, ", ");
  std::vector<std::string> marks(columns.size(), "?");
  Statement write(to, absl::StrCat("INSERT OR IGNORE INTO ", Quoted(table), " (", list,
                                   ") VALUES (", absl::StrJoin(marks, ", "), ")"));
  if (write.get() == nullptr) {
    return absl::UnavailableError(absl::StrCat("salvage ", table, ": ", sqlite3_errmsg(to)));
  }
  const int n = static_cast<int>(columns.size());
  int64_t rows = 0, last = std::numeric_limits<int64_t>::min();
  int gaps = 0;
  while (true) {
    Statement read(from, absl::StrCat("SELECT rowid, ", list, " FROM ", Quoted(table),
                                      " WHERE rowid > ?1 ORDER BY rowid"));
    sqlite3_bind_int64(read.get(), 1, last);
    int rc;
    while ((rc = read.Step()) == SQLITE_ROW) {
      last = sqlite3_column_int64(read.get(), 0);
      for (int c = 0; c < n; ++c) {
        sqlite3_bind_value(write.get(), c + 1, sqlite3_column_value(read.get(), c + 1));
      }
      if (write.Step() != SQLITE_DONE) {
        return absl::UnavailableError(absl::StrCat("salvage ", table, ": ", sqlite3_errmsg(to)));
      }
      sqlite3_reset(write.get());
      ++rows;
    }
    if (rc == SQLITE_DONE || read.get() == nullptr) break;
    // Damage past `last`: the smallest `after` whose seek gets past it, found by doubling a
    // step and then halving it (a seek from within the damaged page's rowids fails, one from
    // past them succeeds).
    ++gaps;
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    // A row that can be found but not read (its payload or overflow page damaged): skipped
    // alone. (Searched for as below, each such row cost a step per rowid before it.)
    if (const std::optional<int64_t> next = FirstRowidAfter(from, table, last); next.has_value()) {
      if (*next == kMax) break;
      last = *next;
      continue;
    }
    int64_t lo = last, step = 1;  // seeks from lo fail
    bool reachable = true;
    while (!FirstRowidAfter(from, table, SaturatingAdd(lo, step)).has_value()) {
      if (SaturatingAdd(lo, step) == kMax) {
        reachable = false;  // the last rows' page is damaged: the rest is lost
        break;
      }
      lo = SaturatingAdd(lo, step);
      if (step <= (kMax >> 1)) step *= 2;
    }
    if (!reachable) break;
    int64_t hi = SaturatingAdd(lo, step);  // a seek from hi gets past the damage
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (FirstRowidAfter(from, table, mid).has_value() ? hi : lo) = mid;
    }
    if (FirstRowidAfter(from, table, hi) == kMax) break;  // no row past the damage
    last = hi;
  }
  return absl::StrCat(table, ": ", rows, " rows",
                      gaps > 0 ? absl::StrCat(" (", gaps, " stretch(es) lost to damage)") : "");
}

// A session's transcript is its messages 0, 1, ...: one that lost a message keeps those
// before it (a transcript with a hole would be served as a conversation that never happened);
// the reply parts of what it lost go too. How many transcripts were cut.
int KeepUnbrokenTranscripts(sqlite3* db) {
  std::vector<std::pair<std::string, int64_t>> cuts;  // session, its first missing index
  {
    Statement read(db, "SELECT session_id, idx FROM messages ORDER BY session_id, idx");
    std::string session;
    int64_t expect = 0;
    bool cut = false;
    while (read.Step() == SQLITE_ROW) {
      const std::string s = Text(read.get(), 0);
      const int64_t idx = sqlite3_column_int64(read.get(), 1);
      if (s != session) {
        session = s;
        expect = 0;
        cut = false;
      }
      if (cut) continue;
      if (idx != expect) {
        cuts.emplace_back(session, expect);
        cut = true;
      }
      ++expect;
    }
  }
  for (const auto& [session, from] : cuts) {
    for (const char* table : {"messages", "reply_parts"}) {
      Statement drop(db,
                     absl::StrCat("DELETE FROM ", table, " WHERE session_id = ?1 AND idx >= ?2"));
      sqlite3_bind_text(drop.get(), 1, session.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(drop.get(), 2, from);
      drop.Step();
    }
  }
  return static_cast<int>(cuts.size());
}

}  // namespace

absl::StatusOr<std::string> FinishSalvage(const std::string& path) {
  const std::string marker = path + kSwapSuffix, fresh = path + ".salvage";
  std::string kept;
  {
    std::ifstream in(marker);
    if (!in) return std::string();  // no salvage to finish
    std::getline(in, kept);
  }
  std::error_code ec;
  if (std::filesystem::exists(fresh, ec)) {
    for (const char* suffix : {"-wal", "-shm", "-journal"}) {
      std::filesystem::remove(path + suffix, ec);  // kept's (linked) or made again
      if (ec) {
        return absl::UnavailableError(
            absl::StrCat("salvage: cannot remove ", path, suffix, ": ", ec.message()));
      }
    }
    std::filesystem::rename(fresh, path, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("salvage: cannot move ", fresh, " to ", path, ": ", ec.message()));
    }
    SyncDirectory(path);
  }
  std::filesystem::remove(marker, ec);
  SyncDirectory(path);
  return kept;
}

absl::StatusOr<std::string> SalvageSqliteFile(const std::string& path) {
  const std::string fresh = path + ".salvage";
  RemoveFiles(fresh);
  // Every tenant's transcripts: its owner's only, as the store's own file (sqlite_store.cc).
  if (const int made = ::open(fresh.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      made >= 0) {
    ::close(made);
  } else {
    return absl::UnavailableError(absl::StrCat("salvage into ", fresh, ": ", std::strerror(errno)));
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(fresh.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    const std::string err = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("salvage into ", fresh, ": ", err));
  }
  sqlite3* old = nullptr;
  bool done = false;
  absl::Cleanup close = [&] {
    sqlite3_close(old);
    sqlite3_close(db);
    if (!done) RemoveFiles(fresh);
  };
  if (sqlite3_open_v2(path.c_str(), &old, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    return absl::DataLossError(absl::StrCat(
        "salvage ", path, ": ", old != nullptr ? sqlite3_errmsg(old) : "out of memory"));
  }
  std::vector<std::pair<std::string, std::string>> tables;  // name, CREATE statement
  int64_t version = 0;
  {
    Statement schema(old,
                     "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT "
                     "LIKE 'sqlite\\_%' ESCAPE '\\'");
    int rc;
    while ((rc = schema.Step()) == SQLITE_ROW) {
      tables.emplace_back(Text(schema.get(), 0), Text(schema.get(), 1));
    }
    if (rc != SQLITE_DONE) {
      return absl::DataLossError(
          absl::StrCat("salvage ", path, ": its schema cannot be read (", sqlite3_errstr(rc), ")"));
    }
    Statement user_version(old, "PRAGMA user_version");
    if (user_version.Step() == SQLITE_ROW) version = sqlite3_column_int64(user_version.get(), 0);
  }
  std::vector<std::string> copied;
  for (const auto& [name, create] : tables) {
    if (absl::Status st = Exec(db, create, "salvage: make table " + name); !st.ok()) return st;
  }
  if (absl::Status st = Exec(db, "BEGIN", "salvage"); !st.ok()) return st;
  for (const auto& [name, create] : tables) {
    absl::StatusOr<std::string> line = CopyRows(old, db, name);
    if (!line.ok()) return line.status();
    copied.push_back(*std::move(line));
  }
  // Rows whose parent row was lost (a message of a session whose row was on a damaged page).
  int64_t orphans = 0;
  {
    std::vector<std::pair<std::string, int64_t>> lost;
    Statement check(db, "PRAGMA main.foreign_key_check");
    while (check.Step() == SQLITE_ROW) {
      lost.emplace_back(Text(check.get(), 0), sqlite3_column_int64(check.get(), 1));
    }
    for (const auto& [table, rowid] : lost) {
      Statement drop(db, absl::StrCat("DELETE FROM main.", Quoted(table), " WHERE rowid = ?1"));
      sqlite3_bind_int64(drop.get(), 1, rowid);
      orphans += drop.Step() == SQLITE_DONE ? 1 : 0;
    }
  }
  const int cut = KeepUnbrokenTranscripts(db);
  if (absl::Status st = Exec(db, absl::StrCat("PRAGMA main.user_version = ", version), "salvage");
      !st.ok()) {
    return st;
  }
  if (absl::Status st = Exec(db, "COMMIT", "salvage"); !st.ok()) return st;
  sqlite3_close(old);
  old = nullptr;
  sqlite3_close(db);
  db = nullptr;
  if (!SyncFile(fresh)) {
    return absl::UnavailableError(absl::StrCat("salvage: cannot sync ", fresh));
  }
  // The damaged file and its log kept under another name (hard links: nothing is moved yet),
  // then the new file said complete (the marker), then the damaged log out of its way (SQLite
  // would replay it into the new file) and the new file over the damaged one in one rename.
  // A start that finds the marker finishes the swap (FinishSalvage), whatever was done of it.
  const std::string kept = absl::StrCat(path, ".damaged-", UnixMillis());
  if (::link(path.c_str(), kept.c_str()) != 0 ||
      (::access((path + "-wal").c_str(), F_OK) == 0 &&
       ::link((path + "-wal").c_str(), (kept + "-wal").c_str()) != 0)) {
    const std::string err = std::strerror(errno);
    RemoveFiles(kept);
    return absl::UnavailableError(
        absl::StrCat("salvage: cannot keep ", path, " as ", kept, ": ", err));
  }
  if (!WriteMarker(path, kept)) {
    RemoveFiles(kept);
    return absl::UnavailableError(absl::StrCat("salvage: cannot write ", path, kSwapSuffix));
  }
  done = true;  // the swap is finished from here on, now or at the next start
  RECALL_RETURN_IF_ERROR(FinishSalvage(path).status());
  return absl::StrCat(
      "copied what could be read into a new ", path, " (", absl::StrJoin(copied, "; "),
      orphans > 0 ? absl::StrCat("; ", orphans, " rows whose parent was lost") : "",
      cut > 0 ? absl::StrCat("; ", cut, " transcript(s) cut at a lost message") : "",
      "); the damaged file is kept as ", kept);
}

}  // namespace recall::coordinator
