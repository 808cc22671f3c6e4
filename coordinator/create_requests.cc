#include "coordinator/create_requests.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
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
  // The record: the digest (64 hex digits), a space, then the session id, or "pending:" and
  // the time its claim was made while a coordinator creates it. The claim is added (one of
  // the coordinators sharing the store gets it), so two replicas given the request at once
  // make one session: the other waits for the id.
  const std::string name = RecordName(request_id);
  const absl::Time deadline = absl::Now() + kRunningWait;
  while (true) {
    const absl::Status claimed =
        store_.AddRecord(tenant, name, absl::StrCat(digest, " pending:", UnixMillis()));
    if (claimed.ok()) {
      absl::StatusOr<SessionRecord> made = create();
      if (!made.ok()) {
        store_.DeleteRecord(tenant, name).IgnoreError();  // not made: a retry may make it
        return made.status();
      }
      if (absl::Status st = store_.PutRecord(tenant, name, absl::StrCat(digest, " ", made->id));
          !st.ok()) {
        // The session is made and answered; a retry of this request waits out the claim.
        RECALL_LOG(WARNING) << "CreateSession request_id " << request_id
                            << ": cannot record session " << made->id << " (" << st << ")";
      }
      return made;
    }
    if (!absl::IsAlreadyExists(claimed)) return claimed;
    absl::StatusOr<std::string> record = store_.GetRecord(tenant, name);
    if (absl::IsNotFound(record.status())) continue;  // released since: claim it
    if (!record.ok()) return record.status();
    const size_t space = record->find(' ');
    if (space == std::string::npos || record->substr(0, space) != digest) {
      return absl::InvalidArgumentError(
          "request_id: a CreateSession with this id asked for another session (its model, "
          "system prompt, cache or metadata differ); a new session needs a new id");
    }
    const std::string rest = record->substr(space + 1);
    int64_t since = 0;
    if (absl::StartsWith(rest, "pending:") &&
        absl::SimpleAtoi(absl::string_view(rest).substr(8), &since)) {
      if (UnixMillis() - since > absl::ToInt64Milliseconds(kStaleClaim)) {
        // Its coordinator died before it recorded the session: taken over.
        store_.DeleteRecord(tenant, name).IgnoreError();
        continue;
      }
      if (absl::Now() >= deadline) {
        return absl::AbortedError(
            "request_id: a CreateSession with this id is still running; send it again once "
            "it has ended (retryable)");
      }
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    absl::StatusOr<SessionRecord> made = store_.Get(tenant, rest);
    if (!absl::IsNotFound(made.status())) return made;
    // Its session was deleted since: this request makes a new one.
    store_.DeleteRecord(tenant, name).IgnoreError();
  }
}

}  // namespace recall::coordinator
