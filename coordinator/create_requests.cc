#include "coordinator/create_requests.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/random_id.h"

namespace recall::coordinator {
namespace {

std::string RecordName(const std::string& request_id) { return "c:" + request_id; }

}  // namespace

CreateRequests::CreateRequests(SessionStore& store) : store_(store), instance_(RandomId("")) {}

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
  // The record: the digest (64 hex digits), a space, then the session id, or "pending:", the
  // time its claim was made and the claiming coordinator's instance while it creates it. The
  // claim is added (one of the coordinators sharing the store gets it), so two replicas given
  // the request at once make one session: the others wait for its id.
  const std::string name = RecordName(request_id);
  const absl::Time deadline = absl::Now() + kRunningWait;
  absl::Duration pause = absl::Milliseconds(10);
  bool claim = true;  // no record read yet, or it was let go
  while (true) {
    if (absl::Now() >= deadline) {
      return absl::AbortedError(
          "request_id: a CreateSession with this id is still running; send it again once it "
          "has ended (retryable)");
    }
    if (claim) {
      const std::string mine = absl::StrCat(digest, " pending:", UnixMillis(), ":", instance_);
      const absl::Status claimed = store_.AddRecord(tenant, name, mine);
      if (claimed.ok()) return CreateClaimed(tenant, name, digest, mine, create);
      if (!absl::IsAlreadyExists(claimed)) return claimed;
    }
    absl::StatusOr<std::string> record = store_.GetRecord(tenant, name);
    claim = absl::IsNotFound(record.status());  // let go since: claimed again
    if (claim) continue;
    if (!record.ok()) return record.status();
    const size_t space = record->find(' ');
    if (space == std::string::npos || record->substr(0, space) != digest) {
      return absl::InvalidArgumentError(
          "request_id: a CreateSession with this id asked for another session (its model, "
          "system prompt, cache or metadata differ); a new session needs a new id");
    }
    const std::string rest = record->substr(space + 1);
    if (absl::StartsWith(rest, "pending:")) {
      const std::vector<std::string> parts = absl::StrSplit(rest, ':');
      int64_t since = 0;
      const bool parsed = parts.size() == 3 && absl::SimpleAtoi(parts[1], &since);
      // Left by a coordinator that died before it recorded the session (or by this one's
      // earlier failure): taken over. This coordinator's own claims run under Once's mark, so
      // one of them seen here is no longer running.
      if (!parsed || parts[2] == instance_ ||
          UnixMillis() - since > absl::ToInt64Milliseconds(kStaleClaim)) {
        RECALL_RETURN_IF_ERROR(store_.DeleteRecord(tenant, name, *record));
        claim = true;
        continue;
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(200));
      continue;
    }
    absl::StatusOr<SessionRecord> made = store_.Get(tenant, rest);
    if (!absl::IsNotFound(made.status())) return made;
    // Its session was deleted since: this request makes a new one.
    RECALL_RETURN_IF_ERROR(store_.DeleteRecord(tenant, name, *record));
    claim = true;
  }
}

absl::StatusOr<SessionRecord> CreateRequests::CreateClaimed(
    const std::string& tenant, const std::string& name, const std::string& digest,
    const std::string& claim, const std::function<absl::StatusOr<SessionRecord>()>& create) {
  absl::StatusOr<SessionRecord> made = create();
  if (!made.ok()) {
    // Not made: a retry may make it (a claim left here is this instance's: taken over).
    store_.DeleteRecord(tenant, name, claim).IgnoreError();
    return made.status();
  }
  const std::string record = absl::StrCat(digest, " ", made->id);
  absl::Status st = store_.PutRecord(tenant, name, record);
  if (!st.ok()) st = store_.PutRecord(tenant, name, record);  // once more
  if (!st.ok()) {
    // The session is made and answered; a retry of this request waits out the claim (or, on
    // this coordinator, takes it over) and makes another.
    RECALL_LOG(WARNING) << "CreateSession " << name << ": cannot record session " << made->id
                        << " (" << st << ")";
  }
  return made;
}

}  // namespace recall::coordinator
