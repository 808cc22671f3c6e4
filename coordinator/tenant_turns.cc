#include "coordinator/tenant_turns.h"

#include "absl/strings/str_cat.h"

namespace recall::coordinator {

absl::Status TenantTurns::AtLimit(int running) const {
  if (limit_ <= 0 || running < limit_) return absl::OkStatus();
  if (refused_ != nullptr) refused_->Increment();
  return absl::ResourceExhaustedError(
      absl::StrCat("the tenant has ", running, " turns running, the limit is ", limit_,
                   " at once (the coordinator's max_running_per_tenant); retry after ",
                   kRetryAfterMs, " ms (retryable)"));
}

absl::Status TenantTurns::Acquire(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  int& running = running_[tenant];
  if (absl::Status st = AtLimit(running); !st.ok()) return st;
  ++running;
  return absl::OkStatus();
}

void TenantTurns::Release(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(tenant);
  if (it == running_.end()) return;
  if (--it->second <= 0) running_.erase(it);
}

absl::Status TenantTurns::Check(const std::string& tenant) const {
  return AtLimit(Running(tenant));
}

int TenantTurns::Running(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(tenant);
  return it == running_.end() ? 0 : it->second;
}

}  // namespace recall::coordinator
