#include "coordinator/idle_sessions.h"

#include <algorithm>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"

namespace recall::coordinator {
namespace {

constexpr int kBatch = 100;  // sessions deleted per store call (turns' writes wait for it)

}  // namespace

IdleSessions::IdleSessions(SessionStore& store, const WorkerRegistry& workers, absl::Duration ttl,
                           metrics::Registry& metrics,
                           std::function<void(const std::string&, const std::string&)> forget)
    : store_(store),
      workers_(workers),
      ttl_(ttl),
      deleted_(metrics.GetCounter("recall_coordinator_sessions_expired_total",
                                  "Sessions deleted for being idle longer than --session-ttl")),
      forget_(std::move(forget)) {
  thread_ = std::thread([this] { Loop(); });
}

IdleSessions::~IdleSessions() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Duration IdleSessions::Period(absl::Duration ttl) {
  return std::clamp(ttl / 4, absl::Seconds(1), absl::Seconds(60));
}

int IdleSessions::Sweep() {
  const int64_t before = UnixMillis() - absl::ToInt64Milliseconds(ttl_);
  int total = 0;
  while (true) {
    absl::StatusOr<std::vector<IdleSession>> gone = store_.DeleteIdle(before, kBatch);
    if (!gone.ok()) {
      RECALL_LOG(WARNING) << "deleting idle sessions: " << gone.status().message()
                          << "; trying again in " << absl::FormatDuration(Period(ttl_));
      break;
    }
    total += static_cast<int>(gone->size());
    deleted_->Increment(static_cast<double>(gone->size()));
    for (const IdleSession& s : *gone) {
      forget_(s.tenant, s.id);
      if (Stopping()) break;  // their caches age out on the workers
      workers_.DropSession(s.worker, s.id);
    }
    if (static_cast<int>(gone->size()) < kBatch || Stopping()) break;
  }
  if (total > 0) {
    RECALL_LOG(INFO) << "deleted " << total << " session(s) idle longer than "
                     << absl::FormatDuration(ttl_) << " (--session-ttl)";
  }
  return total;
}

bool IdleSessions::Stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void IdleSessions::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), Period(ttl_));
      if (stop_) return;
    }
    Sweep();
  }
}

}  // namespace recall::coordinator
