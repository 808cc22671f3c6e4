// SessionStore: the source of truth for sessions, their transcripts and their worker
// bindings. Worker caches are derived state: any worker can rebuild a session from here.
//
// Every call is scoped by tenant: a session of another tenant is NotFound, exactly like a
// session that does not exist. Implementations are thread safe.
#pragma once

#include <cstdint>
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

struct StoredMessage {
  std::string role;
  std::string content;
  // An assistant reply: its token ids as the worker streamed them and how it ended
  // (v1::FinishReason), so a worker rebuilding the session replays it exactly. Empty / 0 when
  // unknown (a reply stored before these were kept).
  std::vector<int32_t> token_ids;
  int finish = 0;
};

// StoredMessage's reply fields as bytes (little-endian int32: finish, then the ids), and back.
std::string EncodeReply(const StoredMessage& m);
void DecodeReply(const std::string& bytes, StoredMessage* m);

struct SessionRecord {
  std::string id;
  std::string tenant;
  std::string model;
  std::string cache_settings;  // serialized recall.v1.CacheSettings
  std::map<std::string, std::string> metadata;
  int64_t created_unix_ms = 0;
  std::string worker;          // the worker the session is bound to ("" = none)
  std::vector<StoredMessage> messages;  // filled by Get only
  int message_count = 0;
};

class SessionStore {
 public:
  virtual ~SessionStore() = default;

  // AlreadyExists if the id is taken (by any tenant).
  virtual absl::Status Create(const SessionRecord& record) = 0;
  // With the transcript.
  virtual absl::StatusOr<SessionRecord> Get(const std::string& tenant,
                                            const std::string& id) = 0;
  // Sessions of `tenant` with id > after, in id order, without transcripts.
  virtual absl::StatusOr<std::vector<SessionRecord>> List(const std::string& tenant,
                                                          const std::string& after,
                                                          int limit) = 0;
  virtual absl::Status Delete(const std::string& tenant, const std::string& id) = 0;
  // Appends at position `index`, which must equal the current message count (so two
  // writers cannot interleave turns): FailedPrecondition otherwise. Durable on return.
  virtual absl::Status Append(const std::string& tenant, const std::string& id, int index,
                              const StoredMessage& message) = 0;
  // Removes messages from position `index` on (a turn that did not happen).
  virtual absl::Status Truncate(const std::string& tenant, const std::string& id, int index) = 0;
  virtual absl::Status Bind(const std::string& tenant, const std::string& id,
                            const std::string& worker) = 0;
  virtual absl::StatusOr<int> CountSessions(const std::string& tenant) = 0;
};

// SQLite (WAL, synchronous=FULL) in `path`; the file is created if missing.
absl::StatusOr<std::unique_ptr<SessionStore>> OpenSqliteStore(const std::string& path);

// Redis at host:port (redis_store.cc); Unavailable when it cannot connect. A server that
// keeps nothing on disk (appendonly no and no RDB save points) loses every session when it
// restarts: FailedPrecondition saying so, or with `allow_volatile` a warning on stderr.
absl::StatusOr<std::unique_ptr<SessionStore>> OpenRedisStore(const std::string& host, int port,
                                                             bool allow_volatile = false);

// "redis://HOST:PORT" or "sqlite://PATH" (also a bare path: SQLite).
absl::StatusOr<std::unique_ptr<SessionStore>> OpenStore(const std::string& url,
                                                        bool allow_volatile = false);

}  // namespace recall::coordinator
