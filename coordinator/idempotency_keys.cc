#include "coordinator/idempotency_keys.h"

#include "absl/strings/str_cat.h"

namespace recall::coordinator {

std::string IdempotencyKeys::Of(const std::string& tenant, const std::string& key) {
  return absl::StrCat(tenant.size(), ":", tenant, key);
}

bool IdempotencyKeys::Claim(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  return running_.insert(Of(tenant, key)).second;
}

void IdempotencyKeys::Release(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  running_.erase(Of(tenant, key));
}

void IdempotencyKeys::Put(const std::string& tenant, const std::string& key,
                          const std::string& session_id) {
  const std::string k = Of(tenant, key);
  absl::MutexLock lock(&mu_);
  if (session_of_.insert_or_assign(k, session_id).second) order_.push_back(k);
  while (order_.size() > capacity_) {
    session_of_.erase(order_.front());
    order_.pop_front();
  }
}

std::string IdempotencyKeys::Find(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = session_of_.find(Of(tenant, key));
  return it == session_of_.end() ? "" : it->second;
}

}  // namespace recall::coordinator
