// TenantTurns: the turns each tenant has running through this coordinator (session turns and
// one-turn Generate / completions alike, from their runner's start to its end), held to a
// limit per tenant (--max-running-per-tenant). A tenant at the limit is refused
// RESOURCE_EXHAUSTED (retryable) while the other tenants' turns still reach the workers:
// without it one key's burst of Generate calls filled every worker's queue and left every
// other tenant refused. Per coordinator: replicas each hold their own count.
//
// Thread safety: thread safe.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"

namespace recall::coordinator {

class TenantTurns {
 public:
  // `limit`: turns a tenant may have running at once; 0 for no limit. `refused` (may be null)
  // counts the turns refused for it (by Acquire or Check: once per request).
  explicit TenantTurns(int limit, metrics::Counter* refused = nullptr)
      : limit_(limit), refused_(refused) {}

  // Counts a turn of `tenant` as running: ResourceExhausted (retryable, naming the limit) when
  // the tenant already has `limit` running. Each OK is matched by one Release.
  absl::Status Acquire(const std::string& tenant);
  void Release(const std::string& tenant);
  // Acquire's answer without counting: a turn refused before its store I/O.
  absl::Status Check(const std::string& tenant) const;
  int Running(const std::string& tenant) const;
  int limit() const { return limit_; }

  // How long a refused tenant is told to wait before retrying.
  static constexpr int kRetryAfterMs = 500;

 private:
  absl::Status AtLimit(int running) const;

  const int limit_;
  metrics::Counter* const refused_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> running_ ABSL_GUARDED_BY(mu_);  // tenants with turns running only
};

}  // namespace recall::coordinator
