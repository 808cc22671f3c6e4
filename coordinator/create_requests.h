// CreateRequests: CreateSession's request ids (CreateSessionRequest.request_id). A request
// sent again with the id of one that made a session (its reply lost with a broken connection,
// a client's retry) gets that session instead of a second one: without it a retried
// CreateSession left an orphan session behind, counted against --max-sessions. What an id
// made is a store record (SessionStore::PutRecord, names "c:ID", kept a day), so a retry finds
// it on any coordinator sharing the store and after a restart. The record is claimed before
// the session is made (SessionStore::AddRecord): of requests of one id that reach replicas
// at once, one makes the session and the others wait for it (two replicas each made one).
//
// Thread safety: thread safe.
#pragma once

#include <functional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/session_store.h"

namespace recall::coordinator {

class CreateRequests {
 public:
  explicit CreateRequests(SessionStore& store);

  // The session `tenant`'s request `request_id` made, when the store still holds it; else
  // `create`'s, recorded under the id. `digest` is what the request asks (its fields but the
  // id): a former request of the id that asked otherwise is InvalidArgument naming
  // request_id. A request of the id still running here is waited for (at most kRunningWait).
  absl::StatusOr<SessionRecord> Once(const std::string& tenant, const std::string& request_id,
                                     const std::string& digest,
                                     const std::function<absl::StatusOr<SessionRecord>()>& create);

  static constexpr absl::Duration kRunningWait = absl::Seconds(10);
  // Another coordinator's claim this old (it died before it recorded the session) is taken
  // over; this coordinator's own claims, once none of its requests of the id runs.
  static constexpr absl::Duration kStaleClaim = absl::Seconds(30);

 private:
  absl::StatusOr<SessionRecord> Run(const std::string& tenant, const std::string& request_id,
                                    const std::string& digest,
                                    const std::function<absl::StatusOr<SessionRecord>()>& create);
  // Creates the session of a claimed id and records it in place of the claim (`claim`: its
  // value).
  absl::StatusOr<SessionRecord> CreateClaimed(
      const std::string& tenant, const std::string& name, const std::string& digest,
      const std::string& claim, const std::function<absl::StatusOr<SessionRecord>()>& create);

  SessionStore& store_;
  const std::string instance_;  // this coordinator's, in its claims
  absl::Mutex mu_;
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);  // tenant-size-prefixed ids
};

}  // namespace recall::coordinator
