#include "coordinator/create_requests.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::coordinator {
namespace {

std::string RecordName(const std::string& request_id) { return "c:" + request_id; }

}  // namespace

absl::StatusOr<SessionRecord> CreateRequests::Once(
    const std::string& tenant, const std::string& request_id, const std::string& digest,
    const std::function<absl::StatusOr<SessionRecord>()>& create) {
  const std::string key = absl::StrCat(tenant.size(), ":", tenant, request_id);
  {
    const auto free = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return running_.count(key) == 0; };
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&free), kRunningWait)) {
      return absl::AbortedError(
          "request_id: a CreateSession with this id is still running; send it again once it "
          "has ended (retryable)");
    }
    running_.insert(key);
  }
  absl::StatusOr<SessionRecord> made = Run(tenant, request_id, digest, create);
  absl::MutexLock lock(&mu_);
  running_.erase(key);
  return made;
}

absl::StatusOr<SessionRecord> CreateRequests::Run(
    const std::string& tenant, const std::string& request_id, const std::string& digest,
    const std::function<absl::StatusOr<SessionRecord>()>& create) {
  // The record: the digest (64 hex digits), a space, the session id.
  absl::StatusOr<std::string> record = store_.GetRecord(tenant, RecordName(request_id));
  if (!record.ok() && !absl::IsNotFound(record.status())) return record.status();
  if (record.ok()) {
    const size_t space = record->find(' ');
    if (space == std::string::npos || record->substr(0, space) != digest) {
      return absl::InvalidArgumentError(
          "request_id: a CreateSession with this id asked for another session (its model, "
          "system prompt, cache or metadata differ); a new session needs a new id");
    }
    absl::StatusOr<SessionRecord> made = store_.Get(tenant, record->substr(space + 1));
    // Deleted since: this request is a new one.
    if (!absl::IsNotFound(made.status())) return made;
  }
  RECALL_ASSIGN_OR_RETURN(SessionRecord made, create());
  if (absl::Status st =
          store_.PutRecord(tenant, RecordName(request_id), absl::StrCat(digest, " ", made.id));
      !st.ok()) {
    // The session is made and answered; only a retry of this request would make another.
    RECALL_LOG(WARNING) << "CreateSession request_id " << request_id << ": cannot record session "
                        << made.id << " (" << st << "); a retry of it would make another";
  }
  return made;
}

}  // namespace recall::coordinator
